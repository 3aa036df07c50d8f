"""MPPI in latent space, for N environments in one call.

Buffers are allocated once, sized by N, so shapes are static (CUDA-graph friendly) and
no memory is allocated per step beyond the network activations. The warm start (last
plan's distribution, shifted by one step) is kept per environment. With a multi-task model every
environment may be a different task: its id picks its embedding, its action mask (applied
to the samples, the mean and the std, as the reference does) and its discount.

MPPILoop is the loop every action space shares: sample candidates, roll them out, score them, refit the
sampling distribution to the elites' softmax weights, act. GaussianMPPI samples from a per-step Gaussian (continuous
actions); planners/categorical.py's CategoricalMPPI from per-step categorical probabilities (discrete ones).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tdmpc.config.planner import MPPIConfig
from tdmpc.model.random import TORCH, RandomSource

from .base import LatentModel

__all__ = ["GaussianMPPI", "MPPILoop", "MPPIConfig"]


class MPPILoop:
    """The planning loop, whatever the action space; a subclass holds the sampling distribution: _warm_start,
    _draw, _sample, _refit and _act."""

    def __init__(self, model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int,
                 discount: float | Tensor, device: torch.device, chunk_rows: int | None = None,
                 random: RandomSource = TORCH):
        """discount: one for every env, or a tensor of one per task id (multi-task models).
        chunk_rows: candidates rolled out per model call. None does all N x S at once (GPUs);
        on a CPU, chunks that fit in cache keep batched planning compute-bound.
        random: where every draw comes from (tdmpc/model/random.py)."""
        self.model, self.cfg, self.discount, self.random = model, cfg, discount, random
        self.chunk_envs = num_envs if chunk_rows is None else max(1, chunk_rows // cfg.num_samples)
        H, N, S, A = cfg.horizon, num_envs, cfg.num_samples, action_dim
        self.num_envs, self.action_dim = N, A
        self.kw: dict[str, Any] = dict(device=device, dtype=torch.float32)
        self.actions = torch.zeros(H, N, S, A, **self.kw)  # candidates; the first num_pi_trajs from the prior
        self.value = torch.zeros(N, S, **self.kw)
        self.G = torch.zeros(N, S, 1, **self.kw)  # model return of each candidate
        self.alive = torch.ones(N, S, 1, **self.kw)  # 0 once the model predicts a termination
        self.gamma = torch.full((N, 1, 1), float(discount) if not isinstance(discount, Tensor) else 0.0, **self.kw)
        self.discounts = torch.ones(H + 1, N, 1, 1, **self.kw)  # gamma^t for t = 0..H, per env
        self.z_final = torch.zeros(N, S, model.latent_dim, device=device, dtype=model.latent_dtype)  # after the horizon
        # made on the CPU and moved: arange on the meta device (the memory estimate's) imports torch._dynamo
        self._powers = torch.arange(H + 1, device="cpu", dtype=torch.float32).view(-1, 1, 1, 1).to(device)
        self.prior_noise: Tensor  # (H, N, num_pi_trajs, A): the policy prior's N(0, 1) draws, set by the subclass
        self.value_noise: Tensor | None = None  # (iterations, N, S, A): the bootstrap's prior sample, if it draws one

    @torch.inference_mode()
    def plan(self, obs: Tensor, first_step: Tensor, eval_mode: bool = False, task: Tensor | None = None) -> Tensor:
        """obs (N, ...), first_step (N,) bool, task (N,) ids or None -> actions (N, A): in [-1, 1] (continuous), or
        one-hot rows (discrete)."""
        return self.plan_graph(obs, first_step, eval_mode, task)

    def plan_graph(self, obs: Tensor, first_step: Tensor, eval_mode: bool = False, task: Tensor | None = None) -> Tensor:
        """plan() without its inference mode: what torch.compile traces (under no_grad) as one graph."""
        c, m = self.cfg, self.model
        H, P, E = c.horizon, c.num_pi_trajs, c.num_elites
        rows = None if task is None else task.view(-1, 1)  # one id per env, for (N, candidates, ...) inputs
        if isinstance(self.discount, Tensor):
            assert task is not None, "per-task discounts need task ids"
            self.gamma.copy_(self.discount[task].view(-1, 1, 1))
        torch.pow(self.gamma, self._powers, out=self.discounts)  # gamma^t for t = 0..H
        mask = m.action_mask(rows)  # (N, 1, A) or None
        z = m.encode(obs, task)
        z_part = m.latent_part(z, task).unsqueeze(1)  # every candidate starts from z: its share, once per plan
        z = z.unsqueeze(1)
        self._warm_start(first_step)
        self._draw()  # every iteration's noise and the prior's, in one draw
        # every iteration's 2 random Q heads, their parameters chosen in one go
        heads = m.q_heads(self.random.head_pairs("plan.q_pairs", m.num_q, c.iterations, self.value.device))

        for i in range(c.iterations):
            self._sample(i, mask)  # into actions[:, :, P:]
            # The first iteration also rolls out the policy prior's P candidates, drawing their actions as it goes;
            # their return and final latent do not change, so later iterations roll out the sampled ones alone.
            prior, col = (P, 0) if i == 0 else (0, P)
            for envs in self._chunks():
                r = None if rows is None else rows[envs]
                mk = None if mask is None else mask[envs]
                self._rollout(z[envs], z_part[envs], self.actions[:, envs, col:], col, envs, r, prior, mk)
                eps = None if self.value_noise is None else self.value_noise[i, envs]
                self.value[envs] = self._value(envs, r, heads[i], eps)
            value = self.value.nan_to_num_(0.0)  # (N, S)
            elite_value, elite_idx = (t[:, :E] for t in torch.sort(value, dim=1, descending=True))
            elite_actions = self.actions.gather(
                2, elite_idx.view(1, -1, E, 1).expand(H, -1, E, self.action_dim))  # (H, N, E, A)
            score = torch.softmax(c.temperature * (elite_value - elite_value.max(1, keepdim=True).values), 1)
            self._refit(score.view(1, -1, E, 1), elite_actions, mask)
        return self._act(score, elite_actions, eval_mode)

    def buffer_bytes(self) -> int:
        """Bytes of the tensors this planner allocates, each once (views through their base; the discount is the
        agent's). The memory estimate builds a planner on the meta device and asks it (tdmpc.memory.peak)."""
        tensors = [t for name, t in vars(self).items() if isinstance(t, Tensor) and name != "discount"]
        bases = {id(base): base for base in (t if t._base is None else t._base for t in tensors)}
        return sum(base.untyped_storage().nbytes() for base in bases.values())

    def _warm_start(self, first_step: Tensor) -> None:
        raise NotImplementedError

    def _draw(self) -> None:
        raise NotImplementedError

    def _sample(self, i: int, mask: Tensor | None) -> None:
        raise NotImplementedError

    def _refit(self, w: Tensor, elite_actions: Tensor, mask: Tensor | None) -> None:
        """The sampling distribution fitted to the elites (H, N, E, A) weighted by w (1, N, E, 1)."""
        raise NotImplementedError

    def _act(self, score: Tensor, elite_actions: Tensor, eval_mode: bool) -> Tensor:
        raise NotImplementedError

    def _chunks(self) -> list[slice]:
        return [slice(e, e + self.chunk_envs) for e in range(0, self.num_envs, self.chunk_envs)]

    def _rollout(self, z: Tensor, z_part: Tensor, actions: Tensor, col: int, envs: slice, rows: Tensor | None,
                 prior: int, mask: Tensor | None) -> None:
        """Model return, survival and final latent of candidates, into [envs, col:] of the buffers. z (envs, 1, L)
        and z_part (its latent_part()) are where every candidate starts. The first `prior` candidates take the
        policy prior's actions, drawn step by step (masked) and written into `actions`.

        The reward head's last layer and the decode run once over the H steps, after the rollout."""
        m = self.model
        n = actions.shape[2]
        features, ok = [], []
        for t in range(self.cfg.horizon):
            if prior:
                a = m.pi_action(z[:, :prior] if t else z.expand(-1, prior, -1), rows, self.prior_noise[t, envs])
                actions[t, :, :prior] = a if mask is None else a * mask
            z, feature = m.step(None, actions[t], rows, z_part) if t == 0 else m.step(z, actions[t], rows)
            features.append(feature)
            if m.episodic:
                ok.append(m.termination(z) <= 0.5)
        rewards = m.decode(m.reward_logits(features)) * self.discounts[:-1, envs]  # (H, envs, n, 1)
        if m.episodic:  # a reward counts until the model predicts a termination; the value, after the last step
            survived = torch.stack(ok).to(rewards.dtype).cumprod(0)  # (H, ...): no termination up to step t
            rewards = rewards * torch.cat([torch.ones_like(survived[:1]), survived[:-1]])
            self.alive[envs, col:col + n] = survived[-1]
        self.G[envs, col:col + n] = rewards.sum(0)
        self.z_final[envs, col:col + n] = z

    def _value(self, envs: slice, rows: Tensor | None, heads: Any, eps: Tensor | None) -> Tensor:
        """Return over the horizon plus the discounted value under the prior (2 random heads, averaged): (envs, S)."""
        m = self.model
        z = self.z_final[envs]
        q = m.prior_q(z, rows, "avg", heads, eps=eps)
        bootstrap = self.discounts[-1, envs]
        alive = self.alive[envs] if m.episodic else 1.0
        return (self.G[envs] + bootstrap * alive * q).squeeze(-1)


class GaussianMPPI(MPPILoop):
    """Continuous actions: candidates from a per-step Gaussian, clamped to [-1, 1], as the reference plans."""

    def __init__(self, model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int,
                 discount: float | Tensor, device: torch.device, chunk_rows: int | None = None,
                 random: RandomSource = TORCH):
        super().__init__(model, cfg, num_envs, action_dim, discount, device, chunk_rows, random)
        # Every N(0, 1) draw of a plan in one buffer, filled at once: the same values however the rollouts are
        # chunked, and one kernel.
        views = self.draw_views(torch.zeros(self.draw_size(cfg, num_envs, action_dim), **self.kw), cfg, num_envs,
                                action_dim)
        self.draws = views["all"]
        self.noise, self.prior_noise, self.value_noise = views["noise"], views["prior"], views["value"]
        self.action_noise = views["action"]
        self.exponential = torch.zeros(num_envs, cfg.num_elites, **self.kw)  # Gumbel noise for the elite choice
        H, N, A = cfg.horizon, num_envs, action_dim
        self.mean = torch.zeros(H, N, A, **self.kw)
        self.std = torch.full((H, N, A), cfg.max_std, **self.kw)
        self.prev_mean = torch.zeros(H, N, A, **self.kw)  # warm start, per environment

    def _warm_start(self, first_step: Tensor) -> None:
        """Last plan's mean shifted one step; zeros for envs whose episode just began."""
        keep = (~first_step).to(self.mean.dtype).unsqueeze(-1)
        self.mean[:-1] = self.prev_mean[1:] * keep
        self.mean[-1] = 0
        self.std.fill_(self.cfg.max_std)

    @staticmethod
    def draw_size(cfg: MPPIConfig, num_envs: int, action_dim: int) -> int:
        H, N, S, P, A, I = cfg.horizon, num_envs, cfg.num_samples, cfg.num_pi_trajs, action_dim, cfg.iterations
        return (I * H * (S - P) + H * P + I * S + 1) * N * A

    @staticmethod
    def draw_views(flat: Tensor, cfg: MPPIConfig, num_envs: int, action_dim: int) -> dict[str, Tensor]:
        """The layout of a plan's N(0, 1) draws (`plan.normal`) in one flat tensor: `noise` (iterations, H, N,
        S - P, A), each iteration's sampled candidates; `prior` (H, N, P, A), the policy prior's P candidates;
        `value` (iterations, N, S, A), each iteration's prior sample at the end of the horizon (the bootstrap);
        `action` (N, A), training's exploration noise on the chosen action; `all`, the whole."""
        H, N, S, P, A, I = cfg.horizon, num_envs, cfg.num_samples, cfg.num_pi_trajs, action_dim, cfg.iterations
        views, start = {"all": flat}, 0
        for name, shape in (("noise", (I, H, N, S - P, A)), ("prior", (H, N, P, A)), ("value", (I, N, S, A)),
                            ("action", (N, A))):
            n = 1
            for d in shape:
                n *= d
            views[name], start = flat[start:start + n].view(shape), start + n
        assert start == flat.numel(), "draw_size and draw_views disagree"
        return views

    def _draw(self) -> None:
        self.random.normal_("plan.normal", self.draws)

    def _sample(self, i: int, mask: Tensor | None) -> None:
        P = self.cfg.num_pi_trajs
        self.actions[:, :, P:] = torch.addcmul(self.mean.unsqueeze(2), self.std.unsqueeze(2), self.noise[i]).clamp_(-1, 1)
        if mask is not None:
            self.actions.mul_(mask)

    def _refit(self, w: Tensor, elite_actions: Tensor, mask: Tensor | None) -> None:
        self.mean.copy_((w * elite_actions).sum(2))
        var = (w * (elite_actions - self.mean.unsqueeze(2)).pow(2)).sum(2)
        self.std.copy_(var.sqrt().clamp_(self.cfg.min_std, self.cfg.max_std))
        if mask is not None:
            self.mean.mul_(mask.squeeze(1))
            self.std.mul_(mask.squeeze(1))

    def _act(self, score: Tensor, elite_actions: Tensor, eval_mode: bool) -> Tensor:
        """One elite per env, sampled from the softmax weights (Gumbel-max, Gumbel noise -log E of Exp(1) draws, as
        the reference: no host sync): its first action, with the std's noise when training."""
        choice = (score.log() - self.random.exponential_("plan.exponential", self.exponential).log()).argmax(1)
        action = elite_actions[0].gather(1, choice.view(-1, 1, 1).expand(-1, 1, self.action_dim)).squeeze(1)
        if not eval_mode:
            action = action + self.std[0] * self.action_noise
        self.prev_mean.copy_(self.mean)
        return action.clamp_(-1, 1)
