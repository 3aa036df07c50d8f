"""DeepMind Control tasks as gymnasium environments (needs the ``[dmc]`` extra).

The suite's tasks and the reference TD-MPC2's custom ones (:mod:`tdmpc.envs.dmc_custom`) share one
namespace, one name parser and one env class; only how a task is built differs.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tdmpc.envs.gl import import_suite

suite = import_suite()  # first: dm_control's renderer is chosen by its first import

from dm_control.rl import control  # noqa: E402

from tdmpc.envs import dmc_custom  # noqa: E402



class _DropSettotalmassWarning(logging.Filter):
    """MuJoCo >= 3.3 warns, through dm_control's absl logger, each time the suite's own XML (cheetah's, ...)
    compiles with the deprecated 'settotalmass': a line per env made, every evaluation, that the user cannot act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "'settotalmass' is deprecated" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropSettotalmassWarning())

# Reference TD-MPC2 names -> dm_control domain names.
DOMAIN_ALIASES = {"cup": "ball_in_cup", "pointmass": "point_mass"}
_SHORT_NAMES = {domain: alias for alias, domain in DOMAIN_ALIASES.items()}
ALL_TASKS = (*suite.ALL_TASKS, *dmc_custom.TASKS)  # (domain, task) in dm_control naming


def parse_task(name: str) -> tuple[str, str] | None:
    """``"cup-catch"`` -> ``("ball_in_cup", "catch")``; None if neither the suite nor dmc_custom has it.

    Everything after the first ``-`` is the task, so ``finger-turn-easy`` and
    ``finger-turn_easy`` both mean dm_control's ``finger`` / ``turn_easy``.
    """
    domain, _, task = name.partition("-")
    domain_task = (DOMAIN_ALIASES.get(domain, domain), task.replace("-", "_"))
    return domain_task if domain_task in ALL_TASKS else None


def task_names() -> list[str]:
    """Every task in reference naming (``cup-catch``, ``finger-turn-easy``, ``cup-spin``), for suggestions."""
    return [f"{_SHORT_NAMES.get(d, d)}-{t.replace('_', '-')}" for d, t in ALL_TASKS]


def load(domain: str, task: str, seed: int | None) -> control.Environment:
    """The dm_control environment of ``(domain, task)``, a suite task or a custom one, seeded with ``seed``."""
    custom = dmc_custom.TASKS.get((domain, task))
    if custom is not None:
        return custom(random=seed)
    return suite.load(domain, task, task_kwargs={"random": seed}, visualize_reward=False)


class DMControlEnv(gym.Env[np.ndarray, np.ndarray]):
    """One DMC task, step for step: no action repeat, the task's own action bounds.

    Observations are the observation dict flattened into one float32 vector, in dict
    order. dm_control ends an episode with discount 0 at a true terminal state and
    discount 1 at its time limit; those become ``terminated`` and ``truncated``.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, domain: str, task: str, *, seed: int | None = None, render_size: tuple[int, int] = (240, 320)):
        self._env = load(domain, task, seed)
        self.render_mode = "rgb_array"
        self.render_size = render_size
        self.camera_id = 2 if domain == "quadruped" else 0  # camera 0 of quadruped is too far away
        self.metadata = {**self.metadata, "render_fps": round(1.0 / self._env.control_timestep())}
        action = self._env.action_spec()
        self.action_space = spaces.Box(action.minimum.astype(np.float32), action.maximum.astype(np.float32))
        obs_dim = sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)

    @property
    def task_random(self) -> np.random.RandomState:
        """The task's own RNG, which draws every initial state (part of the env's RNG state)."""
        return self._env.task.random

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.task_random.seed(seed)
        return self._flatten(self._env.reset().observation), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        step = self._env.step(action)
        terminated = step.last() and step.discount == 0.0
        truncated = step.last() and not terminated
        return self._flatten(step.observation), float(step.reward), bool(terminated), bool(truncated), {}

    def render(self) -> np.ndarray:
        return self.render_frame(*self.render_size)

    def render_frame(self, height: int, width: int) -> np.ndarray:
        """An RGB uint8 (height, width, 3) image of the current state."""
        return self._env.physics.render(height, width, camera_id=self.camera_id)

    def close(self) -> None:
        """Also frees the physics' rendering contexts now: left to the garbage collector at exit, OSMesa's ask a
        render thread that is gone by then, and dm_control prints a traceback per context."""
        self._env.close()
        self._env.physics.free()

    @staticmethod
    def _flatten(observation: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(v, dtype=np.float32).ravel() for v in observation.values()])
