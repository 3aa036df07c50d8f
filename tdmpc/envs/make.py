"""make_env / make_vector_env: one task name in, a wrapped env and its EnvSpec out."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import FlattenObservation, TimeLimit, TransformObservation

from tdmpc.envs.tasks import Task, TaskError, resolve_task
from tdmpc.envs.wrappers import ActionRepeat, PixelObservation, SeedAndRNGState, UnitActions

OBS_TYPES = ("state", "rgb")


@dataclass(frozen=True)
class EnvSpec:
    """What the agent needs to know about a task, with action repeat already applied."""

    task: str
    obs_shape: tuple[int, ...]  # (obs_dim,) for obs="state"; (3*frame_stack, 64, 64) uint8 for obs="rgb"
    action_dim: int
    episode_length: int  # agent steps per episode, after action repeat (DMC: 500)
    action_repeat: int  # DMC default 2, gymnasium tasks default 1
    episodic: bool  # whether the task can truly terminate (trains a termination head)


def make_env(
    task: str,
    *,
    seed: int | None = None,
    obs: str = "state",
    action_repeat: int | None = None,
    render_size: tuple[int, int] = (240, 320),
) -> tuple[gym.Env, EnvSpec]:
    """Build one environment for ``task`` (a DMC ``domain-task`` or a gymnasium id).

    Actions are float32 in [-1, 1]^A; observations float32 vectors (``obs="state"``) or
    stacked uint8 frames (``obs="rgb"``, DMC only). Each episode truncates after
    ``spec.episode_length`` agent steps; ``terminated`` only marks true terminal states.
    ``seed`` takes effect at the first ``reset()``; ``render()`` returns an RGB uint8
    array of ``render_size`` (height, width) where the task supports it.

    Bad input raises one-line errors: UnknownTaskError and ValueError (bad options) before
    anything is built, ImportError for a DMC task without dm_control, ValueError for a
    task whose action space is not a continuous Box (known only once built).
    """
    resolved, repeat = _check(task, obs, action_repeat)
    env = _build(resolved, seed, obs, repeat, render_size)
    return env, _spec(resolved, env.observation_space, env.action_space, repeat)


def make_vector_env(
    task: str,
    num_envs: int,
    *,
    seed: int,
    obs: str = "state",
    action_repeat: int | None = None,
    asynchronous: bool = False,
) -> tuple[gym.vector.VectorEnv, EnvSpec]:
    """``num_envs`` copies of ``make_env(task)``; sub-env i is seeded with ``seed + i``.

    Sub-envs reset themselves in the step that ends their episode (``AutoresetMode.SAME_STEP``),
    so ``step()`` already returns the first observation of the next episode. For the ended
    ones, gymnasium 1.4 puts in ``infos``:

    - ``infos["final_obs"]``: object array (num_envs,), the last observation of sub-env i
      at the indices where ``infos["_final_obs"]`` (bool mask) is True, None elsewhere;
    - ``infos["final_info"]``: the ended episodes' step infos, batched the same way (each key
      with its own ``_key`` mask), and ``infos["_final_info"]``: the mask of ended sub-envs.

    ``terminated`` / ``truncated`` (returned by step) tell a true end from a time limit.
    ``asynchronous=True`` runs each sub-env in its own process (AsyncVectorEnv); a user env
    must then be named ``module:EnvName-v0`` so that those processes can import it.
    """
    resolved, repeat = _check(task, obs, action_repeat)
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    env_fns = [functools.partial(_build, resolved, seed + i, obs, repeat, (240, 320)) for i in range(num_envs)]
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    if asynchronous:
        # Workers start from a fresh forkserver process, not from a fork of this one: a forked
        # EGL context (after any render here) hangs them, and forked torch threads can too.
        envs = gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset, context="forkserver")
    else:
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset)
    envs.action_space.seed(seed)
    return envs, _spec(resolved, envs.single_observation_space, envs.single_action_space, repeat)


def env_rng_state(envs: gym.vector.VectorEnv) -> list[dict[str, Any]]:
    """Every sub-env's RNG state as plain data (safe for ``torch.load(weights_only=True)``)."""
    return list(envs.get_attr("rng_state"))


def set_env_rng_state(envs: gym.vector.VectorEnv, states: list[dict[str, Any]]) -> None:
    """Restore what :func:`env_rng_state` returned: the next ``reset()`` draws the same initial states."""
    envs.set_attr("rng_state", list(states))


def _check(task: str, obs: str, action_repeat: int | None) -> tuple[Task, int]:
    """Validate everything that can be checked from names alone, before building anything."""
    resolved = resolve_task(task)
    if obs not in OBS_TYPES:
        raise ValueError(f"obs must be one of {OBS_TYPES}, got {obs!r}")
    if obs == "rgb" and resolved.dmc is None:
        raise TaskError(f"obs='rgb' is supported for DMC tasks only; use obs='state' for {task!r}")
    repeat = resolved.default_action_repeat if action_repeat is None else action_repeat
    if repeat < 1:
        raise ValueError(f"action_repeat must be at least 1, got {repeat}")
    return resolved, repeat


def _build(task: Task, seed: int | None, obs: str, repeat: int, render_size: tuple[int, int]) -> gym.Env:
    env = _dmc_env(task, seed, render_size) if task.dmc else _gym_env(task, render_size)
    problem = _action_space_problem(task.name, env.action_space)
    if problem:
        env.close()
        raise TaskError(problem)
    env = UnitActions(env)
    if repeat > 1:
        env = ActionRepeat(env, repeat)
    # In agent steps, so that every episode is exactly episode_length long even when the
    # repeat does not divide the env's own limit.
    env = TimeLimit(env, task.env_steps // repeat)
    if obs == "rgb":
        env = PixelObservation(env)
    env = SeedAndRNGState(env, seed)
    env.action_space.seed(seed)
    return env


def _dmc_env(task: Task, seed: int | None, render_size: tuple[int, int]) -> gym.Env:
    from tdmpc.envs.dmcontrol import DMControlEnv  # dm_control is an optional extra

    return DMControlEnv(*task.dmc, seed=seed, render_size=render_size)


def _gym_env(task: Task, render_size: tuple[int, int]) -> gym.Env:
    env = _make_rendering(task.name, *render_size)
    space = env.observation_space
    if not (isinstance(space, spaces.Box) and len(space.shape) == 1):
        env = FlattenObservation(env)  # Dict, Tuple, images as state...
    space = env.observation_space
    if space.dtype != np.float32:  # e.g. MuJoCo's float64; DtypeObservation would warn about the bounds
        float32_space = spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)
        env = TransformObservation(env, functools.partial(np.asarray, dtype=np.float32), float32_space)
    return env


def _make_rendering(env_id: str, height: int, width: int) -> gym.Env:
    """gymnasium.make with rgb_array rendering at (height, width), as far as the env's constructor allows."""
    try:
        return gym.make(env_id, render_mode="rgb_array", width=width, height=height)
    except TypeError:  # no render size (e.g. classic control)
        pass
    try:
        return gym.make(env_id, render_mode="rgb_array")
    except TypeError:  # no rendering at all
        return gym.make(env_id)


def _action_space_problem(task: str, space: gym.Space) -> str | None:
    """Why the agent cannot act in ``space`` (a one-line message), or None if it can."""
    if not isinstance(space, spaces.Box):
        return f"task {task!r} has a {type(space).__name__} action space; only continuous (Box) actions are supported"
    if len(space.shape) != 1 or not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        return f"task {task!r} needs a 1-D action Box with finite bounds, got {space}"
    return None


def _spec(task: Task, obs_space: gym.Space, action_space: gym.Space, repeat: int) -> EnvSpec:
    return EnvSpec(
        task=task.name,
        obs_shape=tuple(obs_space.shape),
        action_dim=int(action_space.shape[0]),
        episode_length=task.env_steps // repeat,
        action_repeat=repeat,
        episodic=task.episodic,
    )
