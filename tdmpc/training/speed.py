"""How long would this run take here? One timed act() and update() before a CPU run starts, and a warning
when the answer is hours."""

from __future__ import annotations

import copy
import os
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import CPU_CONFIG, load_json

if TYPE_CHECKING:
    from tdmpc.training.online import OnlineTrainer


def hours_left(agent: Agent, env_steps_left: int, env_tasks: np.ndarray | None = None) -> tuple[float, float, float]:
    """(seconds per plan, seconds per update, hours for the steps left), timed on the agent itself and put back as it
    was (weights, optimisers, RNG), planning with a planner of its own so the training warm start is untouched.
    Not on a copy: a copy's compiled functions would compile again (--compile), where the agent's first calls
    compile what training would compile first anyway. env_tasks: a multi-task run's task of each env."""
    cfg, dims = agent.cfg, agent.dims
    num_envs = cfg.num_envs if env_tasks is None else len(env_tasks)
    obs = np.zeros((num_envs, *dims.obs_shape), dtype=np.float32 if cfg.obs == "state" else np.uint8)
    H, B = cfg.horizon, cfg.batch_size
    task = None if env_tasks is None else torch.as_tensor(env_tasks).repeat(B // num_envs + 1)[:B]
    batch = Batch(torch.zeros(H + 1, B, *dims.obs_shape), torch.zeros(H, B, *dims.action_shape), torch.zeros(H, B),
                  torch.zeros(H, B, dtype=torch.bool), task)
    saved, rng = copy.deepcopy(agent.state_dict()), torch.get_rng_state()
    timings = []
    for fn in (lambda: agent.act(obs, role="timing", task=env_tasks), lambda: agent.update(batch)):
        fn()
        t0 = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - t0)
    agent.load_state_dict(saved)
    torch.set_rng_state(rng)
    assert cfg.action_repeat is not None and cfg.updates_per_round is not None  # filled in by Config.for_task
    vector_steps = max(env_steps_left, 0) / (num_envs * cfg.action_repeat)
    per_step = timings[0] + timings[1] * cfg.updates_per_round / cfg.update_every
    return timings[0], timings[1], vector_steps * per_step / 3600


def warn_if_slow(trainer: OnlineTrainer, limit_hours: float = 3.0) -> None:
    """A config sized for a GPU on a CPU takes days; say so before it starts."""
    c, cfg = trainer.counters, trainer.cfg
    plan_s, update_s, hours = hours_left(trainer.agent, cfg.steps - c.step, trainer.env_tasks)
    if hours > limit_hours:
        cpu = load_json(CPU_CONFIG)
        if all((getattr(cfg, f) or 0) <= getattr(cpu, f) for f in ("model_size", "num_samples", "iterations", "batch_size")):
            advice = (f"The config is no bigger than {CPU_CONFIG}: the cores are busy (load average "
                      f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores) or slow; fewer {trainer.named('steps')} "
                      f"end sooner")
        else:
            cpu_config = (f"cfg=tdmpc.config.load_json({CPU_CONFIG!r})" if trainer.from_python
                          else f"--cfg {CPU_CONFIG}")
            advice = f"This config is sized for a GPU; for CPU training use {cpu_config}"
        trainer.logger.message(
            f"warning: on this CPU one plan takes {plan_s * 1e3:.0f} ms and one update {update_s * 1e3:.0f} ms, "
            f"so {cfg.steps - c.step:,} env steps would take about {hours:.0f} hours. {advice}")
