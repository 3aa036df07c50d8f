"""Reference TD-MPC2 checkpoints: their state-dict layouts mapped onto our WorldModel's names.

Every size is inferred from tensor shapes, and every key and shape is checked against the layout those
sizes imply, so a damaged or foreign file fails with one line in the reference's own key names.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from tdmpc.config import Config
from tdmpc.errors import CheckpointError
from tdmpc.model.world_model import ModelDims
from tdmpc.tasks.sets import TASK_SETS, reference_info, task_set_name

REFERENCE_MODULES = ("_encoder.", "_dynamics.", "_reward.", "_termination.", "_pi.", "_Qs.", "_target_Qs",
                      "_detach_Qs", "_task_emb.", "_action_masks")


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


def reference_key(key: str) -> str:
    """A reference state-dict (or parameter) name in our model's names."""
    for old, new in (("_encoder.state.", "_encoder."), ("_encoder.rgb.", "_encoder."), ("_Qs.params.", "_Qs."),
                     ("_target_Qs_params.", "_target_Qs.")):
        if key.startswith(old):
            return new + key[len(old):]
    return key


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
    ours = {reference_key(key): value for key, value in sd.items()
            if not key.startswith("_detach_Qs_params.")}  # an alias of _Qs in the reference
    if not any(k.startswith("_target_Qs.") for k in ours):  # early releases: targets = online
        ours.update({k.replace("_Qs.", "_target_Qs.", 1): v.clone() for k, v in ours.items() if k.startswith("_Qs.")})
    return dims, ours


