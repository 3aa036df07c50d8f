"""Tensor-native vector envs: a GPU simulator's torch tensors as they come, one lockstep view for the trainer.

GPU-parallel simulators (ManiSkill3, MuJoCo Playground, Isaac Lab, gymnasium's JAX ``phys2d`` envs through
``JaxToTorch``) step all their envs at once and return tensors on their device. TensorVectorEnv takes such a
gymnasium VectorEnv as it is and gives every step in one form, whatever the env's autoreset mode, with no numpy
and no host sync on the way:

- actions go in as the agent makes them, on its device: in [-1, 1] (mapped onto the env's Box, in torch) or
  integers 0..n-1 (the Discrete space's start added);
- observations, rewards and flags come out as float32 / bool tensors on the agent's device (moved once per
  step when the env's is another), their shapes and dtypes checked on the host (metadata only: no sync);
- autoreset, as the env declares it in ``metadata["autoreset_mode"]`` (next-step when absent, as gymnasium
  assumes): with next-step, the step after an episode ends returns the reset observation and ignores its
  action; that row is marked as no transition. With same-step, the final observation comes from the info
  (gymnasium's ``final_obs`` or ManiSkill3's ``final_observation``, a tensor of all N envs).

So each step of N envs writes exactly one row per env: a transition, or the first observation of an episode.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from tdmpc.envs.make import EnvSpec
from tdmpc.envs.names import DEFAULT_EPISODE_STEPS, custom_task_name, resolve_task
from tdmpc.errors import TaskError

__all__ = ["TensorStep", "TensorVectorEnv", "autoreset_mode", "is_tensor_task", "make_tensor_vector_env",
           "tensor_task_spec"]


@dataclass
class TensorStep:
    """One step of N tensor envs, all on the agent's device."""

    obs: Tensor  # (N, ...) float32: what each env acts on next
    next_obs: Tensor  # (N, ...) float32: what the action led to (the final observation where an episode ended)
    reward: Tensor  # (N,) float32, 0 where no transition
    terminated: Tensor  # (N,) bool, False where no transition
    truncated: Tensor  # (N,) bool, False where no transition
    transition: Tensor  # (N,) bool: the row is a transition (False: a next-step reset, its action ignored)
    started: Tensor  # (N,) bool: obs is the first observation of an episode
    finite: Tensor  # (N,) bool: next_obs and reward hold no NaN or inf
    on_host: bool = False  # host data (HostVectorEnv's): the replay buffer sends it to its device in one copy


def autoreset_mode(env: gym.vector.VectorEnv) -> str:
    """'next_step', 'same_step' or 'disabled': what the env declares, next-step when it declares nothing."""
    mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    names = {m: m.name.lower() for m in gym.vector.AutoresetMode}
    return names.get(gym.vector.AutoresetMode(mode) if isinstance(mode, str) else mode, str(mode))


class TensorVectorEnv:
    """A tensor vector env seen in lockstep (module docstring). `device`: the agent's."""

    on_host = False  # steps arrive on the agent's device

    def __init__(self, env: gym.vector.VectorEnv, task: str, device: torch.device | str):
        self.env, self.task, self.device = env, task, torch.device(device)
        self.num_envs = env.num_envs
        self.mode = autoreset_mode(env)
        if self.mode not in ("next_step", "same_step"):
            raise TaskError(f"task {task!r}: a vector env with autoreset mode {self.mode!r} cannot be trained on; "
                            f"use next-step or same-step autoreset")
        obs_space, action_space = env.single_observation_space, env.single_action_space
        if not isinstance(obs_space, spaces.Box):
            raise TaskError(f"task {task!r}: a tensor env needs a Box observation space, got {obs_space}")
        self.obs_shape = tuple(obs_space.shape)
        self.discrete = isinstance(action_space, spaces.Discrete)
        if isinstance(action_space, spaces.Discrete):
            self.action_dim, self.start = int(action_space.n), int(action_space.start)
        elif isinstance(action_space, spaces.Box) and len(action_space.shape) == 1 and np.isfinite(
                action_space.low).all() and np.isfinite(action_space.high).all():
            self.action_dim = int(action_space.shape[0])
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)
        else:
            raise TaskError(f"task {task!r} has a {type(action_space).__name__} action space ({action_space}); "
                            f"supported are a 1-D Box with finite bounds and Discrete(n)")
        self.env_device: torch.device | None = None  # where the env's tensors live: seen at reset()
        self._resetting = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def reset(self, seed: int | None = None) -> Tensor:
        """Every env's first observation (N, ...) float32, on the agent's device."""
        obs, _ = self.env.reset(seed=seed)
        if not isinstance(obs, torch.Tensor):
            raise TaskError(f"task {self.task!r}: reset() returned a {type(obs).__name__}, not a torch tensor")
        self.env_device = obs.device
        if not self.discrete:
            self.low, self.high = self.low.to(obs.device), self.high.to(obs.device)
        self._resetting.zero_()
        return self._obs(obs, "reset()")

    def step(self, action: Tensor) -> TensorStep:
        """action (N, A) in [-1, 1] or (N,) integers, on any device -> the step, on the agent's device."""
        obs, reward, terminated, truncated, info = self.env.step(self._env_action(action))
        obs = self._obs(obs, "step()")
        reward = self._flag(reward, "reward", float)
        terminated, truncated = self._flag(terminated, "terminated", bool), self._flag(truncated, "truncated", bool)
        if self.mode == "next_step":
            if "final_obs" in info or "final_observation" in info:
                raise TaskError(f"task {self.task!r}: step() put final observations in its info, as same-step "
                                f"autoreset envs do, but the env declares next-step autoreset (or none); set "
                                f"env.metadata['autoreset_mode'] = gymnasium.vector.AutoresetMode.SAME_STEP")
            transition = ~self._resetting
            started = self._resetting.clone()
            next_obs = obs
            reward, terminated, truncated = reward * transition, terminated & transition, truncated & transition
            self._resetting = (terminated | truncated) & transition
        else:
            transition = torch.ones_like(terminated)
            started = terminated | truncated
            final = self._final_obs(info)
            next_obs = obs if final is None else torch.where(started.view(-1, *[1] * len(self.obs_shape)), final, obs)
        finite = torch.isfinite(next_obs.reshape(self.num_envs, -1)).all(1) & torch.isfinite(reward)
        return TensorStep(obs, next_obs, reward, terminated, truncated, transition, started, finite)

    def rng_state(self) -> None:
        """Nothing to save: a resumed run resets its tensor envs."""
        return None

    def close(self) -> None:
        self.env.close()

    # --- checks and conversions ----------------------------------------------------------
    def _env_action(self, action: Tensor) -> Tensor:
        action = action.to(self.env_device or action.device)
        if self.discrete:
            return action.long() + self.start if self.start else action.long()
        return (self.low + (self.high - self.low) * (action.float() + 1) / 2).clamp(self.low, self.high)

    def _obs(self, obs: Any, where: str) -> Tensor:
        if not isinstance(obs, torch.Tensor):
            raise TaskError(f"task {self.task!r}: {where} returned observations as a {type(obs).__name__}, not a "
                            f"torch tensor")
        if tuple(obs.shape) != (self.num_envs, *self.obs_shape):
            raise TaskError(f"task {self.task!r}: {where} returned observations of shape {tuple(obs.shape)}, but "
                            f"{self.num_envs} envs of observation_space {self.obs_shape} make "
                            f"{(self.num_envs, *self.obs_shape)}")
        if not obs.is_floating_point():
            raise TaskError(f"task {self.task!r}: {where} returned {obs.dtype} observations; state observations "
                            f"must be floating point")
        return obs.to(self.device, torch.float32, non_blocking=True)

    def _flag(self, x: Any, name: str, kind: type) -> Tensor:
        """A reward (floating) or a flag (bool) of each env: (N,), on the agent's device."""
        if not isinstance(x, torch.Tensor):
            raise TaskError(f"task {self.task!r}: step() returned {name} as a {type(x).__name__}, not a torch tensor")
        if tuple(x.shape) != (self.num_envs,):
            raise TaskError(f"task {self.task!r}: step() returned {name} of shape {tuple(x.shape)}, not "
                            f"({self.num_envs},)")
        ok = x.is_floating_point() if kind is float else x.dtype == torch.bool
        if not ok:
            raise TaskError(f"task {self.task!r}: step() returned {name} as {x.dtype}, not "
                            f"{'floating point' if kind is float else 'torch.bool'}")
        return x.to(self.device, torch.float32 if kind is float else torch.bool, non_blocking=True)

    def _final_obs(self, info: dict) -> Tensor | None:
        """Same-step autoreset: the ended episodes' last observations, one (N, ...) tensor (gymnasium's
        info['final_obs'] or ManiSkill3's 'final_observation'); None when the info has none (such envs add it only
        in a step where an episode ended: checking that here would cost a host sync per step)."""
        for key in ("final_obs", "final_observation"):
            if key in info:
                return self._obs(info[key], f"step()'s info[{key!r}]")
        return None


def is_tensor_task(env: Any) -> bool:
    """Whether `env` trains on the tensor path: a vector env object, or a gymnasium id whose registered vector env
    (vector_entry_point) is a JAX one or returns torch tensors. (gymnasium's own numpy vector envs, CartPole-v1's
    say, are not: such ids take the numpy path, one env per copy.) An id whose vector env cannot be imported is
    taken as one, so that building it says what to install."""
    if isinstance(env, gym.vector.VectorEnv):
        return True
    if isinstance(env, str) and env in _KIND:
        return _KIND[env]
    tensor, probe = _probe(env)
    if probe is not None:
        probe.close()
    if isinstance(env, str) and gym.registry.get(env.rpartition(":")[2]) is not None:
        _KIND[env] = tensor  # a registered id keeps its kind: each evaluation need not build a probe env again
    return tensor


_KIND: dict[str, bool] = {}  # is_tensor_task's answer per registered id


def tensor_task_spec(env: Any, num_envs: int, *, seed: int | None, action_repeat: int | None) -> EnvSpec | None:
    """A tensor-native task's spec, read off the one-env copy that tells whether it is one (is_tensor_task; then
    closed: a GPU simulator's N envs are built once, for the run); a vector env object's off itself (left open:
    it is trained on); None for a task of the numpy path."""
    if isinstance(env, gym.vector.VectorEnv):
        return make_tensor_vector_env(env, num_envs, seed=seed, device="cpu", action_repeat=action_repeat)[1]
    tensor, probe = _probe(env)
    if not tensor:
        return None
    try:
        envs, spec = make_tensor_vector_env(env, 1, seed=seed, device="cpu", action_repeat=action_repeat,
                                            built=probe)
    except BaseException:
        if probe is not None:
            probe.close()
        raise
    envs.close()
    return spec


def _probe(env: Any) -> tuple[bool, gym.vector.VectorEnv | None]:
    """Whether id `env` is a tensor task (is_tensor_task), and the one-env vector env built to tell when it is
    one (None where nothing was built)."""
    if not isinstance(env, str) or ":" in env and not _importable(env.rpartition(":")[0]):
        return False, None
    spec = gym.registry.get(env.rpartition(":")[2])
    if spec is None or spec.vector_entry_point is None:
        return False, None
    try:
        vec = _make_vec(resolve_task(env).name, 1)
    except (ImportError, gym.error.DependencyNotInstalled):
        return True, None
    try:
        tensor = bool(vec.metadata.get("jax", False)) or isinstance(vec.reset(seed=0)[0], torch.Tensor)
    except BaseException:
        vec.close()
        raise
    if not tensor:
        vec.close()
    return tensor, vec if tensor else None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _make_vec(name: str, num_envs: int) -> gym.vector.VectorEnv:
    with warnings.catch_warnings():  # gymnasium's JAX envs declare no autoreset mode: next-step, as it assumes
        warnings.filterwarnings("ignore", message=r".*missing AutoresetMode metadata")
        return gym.make_vec(name, num_envs, vectorization_mode="vector_entry_point")


def make_tensor_vector_env(env: str | gym.vector.VectorEnv, num_envs: int, *, seed: int | None,
                           device: torch.device | str, action_repeat: int | None = None,
                           built: gym.vector.VectorEnv | None = None) -> tuple[TensorVectorEnv, EnvSpec]:
    """A tensor vector env and its spec: a gymnasium id with a vector_entry_point, made by
    ``gymnasium.make_vec(id, num_envs, vectorization_mode="vector_entry_point")`` (a JAX env through
    ``JaxToTorch``: DLPack, no copy on a GPU) unless `built` is that already, or a vector env object as it is.
    Reset once, with `seed`."""
    if isinstance(env, str):
        task = resolve_task(env)
        try:
            vec = built or _make_vec(task.name, num_envs)
        except (ImportError, gym.error.DependencyNotInstalled) as e:
            raise TaskError(f"task {env!r} needs what its vector env imports ({str(e).splitlines()[0]}); for "
                            f"gymnasium's JAX envs: pip install 'tdmpc[jax]'") from None
        name, steps, episodic = task.name, task.env_steps, task.episodic
    else:
        vec, name = env, custom_task_name(env)
        if vec.num_envs != num_envs:
            raise TaskError(f"the vector env has {vec.num_envs} envs, not num_envs={num_envs}")
        spec = vec.spec
        steps = spec.max_episode_steps if spec is not None and spec.max_episode_steps else DEFAULT_EPISODE_STEPS
        episodic = None
    if action_repeat not in (None, 1):
        raise TaskError(f"task {name!r}: action repeat {action_repeat} is not supported for tensor envs (their "
                        f"envs step in lockstep); use 1")
    if vec.metadata.get("jax", False):
        from gymnasium.wrappers.vector import JaxToTorch

        vec = JaxToTorch(vec, device=torch.device(device))
    envs = TensorVectorEnv(vec, name, device)
    envs.reset(seed=seed)
    if episodic is None:
        episodic = bool(vec.metadata.get("episodic", False))
    return envs, EnvSpec(task=name, obs_shape=envs.obs_shape, action_dim=envs.action_dim, episode_length=steps,
                         action_repeat=1, episodic=episodic, discrete=envs.discrete)
