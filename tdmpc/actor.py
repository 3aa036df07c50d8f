"""Acting: plans with the world model for one observation or a batch of N, from a frozen planning copy of its
weights in the planning dtype, refreshed lazily after updates. One planner per (N, role), each with its own warm
start; on CUDA every plan() replays as a CUDA graph.

act() copies its actions back to the host, the one device->host copy per step.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from tdmpc.config import Config
from tdmpc.errors import BadInput, TaskError
from tdmpc.model.random import TORCH, RandomSource
from tdmpc.model.planning_copy import planning_copy, sync_copy
from tdmpc.model.world_model import ModelDims, WorldModel
from tdmpc.planners.make import make_planner
from tdmpc.planners.base import Planner
from tdmpc.planners.mppi import MPPIConfig
from tdmpc.runtime.compile import PLAN_OPTIONS, compile_enabled, compiled_if
from tdmpc.runtime.cuda_graphs import CUDAGraphed
from tdmpc.runtime.device import cpu_fast_paths, resolve_dtype
from tdmpc.runtime.streams import UpdateStream
from tdmpc.runtime.transfer import to_device
from tdmpc.tasks.sets import task_set_name

# Candidates per model call when planning on a CPU: ~2 envs at 512 samples. Larger calls
# spill the activations out of cache and batched planning turns memory-bound.
CPU_PLAN_CHUNK_ROWS = 1024


class Actor:
    def __init__(self, cfg: Config, dims: ModelDims, model: WorldModel, discount: float | Tensor,
                 device: torch.device, graphs: bool, streams: UpdateStream):
        """model: the trained model, read through a planning copy; graphs: plan() replays as CUDA graphs;
        streams: where the updates run, which the planning copy's refresh waits for."""
        self.cfg, self.dims, self.model, self.discount = cfg, dims, model, discount
        self.device, self.graphs, self.streams = device, graphs, streams
        self.compile = compile_enabled(cfg.compile, device)
        self.random: RandomSource = TORCH  # Agent.use_random() sets the agent's
        self.plan_dtype = resolve_dtype(cfg.precision, device)
        self.plan_model = planning_copy(model, self.plan_dtype)
        self.stale = False  # the model was updated since the planning copy was refreshed
        self.planner_cfg = MPPIConfig.from_config(cfg, dims.action_dim)
        self._planners: dict[tuple[int, str], Planner] = {}
        self._plan_fns: dict[tuple[int, str, bool], Callable] = {}
        self._warned_large = False  # act() said once that observations are out of range

    def planner(self, num_envs: int, role: str = "train") -> Planner:
        """One planner per (N, role), so evaluation never disturbs the training warm start."""
        key = (num_envs, role)
        if key not in self._planners:
            chunk_rows = (self.cfg.plan_chunk_envs * self.cfg.num_samples if self.cfg.plan_chunk_envs else
                          CPU_PLAN_CHUNK_ROWS if cpu_fast_paths(self.device) else None)
            self._planners[key] = make_planner(self.cfg.planner, self.plan_model, self.planner_cfg, num_envs,
                                               self.dims.action_dim, self.discount, self.device, chunk_rows,
                                               self.random)
        return self._planners[key]

    def use_random(self, source: RandomSource) -> None:
        self.random = source
        self.plan_model.use_random(source)
        for planner in self._planners.values():
            planner.random = source

    def _plan_fn(self, num_envs: int, role: str, eval_mode: bool) -> Callable:
        key = (num_envs, role, eval_mode)
        if key not in self._plan_fns:
            planner = self.planner(num_envs, role)
            # act() runs it in inference mode, or under no_grad when compiled (PyTorch issue 180823)
            graph = compiled_if(self.compile, planner.plan_graph, f"plan() for {num_envs} env(s), {role}", PLAN_OPTIONS)
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
        if names is not None and any(isinstance(t, str) for t in names):
            if not all(isinstance(t, str) for t in names):
                raise TaskError(f"task {task!r} mixes names and ids: give names only or ids only")
            unknown = [t for t in names if t not in tasks]
            if unknown:
                close = difflib.get_close_matches(unknown[0], tasks, n=1, cutoff=0.75)
                raise TaskError(f"task '{unknown[0]}' is not in this model's task set ({task_set_name(tasks)})"
                                + (f"; did you mean {close[0]!r}?" if close else ""))
            task = [tasks.index(t) for t in names]
        try:
            ids = torch.as_tensor(task, dtype=torch.long).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TaskError(f"task {task!r} is not a task name, an id, or one of them per observation ({e})") from None
        if ids.numel() not in (1, n):
            raise TaskError(f"{ids.numel()} tasks for {n} observation{'s' if n != 1 else ''}: give one task for all "
                            f"or one per observation")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= len(tasks)):
            raise TaskError(f"task id {int(ids.max()) if int(ids.max()) >= len(tasks) else int(ids.min())} is "
                            f"out of range: this model has {len(tasks)} tasks (ids 0-{len(tasks) - 1})")
        return ids.expand(n).to(self.device, non_blocking=True)

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
        role: which planner plans (one per batch size and role, each with its own warm start; default 'train',
        or 'eval' with eval_mode): name one per stream of episodes you interleave, so they do not share a plan.

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
        with torch.no_grad() if self.compile else torch.inference_mode():
            if self.stale:
                self.streams.before_refresh()
                sync_copy(self.plan_model, self.model)
                self.stale = False
            self.streams.inputs_ready()  # the plan queued next runs beside the next round of updates
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
            if self.dims.multitask and x.dim() in (1, 2) and 0 < x.shape[-1] < shape[0]:  # a task's own, unpadded
                raise BadInput(f"act() takes {want}, got shape {tuple(x.shape)}: a multi-task model's observations "
                               f"are each task's own zero-padded to {shape[0]} (np.pad(obs, (0, {shape[0]} - "
                               f"len(obs))), as its training envs pad them); its actions come padded the same way")
            raise BadInput(f"act() takes {want}, got shape {tuple(x.shape)}")
        if pixels:
            if x.dtype != torch.uint8:
                raise BadInput(f"act() takes pixel observations as uint8 frames, got {x.dtype}")
        elif x.dtype != torch.float32:
            if x.is_complex():
                raise BadInput(f"act() takes real float32 observations, got {x.dtype}")
            x = x.float()  # bool, integer and float64 observations, as the envs' float32 wrapper converts them
        if x.device.type == "cpu" and not pixels:  # host data, checked in numpy; a tensor on a GPU is not read back
            values = x.detach().numpy().reshape(1 if single else len(x), -1)
            finite = np.isfinite(values).all(1)
            if not finite.all():
                raise BadInput(f"act() got NaN or inf in observation {int(np.flatnonzero(~finite)[0])}: the agent "
                               f"cannot plan from it")
            big = float(np.abs(values).max())
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
    def predicts_termination(self, obs: Tensor, action: Tensor) -> Tensor:
        """(N,) bool on the device: does the termination head say `action` ends the episode from `obs`? It reads
        the latent the dynamics predict, as planning does; evaluation scores it against the env's terminations."""
        m = self.model
        with torch.inference_mode():
            z = m.next(m.encode(obs.to(self.device)), m.action_input(action.to(self.device, torch.float32)))
            return (m.termination(z) > 0.5).squeeze(-1)
