"""Kernels of one seeding step of the numpy path (env step and store; no act, no update), counted on the CPU on
CUDA's code path: what the one step path adds to a GPU's work per vector step. Run against an install (the one
before with PYTHONPATH=/tmp/before_site, from /tmp), prints JSON: {num_envs: kernels}."""

import json
import tempfile
from pathlib import Path

import torch

from tdmpc.bench.kernels import count_kernels
from tdmpc.config import Config, validate
from tdmpc.runtime.device import cuda_code_path
from tdmpc.training.setup import trainer_for

out = {}
for n in (1, 8):
    cfg = validate(Config(task="Pendulum-v1", device="cpu", model_size=1, num_envs=n, seed_steps=10**6, steps=10**7,
                          eval_freq=10**9, eval_episodes=0, save_every=10**9, log_every=10**9, progress=False,
                          tensorboard=False, threads=1))
    with cuda_code_path(), tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
        for _ in range(3):
            trainer.step()
        out[n] = sum(count_kernels(trainer.step).counts.values())
        trainer.close()
print(json.dumps(out))
