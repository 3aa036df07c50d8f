"""What routing every matmul through tdmpc.model.layers.linear costs an fp32 call on the CPU: F.linear (what the
layers called before) against layers.linear at a tiny shape (16 x 32 by 32 x 32), where the call's overhead is all
of its time; one thread, 20,000 calls each after 200 warm-up, three rounds alternating.

    python results/bf16-emulated/linear_overhead.py > results/bf16-emulated/linear_overhead.txt
"""

import subprocess
import time

import torch
import torch.nn.functional as F

from tdmpc.bench.timing import machine_info
from tdmpc.model import layers

torch.set_num_threads(1)
x, w, b = torch.randn(16, 32), torch.randn(32, 32), torch.randn(32)


def us_per_call(fn, n=20_000):
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


info = machine_info(torch.device("cpu"))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"{info['cpu']}, isa {' '.join(info['isa'])}, torch {info['torch']}, at {commit}, one thread:")
for _ in range(3):
    plain, routed = us_per_call(lambda: F.linear(x, w, b)), us_per_call(lambda: layers.linear(x, w, b))
    print(f"F.linear {plain:.2f} us, layers.linear {routed:.2f} us ({routed - plain:+.2f})", flush=True)
