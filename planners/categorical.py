"""MPPI over discrete actions: per-step categorical probabilities instead of a Gaussian's mean and std.

Each iteration samples candidate sequences from the probabilities (one draw, inverse CDF: static shapes, no
host sync), the policy prior's among them, and refits the probabilities to the elites' softmax weights, as MPPI
refits its mean: p_t(a) = sum of the weights of the elites whose step-t action is a. Mixing with uniform at
min_prob after each refit keeps every action possible (the analogue of min_std). A plan warm-starts from the
last plan's probabilities shifted by one step, half of them (WARM_START) and half uniform, as MPPI restarts its
std at max_std around a warm mean. Training takes a draw from the first step's probabilities; evaluation the
most probable action. Actions are one-hot rows throughout, as the world model reads them.

Multi-task models are continuous (WorldModel refuses a discrete one), so there is no action mask here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tdmpc.config.planner import MPPIConfig
from tdmpc.model.policy import one_hot_argmax
from tdmpc.model.random import TORCH, RandomSource

from .base import LatentModel
from .mppi import MPPILoop

__all__ = ["CategoricalMPPI", "WARM_START", "sample_one_hot"]

WARM_START = 0.5  # the last plan's share of a warm-started step's probabilities; the rest is uniform


class CategoricalMPPI(MPPILoop):
    def __init__(self, model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int,
                 discount: float | Tensor, device: torch.device, chunk_rows: int | None = None,
                 random: RandomSource = TORCH):
        super().__init__(model, cfg, num_envs, action_dim, discount, device, chunk_rows, random)
        H, N, S, P, A = cfg.horizon, num_envs, cfg.num_samples, cfg.num_pi_trajs, action_dim
        # Every iteration's U(0, 1) draws for the sampled candidates' steps, then the acting draw: one draw.
        self.draws = torch.zeros(cfg.iterations * H * N * (S - P) + N, **self.kw)
        self.uniform = self.draws[:-N].view(cfg.iterations, H, N, S - P)
        self.act_draw = self.draws[-N:].view(N, 1)
        self.prior_noise = torch.zeros(H, N, P, A, **self.kw)
        self.probs = torch.full((H, N, A), 1.0 / A, **self.kw)
        self.prev_probs = torch.full((H, N, A), 1.0 / A, **self.kw)  # warm start, per environment

    def _warm_start(self, first_step: Tensor) -> None:
        """Last plan's probabilities shifted one step, WARM_START of them and the rest uniform; uniform for the last
        step and for envs whose episode just began."""
        keep = (~first_step).to(self.probs.dtype).view(1, -1, 1) * WARM_START
        uniform = 1.0 / self.action_dim
        self.probs[:-1] = uniform + keep * (self.prev_probs[1:] - uniform)
        self.probs[-1] = uniform

    def _draw(self) -> None:
        self.random.uniform_("plan.uniform", self.draws)
        self.random.normal_("plan.normal", self.prior_noise)

    def _sample(self, i: int, mask: Tensor | None) -> None:
        self.actions[:, :, self.cfg.num_pi_trajs:] = sample_one_hot(self.probs, self.uniform[i])

    def _refit(self, w: Tensor, elite_actions: Tensor, mask: Tensor | None) -> None:
        floor = self.cfg.min_prob
        self.probs.copy_((w * elite_actions).sum(2) * (1 - floor) + floor / self.action_dim)

    def _act(self, score: Tensor, elite_actions: Tensor, eval_mode: bool) -> Tensor:
        self.prev_probs.copy_(self.probs)
        first = self.probs[0]  # (N, A)
        return one_hot_argmax(first) if eval_mode else sample_one_hot(first, self.act_draw).squeeze(-2)


def sample_one_hot(probs: Tensor, u: Tensor) -> Tensor:
    """probs (..., A) and U(0, 1) draws u (..., K) -> K one-hot samples (..., K, A) by inverse CDF: action a where
    cdf(a - 1) <= u < cdf(a). The last cdf entry counts as 1, whatever rounding made it."""
    below = (u.unsqueeze(-1) < probs.cumsum(-1).unsqueeze(-2)).to(probs.dtype)  # (..., K, A): 0...0 1...1
    below[..., -1] = 1.0
    return below - F.pad(below[..., :-1], (1, 0))
