"""HostVectorEnv: a numpy vector env behind the tensor envs' interface (one step path for both kinds)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from tdmpc.envs.host import HostVectorEnv
from tdmpc.errors import NonFiniteData


class Counter(gym.Env):
    """obs = (episode step, episode id); 3-step episodes, the even ids terminated, the odd ones truncated; the
    reward of step `nan_at` of episode 0 is NaN, and episode `nan_reset`'s first observation is."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, nan_at: int = -1, nan_reset: int = -1):
        self.episode, self.t, self.nan_at, self.nan_reset = -1, 0, nan_at, nan_reset

    def reset(self, *, seed=None, options=None):
        self.episode, self.t = self.episode + 1, 0
        return np.array([0, np.nan if self.episode == self.nan_reset else self.episode], np.float32), {}

    def step(self, action):
        self.t += 1
        reward = np.nan if self.episode == 0 and self.t == self.nan_at else float(action[0])
        end = self.t == 3
        return np.array([self.t, self.episode], np.float32), reward, end and self.episode % 2 == 0, \
            end and self.episode % 2 == 1, {}


def host_envs(n: int = 2, on_nonfinite=None, **kw) -> HostVectorEnv:
    vec = gym.vector.SyncVectorEnv([lambda: Counter(**kw)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return HostVectorEnv(vec, "counter", on_nonfinite)


def test_a_step_is_a_tensor_step_with_the_final_observation_and_the_next_episodes_first():
    envs = host_envs()
    obs = envs.reset(seed=0)
    assert obs.dtype == torch.float32 and obs.tolist() == [[0, 0], [0, 0]]
    for t in (1, 2):
        s = envs.step(torch.full((2, 1), 0.5))
        assert s.on_host and s.transition.all() and not s.started.any() and s.obs.tolist() == [[t, 0], [t, 0]]
    s = envs.step(torch.tensor([[0.25], [-0.25]]))
    assert s.next_obs.tolist() == [[3, 0], [3, 0]]  # the final observation of the ended episode
    assert s.obs.tolist() == [[0, 1], [0, 1]] and s.started.all()  # the next episode's first
    assert s.terminated.all() and not s.truncated.any() and s.reward.tolist() == [0.25, -0.25] and s.finite.all()


def test_a_non_finite_reward_is_named_at_once_or_its_env_restarts():
    with pytest.raises(NonFiniteData, match=r"env 0 \(counter\) returned a non-finite reward"):
        envs = host_envs(nan_at=2)
        envs.reset(seed=0)
        for _ in range(2):
            envs.step(torch.zeros(2, 1))
    seen = []
    envs = host_envs(nan_at=2, on_nonfinite=lambda *a: seen.append(a[:2]))
    envs.reset(seed=0)
    envs.step(torch.zeros(2, 1))
    s = envs.step(torch.zeros(2, 1))
    assert seen == [(0, "reward")]
    assert not s.finite.any() and s.reward.tolist() == [0, 0]  # both envs are copies: both NaN
    assert s.started.all() and s.obs.tolist() == [[0, 1], [0, 1]]  # reset: a new episode begins there


def test_a_non_finite_first_observation_is_reset_again_a_few_times_at_most():
    seen = []
    envs = host_envs(1, on_nonfinite=lambda *a: seen.append(a[1]), nan_reset=0)
    assert envs.reset(seed=0).tolist() == [[0, 1]] and seen == ["observation from reset()"]
    envs = host_envs(1, on_nonfinite=lambda *a: None, nan_reset=0)
    envs.env.envs[0].reset = lambda **kw: (np.array([np.nan, 0], np.float32), {})
    with pytest.raises(NonFiniteData, match="at 3 resets in a row"):
        envs.reset(seed=0)
