"""Checkpoint files: atomic writes, safe loads, and import of reference TD-MPC2 checkpoints.

Every load uses `torch.load(weights_only=True)`: a checkpoint can never run code.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from tdmpc.config import MODEL_SIZES, SIZE_FIELDS, Config, from_dict, validate
from tdmpc.task_sets import TASK_SETS, expand, reference_info, task_set_name
from tdmpc.world_model import ModelDims, WorldModel

FORMAT = "tdmpc"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line."""


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Write via `write(tmp_path)` to a temp file in the same directory, fsync, then rename.

    A crash at any point leaves either the old file or the new one, never half of one. A write that
    fails leaves no temp file, and is an OSError naming the file (torch.save reports a write cut short
    by a full disk as a RuntimeError).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        try:
            write(Path(tmp))
        except RuntimeError as e:
            if "unexpected pos" not in str(e) and "write" not in str(e).lower():
                raise
            raise OSError(errno.ENOSPC, f"the write of {path} was cut short (is the disk full?)") from None
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


def load_file(path: str | Path, mmap: bool = False) -> dict:
    """torch.load with weights_only=True, turning every failure into a one-line CheckpointError.

    `mmap=True` maps the tensors instead of reading them (cheap when only shapes are needed);
    it applies to zip-format files, which is what torch.save has written since torch 1.6.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' is a directory; pass a .pt file")
    with open(path, "rb") as f:
        head = f.read(8)
    if not head:
        raise CheckpointError(f"cannot load '{path}': the file is empty")
    is_zip = head.startswith(b"PK\x03\x04")
    if not is_zip and head[0] != 0x80:  # neither torch's zip format nor a (legacy-format) pickle
        what = "a text file" if _looks_like_text(path) else "unknown binary data"
        raise CheckpointError(f"cannot load '{path}': not a torch checkpoint ({what}, not the zip archive "
                              f"torch.save writes)")
    if is_zip and not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot load '{path}': the file is truncated or corrupt (incomplete zip archive)")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise, not an error
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except Exception as e:  # noqa: BLE001 - whatever the unpickler trips on, the user gets one line
        raise CheckpointError(f"cannot load '{path}': {_load_failure(e)}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"cannot load '{path}': expected a dict, found {type(obj).__name__}")
    return obj


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        chunk = f.read(4096)
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in chunk


def _load_failure(e: Exception) -> str:
    """Why torch.load failed, in a few words."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(e).__name__
    if m := re.search(r"GLOBAL (\S+)", text):
        return (f"it holds a Python object ({m.group(1)}) that a safe weights-only load refuses to build; "
                f"only tensors and plain containers are accepted")
    if "Weights only load failed" in text:
        return "not a torch checkpoint (its pickle data is not what torch.save writes)"
    if isinstance(e, (EOFError, zipfile.BadZipFile)) or "EOF" in first or "central directory" in first:
        return "the file is truncated or corrupt"
    return f"not a readable torch checkpoint ({type(e).__name__}: {first[:120]})"


_REFERENCE_MODULES = ("_encoder.", "_dynamics.", "_reward.", "_termination.", "_pi.", "_Qs.", "_target_Qs",
                      "_detach_Qs", "_task_emb.", "_action_masks")


def is_reference(obj: dict) -> bool:
    """A reference TD-MPC2 file: {"model": state_dict} (what its save() writes) or a bare state dict."""
    if obj.get("format") == FORMAT:
        return False
    sd = obj.get("model", obj)
    return isinstance(sd, dict) and any(isinstance(k, str) and k.startswith(_REFERENCE_MODULES) for k in sd)


# --- reference layout -------------------------------------------------------------------
#
# The reference model (tdmpc2/common/world_model.py) keeps the state-dict names below; every
# hidden layer is a NormedLinear (`weight`, `bias`, `ln.weight`, `ln.bias`), the last layer
# of reward/termination/pi/Q a plain Linear, the last of encoder/dynamics a NormedLinear
# with SimNorm. The Q ensemble is a tensordict of stacked parameters (leading dim num_q):
#   _Qs.params.{layer}.{name}, _target_Qs_params.{layer}.{name}, _detach_Qs_params... (alias)
# plus tensordict metadata entries such as `_Qs.params.__batch_size` / `__device`.
# Releases before the torch.compile rework numbered the ensemble flat instead:
#   _Qs.params.{4 * layer + k}, _target_Qs.params.{4 * layer + k}, k: weight, bias, ln.weight, ln.bias.

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


def _key_list(keys: list[str], n: int = 4) -> str:
    return f"{keys[:n]}{' ...' if len(keys) > n else ''} ({len(keys)} in all)"


def _renumber_prerelease(sd: dict) -> dict:
    """The reference's pre-release layout (its issue #23) nested each MLP as Sequential(Linear, LayerNorm,
    activation, ...): `_dynamics.0.0.weight`, `_dynamics.0.1.weight` (its LayerNorm), `_dynamics.0.3.weight`,
    and the state encoder shifted by one (`_encoder.state.1.weight`). Walking a module's tensors in index
    order, a 2-D weight starts the next layer and a 1-D one right after it is that layer's LayerNorm."""
    if "_dynamics.0.0.weight" not in sd:
        return sd
    if "_dynamics.0.weight" in sd:
        raise CheckpointError("the state dict mixes the current layout ('_dynamics.0.weight') with the reference's "
                              "pre-release one ('_dynamics.0.0.weight')")
    out, done = {}, set()
    for prefix, nested in (("_encoder.state.", ""), ("_dynamics.", "0."), ("_reward.", "0."),
                           ("_termination.", "0."), ("_pi.", "0.")):
        old = prefix + nested
        index = sorted({int(m.group(1)) for k in sd if (m := re.fullmatch(re.escape(old) + r"(\d+)\.weight", k))})
        layer = -1
        for i in index:
            normed = sd[f"{old}{i}.weight"].dim() == 1
            layer += 0 if normed else 1
            for name in ("weight", "bias"):
                if f"{old}{i}.{name}" in sd:  # a missing one is reported by the key check, by its new name
                    out[f"{prefix}{layer}.{'ln.' if normed else ''}{name}"] = sd[f"{old}{i}.{name}"]
                    done.add(f"{old}{i}.{name}")
    out.update({k: v for k, v in sd.items() if k not in done})
    return out


def _clean_reference(sd: dict, source: str) -> dict:
    """Tensors only: drop tensordict metadata, reject what we cannot import, with one line each."""
    out = {}
    for key, value in sd.items():
        if not isinstance(key, str) or key.rsplit(".", 1)[-1].startswith("__"):
            continue  # tensordict metadata: `_Qs.params.__batch_size`, `__device`, ...
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{source}: '{key}' holds a {type(value).__name__}, not a tensor")
        out[key] = value
    return out


def _shape(sd: dict, key: str, ndim: int, source: str) -> tuple[int, ...]:
    if key not in sd:
        raise CheckpointError(f"{source}: state dict does not match a TD-MPC2 world model: missing '{key}' "
                              f"(needed to infer the model sizes)")
    shape = tuple(sd[key].shape)
    if len(shape) != ndim:
        raise CheckpointError(f"{source}: '{key}' has shape {shape}; a TD-MPC2 world model has a "
                              f"{ndim}-D tensor there")
    return shape


def _scalar(sd: dict, key: str, default: float) -> float:
    return float(sd[key]) if key in sd and sd[key].numel() == 1 else default


def _infer_dims(sd: dict, source: str, tasks: tuple[str, ...] | None) -> tuple[ModelDims, str]:
    """Every size from tensor shapes; returns the dims and the encoder's key prefix. A multi-task model's
    task names are `tasks`, else those of the reference's set of its size (mt30, mt80)."""
    num_tasks, task_dim = _shape(sd, "_task_emb.weight", 2, source) if "_task_emb.weight" in sd else (0, 0)
    if _layers(sd, "_encoder.state."):
        enc_prefix = "_encoder.state."
        enc = _layers(sd, enc_prefix)
        enc_dim, obs_dim = _shape(sd, f"{enc_prefix}{enc[0]}.weight", 2, source)
        obs_shape: tuple[int, ...] = (obs_dim - task_dim,)
        latent = _shape(sd, f"{enc_prefix}{enc[-1]}.weight", 2, source)[0]
        num_enc_layers, num_channels = len(enc), 32
    elif _layers(sd, "_encoder.rgb."):
        enc_prefix = "_encoder.rgb."
        num_channels, in_channels = _shape(sd, f"{enc_prefix}{_layers(sd, enc_prefix)[0]}.weight", 4, source)[:2]
        obs_shape, latent = (in_channels, 64, 64), num_channels * 16  # 64x64 frames -> 4x4 x channels
        enc_dim, num_enc_layers = 256, 2  # unused by the pixel encoder
    else:
        raise CheckpointError(f"{source}: state dict does not match a TD-MPC2 world model: no encoder "
                              f"('_encoder.state.*' or '_encoder.rgb.*')")
    mlp_dim, dyn_in = _shape(sd, "_dynamics.0.weight", 2, source)
    num_q = _shape(sd, "_Qs.params.0.weight", 3, source)[0]
    num_bins = _shape(sd, "_reward.2.weight", 2, source)[0]
    log_std_min = _scalar(sd, "log_std_min", -10.0)  # absent from early releases: the reference's bounds
    log_std_max = log_std_min + _scalar(sd, "log_std_dif", 12.0)
    action_dim = dyn_in - latent - task_dim
    if action_dim < 1:
        raise CheckpointError(f"{source}: '_dynamics.0.weight' has {dyn_in} inputs, not more than the latent "
                              f"size {latent}{f' and task dim {task_dim}' if task_dim else ''}: not a TD-MPC2 "
                              f"world model")
    names, action_dims = _task_set(sd, num_tasks, action_dim, source, tasks) if num_tasks else ((), ())
    # What the file does not store (vmin, vmax, simnorm_dim, dropout) takes the reference defaults.
    dims = dataclasses.replace(
        ModelDims.from_config(Config(), obs_shape, action_dim, any(k.startswith("_termination.") for k in sd)),
        latent_dim=latent, mlp_dim=mlp_dim, enc_dim=enc_dim, num_enc_layers=num_enc_layers, num_q=num_q,
        num_bins=num_bins, num_channels=num_channels, log_std_min=log_std_min, log_std_max=log_std_max,
        tasks=names, task_dim=task_dim, action_dims=action_dims)
    return dims, enc_prefix


def _task_set(sd: dict, num_tasks: int, action_dim: int, source: str,
              given: tuple[str, ...] | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A multi-task model's task names and each task's action dims (from its action masks), checked
    against the named set's own dims where those are known (mt30, mt80)."""
    masks = sd.get("_action_masks")
    if not isinstance(masks, torch.Tensor) or tuple(masks.shape) != (num_tasks, action_dim):
        raise CheckpointError(f"{source}: a multi-task model needs '_action_masks' of shape {(num_tasks, action_dim)}")
    action_dims = tuple(int(n) for n in masks.sum(1).round().long())
    if given is None:
        found = [name for name, names in TASK_SETS.items() if len(names) == num_tasks]
        if not found:
            raise CheckpointError(f"{source}: a multi-task model of {num_tasks} tasks, which is neither mt30 nor "
                                  f"mt80: name its tasks in id order (--task-set a,b,c / task_set=...)")
        given = TASK_SETS[found[0]]
    if len(given) != num_tasks:
        raise CheckpointError(f"{source}: the model has {num_tasks} task embeddings but the task set names "
                              f"{len(given)} tasks ({task_set_name(given)})")
    for i, name in enumerate(given):
        info = reference_info(name)
        if info is not None and info.action_dim != action_dims[i]:
            raise CheckpointError(f"{source}: task {i} ({name}) acts on {action_dims[i]} dims in the model but "
                                  f"{info.action_dim} in its task set: the task set does not match the checkpoint")
    return tuple(given), action_dims


def _reference_shapes(d: ModelDims, enc_prefix: str) -> dict[str, tuple[int, ...]]:
    """Every key of a reference state dict with these dims, and its shape."""
    L, A, M, T = d.latent_dim, d.action_dim, d.mlp_dim, d.task_dim
    shapes: dict[str, tuple[int, ...]] = {"log_std_min": (), "log_std_dif": ()}
    if d.multitask:
        shapes["_task_emb.weight"], shapes["_action_masks"] = (len(d.tasks), T), (len(d.tasks), A)

    def mlp(prefix: str, sizes: list[int], normed_last: bool, lead: tuple[int, ...] = ()) -> None:
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            shapes[f"{prefix}{i}.weight"], shapes[f"{prefix}{i}.bias"] = (*lead, n_out, n_in), (*lead, n_out)
            if normed_last or i < len(sizes) - 2:
                shapes[f"{prefix}{i}.ln.weight"] = shapes[f"{prefix}{i}.ln.bias"] = (*lead, n_out)

    if d.pixels:
        C, kernels = d.num_channels, (7, 5, 3, 3)
        for i, (idx, k) in enumerate(zip((2, 4, 6, 8), kernels)):  # after ShiftAug and PixelPreprocess
            shapes[f"{enc_prefix}{idx}.weight"] = (C, d.obs_shape[0] if i == 0 else C, k, k)
            shapes[f"{enc_prefix}{idx}.bias"] = (C,)
    else:
        mlp(enc_prefix, [d.obs_shape[0] + T, *max(d.num_enc_layers - 1, 1) * [d.enc_dim], L], True)
    mlp("_dynamics.", [L + T + A, M, M, L], True)
    mlp("_reward.", [L + T + A, M, M, d.num_bins], False)
    if d.episodic:
        mlp("_termination.", [L, M, M, 1], False)
    mlp("_pi.", [L + T, M, M, 2 * A], False)
    mlp("_Qs.params.", [L + T + A, M, M, d.num_bins], False, (d.num_q,))
    mlp("_target_Qs_params.", [L + T + A, M, M, d.num_bins], False, (d.num_q,))
    return shapes


def _check_reference_keys(sd: dict, dims: ModelDims, enc_prefix: str, source: str) -> None:
    """Missing/unexpected keys and wrong shapes, named as the reference names them, in one line."""
    expected = _reference_shapes(dims, enc_prefix)
    optional = {"log_std_min", "log_std_dif"}  # early releases lack them: the defaults apply
    if not any(k.startswith("_target_Qs_params.") for k in sd):  # so do the targets: online copies then
        optional |= {k for k in expected if k.startswith("_target_Qs_params.")}
    missing = [k for k in expected if k not in sd and k not in optional]
    unexpected = [k for k in sd if k not in expected and not k.startswith("_detach_Qs_params.")]
    inferred = (f"inferred obs {dims.obs_shape[0] if not dims.pixels else dims.obs_shape}, action "
                f"{dims.action_dim}, latent {dims.latent_dim}, mlp {dims.mlp_dim}, num_q {dims.num_q}"
                + (f", {len(dims.tasks)} tasks of task dim {dims.task_dim}" if dims.multitask else ""))
    if missing or unexpected:
        parts = ([f"missing keys {_key_list(missing)}"] if missing else []) + \
                ([f"unexpected keys {_key_list(unexpected)}"] if unexpected else [])
        raise CheckpointError(f"{source}: state dict does not match a TD-MPC2 world model ({inferred}): "
                              + "; ".join(parts))
    wrong = [f"'{k}' {tuple(v.shape)} (expected {expected[k]})" for k, v in sd.items()
             if k in expected and tuple(v.shape) != expected[k]]
    if wrong:
        raise CheckpointError(f"{source}: tensor shapes disagree with each other ({inferred}): "
                              + ", ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""))


def reference_to_ours(sd: dict, source: str = "checkpoint",
                      tasks: tuple[str, ...] | None = None) -> tuple[ModelDims, dict]:
    """Map a reference state dict onto our key names and infer every size from tensor shapes.

    Reads the current layout, the older flat Q-ensemble numbering and the pre-release nested
    layout; skips tensordict metadata; single- and multi-task models (`tasks`: a multi-task model's
    task names in id order, by default its size's reference set); checks every key and shape against
    the layout the inferred sizes imply, so a damaged file fails here with the reference's own key names.
    """
    sd = _renumber_prerelease(_unflatten_old_q_layout(_clean_reference(sd, source)))
    dims, enc_prefix = _infer_dims(sd, source, tasks)
    _check_reference_keys(sd, dims, enc_prefix, source)
    ours = {}
    for key, value in sd.items():
        if key.startswith("_detach_Qs_params."):
            continue  # an alias of _Qs in the reference
        new = key.replace(enc_prefix, "_encoder.", 1) if key.startswith(enc_prefix) else key
        new = new.replace("_Qs.params.", "_Qs.", 1).replace("_target_Qs_params.", "_target_Qs.", 1)
        ours[new] = value
    if not any(k.startswith("_target_Qs.") for k in ours):  # early releases: targets = online
        ours.update({k.replace("_Qs.", "_target_Qs.", 1): v.clone() for k, v in ours.items() if k.startswith("_Qs.")})
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


def load_reference(path: str | Path, map_location: str | torch.device = "cpu",
                   tasks: tuple[str, ...] | None = None) -> WorldModel:
    """A reference TD-MPC2 checkpoint ({"model": state_dict}) as our WorldModel; `tasks` names a multi-task
    model's tasks in id order (default: mt30 or mt80, by its number of tasks)."""
    obj = load_file(path)
    sd = obj.get("model", obj)
    dims, ours = reference_to_ours(sd, source=str(path), tasks=tasks)
    model = WorldModel(dims)
    load_state_strict(model, ours, str(path))
    return model.to(map_location).eval()


# --- reading a checkpoint for use --------------------------------------------------------

@dataclass
class LoadedCheckpoint:
    cfg: Config
    dims: ModelDims
    state: dict  # our state-dict layout (model, and optimisers when present)
    episode_length: int | list[int] | None  # None for reference checkpoints: taken from the task(s)
    imported: bool  # a reference TD-MPC2 checkpoint


def read_checkpoint(path: str | Path, overrides: dict | None = None, mmap: bool = False) -> LoadedCheckpoint:
    """Our checkpoint or a reference one, as config + dims + state; `overrides` apply to the config.

    `mmap=True` maps the tensors rather than reading them: cheap when only the dims are needed."""
    path, overrides = Path(path), overrides or {}
    obj = load_file(path, mmap=mmap)
    if is_reference(obj):
        given = tuple(overrides["task_set"]) if overrides.get("task_set") else None
        dims, state = reference_to_ours(obj.get("model", obj), str(path), given)
        base = Config(**dims.config_values())
        if dims.multitask:  # the task it plays is chosen later; until then it names its set
            base = dataclasses.replace(base, task=next((n for n, t in TASK_SETS.items() if t == dims.tasks),
                                                       ",".join(dims.tasks)))
        return LoadedCheckpoint(validate(from_dict(overrides, base=base)), dims, {"model": state}, None, True)
    if obj.get("format") != FORMAT or "dims" not in obj:
        keys = [str(k) for k in list(obj)[:4]]
        raise CheckpointError(f"{path}: neither a tdmpc checkpoint nor a TD-MPC2 state dict "
                              f"(it holds keys {keys}{' ...' if len(obj) > 4 else ''})")
    cfg = validate(from_dict(overrides, base=from_dict(obj["config"], source=str(path))))
    length = obj["episode_length"]
    return LoadedCheckpoint(cfg, ModelDims.from_dict(obj["dims"]), obj,
                            [int(n) for n in length] if isinstance(length, (list, tuple)) else int(length), False)


def check_dims_match(dims: ModelDims, obs_shape: tuple[int, ...], action_dim: int, task: str, source: str) -> None:
    """A model made for other observation/action sizes than the task's is a one-line error."""
    if (tuple(dims.obs_shape), dims.action_dim) != (tuple(obs_shape), action_dim):
        raise CheckpointError(
            f"{source}: model is for obs {tuple(dims.obs_shape)} / action dim {dims.action_dim}, but task "
            f"'{task}' has obs {tuple(obs_shape)} / action dim {action_dim}")


# --- --init-from: starting a run from a checkpoint's weights ---------------------------------

def architecture_from_checkpoint(cfg: Config, path: str | Path, given: set[str]) -> tuple[Config, str]:
    """The architecture fields the user did not give (`given`: the fields set on the command line) come
    from the checkpoint, so a released model fine-tunes without spelling out its sizes. Sizes that were
    given stay, and if they contradict the checkpoint, init_weights fails with 'architecture differs'.

    Returns the config and a note saying what was taken (printed once the weights have loaded)."""
    dims = read_checkpoint(path, mmap=True).dims  # shapes only: tensors stay on disk
    theirs = {k: v for k, v in dims.config_values().items() if k not in ("model_size", "dropout")}
    if "model_size" in given:  # the preset asked for stands
        given = given | set(SIZE_FIELDS)
    take = {name: value for name, value in theirs.items() if name not in given}
    new_tasks: tuple[str, ...] = ()
    if dims.multitask and "task_set" in take:  # tasks it was not trained on get new embedding rows
        new_tasks = tuple(t for t in expand(cfg.task) if t not in dims.tasks)
        take["task_set"] = dims.tasks + new_tasks
    sizes = {**cfg.sizes(), **{k: v for k, v in take.items() if k in SIZE_FIELDS}}
    preset = next((n for n, p in MODEL_SIZES.items() if p == sizes), None)
    model_size = cfg.model_size if "model_size" in given else preset
    new = validate(dataclasses.replace(cfg, **{**take, **sizes, "model_size": model_size}))
    shown = {k: take[k] for k in (*SIZE_FIELDS, "episodic") if k in take}
    shown.update({k: v for k, v in take.items() if k not in shown and v != getattr(cfg, k)})
    if "task_set" in shown:
        shown["task_set"] = task_set_name(dims.tasks) + (f" + new: {', '.join(new_tasks)}" if new_tasks else "")
    if not shown:
        return new, ""
    size = f" (model size {preset})" if preset and "model_size" not in given else ""
    return new, (f"init-from: architecture from the checkpoint{size}: "
                 + ", ".join(f"{k} {v}" for k, v in shown.items()))


def init_weights(model: WorldModel, path: str | Path, obs_shape: tuple[int, ...], action_dim: int, task: str) -> str:
    """Load a checkpoint's model weights (online and target heads) into `model`, whose architecture must
    be the checkpoint's; optimisers start fresh. Returns a line saying what was loaded."""
    ck = read_checkpoint(path)
    check_dims_match(ck.dims, obs_shape, action_dim, task, str(path))
    ours, theirs = _architecture(model.dims), _architecture(ck.dims)
    old = len(ck.dims.tasks)
    extends = ck.dims.multitask and model.dims.tasks[:old] == ck.dims.tasks
    if extends:  # new tasks appended: their embedding rows and masks stay as the model made them
        for k in ("tasks", "action_dims"):
            ours[k] = ours[k][:old]
    if ours != theirs:
        diffs = [f"{k}: checkpoint {theirs[k]}, config {ours.get(k)}" for k in theirs if theirs[k] != ours.get(k)]
        raise CheckpointError(f"{path}: architecture differs from this config ({', '.join(diffs[:4])}); drop "
                              f"those flags and --init-from takes the checkpoint's architecture")
    state = dict(ck.state["model"])
    if extends and len(model.dims.tasks) > old:
        own = model.state_dict()
        for key in ("_task_emb.weight", "_action_masks"):
            state[key] = torch.cat([state[key], own[key][old:]])
    load_state_strict(model, state, str(path))
    origin = "an imported reference TD-MPC2 checkpoint" if ck.imported else "a tdmpc checkpoint"
    added = f" (new embedding rows for {', '.join(model.dims.tasks[old:])})" if len(model.dims.tasks) > old else ""
    return f"initialised weights from {origin}: {path}{added}"


def _architecture(dims: ModelDims) -> dict:
    """The fields of ModelDims that fix the networks (dropout is a training setting; the pixel
    encoder has no enc_dim/num_enc_layers, the state encoder no num_channels)."""
    unused = {"dropout"} | ({"enc_dim", "num_enc_layers"} if dims.pixels else {"num_channels"})
    return {k: v for k, v in dims.to_dict().items() if k not in unused}
