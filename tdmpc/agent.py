"""The TD-MPC2 agent: acts by planning with the world model, learns from replayed sub-trajectories.

act() copies its actions back to the host, the one device->host copy per step; update()
reads nothing back: metrics stay on the device and non-finite updates are skipped by the
fused optimiser itself.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.errors import BadInput, CheckpointError, TaskError
from tdmpc.model import checkpoint
from tdmpc.model.world_model import ModelDims, WorldModel, planning_copy, sync_copy
from tdmpc.planners.make import make_planner
from tdmpc.planners.mppi import MPPILoop, MPPIConfig
from tdmpc.planners.random import TORCH, RandomSource
from tdmpc.runtime.cuda_graphs import CUDAGraphed
from tdmpc.runtime.compile import compiled_if
from tdmpc.runtime.device import cpu_fast_paths, resolve_device, resolve_dtype, set_matmul_precision, set_threads
from tdmpc.runtime.distributed import SINGLE, Shard
from tdmpc.runtime.transfer import to_device
from tdmpc.tasks.sets import reference_info, task_set_name


# Candidates per model call when planning on a CPU: ~2 envs at 512 samples. Larger calls
# spill the activations out of cache and batched planning turns memory-bound.
CPU_PLAN_CHUNK_ROWS = 1024


def discount_for(episode_length: int, cfg: Config) -> float:
    """Longer episodes get a longer horizon: gamma = (f - 1) / f with f = L / 5, clipped."""
    f = episode_length / cfg.discount_denom
    return float(min(max((f - 1) / f, cfg.discount_min), cfg.discount_max))


class Agent:
    def __init__(self, cfg: Config, dims: ModelDims, episode_length: int | Sequence[int], device: torch.device,
                 shard: Shard = SINGLE):
        """episode_length: agent steps per episode; for a multi-task model, one per task of its task set
        (each task gets its own discount, as in the reference). shard: this process's rank in data-parallel
        training (tdmpc.runtime.distributed), whose updates then average gradients over the ranks."""
        self.cfg, self.dims, self.device, self.shard = cfg, dims, device, shard
        self.episode_length = episode_length
        self.imported_from_reference = False  # set by from_checkpoint for a reference TD-MPC2 file
        self._warned_large = False  # act() said once that observations are out of range
        if dims.multitask:
            lengths = list(episode_length) if isinstance(episode_length, Sequence) else [episode_length] * len(dims.tasks)
            if len(lengths) != len(dims.tasks):
                raise ValueError(f"{len(lengths)} episode lengths for a model of {len(dims.tasks)} tasks")
            self.discount: float | Tensor = torch.tensor([discount_for(n, cfg) for n in lengths], device=device)
        else:
            assert isinstance(episode_length, int)
            self.discount = discount_for(episode_length, cfg)
        set_matmul_precision(cfg.matmul_precision, device)
        self.plan_dtype = resolve_dtype(cfg.precision, device)
        self.train_dtype = resolve_dtype(cfg.train_precision, device)
        self.fp32_values = cfg.train_precision == "mixed"
        self.random: RandomSource = TORCH  # every draw of update() and plan() (use_random)
        self.model = WorldModel(dims).to(device)
        self.model.eval()
        # Planning reads a frozen copy in the planning dtype, refreshed lazily after updates.
        self.plan_model = planning_copy(self.model, self.plan_dtype)
        self._plan_model_stale = False
        m = self.model
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
        H = cfg.horizon
        self._rho = cfg.rho ** torch.arange(H + 1, device=device, dtype=torch.float32)
        self._quantiles = torch.tensor([0.05, 0.95], device=device)
        self.planner_cfg = MPPIConfig.from_config(cfg, dims.action_dim)
        self._planners: dict[tuple[int, str], MPPILoop] = {}
        # On CUDA, plan() and update() replay as CUDA graphs (static shapes, no host syncs); not across ranks.
        self.graphs = device.type == "cuda" and cfg.cuda_graphs and shard.world == 1
        self._plan_fns: dict[tuple[int, str, bool], Callable] = {}
        self._update_fn: Callable = CUDAGraphed(self._update_tensors) if self.graphs else self._update_tensors
        # With cfg.compile the losses (forward and backward, through AOTAutograd) and the clipping statistics are
        # compiled graphs; backward() and the fused optimiser steps run between them. Data-parallel updates stay
        # eager (collectives).
        compile_update = cfg.compile and shard.world == 1
        self._model_loss = compiled_if(compile_update, self._model_loss_eager, "update() world-model loss")
        self._pi_loss = compiled_if(compile_update, self._pi_loss_eager, "update() policy loss")
        self._clip_stats: dict[torch.optim.Optimizer, Callable] = {
            optim: compiled_if(compile_update, self._clip_stats_eager, f"update() {name} clipping")
            for optim, name in ((self.optim, "world-model"), (self.pi_optim, "policy"))}

    # --- acting -------------------------------------------------------------------
    def planner(self, num_envs: int, role: str = "train") -> MPPILoop:
        """One planner per (N, role), so evaluation never disturbs the training warm start."""
        key = (num_envs, role)
        if key not in self._planners:
            chunk_rows = (self.cfg.plan_chunk_envs * self.cfg.num_samples if self.cfg.plan_chunk_envs else
                          CPU_PLAN_CHUNK_ROWS if cpu_fast_paths(self.device) else None)
            self._planners[key] = make_planner(self.plan_model, self.planner_cfg, num_envs, self.dims.action_dim,
                                               self.discount, self.device, chunk_rows, self.random)
        return self._planners[key]

    def use_random(self, source: RandomSource) -> None:
        """Take every random draw of update() and plan() from `source` (planners/random.py names them): the model's,
        the planning copy's and every planner's. tdmpc.parity replays the reference's recorded draws through it."""
        self.random = source
        self.model.use_random(source)
        self.plan_model.use_random(source)
        for planner in self._planners.values():
            planner.random = source

    def _plan_fn(self, num_envs: int, role: str, eval_mode: bool) -> Callable:
        key = (num_envs, role, eval_mode)
        if key not in self._plan_fns:
            planner = self.planner(num_envs, role)
            # act() runs it in inference mode, or under no_grad when compiled (PyTorch issue 180823)
            graph = compiled_if(self.cfg.compile, planner.plan_graph, f"plan() for {num_envs} env(s), {role}")
            fn = lambda obs, first, *task: graph(obs, first, eval_mode, *task)  # noqa: E731
            self._plan_fns[key] = CUDAGraphed(fn) if self.graphs else fn
        return self._plan_fns[key]

    def task_ids(self, task: int | str | Sequence | np.ndarray | Tensor | None, n: int) -> Tensor | None:
        """(n,) task ids on the device for a multi-task model (names or ids, one for all or one per row);
        None for a single-task one. Out-of-range ids and unknown names are one-line TaskErrors."""
        tasks = self.dims.tasks
        if not tasks:
            if task is not None:
                raise TaskError("this is a single-task model: it takes no task")
            return None
        if task is None:
            raise TaskError(f"a multi-task model needs the task of each observation (one of {len(tasks)}: "
                            f"{', '.join(tasks[:4])}, ...)")
        names = [task] if isinstance(task, str) else list(task) if isinstance(task, (list, tuple)) else None
        if names is not None and all(isinstance(t, str) for t in names):
            unknown = [t for t in names if t not in tasks]
            if unknown:
                raise TaskError(f"task '{unknown[0]}' is not in this model's task set ({task_set_name(tasks)})")
            task = [tasks.index(t) for t in names]
        ids = torch.as_tensor(task, dtype=torch.long).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= len(tasks)):
            raise TaskError(f"task id {int(ids.max()) if int(ids.max()) >= len(tasks) else int(ids.min())} is "
                            f"out of range: this model has {len(tasks)} tasks (ids 0-{len(tasks) - 1})")
        return ids.expand(n).to(self.device, non_blocking=True)

    def _autocast(self):
        # The autocast weight cache must be off while CUDA graphs capture.
        return torch.autocast(self.device.type, dtype=self.train_dtype, enabled=self.train_dtype != torch.float32,
                              cache_enabled=not self.graphs)

    def _values(self, z: Tensor) -> tuple[contextlib.AbstractContextManager, Tensor]:
        """Where Q heads read latents in an update: with train_precision 'mixed', outside autocast and from fp32
        latents (bf16 rounding there is as large as a per-step reward, RESULTS.md); otherwise as the rest."""
        if self.fp32_values:
            return torch.autocast(self.device.type, enabled=False), z.float()
        return contextlib.nullcontext(), z

    def act(self, obs: np.ndarray | Tensor, first_step: np.ndarray | Tensor | bool | None = None,
            eval_mode: bool = False, role: str | None = None,
            task: int | str | Sequence | np.ndarray | Tensor | None = None) -> np.ndarray | int | Tensor:
        """Actions for one observation or a batch of N: in [-1, 1], (A,) or (N, A), for a continuous model; a
        discrete model's are integers, an int or (N,). Numpy (or lists) in, numpy out; a torch tensor in, a tensor
        out, on the agent's device and without a copy to the host (a GPU simulator's observations), one discrete
        action as a 0-d tensor.

        first_step marks envs whose episode just began (True for all at the first call of an
        episode): their plan starts afresh instead of from the last plan's mean. Default: none.
        eval_mode: act as evaluation does (the plan's mean, a discrete plan's most probable action) instead of
        with training's exploration noise.
        task: a multi-task model's task of each observation (a name or id, or one per row).

        Integer or bool observations are converted as training converts them (to float32; pixels stay uint8).
        An observation of the wrong shape, an empty batch, a bad first_step, and NaN or inf in observations
        on the host (numpy, lists, CPU tensors; not tensors on a GPU, which checking would read back from the
        device) are a one-line ValueError (BadInput); values beyond 1e6 are warned about once."""
        obs_t, single = self._observations(obs)
        n = obs_t.shape[0]
        first = self._first_steps(first_step, n)
        if not isinstance(obs, Tensor) or (obs_t.device.type == "cpu" and self.device.type != "cpu"):
            obs_t, first = to_device(self.device, obs_t, first)  # host observations and flags in one copy
        planned = self.act_on_device(obs_t, first.to(self.device, non_blocking=True), eval_mode, role,
                                     self.task_ids(task, n))
        if isinstance(obs, Tensor):
            return planned.clone() if not single else planned[0].clone()  # not the planner's reused buffer
        actions = planned.cpu().numpy()
        if not single:
            return actions
        return actions[0].item() if actions.ndim == 1 else actions[0]  # one discrete action: a Python int

    def act_on_device(self, obs: Tensor, first: Tensor, eval_mode: bool = False, role: str | None = None,
                      task: Tensor | None = None) -> Tensor:
        """act() for a batch already on the agent's device and checked: (N, *obs_shape) observations, (N,) bool
        first-step flags and (N,) task ids (task_ids()) or None -> actions on the device, as the envs take them: (N, A)
        float32, or (N,) integers for a discrete model. Training acts on its replay buffer's newest rows through it,
        so an env step sends nothing to the device to act."""
        # Inference mode, or no_grad for compiled planning: inductor cannot compile on inference tensors.
        with torch.no_grad() if self.cfg.compile else torch.inference_mode():
            if self._plan_model_stale:
                sync_copy(self.plan_model, self.model)
                self._plan_model_stale = False
            n = obs.shape[0]
            if self.cfg.mpc:
                plan = self._plan_fn(n, role or ("eval" if eval_mode else "train"), eval_mode)
                a = plan(obs, first) if task is None else plan(obs, first, task)
            else:
                policy = self.plan_model.pi(self.plan_model.encode(obs, task), task)
                a = policy.mean if eval_mode else policy.action
            return self.plan_model.env_action(a)

    def _observations(self, obs: np.ndarray | Tensor) -> tuple[Tensor, bool]:
        """(N, *obs_shape) observations in the dtype the model takes, and whether one was given unbatched."""
        shape, pixels = tuple(self.dims.obs_shape), self.dims.pixels
        want = f"one observation of shape {shape} or a batch of shape (N, {', '.join(map(str, shape))})"
        try:
            x = torch.as_tensor(obs)
        except (TypeError, ValueError, RuntimeError) as e:
            raise BadInput(f"act() takes {want} ({'uint8' if pixels else 'float32'}), not {type(obs).__name__}: "
                           f"{str(e).splitlines()[0]}") from None
        single = tuple(x.shape) == shape
        if not single and not (x.dim() == len(shape) + 1 and tuple(x.shape[1:]) == shape and x.shape[0] > 0):
            raise BadInput(f"act() takes {want}, got shape {tuple(x.shape)}")
        if pixels:
            if x.dtype != torch.uint8:
                raise BadInput(f"act() takes pixel observations as uint8 frames, got {x.dtype}")
        elif x.dtype != torch.float32:
            if x.is_complex():
                raise BadInput(f"act() takes real float32 observations, got {x.dtype}")
            x = x.float()  # bool, integer and float64 observations, as the envs' float32 wrapper converts them
        if x.device.type == "cpu" and not pixels:  # host data; a tensor on a GPU is not read back
            values = x.detach().reshape(1 if single else len(x), -1)
            finite = torch.isfinite(values).all(1)
            if not bool(finite.all()):
                raise BadInput(f"act() got NaN or inf in observation {int(torch.nonzero(~finite)[0, 0])}: the agent "
                               f"cannot plan from it")
            big = float(values.abs().max())
            if big > 1e6 and not self._warned_large:
                self._warned_large = True
                warnings.warn(f"act() got observation values up to {big:.3g}: far outside what the encoder was "
                              f"trained on, so its latent is not to be trusted", stacklevel=4)
        return (x.unsqueeze(0) if single else x), single

    @staticmethod
    def _first_steps(first_step: np.ndarray | Tensor | bool | None, n: int) -> Tensor:
        """(n,) bool: one flag for every observation, or one per observation."""
        if first_step is None:
            return torch.zeros(n, dtype=torch.bool)
        if isinstance(first_step, str) or not isinstance(first_step, (bool, np.bool_, np.ndarray, Tensor, list, tuple)):
            raise BadInput(f"first_step takes a bool or one bool per observation, not {type(first_step).__name__}")
        flags = torch.as_tensor(first_step, dtype=torch.bool).reshape(-1)
        if flags.numel() not in (1, n):
            raise BadInput(f"first_step has {flags.numel()} flags for {n} observations")
        return flags.expand(n)

    @torch.inference_mode()
    def predicts_termination(self, obs: np.ndarray | Tensor, action: np.ndarray | Tensor) -> np.ndarray:
        """(N,) bool: does the termination head say `action` ends the episode from `obs`? It reads the latent the
        dynamics predict, as planning does; evaluation scores it against the env's terminations."""
        m = self.model
        z = m.encode(torch.as_tensor(obs).to(self.device))
        z = m.next(z, m.action_input(torch.as_tensor(action, dtype=torch.float32).to(self.device)))
        return (m.termination(z) > 0.5).squeeze(-1).cpu().numpy()

    # --- learning -----------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, Tensor]:
        """One gradient step of the world model, then of the policy; metrics stay on the device.

        A multi-task batch carries one task id per sub-trajectory: its embedding and its discount."""
        if (batch.task is None) == self.dims.multitask:
            raise ValueError("a multi-task model trains on batches with task ids, a single-task model without")
        tensors = (batch.obs, batch.action, batch.reward, batch.terminated)
        metrics = self._update_fn(*tensors) if batch.task is None else self._update_fn(*tensors, batch.task)
        self._plan_model_stale = True
        return metrics

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
        """The world model's loss (TD targets from the target Qs), its parts (detached), the latents of the
        rollout and which of them the episode reached (for the policy update)."""
        cfg, m = self.cfg, self.model
        batch = Batch(obs, action, reward, terminated, task)
        H = cfg.horizon
        rho = self._rho[:H]
        discount = self.discount if task is None else self.discount[task]  # type: ignore[index]
        with self._autocast():
            # State observations: one encoder pass for z_0 (with grad) and the targets' latents (detached); the
            # weight gradients' rows this adds are cheap. Pixels: the targets' frames apart, without grad, since
            # convolution weight gradients over H+1 frames would cost more than the launches they save.
            z_all = None if self.dims.pixels else m.encode(batch.obs, task)
        with torch.no_grad(), self._autocast():
            # The targets' frames unshifted: the reference encodes them in eval mode.
            next_z = m.encode(batch.obs[1:], task, augment=False) if z_all is None else z_all[1:].detach()
            next_action = m.pi(next_z, task, eps=self._noise("td_target.pi_eps", next_z.shape[:-1])).action
            values, z_in = self._values(next_z)
            with values:
                next_q = m.prior_q(z_in, task, "min", target=True, action=next_action).squeeze(-1)
            td_target = batch.reward + discount * (1 - batch.terminated.float()) * next_q
        # (H, B) 1 up to and including a terminal step, 0 after it: a start near the end of a terminated episode
        # reaches past it (ReplayBuffer); those steps are not the episode's and get no loss. All 1 without one.
        ended = batch.terminated.long()
        alive = (ended.cumsum(0) - ended == 0).float()

        with self._autocast():
            z = m.encode(batch.obs[0], task) if z_all is None else z_all[0]
            zs_list = [z]
            for t in range(H):
                zs_list.append(m.next(zs_list[-1], batch.action[t], task))
            zs = torch.stack(zs_list)  # (H+1, B, L)
            consistency = (F.mse_loss(zs[1:].float(), next_z.float(), reduction="none").mean(2) * alive).mean(1)
            reward_ce = (m.two_hot.cross_entropy(m.reward(zs[:-1], batch.action, task), batch.reward) * alive).mean(1)
            values, z_in = self._values(zs[:-1])
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

    def _update_pi(self, zs: Tensor, task: Tensor | None, reached: Tensor | None = None) -> dict[str, Tensor]:
        """Maximise Q of the prior's actions plus an entropy bonus, on detached latents (H+1, B, L); `reached`
        (H+1, B) weights out latents past an episode's end."""
        loss, metrics = self._pi_loss(zs, task, reached)
        loss.backward()
        grad_norm, skipped = self._optimizer_step(self.pi_optim)
        return {"pi_loss": loss.detach(), "pi_grad_norm": grad_norm, "pi_skipped": skipped, **metrics}

    def _pi_loss_eager(self, zs: Tensor, task: Tensor | None, reached: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        cfg, m = self.cfg, self.model
        with self._autocast():
            policy = m.pi(zs, task, eps=self._noise("pi.pi_eps", zs.shape[:-1]))
            values, z_in = self._values(zs)
            with values:
                q = m.prior_value(z_in, policy, task).float()
        self._update_scale(self.shard.gather(q[0]), None if task is None else self.shard.gather(task))
        scale = self.scale if self.scale.dim() == 0 else self.scale[task].view(1, -1, 1)
        bonus = policy.scaled_entropy
        if cfg.entropy_bonus == "squashed":  # Config.entropy_bonus says why
            bonus = bonus + policy.squash_correction
        objective = cfg.entropy_coef * bonus + q / scale
        if m.discrete and cfg.uniform_prior_coef:  # policy.log_std: the categorical's log-probabilities
            objective = objective + cfg.uniform_prior_coef * policy.log_std.mean(-1, keepdim=True)
        if reached is not None and cfg.mask_policy_after_terminal:
            objective = objective * reached.unsqueeze(-1)
        loss = -(self._rho * objective.mean((1, 2))).mean()
        return loss, {"pi_entropy": policy.entropy.mean().detach(),
                      "pi_scaled_entropy": policy.scaled_entropy.mean().detach(), "pi_scale": self.scale.mean()}

    def _noise(self, name: str, rows: torch.Size) -> Tensor:
        """N(0, 1) policy noise for batch rows (T, B): drawn for the global batch and sliced for this rank, so
        the ranks together draw what one process would."""
        T, B = rows
        draw = self.random.normal(name, (T, B * self.shard.world, self.dims.action_dim), self.device)
        return self.shard.rows(draw, B, 1)

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
        grad_norm, found_inf, grad_scale = self._clip_stats[optim](grads)
        optim.grad_scale, optim.found_inf = grad_scale, found_inf  # type: ignore[attr-defined]
        optim.step()
        optim.zero_grad(set_to_none=True)
        return grad_norm, found_inf

    @staticmethod
    def grads(optim: torch.optim.Optimizer) -> list[Tensor]:
        """The gradients an optimiser steps with (its parameters' that have one)."""
        return [p.grad for g in optim.param_groups for p in g["params"] if p.grad is not None]

    def _clip_stats_eager(self, grads: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The gradient's norm; 1.0 if it is not finite, else 0.0 (counted into `nonfinite`); and fused Adam's
        grad_scale, max(1, norm / grad_clip_norm): clipping to grad_clip_norm, as torch's clip_grad_norm_ does but
        for its 1e-6 added to the norm, which moves a float32 norm above 16 by at most one ulp (1.9e-6) and one of
        32 or more not at all (tests/test_update_parity.py holds the result to the reference's). Compiled
        (--compile), this is 2 kernels instead of 8."""
        grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        found_inf = (grad_norm - grad_norm).isnan().float()  # inf - inf and nan - nan are nan
        self.nonfinite.add_(found_inf)
        return grad_norm, found_inf, (grad_norm / self.cfg.grad_clip_norm).clamp(min=1.0)

    # --- persistence --------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict(),
                "pi_optim": self.pi_optim.state_dict(), "scale": self.scale, "nonfinite": self.nonfinite}

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        checkpoint.load_state_strict(self.model, state["model"], source)
        self._plan_model_stale = True
        if "optim" in state:
            self.optim.load_state_dict(state["optim"])
            self.pi_optim.load_state_dict(state["pi_optim"])
        if "scale" in state:  # a shared scale fills every task's; per-task scales averaged into a shared one
            self.scale.copy_(state["scale"] if self.scale.dim() else state["scale"].mean())
            self.nonfinite.copy_(state["nonfinite"])

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Our own checkpoint format; extra holds training state (counters, RNGs...)."""
        checkpoint.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION,
                         "config": self.cfg.to_dict(), "dims": self.dims.to_dict(),
                         "episode_length": self.episode_length if isinstance(self.episode_length, int)
                         else list(self.episode_length), **self.state_dict(), **(extra or {})}, Path(path))

    def load(self, path: str | Path) -> dict:
        obj = checkpoint.load_file(path)
        self.load_state_dict(obj, str(path))
        return obj

    @classmethod
    def from_checkpoint(cls, path: str | Path, task: str | None = None, device: str = "auto",
                        **overrides: object) -> "Agent":
        """An agent from one of our checkpoints or a reference TD-MPC2 one, ready to act.

        A single-task reference file does not name its task: pass `task`, whose episode length sets
        the discount; a multi-task one acts on the task passed to act(). `overrides` are Config fields
        (e.g. num_samples=256, mpc=False); threads=N sets torch's CPU threads for the process, as --threads does
        (without it, torch's own default)."""
        from tdmpc.envs import episode_length, make_env  # the envs pull in gymnasium; acting needs them only here
        from tdmpc.envs.tensor import is_tensor_task

        over = {**overrides, "device": device, **({"task": task} if task else {})}
        ck = checkpoint.read_checkpoint(path, over)
        if ck.imported and task is None and not ck.dims.multitask:
            raise CheckpointError(f"{path}: a reference TD-MPC2 checkpoint does not name its task; "
                                             f"give the task it was trained on (--task walker-walk, or "
                                             f"task='walker-walk' from Python)")
        if task is not None and not ck.dims.multitask and not is_tensor_task(task):  # other sizes: refused now
            env, spec = make_env(task, seed=0, obs=ck.cfg.obs, action_repeat=ck.cfg.action_repeat)
            env.close()
            checkpoint.check_dims_match(ck.dims, spec.obs_shape, spec.action_dim, spec.discrete, spec.task, str(path))
        length: int | Sequence[int]
        if ck.episode_length is not None:
            length = ck.episode_length
        elif ck.dims.multitask:  # each task of the set: the reference's table, or its env
            length = [info.episode_length if (info := reference_info(t)) else episode_length(t, ck.cfg.action_repeat)
                      for t in ck.dims.tasks]
        else:
            length = episode_length(ck.cfg.task, ck.cfg.action_repeat)
        if isinstance(threads := ck.cfg.threads, int) and "threads" in overrides:  # checked by read_checkpoint
            set_threads(threads)
        agent = cls(ck.cfg, ck.dims, length, resolve_device(device))
        agent.load_state_dict(ck.state, str(path))
        agent.imported_from_reference = ck.imported
        return agent
