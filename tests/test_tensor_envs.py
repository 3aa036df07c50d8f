"""Tensor-native vector envs (tdmpc/envs/tensor.py): a simulator's torch tensors in lockstep, whatever its autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from helpers import import_or_skip
from tdmpc.envs.tensor import TensorVectorEnv, autoreset_mode, is_tensor_vector_env, make_tensor_vector_env
from tdmpc.errors import TaskError


class TorchPointEnv(gym.vector.VectorEnv):
    """N points on a line, written for these tests: torch tensors only (numpy actions are refused), episodes of
    `length` steps that end in a terminal state (an even env) or a time limit (an odd one). obs = (position, step);
    reward = the action taken. Next-step autoreset unless `same_step` (then info['final_obs'] holds the last obs)."""

    def __init__(self, num_envs: int = 4, length: int = 3, same_step: bool = False, discrete: bool = False):
        self.num_envs, self.length, self.same_step = num_envs, length, same_step
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = spaces.Discrete(3, start=-1) if discrete else spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        mode = gym.vector.AutoresetMode.SAME_STEP if same_step else gym.vector.AutoresetMode.NEXT_STEP
        self.metadata = {"autoreset_mode": mode}
        self.t = torch.zeros(num_envs)
        self.pos = torch.zeros(num_envs)
        self.ended = torch.zeros(num_envs, dtype=torch.bool)
        self.actions: list[torch.Tensor] = []

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.pos, self.t], 1)

    def reset(self, *, seed=None, options=None):
        self.t.zero_()
        self.pos.zero_()
        self.ended.zero_()
        return self._obs(), {}

    def step(self, action):
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"TorchPointEnv takes torch tensors, not {type(action).__name__}")
        self.actions.append(action.clone())
        a = action.float().view(self.num_envs)
        if not self.same_step:  # the envs that ended last step reset now, ignoring their action
            self.t[self.ended], self.pos[self.ended] = 0, 0
            restarted = self.ended.clone()
        else:
            restarted = torch.zeros_like(self.ended)
        moving = ~restarted
        self.pos = torch.where(moving, self.pos + a, self.pos)
        self.t = torch.where(moving, self.t + 1, self.t)
        done = moving & (self.t >= self.length)
        even = torch.arange(self.num_envs) % 2 == 0
        terminated, truncated = done & even, done & ~even
        reward = torch.where(moving, a, torch.zeros_like(a))
        info = {}
        obs = self._obs()
        if self.same_step:
            info["final_obs"] = obs.clone()
            self.t[done], self.pos[done] = 0, 0
            obs = self._obs()
        self.ended = done
        return obs, reward, terminated, truncated, info


def steps(envs: TensorVectorEnv, n: int, action: torch.Tensor) -> list:
    envs.reset(seed=0)
    return [envs.step(action) for _ in range(n)]


def test_next_step_autoreset_marks_the_reset_step_as_no_transition():
    env = TorchPointEnv(length=3)
    assert autoreset_mode(env) == "next_step" and is_tensor_vector_env(env)
    envs = TensorVectorEnv(env, "points", "cpu")
    out = steps(envs, 5, torch.ones(4, 1))  # +1 in [-1, 1] is +2 on the env's Box(-2, 2)
    assert torch.equal(env.actions[0], torch.full((4, 1), 2.0))
    assert [bool(s.transition[0]) for s in out] == [True, True, True, False, True]
    assert [bool(s.started[0]) for s in out] == [False, False, False, True, False]
    third, reset = out[2], out[3]
    assert third.terminated.tolist() == [True, False, True, False] and third.truncated.tolist() == [False, True, False, True]
    assert torch.equal(third.next_obs[:, 0], torch.full((4,), 6.0))  # the final observation: 3 steps of +2
    assert torch.equal(reset.obs, torch.zeros(4, 2)) and torch.equal(reset.reward, torch.zeros(4))
    assert not reset.terminated.any() and not reset.truncated.any()
    assert all(s.finite.all() for s in out)


def test_same_step_autoreset_takes_the_final_observation_from_the_info():
    env = TorchPointEnv(length=2, same_step=True)
    assert autoreset_mode(env) == "same_step"
    out = steps(TensorVectorEnv(env, "points", "cpu"), 3, -torch.ones(4, 1))
    assert all(s.transition.all() for s in out)
    assert out[1].started.all() and not out[0].started.any()
    assert torch.equal(out[1].next_obs, torch.tensor([[-4.0, 2.0]] * 4))  # what the action led to
    assert torch.equal(out[1].obs, torch.zeros(4, 2))  # what the envs act on next: the new episode's first


def test_discrete_actions_reach_the_env_as_integers_from_its_start():
    env = TorchPointEnv(discrete=True)
    envs = TensorVectorEnv(env, "points", "cpu")
    assert envs.discrete and envs.action_dim == 3
    steps(envs, 1, torch.tensor([0, 1, 2, 2]))
    assert torch.equal(env.actions[0], torch.tensor([-1, 0, 1, 1]))


class Broken(TorchPointEnv):
    def __init__(self, what: str, **kw):
        super().__init__(**kw)
        self.what = what

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.what == "numpy":
            obs = obs.numpy()
        elif self.what == "shape":
            obs = obs[:, :1]
        elif self.what == "dtype":
            obs = obs.long()
        elif self.what == "reward":
            reward = reward.view(-1, 1)
        elif self.what == "flags":
            terminated = terminated.float()
        elif self.what == "nan":
            reward = torch.where(torch.arange(self.num_envs) == 2, torch.nan, reward)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("what,message", [
    ("numpy", "returned observations as a ndarray, not a torch tensor"),
    ("shape", "returned observations of shape (4, 1), but 4 envs of observation_space (2,) make (4, 2)"),
    ("dtype", "returned torch.int64 observations; state observations must be floating point"),
    ("reward", "returned reward of shape (4, 1), not (4,)"),
    ("flags", "returned terminated as torch.float32, not torch.bool"),
])
def test_bad_tensors_are_one_line_errors(what, message):
    envs = TensorVectorEnv(Broken(what), "points", "cpu")
    envs.reset()
    with pytest.raises(TaskError) as e:
        envs.step(torch.zeros(4, 1))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_non_finite_rows_are_flagged_without_a_host_check():
    envs = TensorVectorEnv(Broken("nan"), "points", "cpu")
    out = steps(envs, 1, torch.zeros(4, 1))
    assert out[0].finite.tolist() == [True, True, False, True]


def test_envs_without_autoreset_or_with_other_spaces_are_refused():
    env = TorchPointEnv()
    env.metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}
    with pytest.raises(TaskError, match="autoreset mode 'disabled'"):
        TensorVectorEnv(env, "points", "cpu")
    env = TorchPointEnv()
    env.single_action_space = spaces.MultiDiscrete([2, 2])
    with pytest.raises(TaskError, match="MultiDiscrete action space"):
        TensorVectorEnv(env, "points", "cpu")
    assert not is_tensor_vector_env(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))


def test_a_vector_env_object_and_its_spec():
    envs, spec = make_tensor_vector_env(TorchPointEnv(num_envs=4), 4, seed=0, device="cpu")
    assert spec.obs_shape == (2,) and spec.action_dim == 1 and not spec.discrete and spec.action_repeat == 1
    with pytest.raises(TaskError, match="has 4 envs, not num_envs=8"):
        make_tensor_vector_env(TorchPointEnv(num_envs=4), 8, seed=0, device="cpu")
    with pytest.raises(TaskError, match="action repeat 2 is not supported"):
        make_tensor_vector_env(TorchPointEnv(num_envs=4), 4, seed=0, device="cpu", action_repeat=2)


def test_gymnasium_jax_pendulum_by_id_gives_torch_tensors():
    """phys2d/Pendulum-v0 registers a JAX vector env (vector_entry_point): made with make_vec, through JaxToTorch."""
    import_or_skip("jax", "pip install -e '.[jax]'")
    envs, spec = make_tensor_vector_env("phys2d/Pendulum-v0", 8, seed=0, device="cpu")
    assert spec.obs_shape == (3,) and spec.action_dim == 1 and spec.episode_length == 200 and not spec.episodic
    out = [envs.step(torch.zeros(8, 1)) for _ in range(201)]
    assert out[199].truncated.all() and not out[200].transition.any() and out[200].started.all()
    assert all(isinstance(s.reward, torch.Tensor) and s.reward.dtype == torch.float32 for s in out)
