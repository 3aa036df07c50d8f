"""Learning: one gradient step of the world model, then of the policy prior, from a batch of sub-trajectories, with
the optimisers, the running Q scale and the clipping (folded into fused Adam). The losses are tdmpc/losses.py's.

update() reads nothing back: metrics stay on the device and a non-finite update is skipped by the fused optimiser
itself.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import Tensor

from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.losses import LossSetup, policy_loss, world_model_loss
from tdmpc.model.random import TORCH, RandomSource
from tdmpc.model.world_model import ModelDims, WorldModel
from tdmpc.runtime.compile import compile_enabled, compiled_if
from tdmpc.runtime.cuda_graphs import CUDAGraphed
from tdmpc.runtime.device import resolve_dtype
from tdmpc.runtime.distributed import Shard


class Learner:
    def __init__(self, cfg: Config, dims: ModelDims, model: WorldModel, discount: float | Tensor,
                 device: torch.device, shard: Shard, graphs: bool):
        """shard: this process's rank in data-parallel training, whose updates average gradients over the ranks.
        graphs: update() replays as a CUDA graph (static shapes, no host syncs)."""
        self.cfg, self.dims, self.model, self.device, self.shard, self.graphs = cfg, dims, model, device, shard, graphs
        self.random: RandomSource = TORCH  # Agent.use_random() sets the agent's
        self.train_dtype = resolve_dtype(cfg.train_precision, device)
        self.fp32_values = cfg.train_precision == "mixed"
        m = model
        fused: dict[str, Any] = dict(fused=True, capturable=device.type == "cuda")
        heads = [*m._dynamics.parameters(), *m._reward.parameters(), *m._Qs.parameters()]
        if m._termination is not None:
            heads += list(m._termination.parameters())
        if dims.multitask:  # the task embedding trains with the world model, as in the reference
            heads += list(m._task_emb.parameters())
        self.optim = torch.optim.Adam([  # type: ignore[arg-type]
            {"params": list(m._encoder.parameters()), "lr": cfg.lr * cfg.enc_lr_scale},
            {"params": heads},
        ], lr=cfg.lr, **fused)
        self.pi_optim = torch.optim.Adam(m._pi.parameters(), lr=cfg.lr, eps=1e-5, **fused)
        # Running 5-95% range of Q, for the policy loss: one, or one per task of the set (Config.task_scales).
        self.scale = torch.ones(len(dims.tasks) if dims.multitask and cfg.task_scales else (), device=device)
        self.nonfinite = torch.zeros((), device=device)  # skipped updates (non-finite gradients)
        self._quantiles = torch.tensor([0.05, 0.95], device=device)
        self.losses = LossSetup(model, cfg, discount, cfg.rho ** torch.arange(cfg.horizon + 1, device=device,
                                                                               dtype=torch.float32),
                                self._noise, self._autocast, self._values)
        self._update_fn: Callable = CUDAGraphed(self._update_tensors) if graphs else self._update_tensors
        # With cfg.compile the losses (forward and backward, through AOTAutograd) and the clipping statistics are
        # compiled graphs; backward() and the fused optimiser steps run between them. Data-parallel updates stay
        # eager (collectives).
        compile_update = compile_enabled(cfg.compile, device) and shard.world == 1
        self._model_loss = compiled_if(compile_update, self._model_loss_eager, "update() world-model loss")
        self._pi_loss = compiled_if(compile_update, self._pi_loss_eager, "update() policy loss")
        self._clip_stats: dict[torch.optim.Optimizer, Callable] = {
            optim: compiled_if(compile_update, self._clip_stats_eager, f"update() {name} clipping")
            for optim, name in ((self.optim, "world-model"), (self.pi_optim, "policy"))}

    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One gradient step of the world model, then of the policy; metrics stay on the device.

        A multi-task batch carries one task id per sub-trajectory: its embedding and its discount."""
        if (batch.task is None) == self.dims.multitask:
            raise ValueError("a multi-task model trains on batches with task ids, a single-task model without")
        tensors = (batch.obs, batch.action, batch.reward, batch.terminated)
        return self._update_fn(*tensors) if batch.task is None else self._update_fn(*tensors, batch.task)

    def _update_tensors(self, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
                        task: Tensor | None = None) -> dict[str, Tensor]:
        m = self.model
        m.train()
        action = m.action_input(action)  # a discrete model's stored integers as one-hot rows
        total, losses, zs, reached = self._model_loss(obs, action, reward, terminated, task)
        total.backward()
        grad_norm, skipped = self._optimizer_step(self.optim)
        pi_metrics = self._update_pi(zs.detach(), task, reached)
        m.soft_update_targets(self.cfg.tau)
        m.eval()
        return {**losses, "total_loss": total.detach(), "grad_norm": grad_norm, "skipped": skipped, **pi_metrics}

    def _model_loss_eager(self, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
                          task: Tensor | None) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
        return world_model_loss(self.losses, obs, action, reward, terminated, task)

    def _update_pi(self, zs: Tensor, task: Tensor | None, reached: Tensor | None = None) -> dict[str, Tensor]:
        loss, metrics = self._pi_loss(zs, task, reached)
        loss.backward()
        grad_norm, skipped = self._optimizer_step(self.pi_optim)
        return {"pi_loss": loss.detach(), "pi_grad_norm": grad_norm, "pi_skipped": skipped, **metrics}

    def _pi_loss_eager(self, zs: Tensor, task: Tensor | None, reached: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        # the scale's metric inside the (compiled) loss, as before the losses moved: no kernel of its own
        loss, metrics = policy_loss(self.losses, zs, task, reached, self._scale_for)
        return loss, {**metrics, "pi_scale": self.scale.mean()}

    def _scale_for(self, q: Tensor, task: Tensor | None) -> Tensor:
        """Update the running scale with the batch's Q at t = 0 (over every rank's rows) and return what the
        policy loss divides Q by: the scale, or each row's task's."""
        self._update_scale(self.shard.gather(q), None if task is None else self.shard.gather(task))
        return self.scale if self.scale.dim() == 0 else self.scale[task].view(1, -1, 1)

    def _noise(self, name: str, rows: torch.Size) -> Tensor:
        """N(0, 1) policy noise for batch rows (T, B): drawn for the global batch and sliced for this rank, so
        the ranks together draw what one process would."""
        T, B = rows
        draw = self.random.normal(name, (T, B * self.shard.world, self.dims.action_dim), self.device)
        return self.shard.rows(draw, B, 1)

    def _autocast(self) -> contextlib.AbstractContextManager:
        # The autocast weight cache must be off while CUDA graphs capture.
        return torch.autocast(self.device.type, dtype=self.train_dtype, enabled=self.train_dtype != torch.float32,
                              cache_enabled=not self.graphs)

    def _values(self, z: Tensor) -> tuple[contextlib.AbstractContextManager, Tensor]:
        """Where Q heads read latents in an update: with train_precision 'mixed', outside autocast and from fp32
        latents (bf16 rounding there is as large as a per-step reward, RESULTS.md); otherwise as the rest."""
        if self.fp32_values:
            return torch.autocast(self.device.type, enabled=False), z.float()
        return contextlib.nullcontext(), z

    @torch.no_grad()
    def _update_scale(self, q: Tensor, task: Tensor | None) -> None:
        """scale <- lerp(scale, max(1, P95 - P5 of q), tau) over the batch's (B, 1) q, or per task over each task's
        rows (a task absent from the batch keeps its scale). The percentiles interpolate linearly between sorted
        values, as the reference does; no loop over tasks and no checks that would sync the host."""
        q = q.flatten()
        if self.scale.dim() == 0:
            rows = torch.ones(1, q.numel(), dtype=torch.bool, device=q.device)
        else:  # (tasks, B): which rows are each task's; the others sort last as +inf
            rows = task.view(1, -1) == torch.arange(self.scale.numel(), device=q.device).view(-1, 1)  # type: ignore[union-attr]
        x = torch.where(rows, q, torch.inf).sort(dim=1).values
        n = rows.sum(1, keepdim=True)
        pos = self._quantiles * (n - 1).clamp(min=0)  # (groups, 2)
        lo = pos.floor().long()
        hi = torch.minimum(lo + 1, (n - 1).clamp(min=0))
        frac = pos - lo
        p5, p95 = (x.gather(1, lo) * (1 - frac) + x.gather(1, hi) * frac).unbind(1)
        value = (p95 - p5).clamp(min=1.0)
        update = torch.isfinite(value) & (n.squeeze(1) > 0)
        self.scale.lerp_(torch.where(update, value, self.scale.view(-1)).view_as(self.scale), self.cfg.tau)

    def _optimizer_step(self, optim: torch.optim.Optimizer) -> tuple[Tensor, Tensor]:
        """Clip, then step unless the gradient is non-finite, both inside fused Adam: it divides the gradients by
        `grad_scale` and skips the step on `found_inf` (_clip_stats), so no kernel rescales the gradients.

        Returns the gradient norm and 1.0 if the step was skipped (both on the device)."""
        grads = self.grads(optim)
        self.shard.average(grads)  # data-parallel ranks step with the global batch's gradient
        # The per-tensor norms and their stack stay eager (a multi-tensor kernel and one copy): compiled, Triton
        # stacks 0-d tensors one kernel each, one per parameter tensor (46 of the H200 update's 346 kernels).
        grad_norm, found_inf, grad_scale = self._clip_stats[optim](torch.stack(torch._foreach_norm(grads)))
        optim.grad_scale, optim.found_inf = grad_scale, found_inf  # type: ignore[attr-defined]
        optim.step()
        optim.zero_grad(set_to_none=True)
        return grad_norm, found_inf

    @staticmethod
    def grads(optim: torch.optim.Optimizer) -> list[Tensor]:
        """The gradients an optimiser steps with (its parameters' that have one)."""
        return [p.grad for g in optim.param_groups for p in g["params"] if p.grad is not None]

    def _clip_stats_eager(self, norms: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """From the gradient tensors' norms: the gradient's norm; 1.0 if it is not finite, else 0.0 (counted into
        `nonfinite`); and fused Adam's grad_scale, max(1, norm / grad_clip_norm): clipping to grad_clip_norm, as
        torch's clip_grad_norm_ does but for its 1e-6 added to the norm, which moves a float32 norm above 16 by at
        most one ulp (1.9e-6) and one of 32 or more not at all (tests/test_update_parity.py holds the result to the
        reference's). Compiled, this is one kernel instead of six."""
        grad_norm = torch.linalg.vector_norm(norms)
        found_inf = (grad_norm - grad_norm).isnan().float()  # inf - inf and nan - nan are nan
        self.nonfinite.add_(found_inf)
        return grad_norm, found_inf, (grad_norm / self.cfg.grad_clip_norm).clamp(min=1.0)

    def state_dict(self) -> dict:
        return {"optim": self.optim.state_dict(), "pi_optim": self.pi_optim.state_dict(), "scale": self.scale,
                "nonfinite": self.nonfinite}

    def load_state_dict(self, state: dict) -> None:
        if "optim" in state:
            self.optim.load_state_dict(state["optim"])
            self.pi_optim.load_state_dict(state["pi_optim"])
        if "scale" in state:  # a shared scale fills every task's; per-task scales averaged into a shared one
            self.scale.copy_(state["scale"] if self.scale.dim() else state["scale"].mean())
            self.nonfinite.copy_(state["nonfinite"])
