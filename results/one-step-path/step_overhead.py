"""The step path's own time per vector step (everything but acting and updating), numpy envs, on the CPU: N
Pendulum-v1 envs, model size 1, after seeding and the pretraining burst; the time in Agent.act_on_device and
Trainer.update is taken out. Run against an install (the one before with PYTHONPATH=/tmp/before_site, from /tmp);
prints JSON {num_envs: {"step_ms": .., "agent_ms": .., "path_ms": ..}} (medians over vector steps)."""

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tdmpc.agent import Agent
from tdmpc.config import Config, validate
from tdmpc.training.setup import trainer_for
from tdmpc.training.trainer import Trainer

spent = [0.0]


def timed(fn):
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
    return call


Agent.act_on_device = timed(Agent.act_on_device)
Trainer.update = timed(Trainer.update)
out = {}
for n in (1, 8, 64):
    cfg = validate(Config(task="Pendulum-v1", device="cpu", model_size=1, num_envs=n, seed_steps=200, steps=10**7,
                          num_samples=64, num_elites=8, num_pi_trajs=4, iterations=1, batch_size=32,
                          updates_per_round=1, eval_freq=10**9, eval_episodes=0, save_every=10**9, log_every=10**9,
                          progress=False, tensorboard=False, threads=1))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
        while trainer.counters.step < 200 + 20 * n:
            trainer.step()
        steps, agent = [], []
        for _ in range(200):
            spent[0] = 0.0
            t0 = time.perf_counter()
            trainer.step()
            steps.append(time.perf_counter() - t0)
            agent.append(spent[0])
        trainer.close()
    path = [s - a for s, a in zip(steps, agent)]
    out[n] = {k: round(1000 * statistics.median(v), 3) for k, v in (("step_ms", steps), ("agent_ms", agent),
                                                                      ("path_ms", path))}
print(json.dumps(out))
