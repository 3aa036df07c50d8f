"""Checkpoint files: atomic writes, safe loads, and import of reference TD-MPC2 checkpoints.

Every load uses `torch.load(weights_only=True)`: a checkpoint can never run code.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path

import torch

from tdmpc.world_model import ModelDims, WorldModel

FORMAT = "tdmpc"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line."""


def atomic_write(path: Path, write) -> None:
    """Write via `write(tmp_path)` to a temp file in the same directory, fsync, then rename.

    A crash at any point leaves either the old file or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save(obj: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def load_file(path: str | Path) -> dict:
    """torch.load with weights_only=True, turning every failure into a one-line CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' is a directory; pass a .pt file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            why = "it holds Python objects that a safe (weights-only) load refuses"
        elif isinstance(e, (EOFError, zipfile.BadZipFile)) or "central directory" in first or "failed finding" in first:
            why = "the file is truncated or corrupt"
        else:
            why = f"not a readable torch checkpoint ({first[:120]})"
        raise CheckpointError(f"cannot load '{path}': {why}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"cannot load '{path}': expected a dict, found {type(obj).__name__}")
    return obj


def is_reference(obj: dict) -> bool:
    sd = obj.get("model", obj)
    return obj.get("format") != FORMAT and isinstance(sd, dict) and any(
        isinstance(k, str) and k.startswith("_encoder.") for k in sd)


# --- reference layout -------------------------------------------------------------------

_LN_NAMES = ("weight", "bias", "ln.weight", "ln.bias")


def _unflatten_old_q_layout(sd: dict) -> dict:
    """Older reference checkpoints numbered ensemble tensors flat: `_Qs.params.{4*layer + k}`."""
    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"(_Qs|_target_Qs)\.params\.(\d+)", key)
        if m:
            n = int(m.group(2))
            prefix = "_Qs.params." if m.group(1) == "_Qs" else "_target_Qs_params."
            out[f"{prefix}{n // 4}.{_LN_NAMES[n % 4]}"] = value
        else:
            out[key] = value
    return out


def _layers(sd: dict, prefix: str) -> list[int]:
    idx = {int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.weight$", k))}
    return sorted(idx)


def reference_to_ours(sd: dict, source: str = "checkpoint") -> tuple[ModelDims, dict]:
    """Map a reference state dict onto our key names and infer every size from tensor shapes."""
    sd = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor) and "__" not in k}
    if any(k.startswith("_task_emb") for k in sd):
        raise CheckpointError(f"{source}: multi-task reference checkpoints are not supported yet "
                              "(found a task embedding)")
    sd = _unflatten_old_q_layout(sd)
    try:
        if _layers(sd, "_encoder.state."):
            enc = _layers(sd, "_encoder.state.")
            w0 = sd[f"_encoder.state.{enc[0]}.weight"]
            obs_shape: tuple[int, ...] = (w0.shape[1],)
            enc_dim, num_enc_layers, num_channels = w0.shape[0], len(enc), 32
            latent = sd[f"_encoder.state.{enc[-1]}.weight"].shape[0]
            enc_prefix = "_encoder.state."
        elif _layers(sd, "_encoder.rgb."):
            convs = _layers(sd, "_encoder.rgb.")
            w0 = sd[f"_encoder.rgb.{convs[0]}.weight"]
            num_channels = w0.shape[0]
            obs_shape, enc_dim, num_enc_layers = (w0.shape[1], 64, 64), 256, 2
            latent = num_channels * 16
            enc_prefix = "_encoder.rgb."
        else:
            raise KeyError("_encoder.state.0.weight")
        dyn0 = sd["_dynamics.0.weight"]
        q0 = sd["_Qs.params.0.weight"]
        dims = ModelDims(
            obs_shape=obs_shape, action_dim=dyn0.shape[1] - latent, latent_dim=latent, mlp_dim=dyn0.shape[0],
            enc_dim=enc_dim, num_enc_layers=num_enc_layers, num_q=q0.shape[0],
            episodic="_termination.0.weight" in sd, num_bins=sd["_reward.2.weight"].shape[0],
            num_channels=num_channels,
            log_std_min=float(sd["log_std_min"]) if "log_std_min" in sd else -10.0,
            log_std_max=float(sd["log_std_min"] + sd["log_std_dif"]) if "log_std_dif" in sd else 2.0)
    except (KeyError, IndexError) as e:
        raise CheckpointError(f"{source}: not a TD-MPC2 world model (missing {e})") from None

    ours = {}
    for key, value in sd.items():
        if key.startswith("_detach_Qs_params."):
            continue  # an alias of _Qs in the reference
        new = key.replace(enc_prefix, "_encoder.", 1) if key.startswith(enc_prefix) else key
        new = new.replace("_Qs.params.", "_Qs.", 1).replace("_target_Qs_params.", "_target_Qs.", 1)
        ours[new] = value
    if not any(k.startswith("_target_Qs.") for k in ours):  # very old files: targets = online
        ours.update({k.replace("_Qs.", "_target_Qs.", 1): v for k, v in ours.items() if k.startswith("_Qs.")})
    return dims, ours


def load_state_strict(model: torch.nn.Module, sd: dict, source: str) -> None:
    """load_state_dict with one-line errors listing the first few missing/unexpected keys or shapes."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:4]}{' ...' if len(missing) > 4 else ''} ({len(missing)} in all)")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''} "
                         f"({len(unexpected)} in all)")
        raise CheckpointError(f"{source}: state dict does not match the model: " + "; ".join(parts))
    for k, v in sd.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(f"{source}: '{k}' has shape {tuple(v.shape)}, the model expects "
                                  f"{tuple(own[k].shape)}")
    model.load_state_dict(sd)


def load_reference(path: str | Path, map_location: str | torch.device = "cpu") -> WorldModel:
    """A reference TD-MPC2 checkpoint ({"model": state_dict}) as our WorldModel."""
    obj = load_file(path)
    sd = obj.get("model", obj)
    dims, ours = reference_to_ours(sd, source=str(path))
    model = WorldModel(dims)
    load_state_strict(model, ours, str(path))
    return model.to(map_location).eval()
