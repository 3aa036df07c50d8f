"""Kernels of one seeding step of the tensor path (a tensor-native env's step and store; no act, no update), counted
on the CPU on CUDA's code path, beside step_kernels.py's numpy step. Run from the checkout root against an install
(PYTHONPATH as in step_kernels.py; the env is the tests' TorchPoint); prints JSON: {num_envs: kernels}."""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests")
from test_tensor_envs import TorchPointEnv, tensor_trainer  # noqa: E402

from tdmpc.bench.kernels import count_kernels  # noqa: E402
from tdmpc.runtime.device import cuda_code_path  # noqa: E402

out = {}
for n in (1, 8):
    with cuda_code_path(), tempfile.TemporaryDirectory() as tmp:
        trainer = tensor_trainer(Path(tmp) / "run", TorchPointEnv(num_envs=n, length=10**6), seed_steps=10**6,
                                 steps=10**7, eval_freq=10**9, save_every=10**9, log_every=10**9)
        for _ in range(3):
            trainer.step()
        out[n] = sum(count_kernels(trainer.step).counts.values())
        trainer.close()
print(json.dumps(out))
