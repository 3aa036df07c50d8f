"""The losses of one update, as the reference computes them (its `_update` and `update_pi`, tdmpc2.py:208-305):
the world model's (latent consistency, reward and value cross-entropies against TD targets from the target Qs,
termination for episodic tasks, each step weighted by rho^t) and the policy prior's (Q over the running scale
plus an entropy bonus). tdmpc.parity checks both against the reference's own numbers.

Plain functions of a LossSetup: the learner (tdmpc/learner.py) compiles them (--compile) and steps the optimisers.

Update activations: what the losses keep for backward, counted per element (_kept). Eager, a hidden
Linear -> LayerNorm -> Mish element keeps LayerNorm's input and output in fp32 and the next layer's input in
the autocast dtype (12 bytes in fp32), a SimNorm latent 2 fp32 copies, dropout (the Q ensemble's first layer)
3 more; compiled, AOTAutograd's min-cut recomputes LayerNorm in backward: a layer's output and the next layer's
input (8 bytes in fp32), 1 copy of a latent, a bool mask. Rows: the encoder sees (H+1) x B observations,
dynamics H x B, reward/termination H x B, the Q ensemble num_q x H x B from one shared input. world_model_saved_bytes() is that sum, checked against what autograd really saves
(tests/test_memory.py; fp32, eager and compiled); bf16 autocast is modelled, not checked. Add the sampled
batch, the no-grad TD targets, the world model's gradients and a backward working set (2 fp32 copies of the
widest activation). The policy update (pi, and 2 Q heads on (H+1) x B detached latents) runs after the world
model's tensors are freed, so the larger of the two counts; policy_saved_bytes() is an upper bound of what the
policy loss keeps (within 25%, checked the same way). update_activation_bytes() is that estimate
(tdmpc.memory adds it to its peak).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.model.world_model import ModelDims, WorldModel


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
        next_z = m.encode(batch.obs[1:], task) if z_all is None else z_all[1:].detach()
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


# --- their memory ----------------------------------------------------------------------------------------------

def _numel(module: torch.nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _encoder_saved(dims: ModelDims, rows: int, d: int, hid: int, sim: int) -> int:
    """Bytes the encoder keeps for backward for `rows` observations (state MLP or pixel convs)."""
    if dims.pixels:
        c, side, ch = dims.obs_shape[0], dims.obs_shape[-1], dims.num_channels
        convs, s = 0, side
        for k, stride in ((7, 2), (5, 2), (3, 2), (3, 1)):
            s = (s - k) // stride + 1
            convs += ch * s * s * d  # each conv's output, kept by ReLU and the next conv
        augment = 3 * c * (side + 6) ** 2 * 4  # padded fp32 frames, sampling grid, shifted frames
        return rows * (c * side * side * d + convs + dims.latent_dim * 2 * 4 + augment)
    hidden = max(dims.num_enc_layers - 1, 1) * dims.enc_dim
    return rows * (dims.obs_shape[0] * d + hidden * hid + dims.latent_dim * sim)


def _kept(d: int, compiled: bool) -> dict[str, int]:
    """Bytes kept for backward per element of each kind (module docstring); d: the autocast dtype's size."""
    if compiled:  # AOTAutograd's min-cut keeps a layer's output and the next layer's input, recomputing the rest
        return {"hidden": 4 + d, "latent": 4, "stacked": 1, "dropout": 1, "logits": 1}
    return {"hidden": 2 * 4 + d,  # LayerNorm's input and output (Mish's input), the next layer's input
            "latent": 2 * 4,  # LayerNorm's input, SimNorm's softmax output
            "stacked": 2,  # copies of the stacked rollout latents
            "dropout": 3 * 4,  # a float mask and the masked copies
            "logits": 3}  # fp32 R x num_bins copies beside the Q heads' log-probabilities


def world_model_saved_bytes(cfg: Config, dims: ModelDims, model: WorldModel, dtype: torch.dtype,
                            compiled: bool) -> int:
    """What world_model_loss keeps for backward: tests/test_memory.py checks it against the tensors autograd
    saves, eager and compiled, on CUDA's code path."""
    B, H = cfg.batch_size, cfg.horizon
    L, A, M, Q, nb = dims.latent_dim, dims.action_dim, dims.mlp_dim, dims.num_q, dims.num_bins
    d, k, R = dtype.itemsize, _kept(dtype.itemsize, compiled), H * B
    hid = k["hidden"]
    # the encoder: one pass over all H+1 steps' states (its latent's one fp32 copy kept), or B frames
    saved = (_encoder_saved(dims, B if dims.pixels else (H + 1) * B, d, hid, 4)
             + H * B * ((L + A) * d + 2 * M * hid + L * k["latent"])  # dynamics rollout
             + k["stacked"] * (H + 1) * B * L * 4  # the stacked latents (the consistency loss's input)
             + R * ((L + A) * d + 2 * M * hid)  # reward head
             + R * (L + A) * d + Q * R * M * (2 * hid + k["dropout"])  # Q ensemble: one input for all
             + (Q + k["logits"]) * R * nb * 4  # log-probabilities, two-hot targets
             + (R * (L * d + 2 * M * hid + 4) if dims.episodic else 0))  # termination head
    if d < 4 and not compiled:  # autocast casts every weight at each call (no weight cache under CUDA graphs)
        saved += d * (_numel(model._encoder) + H * _numel(model._dynamics) + _numel(model._reward)
                      + _numel(model._Qs) + _numel(model._termination))
    return saved


def policy_saved_bytes(cfg: Config, dims: ModelDims, dtype: torch.dtype, compiled: bool) -> int:
    """What policy_loss keeps for backward, an upper bound (tests/test_memory.py): pi on the (H+1) x B latents and
    its action statistics, and a Gaussian prior's Q of its action through 2 heads (a categorical prior's expected
    Q keeps nothing: neither the latents nor the Q weights take gradients there)."""
    L, A, M, nb = dims.latent_dim, dims.action_dim, dims.mlp_dim, dims.num_bins
    d, hid, Rp = dtype.itemsize, _kept(dtype.itemsize, compiled)["hidden"], (cfg.horizon + 1) * cfg.batch_size
    pi = Rp * (L * d + 2 * M * hid + 2 * A * 4 * 4)
    # The Q weights take no gradient here, so no layer input is kept: compiled, one fp32 copy and a mask per
    # hidden element; eager counted as a hidden layer's (an upper bound). Their 2 heads' weights, selected
    # (copied) from the ensemble's, are kept.
    q_hidden = 4 + 1 if compiled else hid
    heads = 2 * 4 * M * (L + A + M + nb)
    return pi if dims.discrete else pi + 2 * Rp * (2 * M * q_hidden + nb * 4) + heads


def update_activation_bytes(cfg: Config, dims: ModelDims, model: WorldModel, dtype: torch.dtype,
                            compiled: bool) -> int:
    """Temporaries of one update() besides the gradients (formulas in the module docstring)."""
    B, H = cfg.batch_size, cfg.horizon
    L, A, M, Q, nb = dims.latent_dim, dims.action_dim, dims.mlp_dim, dims.num_q, dims.num_bins
    d, R = dtype.itemsize, H * B
    hid = _kept(d, compiled)["hidden"]
    obs_bytes = math.prod(dims.obs_shape) * (1 if dims.pixels else 4)
    batch = (H + 1) * B * obs_bytes + R * (4 * A + 4 + 1)
    targets = R * L * 4 + 2 * R * 4  # next_z, TD targets
    world = (world_model_saved_bytes(cfg, dims, model, dtype, compiled)
             + 2 * Q * R * M * 4)  # backward working set: gradients of the widest activation
    # The policy update and the no-grad TD targets run while the world model's gradients are not
    # allocated (they are counted apart, in MemoryEstimate.gradients): subtract them there.
    wm_grads = 4 * sum(p.numel() for p in model.world_model_parameters())
    policy = policy_saved_bytes(cfg, dims, dtype, compiled) + 4 * _numel(model._pi) - wm_grads
    no_grad = R * (_encoder_saved(dims, 1, d, hid, 12) + 2 * ((L + A) * d + 3 * M * d + nb * 4)) - wm_grads
    return batch + targets + max(world, policy, no_grad)
