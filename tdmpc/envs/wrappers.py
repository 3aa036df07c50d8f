"""The wrappers gymnasium does not have: action repeat, and seeding with a picklable RNG state.

make_env uses gymnasium's own wrappers for everything else (TransformAction, TimeLimit,
AddRenderObservation, FrameStackObservation, ...). Each records its constructor arguments
(RecordConstructorArgs), so ``env.spec`` of a wrapped gymnasium task can rebuild it with
``gymnasium.make(env.spec)``, as gymnasium's checker does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from tdmpc.envs.dmcontrol import DMControlEnv


class ActionRepeat(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Apply each action ``repeat`` times, summing the rewards (reference protocol: 2 on DMC).

    Fewer decisions per environment step means fewer planner calls. The repeat stops early
    when the episode ends; ``success`` (Meta-World style) is true if any repeated step had it.
    """

    def __init__(self, env: gym.Env, repeat: int):
        gym.utils.RecordConstructorArgs.__init__(self, repeat=repeat)
        super().__init__(env)
        self.repeat = repeat

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        total, success = 0.0, False
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            success = success or bool(info.get("success", False))
            if terminated or truncated:
                break
        if "success" in info:
            info = {**info, "success": success}
        return obs, total, terminated, truncated, info


class SeedAndRNGState(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Outermost wrapper: seeds the first reset, and exposes the RNG state as plain data.

    ``rng_state`` holds everything the next reset() draws from: the seed still waiting for
    the first reset, the env's gymnasium ``np_random`` and, for DMC, the task's
    ``random``. It is dicts, lists, ints, floats and strs only, so it survives
    ``torch.load(weights_only=True)``; assigning it back makes a resumed run draw the
    same initial states.
    """

    def __init__(self, env: gym.Env, seed: int | None):
        gym.utils.RecordConstructorArgs.__init__(self, seed=seed)
        super().__init__(env)
        self._pending_seed = seed  # applied at the first reset, the gymnasium way of seeding

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        seed = self._pending_seed if seed is None else seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)

    @property
    def rng_state(self) -> dict[str, Any]:
        state = {"pending_seed": self._pending_seed, "np_random": _plain(self.np_random.bit_generator.state)}
        task_random = getattr(self.unwrapped, "task_random", None)  # DMC only
        if task_random is not None:
            state["task_random"] = _plain(task_random.get_state(legacy=False))
        return state

    @rng_state.setter
    def rng_state(self, state: dict[str, Any]) -> None:
        self._pending_seed = state["pending_seed"]
        self.np_random.bit_generator.state = state["np_random"]
        if "task_random" in state:
            cast("DMControlEnv", self.unwrapped).task_random.set_state(state["task_random"])  # DMC only


def _plain(value: Any) -> Any:
    """A numpy RNG state with its arrays and numpy scalars turned into lists and Python numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
