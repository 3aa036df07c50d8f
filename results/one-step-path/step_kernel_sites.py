"""Where the counted ops of one numpy seeding step come from (step_kernels.py counts them): each op the kernel
counter counts, with the line of the package that called it, on CUDA's code path, 8 envs of Pendulum-v1. The
counter sees only CPU tensors here, so this tells which ops touch the host step's own flags (no GPU kernel) and
which are torch.where's wrapped Python scalars (CPU tensors on CUDA too).

    python results/one-step-path/step_kernel_sites.py
"""

import tempfile
from pathlib import Path

import torch

from tdmpc.bench.kernels import count_kernels
from tdmpc.config import Config, validate
from tdmpc.runtime.device import cuda_code_path
from tdmpc.training.setup import trainer_for

cfg = validate(Config(task="Pendulum-v1", device="cpu", model_size=1, num_envs=8, seed_steps=10**6, steps=10**7,
                      eval_freq=10**9, eval_episodes=0, save_every=10**9, log_every=10**9, progress=False,
                      tensorboard=False, threads=1))
with cuda_code_path(), tempfile.TemporaryDirectory() as tmp:
    trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
    for _ in range(3):
        trainer.step()
    counter = count_kernels(trainer.step, sites=True)
    trainer.close()
assert counter.sites is not None
for (op, site), n in sorted(counter.sites.items(), key=lambda kv: kv[0][1]):
    print(f"{n}  {op:<14} {site}")
print(f"{counter.total} in all")
