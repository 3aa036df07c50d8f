"""What a resume may change in its run's config, and what it may not (its files are made for it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tdmpc.config import SIZE_FIELDS, Config, NetworkSettings, changed_fields
from tdmpc.envs.names import CUSTOM_PREFIX
from tdmpc.errors import BadInput
from tdmpc.runtime.args import named
from tdmpc.training.run_dir import checkpoint_path


# What a resumed run cannot change: the replay buffer's layout and the networks' shapes, which its files hold.
FIXED_ON_RESUME = ("task", "obs", "num_envs", "buffer_size", "horizon", "action_repeat", "episodic", "model_size",
                   *SIZE_FIELDS, *(f.name for f in dataclasses.fields(NetworkSettings) if f.name != "dropout"),
                   "task_set", "task_dim")


BUFFER_LAYOUT = ("num_envs", "buffer_size", "horizon")


def resume_changes(base: Config, cfg: Config, resume: Path, from_python: bool = False,
                   flag: str = "--resume") -> dict[str, tuple[Any, Any]]:
    """What a resume changes in its run's config (`base`), once what it may not change is refused (before
    anything in the run directory is touched); from_python: said with fit()'s keywords, else with `flag`, the
    command's flag that resumes."""
    on_resume = "resume=True" if from_python else flag
    init_from = named("init_from", str(checkpoint_path(resume)), from_python)
    if bool(base.dataset) != bool(cfg.dataset):
        was, now = ("offline", "online") if base.dataset else ("online", "offline")
        unit = "updates" if base.dataset else "env steps"
        raise BadInput(f"{named('dataset', None, from_python)} cannot turn an {was} run {now} on {on_resume} (its "
                       f"steps count {unit}); start a new run with {init_from} instead")
    changed = changed_fields(dataclasses.replace(base, run_dir=cfg.run_dir), cfg)
    old_sizes, new_sizes = base.sizes(), cfg.sizes()
    for name in set(SIZE_FIELDS) & set(changed):  # a size is what the preset makes it, not its field's None
        if old_sizes[name] == new_sizes[name]:
            del changed[name]  # the run's own value, given explicitly
        else:
            changed[name] = (old_sizes[name], new_sizes[name])
    for name in FIXED_ON_RESUME:
        # an env object's run names no task that rebuilds it: its registered id may (the checkpoint checks dims)
        rebuilt = name == "task" and str(base.task).startswith(CUSTOM_PREFIX)
        if name in changed and not rebuilt:
            why = "its replay buffer is laid out for it" if name in BUFFER_LAYOUT else "its checkpoint is made for it"
            keep = f"; to keep its weights, start a new run with {init_from}" if name in BUFFER_LAYOUT else ""
            raise BadInput(f"{named(name, None, from_python)} cannot change on {on_resume}: this run has "
                           f"{changed[name][0]!r} ({why}){keep}")
    return changed
