"""Which tasks a run trains on, and a multi-task model's task set.

A run trains one multi-task model when its task names several tasks (`--task mt30`,
`--task walker-walk,cheetah-run`) or when the model has a task set (`task_set`, taken from a
multi-task checkpoint by --init-from: the fine-tuned tasks are then a subset of it, or are
appended to it as new embedding rows). Every task of the set needs its own obs and action dims
(for the action masks) and its episode length (for its discount): the reference's sets know
them; other tasks are built once to read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tdmpc.config import Config
from tdmpc.errors import ConfigError, TaskError
from tdmpc.tasks.sets import TaskInfo, expand, reference_info

if TYPE_CHECKING:
    from tdmpc.envs import EnvSpec


@dataclass(frozen=True)
class TaskSetup:
    """A multi-task run: the tasks trained on, the model's task set, and each set task's dims."""

    tasks: tuple[str, ...]  # trained on, each in task_set
    task_set: tuple[str, ...]  # the model's embedding rows, in id order
    infos: tuple[TaskInfo, ...]  # per task of the set
    action_repeat: int

    @property
    def obs_dim(self) -> int:
        return max(i.obs_dim for i in self.infos)

    @property
    def action_dim(self) -> int:
        return max(i.action_dim for i in self.infos)

    @property
    def obs_dims(self) -> tuple[int, ...]:
        return tuple(i.obs_dim for i in self.infos)

    @property
    def action_dims(self) -> tuple[int, ...]:
        return tuple(i.action_dim for i in self.infos)

    def action_masks(self, env_tasks: np.ndarray) -> np.ndarray:
        """(envs, action_dim) ones on each env's own action dims: random seed actions are zero past them, as
        the policy's and the planner's are."""
        return (np.arange(self.action_dim) < np.array(self.action_dims)[env_tasks][:, None]).astype(np.float32)

    @property
    def episode_lengths(self) -> tuple[int, ...]:
        return tuple(i.episode_length for i in self.infos)

    def ids(self, names: tuple[str, ...] | None = None) -> np.ndarray:
        """Task ids (indices in the set) of `names` (default: the tasks trained on)."""
        return np.array([self.task_set.index(t) for t in (names or self.tasks)], dtype=np.int64)

    def env_tasks(self, envs_per_task: int) -> np.ndarray:
        """The task id of each env of make_task_envs(tasks, envs_per_task): task-major."""
        return np.repeat(self.ids(), envs_per_task)

    def spec(self, cfg: Config) -> EnvSpec:
        """What the model is built for: obs and actions padded over the task set; no terminations (as the
        reference's multi-task models)."""
        from tdmpc.envs import EnvSpec

        return EnvSpec(task=cfg.task, obs_shape=(self.obs_dim,), action_dim=self.action_dim,
                       episode_length=max(self.episode_lengths), action_repeat=self.action_repeat, episodic=False)


def task_setup(cfg: Config) -> TaskSetup | None:
    """The run's multi-task setup, or None for a single-task model."""
    tasks = expand(cfg.task)
    if not tasks:
        raise ConfigError(f"config field 'task' = {cfg.task!r}: name a task")
    if len(tasks) == 1 and not cfg.task_set:
        return None
    if len(set(tasks)) != len(tasks):
        raise ConfigError(f"config field 'task' = {cfg.task!r}: names a task twice")
    task_set = cfg.task_set or tasks
    missing = [t for t in tasks if t not in task_set]
    if missing:
        raise ConfigError(f"task {missing[0]!r} is not in the model's task set ({len(task_set)} tasks); --init-from "
                          f"adds the tasks it does not have as new embedding rows")
    if cfg.obs != "state":
        raise ConfigError("config field 'obs': multi-task models take state observations (as the reference's)")
    if cfg.episodic:
        raise ConfigError("config field 'episodic': multi-task models are for tasks without terminations (as the "
                          "reference's); train episodic tasks one at a time")
    infos = tuple(_info(t, cfg.action_repeat) for t in task_set)
    repeats = {_repeat(t, cfg.action_repeat) for t in tasks}
    if len(repeats) > 1:
        raise ConfigError(f"config field 'action_repeat' = None: the tasks {', '.join(tasks)} have different default "
                          f"action repeats ({', '.join(map(str, sorted(repeats)))}); set one for all")
    return TaskSetup(tuple(tasks), tuple(task_set), infos, repeats.pop())


def _repeat(task: str, action_repeat: int | None) -> int:
    from tdmpc.envs.names import resolve_task

    return action_repeat or resolve_task(task).default_action_repeat


def _info(task: str, action_repeat: int | None) -> TaskInfo:
    """A task's own dims and episode length: the reference sets' table (with their action repeat), else
    read off the built env."""
    known = reference_info(task)
    if known is not None and action_repeat in (None, 2):
        return known
    from tdmpc.envs import make_env  # builds envs: only for tasks outside the reference sets

    env, spec = make_env(task, action_repeat=action_repeat)
    env.close()
    if spec.discrete:  # said here, where --dry-run asks too, not first when the training envs are built
        raise TaskError(f"task {task!r} has discrete actions; multi-task models are for continuous ones")
    return TaskInfo(task, spec.obs_shape[0], spec.action_dim, spec.episode_length, spec.episodic)
