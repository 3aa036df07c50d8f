"""Numpy vector envs seen as tensor envs: one lockstep step form (TensorStep) for the trainer and the evaluation.

HostVectorEnv wraps the gymnasium vector env make_envs builds (sub-envs reset in the step that ends their
episode, AutoresetMode.SAME_STEP) and gives TensorVectorEnv's interface: actions in as tensors (read back once,
the only host wait of a step on a GPU), each step out as a TensorStep of CPU tensors marked `on_host`, which the
replay buffer sends to its device in one copy. Every row is a transition; an ended episode's row holds its final
observation in `next_obs` and the next episode's first in `obs`.

NaN or inf costs nothing to find on host data, so it is handled here, at its source: `on_nonfinite` (the trainer's,
or an error naming the env by default) raises, or the row is marked not finite and its env reset (a new episode
starts there). A reset's observation is checked too, and the env reset again, a few times at most.
"""

from __future__ import annotations

from typing import Any, Callable, Union, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from tdmpc.envs.make import VectorEnvs, env_rng_state, set_env_rng_state
from tdmpc.envs.tensor import TensorStep, TensorVectorEnv
from tdmpc.errors import NonFiniteData

# on_nonfinite(env, what, remedy, done): NaN or inf in `what` of env `env`; raise, or note that it was `done`
NonFiniteHandler = Callable[[int, str, str, str], None]


class HostVectorEnv:
    """A numpy vector env behind TensorVectorEnv's interface (module docstring)."""

    on_host = True  # steps arrive as host data (the replay buffer sends them over in one copy)
    device = torch.device("cpu")

    def __init__(self, env: VectorEnvs, task: str, on_nonfinite: NonFiniteHandler | None = None,
                 reset_tries: int = 3):
        self.env, self.task, self.num_envs = env, task, env.num_envs
        self.discrete = isinstance(env.single_action_space, spaces.Discrete)
        self.on_nonfinite = on_nonfinite or self._raise
        self.reset_tries = reset_tries
        self.info: dict[str, Any] = {}  # the last step's info (evaluation reads success from it)

    def reset(self, seed: int | None = None) -> Tensor:
        """Every env's first observation (N, ...), checked."""
        obs, _ = self.env.reset(seed=seed)
        return _obs(self._checked_resets(np.arange(self.num_envs), obs))

    def step(self, action: Tensor) -> TensorStep:
        obs, reward, terminated, truncated, info = self.env.step(action.cpu().numpy())
        self.info = info
        started = terminated | truncated
        next_obs = obs
        if started.any():  # same-step autoreset: obs already holds the next episode's first observation
            next_obs = obs.copy()
            for e in np.flatnonzero(started):
                next_obs[e] = info["final_obs"][e]
        finite = np.isfinite(next_obs.reshape(self.num_envs, -1)).all(1) & np.isfinite(reward)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            self.on_nonfinite(i, "reward" if not np.isfinite(reward[i]) else "observation", "skip such transitions",
                              "dropped, and its episode restarts")
            fresh, _ = self.env.reset(options={"reset_mask": ~finite})
            obs = np.where(finite.reshape(-1, *[1] * (obs.ndim - 1)), obs, fresh)
            reward, terminated, truncated = np.where(finite, reward, 0.0), terminated & finite, truncated & finite
            started = started | ~finite
        if started.any():
            obs = obs.copy()
            obs[started] = self._checked_resets(np.flatnonzero(started), obs[started])
        term, trunc, transition, start, ok = (torch.from_numpy(np.asarray(x, dtype=bool)) for x in (
            terminated, truncated, np.ones(self.num_envs, dtype=bool), started, finite))
        return TensorStep(_obs(obs), _obs(next_obs), torch.from_numpy(np.asarray(reward, dtype=np.float32)), term,
                          trunc, transition, start, ok, on_host=True)

    def render(self) -> np.ndarray:
        """The first env's frame (the evaluation's video)."""
        return cast(np.ndarray, self.env.envs[0].render())  # type: ignore[union-attr]

    def rng_state(self) -> list[dict[str, Any]]:
        return env_rng_state(self.env)

    def set_rng_state(self, states: list[dict[str, Any]]) -> None:
        set_env_rng_state(self.env, states)

    def close(self) -> None:
        self.env.close()

    def _checked_resets(self, envs: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Reset observations of `envs`, NaN or inf in them reported (on_nonfinite) and those envs reset again, a
        few times at most."""
        for _ in range(self.reset_tries):
            bad = ~np.isfinite(first.reshape(len(first), -1)).all(1)
            if not bad.any():
                return first
            self.on_nonfinite(int(envs[np.flatnonzero(bad)[0]]), "observation from reset()", "reset such envs again",
                              "reset again")
            mask = np.zeros(self.num_envs, dtype=bool)
            mask[envs[bad]] = True
            fresh, _ = self.env.reset(options={"reset_mask": mask})
            first = first.copy()
            first[bad] = fresh[envs[bad]]
        raise NonFiniteData(f"env {int(envs[np.flatnonzero(bad)[0]])} returned non-finite observations at "
                            f"{self.reset_tries} resets in a row")

    def _raise(self, env: int, what: str, remedy: str, done: str) -> None:
        raise NonFiniteData(f"env {env} ({self.task}) returned a non-finite {what}; pass --nonfinite-data drop to "
                            f"{remedy}")


def _obs(x: np.ndarray) -> Tensor:
    """Observations as the agent takes them: float32, or uint8 pixels."""
    return torch.from_numpy(x if x.dtype == np.uint8 and x.ndim == 4 else x.astype(np.float32, copy=False))


LockstepEnv = Union[HostVectorEnv, TensorVectorEnv]  # what the trainer and the evaluation step
