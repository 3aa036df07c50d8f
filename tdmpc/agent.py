"""The TD-MPC2 agent: an Actor that plans with the world model (tdmpc/actor.py) and a Learner that updates it from
replayed sub-trajectories (tdmpc/learner.py, with the losses in tdmpc/losses.py), around one model; plus
checkpoints, ours and the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from tdmpc.actor import Actor
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.errors import CheckpointError
from tdmpc.learner import Learner
from tdmpc.model import checkpoint
from tdmpc.model.random import RandomSource
from tdmpc.model.world_model import ModelDims, WorldModel
from tdmpc.planners.base import Planner
from tdmpc.planners.mppi import MPPIConfig
from tdmpc.runtime.device import resolve_device, set_matmul_precision, set_threads
from tdmpc.runtime.distributed import SINGLE, Shard
from tdmpc.runtime.streams import UpdateStream
from tdmpc.tasks.sets import reference_info


def discount_for(episode_length: int, cfg: Config) -> float:
    """Longer episodes get a longer horizon: gamma = (f - 1) / f with f = L / 5, clipped."""
    f = episode_length / cfg.discount_denom
    return float(min(max((f - 1) / f, cfg.discount_min), cfg.discount_max))


class Agent:
    """The world model, its planner (Actor: act) and its updates (Learner: update), as a run trains and an
    evaluation plays them. Agent.from_checkpoint loads one; act() plays it."""

    def __init__(self, cfg: Config, dims: ModelDims, episode_length: int | Sequence[int], device: torch.device,
                 shard: Shard = SINGLE):
        """episode_length: agent steps per episode; for a multi-task model, one per task of its task set
        (each task gets its own discount, as in the reference). shard: this process's rank in data-parallel
        training (tdmpc.runtime.distributed), whose updates then average gradients over the ranks."""
        self.cfg, self.dims, self.device, self.shard = cfg, dims, device, shard
        self.episode_length = episode_length
        self.imported_from_reference = False  # set by from_checkpoint for a reference TD-MPC2 file
        if dims.multitask:
            lengths = list(episode_length) if isinstance(episode_length, Sequence) else [episode_length] * len(dims.tasks)
            if len(lengths) != len(dims.tasks):
                raise ValueError(f"{len(lengths)} episode lengths for a model of {len(dims.tasks)} tasks")
            self.discount: float | Tensor = torch.tensor([discount_for(n, cfg) for n in lengths], device=device)
        else:
            assert isinstance(episode_length, int)
            self.discount = discount_for(episode_length, cfg)
        set_matmul_precision(cfg.matmul_precision, device)
        self.model = WorldModel(dims).to(device)
        self.model.eval()
        # On CUDA, plan() and update() replay as CUDA graphs (static shapes, no host syncs); not across ranks.
        self.graphs = device.type == "cuda" and cfg.cuda_graphs and shard.world == 1
        self.learner = Learner(cfg, dims, self.model, self.discount, device, shard, self.graphs)
        self.streams = UpdateStream(device, cfg.update_stream and bool(cfg.overlap_updates))
        self.actor = Actor(cfg, dims, self.model, self.discount, device, self.graphs, self.streams)

    # --- acting (Actor) -----------------------------------------------------------
    def act(self, obs: np.ndarray | Tensor, first_step: np.ndarray | Tensor | bool | None = None,
            eval_mode: bool = False, role: str | None = None,
            task: int | str | Sequence | np.ndarray | Tensor | None = None) -> np.ndarray | int | Tensor:
        return self.actor.act(obs, first_step, eval_mode, role, task)

    def act_on_device(self, obs: Tensor, first: Tensor, eval_mode: bool = False, role: str | None = None,
                      task: Tensor | None = None) -> Tensor:
        return self.actor.act_on_device(obs, first, eval_mode, role, task)

    act.__doc__, act_on_device.__doc__ = Actor.act.__doc__, Actor.act_on_device.__doc__  # the Actor's own words

    def planner(self, num_envs: int, role: str = "train") -> Planner:
        return self.actor.planner(num_envs, role)

    def task_ids(self, task: int | str | Sequence | np.ndarray | Tensor | None, n: int) -> Tensor | None:
        return self.actor.task_ids(task, n)

    task_ids.__doc__ = Actor.task_ids.__doc__

    def predicts_termination(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.actor.predicts_termination(obs, action)

    @property
    def plan_model(self) -> WorldModel:
        return self.actor.plan_model

    @property
    def planner_cfg(self) -> MPPIConfig:
        return self.actor.planner_cfg

    @property
    def plan_dtype(self) -> torch.dtype:
        return self.actor.plan_dtype

    # --- learning (Learner) -------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, Tensor]:
        """Learner.update: one gradient step of the world model, then of the policy; metrics stay on the device.
        The next plan reads the updated weights."""
        metrics = self.learner.update(batch)
        self.weights_changed()
        return metrics

    def weights_changed(self) -> None:
        """The model's weights were written (an update, a load, --init-from): the next plan refreshes its copy."""
        self.actor.stale = True

    @property
    def optim(self) -> torch.optim.Optimizer:
        return self.learner.optim

    @property
    def pi_optim(self) -> torch.optim.Optimizer:
        return self.learner.pi_optim

    @property
    def scale(self) -> Tensor:
        return self.learner.scale

    @property
    def nonfinite(self) -> Tensor:
        return self.learner.nonfinite

    def use_random(self, source: RandomSource) -> None:
        """Take every random draw of update() and plan() from `source` (tdmpc/model/random.py names them): the
        model's, the planning copy's and every planner's. tdmpc.parity replays the reference's recorded draws."""
        self.model.use_random(source)
        self.learner.random = source
        self.actor.use_random(source)

    # --- persistence --------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), **self.learner.state_dict()}

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        checkpoint.load_state_strict(self.model, state["model"], source)
        self.weights_changed()
        self.learner.load_state_dict(state)

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
        arch = ck.dims.config_values()  # the model is the checkpoint's: another architecture is refused, not ignored
        if differs := [f"{k}: checkpoint {arch[k]!r}, given {v!r}" for k, v in overrides.items()
                       if k in arch and k not in ("model_size", "dropout", "task_set") and v != arch[k]]:
            raise CheckpointError(f"{path}: its model's architecture is fixed ({', '.join(differs)}); leave those "
                                  f"settings out")
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
            set_threads(threads, from_python=True)
        agent = cls(ck.cfg, ck.dims, length, resolve_device(device, from_python=True))
        agent.load_state_dict(ck.state, str(path))
        agent.imported_from_reference = ck.imported
        return agent
