"""fp32 against bf16 matmuls on this CPU, at the bench's peak shapes: one timed call each after one warm-up,
2 threads. On a CPU without AVX512-BF16 or AMX torch emulates bf16 (docs/speed.md).

    python results/bf16-emulated/matmul.py > results/bf16-emulated/matmul.txt
"""

import time

import torch

from tdmpc.bench.timing import machine_info
from tdmpc.runtime.device import cpu_has_fast_bf16

torch.set_num_threads(2)
info = machine_info(torch.device("cpu"))
print(f"{info['cpu']}, isa {' '.join(info['isa'])}, torch {info['torch']}, fast bf16: {cpu_has_fast_bf16()}")
for M, K, N in [(512, 518, 1024), (512, 512, 512), (16384, 512, 512), (768, 518, 512), (2048, 2048, 2048)]:
    line = [f"{M}x{K}x{N}:"]
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(M, K, dtype=dtype), torch.randn(K, N, dtype=dtype)
        a @ b
        t = time.perf_counter()
        a @ b
        t = time.perf_counter() - t
        line.append(f"{str(dtype).replace('torch.', '')} {t * 1e3:.1f} ms ({2 * M * K * N / t / 1e9:.1f} GFLOP/s)")
    print("  ".join(line), flush=True)
