"""--init-from: a run starts from a checkpoint's weights (ours or a reference TD-MPC2 one).

The architecture fields the user did not set come from the checkpoint, so a released model fine-tunes
without spelling out its sizes; a multi-task model gets new embedding rows for tasks it was not trained on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tdmpc.config import MODEL_SIZES, SIZE_FIELDS, Config, validate
from tdmpc.errors import CheckpointError
from tdmpc.model.checkpoint import (LoadedCheckpoint, check_dims_match, checkpoint_path, is_reference, load_file,
                                    load_state_strict, read_checkpoint, reference_task_count)
from tdmpc.model.world_model import ModelDims, WorldModel
from tdmpc.tasks.sets import expand, task_set_name


def architecture_from_checkpoint(cfg: Config, path: str | Path, given: set[str],
                                 from_python: bool = False) -> tuple[Config, str]:
    """The architecture fields the user did not give (`given`: the fields set on the command line) come
    from the checkpoint, so a released model fine-tunes without spelling out its sizes. Sizes that were
    given and contradict the checkpoint are refused here ('architecture differs'), before anything is built.

    Returns the config and a note saying what was taken (printed once the weights have loaded)."""
    dims = read_init(path, cfg.task_set if "task_set" in given else (), mmap=True).dims  # shapes: tensors stay on disk
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
    new = validate(dataclasses.replace(cfg, **{**take, **sizes, "model_size": model_size}), from_python)
    unused = {"task_set", "episodic"} | ({"enc_dim", "num_enc_layers"} if dims.pixels else {"num_channels"})
    diffs = [f"{k}: checkpoint {v}, config {getattr(new, k)}" for k, v in theirs.items()
             if k in given and k not in unused and getattr(new, k) != v]
    if diffs:  # the run would refuse the weights: said now, --dry-run included
        raise _architecture_differs(path, diffs, from_python)
    shown = {k: take[k] for k in (*SIZE_FIELDS, "episodic") if k in take}
    shown.update({k: v for k, v in take.items() if k not in shown and v != getattr(cfg, k)})
    if "task_set" in shown:
        shown["task_set"] = task_set_name(dims.tasks) + (f" + new: {', '.join(new_tasks)}" if new_tasks else "")
    if not shown:
        return new, ""
    size = f" (model size {preset})" if preset and "model_size" not in given else ""
    return new, (f"init-from: architecture from the checkpoint{size}: "
                 + ", ".join(f"{k} {v}" for k, v in shown.items()))


def read_init(path: str | Path, task_set: tuple[str, ...], mmap: bool = False) -> LoadedCheckpoint:
    """The checkpoint --init-from names. A reference multi-task file names no tasks: the first n of the run's
    `task_set` (--task-set) are its n (needed unless it has mt30's or mt80's count), the rest new rows."""
    obj = load_file(checkpoint_path(path), mmap=True)
    count = reference_task_count(obj) if is_reference(obj) else 0
    return read_checkpoint(path, {"task_set": task_set[:count]} if task_set and count else None, mmap=mmap)


def init_weights(model: WorldModel, path: str | Path, obs_shape: tuple[int, ...], action_dim: int, discrete: bool,
                 task: str, task_set: tuple[str, ...] = ()) -> str:
    """Load a checkpoint's model weights (online and target heads) into `model`, whose architecture must
    be the checkpoint's; optimisers start fresh. Returns a line saying what was loaded."""
    ck = read_init(path, task_set)
    check_dims_match(ck.dims, obs_shape, action_dim, discrete, task, str(path))
    ours, theirs = _architecture(model.dims), _architecture(ck.dims)
    old = len(ck.dims.tasks)
    extends = ck.dims.multitask and model.dims.tasks[:old] == ck.dims.tasks
    if extends:  # new tasks appended: their embedding rows and masks stay as the model made them
        for k in ("tasks", "action_dims"):
            ours[k] = ours[k][:old]
    if ours != theirs:
        diffs = [f"{k}: checkpoint {theirs[k]}, config {ours.get(k)}" for k in theirs if theirs[k] != ours.get(k)]
        raise _architecture_differs(path, diffs)
    state = dict(ck.state["model"])
    if extends and len(model.dims.tasks) > old:
        own = model.state_dict()
        for key in ("_task_emb.weight", "_action_masks"):
            state[key] = torch.cat([state[key], own[key][old:]])
    load_state_strict(model, state, str(path))
    origin = "an imported reference TD-MPC2 checkpoint" if ck.imported else "a tdmpc checkpoint"
    added = f" (new embedding rows for {', '.join(model.dims.tasks[old:])})" if len(model.dims.tasks) > old else ""
    return f"initialised weights from {origin}: {path}{added}"


def _architecture_differs(path: str | Path, diffs: list[str], from_python: bool = False) -> CheckpointError:
    what = "keywords and init_from" if from_python else "flags and --init-from"
    return CheckpointError(f"{path}: architecture differs from this config ({', '.join(diffs[:4])}); drop those "
                           f"{what} takes the checkpoint's architecture")


def _architecture(dims: ModelDims) -> dict:
    """The fields of ModelDims that fix the networks (dropout is a training setting; the pixel
    encoder has no enc_dim/num_enc_layers, the state encoder no num_channels)."""
    unused = {"dropout"} | ({"enc_dim", "num_enc_layers"} if dims.pixels else {"num_channels"})
    return {k: v for k, v in dims.to_dict().items() if k not in unused}
