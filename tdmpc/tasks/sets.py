"""The reference TD-MPC2's multi-task task sets, mt30 and mt80: names in id order, and each task's dims.

A task's id is its index in the set (reference common/__init__.py). The dims are what the
reference reads off its envs (envs/__init__.py): each task's own obs and action dims, and its
episode length in agent steps (DMC 500 with action repeat 2, Meta-World 100). The set's model
takes obs zero-padded to the largest obs dim and actions padded to the largest action dim.
Meta-World's envs are not available here; its dims come from its source (39 / 4 / 100).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tdmpc.errors import BadInput

# task -> (obs dim, action dim), read off the reference's own mt30 checkpoint metadata
DMC30: dict[str, tuple[int, int]] = {
    "walker-stand": (24, 6), "walker-walk": (24, 6), "walker-run": (24, 6), "cheetah-run": (17, 6),
    "reacher-easy": (6, 2), "reacher-hard": (6, 2), "acrobot-swingup": (6, 1), "pendulum-swingup": (3, 1),
    "cartpole-balance": (5, 1), "cartpole-balance-sparse": (5, 1), "cartpole-swingup": (5, 1),
    "cartpole-swingup-sparse": (5, 1), "cup-catch": (8, 2), "finger-spin": (9, 2), "finger-turn-easy": (12, 2),
    "finger-turn-hard": (12, 2), "fish-swim": (24, 5), "hopper-stand": (15, 4), "hopper-hop": (15, 4),
    # the 11 custom tasks (tdmpc.envs.dmc_custom)
    "walker-walk-backwards": (24, 6), "walker-run-backwards": (24, 6), "cheetah-run-backwards": (17, 6),
    "cheetah-run-front": (17, 6), "cheetah-run-back": (17, 6), "cheetah-jump": (17, 6),
    "hopper-hop-backwards": (15, 4), "reacher-three-easy": (8, 3), "reacher-three-hard": (8, 3),
    "cup-spin": (8, 2), "pendulum-spin": (3, 1),
}
METAWORLD50 = tuple("mw-" + t for t in (
    "assembly basketball button-press-topdown button-press-topdown-wall button-press button-press-wall "
    "coffee-button coffee-pull coffee-push dial-turn disassemble door-open door-close drawer-close drawer-open "
    "faucet-open faucet-close hammer handle-press-side handle-press handle-pull-side handle-pull lever-pull "
    "peg-insert-side peg-unplug-side pick-out-of-hole pick-place pick-place-wall plate-slide plate-slide-side "
    "plate-slide-back plate-slide-back-side push-back push push-wall reach reach-wall shelf-place soccer "
    "stick-push stick-pull sweep-into sweep window-open window-close bin-picking box-close door-lock "
    "door-unlock hand-insert").split())
METAWORLD_DIMS = (39, 4)
DMC_EPISODE, METAWORLD_EPISODE = 500, 100  # agent steps

TASK_SETS: dict[str, tuple[str, ...]] = {"mt30": tuple(DMC30), "mt80": tuple(DMC30) + METAWORLD50}



@dataclass(frozen=True)
class TaskInfo:
    """One task of a set: its own dims (before padding) and episode length in agent steps."""

    name: str
    obs_dim: int
    action_dim: int
    episode_length: int
    episodic: bool = False  # it can terminate (the reference sets' tasks do not)


def reference_info(name: str) -> TaskInfo | None:
    """A task of the reference sets, or None."""
    if name in DMC30:
        return TaskInfo(name, *DMC30[name], DMC_EPISODE)
    if name in METAWORLD50:
        return TaskInfo(name, *METAWORLD_DIMS, METAWORLD_EPISODE)
    return None


def task_set_name(tasks: tuple[str, ...] | list[str]) -> str:
    """'mt30' / 'mt80' for a reference set, else the names (shortened), for messages."""
    for name, names in TASK_SETS.items():
        if tuple(tasks) == names:
            return f"{name}: {', '.join(names[:3])}, ... ({len(names)} tasks)"
    shown = ", ".join(tasks[:6]) + (", ..." if len(tasks) > 6 else "")
    return f"{shown} ({len(tasks)} tasks)"


def chosen_task(tasks: tuple[str, ...], task: str | None, model: object, verb: str) -> str:
    """The one task a multi-task model (of `tasks`) is to play: `task` when it names one task, not a list or a set;
    else a one-line BadInput naming the set (whether the set holds it is Agent.task_ids' to say)."""
    if task is None or "," in task or task in TASK_SETS:
        many = "" if task is None else f", and --task {task} names {len(expand(task))} tasks"
        raise BadInput(f"{model} is a multi-task model{many}: choose the one task to {verb} with --task, one of "
                       f"{task_set_name(tasks)}")
    return task


_VERSIONED = re.compile(r"-v\d+$")


def gymnasium_form(name: str) -> bool:
    """Whether a task name has a gymnasium id's form (``Pendulum-v1``, ``my_module:MyEnv-v0``): a DMC name is
    ``domain-task`` with no version. Known from the name alone, before any simulator is imported."""
    return ":" in name or bool(_VERSIONED.search(name))


def expand(task: str) -> tuple[str, ...]:
    """A task field's tasks: 'mt30' / 'mt80', or names separated by commas; one name is one task."""
    if task in TASK_SETS:
        return TASK_SETS[task]
    return tuple(t.strip() for t in task.split(",") if t.strip())
