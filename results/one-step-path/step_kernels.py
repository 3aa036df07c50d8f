"""Kernels of one seeding step of the numpy path (env step and store; no act, no update), counted on the CPU on
CUDA's code path: what the one step path adds to a GPU's work per vector step. Run against an install (the one
before with PYTHONPATH=/tmp/before_site, from /tmp), prints JSON: {num_envs: kernels}.

With --sites (an install from 85034f7 on), each counted op of the 8-env step with the line of the package that
called it instead: the counter sees only CPU tensors here, so this tells which ops touch the host step's own
flags (no GPU kernel) and which are torch.where's wrapped Python scalars (CPU tensors on CUDA too)."""

import json
import sys
import tempfile
from pathlib import Path

import torch

from tdmpc.bench.kernels import count_kernels
from tdmpc.config import Config, validate
from tdmpc.runtime.device import cuda_code_path
from tdmpc.training.setup import trainer_for

sites = "--sites" in sys.argv[1:]
out = {}
for n in (8,) if sites else (1, 8):
    cfg = validate(Config(task="Pendulum-v1", device="cpu", model_size=1, num_envs=n, seed_steps=10**6, steps=10**7,
                          eval_freq=10**9, eval_episodes=0, save_every=10**9, log_every=10**9, progress=False,
                          tensorboard=False, threads=1))
    with cuda_code_path(), tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
        for _ in range(3):
            trainer.step()
        counter = count_kernels(trainer.step, sites=True) if sites else count_kernels(trainer.step)
        out[n] = counter.total
        trainer.close()
if sites:
    assert counter.sites is not None
    for (op, site), k in sorted(counter.sites.items(), key=lambda kv: kv[0][1]):
        print(f"{k}  {op:<14} {site}")
    print(f"{counter.total} in all")
else:
    print(json.dumps(out))
