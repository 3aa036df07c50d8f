"""The losses of one update, as the reference computes them (its `_update` and `update_pi`, tdmpc2.py:208-305):
the world model's (latent consistency, reward and value cross-entropies against TD targets from the target Qs,
termination for episodic tasks, each step weighted by rho^t) and the policy prior's (Q over the running scale
plus an entropy bonus). tdmpc.parity checks both against the reference's own numbers.

Plain functions of a LossSetup: the learner (tdmpc/learner.py) compiles them (--compile) and steps the optimisers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.model.world_model import WorldModel


@dataclass
class LossSetup:
    """What the losses read besides the batch."""

    model: WorldModel
    cfg: Config
    discount: float | Tensor  # one, or one per task id (multi-task models)
    rho: Tensor  # (H+1,) rho^t
    noise: Callable[[str, torch.Size], Tensor]  # N(0, 1) policy noise for (T, B) rows, under a draw's name
    autocast: Callable[[], contextlib.AbstractContextManager]  # train_precision's autocast
    values: Callable[[Tensor], tuple[contextlib.AbstractContextManager, Tensor]]  # where Q heads read latents


def world_model_loss(s: LossSetup, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
                     task: Tensor | None) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
    """The world model's loss (TD targets from the target Qs), its parts (detached), the latents of the
    rollout and which of them the episode reached (for the policy update)."""
    cfg, m = s.cfg, s.model
    batch = Batch(obs, action, reward, terminated, task)
    H = cfg.horizon
    rho = s.rho[:H]
    discount = s.discount if task is None else s.discount[task]  # type: ignore[index]
    with s.autocast():
        # State observations: one encoder pass for z_0 (with grad) and the targets' latents (detached); the
        # weight gradients' rows this adds are cheap. Pixels: the targets' frames apart, without grad, since
        # convolution weight gradients over H+1 frames would cost more than the launches they save.
        z_all = None if m.dims.pixels else m.encode(batch.obs, task)
    with torch.no_grad(), s.autocast():
        # The targets' frames unshifted: the reference encodes them in eval mode.
        next_z = m.encode(batch.obs[1:], task, augment=False) if z_all is None else z_all[1:].detach()
        next_action = m.pi(next_z, task, eps=s.noise("td_target.pi_eps", next_z.shape[:-1])).action
        values, z_in = s.values(next_z)
        with values:
            next_q = m.prior_q(z_in, task, "min", target=True, action=next_action).squeeze(-1)
        td_target = batch.reward + discount * (1 - batch.terminated.float()) * next_q
    # (H, B) 1 up to and including a terminal step, 0 after it: a start near the end of a terminated episode
    # reaches past it (ReplayBuffer); those steps are not the episode's and get no loss. All 1 without one.
    ended = batch.terminated.long()
    alive = (ended.cumsum(0) - ended == 0).float()

    with s.autocast():
        z = m.encode(batch.obs[0], task) if z_all is None else z_all[0]
        zs_list = [z]
        for t in range(H):
            zs_list.append(m.next(zs_list[-1], batch.action[t], task))
        zs = torch.stack(zs_list)  # (H+1, B, L)
        consistency = (F.mse_loss(zs[1:].float(), next_z.float(), reduction="none").mean(2) * alive).mean(1)
        reward_ce = (m.two_hot.cross_entropy(m.reward(zs[:-1], batch.action, task), batch.reward) * alive).mean(1)
        values, z_in = s.values(zs[:-1])
        with values:
            q_logits = m.Q(z_in, batch.action, task)
        value_ce = (m.two_hot.cross_entropy(q_logits, td_target.unsqueeze(0)) * alive).mean((0, 2))
        losses = {
            "consistency_loss": (rho * consistency).mean(),
            "reward_loss": (rho * reward_ce).mean(),
            "value_loss": (rho * value_ce).mean(),
        }
        total = (cfg.consistency_coef * losses["consistency_loss"] + cfg.reward_coef * losses["reward_loss"]
                 + cfg.value_coef * losses["value_loss"])
        if m.episodic:
            term_logits = m.termination(zs[1:], logits=True).squeeze(-1).float()
            # A plain mean over the (alive) steps and batch, without rho weights, as the reference computes it.
            losses["termination_loss"] = F.binary_cross_entropy_with_logits(
                term_logits, batch.terminated.float(), weight=alive, reduction="sum") / alive.sum()
            total = total + cfg.termination_coef * losses["termination_loss"]
    # The prior learns on the latents the episode reached: z_0, and z_t+1 after an alive, non-terminal step.
    reached = torch.cat([torch.ones_like(alive[:1]), alive * (1 - ended)])
    return total, {k: v.detach() for k, v in losses.items()}, zs, reached


def policy_loss(s: LossSetup, zs: Tensor, task: Tensor | None, reached: Tensor | None,
                scale: Callable[[Tensor, Tensor | None], Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Maximise Q of the prior's actions (over the running 5-95% scale) plus an entropy bonus, on the rolled-out
    latents zs (H+1, B, L), detached; `reached` (H+1, B) weights out latents past an episode's end (an episodic
    task's deliberate difference, Config.mask_policy_after_terminal). scale(q at t = 0, task) updates the running
    scale and returns what to divide Q by, as the reference's RunningScale does."""
    cfg, m = s.cfg, s.model
    with s.autocast():
        policy = m.pi(zs, task, eps=s.noise("pi.pi_eps", zs.shape[:-1]))
        values, z_in = s.values(zs)
        with values:
            q = m.prior_value(z_in, policy, task).float()
    divide_by = scale(q[0], task)
    bonus = policy.scaled_entropy
    if cfg.entropy_bonus == "squashed":  # Config.entropy_bonus says why
        bonus = bonus + policy.squash_correction
    objective = cfg.entropy_coef * bonus + q / divide_by
    if m.discrete and cfg.uniform_prior_coef:  # policy.log_std: the categorical's log-probabilities
        objective = objective + cfg.uniform_prior_coef * policy.log_std.mean(-1, keepdim=True)
    if reached is not None and cfg.mask_policy_after_terminal:
        objective = objective * reached.unsqueeze(-1)
    loss = -(s.rho * objective.mean((1, 2))).mean()
    return loss, {"pi_entropy": policy.entropy.mean().detach(),
                  "pi_scaled_entropy": policy.scaled_entropy.mean().detach()}
