"""fp32 against bf16 matmuls on this CPU, at the bench's peak shapes: one timed call each after one warm-up,
2 threads. On a CPU without AVX512-BF16 or AMX torch emulates bf16 (docs/speed.md); the last column is a bf16
matmul as the package's layers run it there (tdmpc.model.layers.linear: in fp32 on the bf16 values, the result
rounded to bf16).

    python results/bf16-emulated/matmul.py > results/bf16-emulated/matmul.txt
"""

import time

import torch

from tdmpc.bench.timing import machine_info
from tdmpc.model.layers import linear
from tdmpc.runtime.device import cpu_has_fast_bf16

torch.set_num_threads(2)
info = machine_info(torch.device("cpu"))
print(f"{info['cpu']}, isa {' '.join(info['isa'])}, torch {info['torch']}, fast bf16: {cpu_has_fast_bf16()}")
for M, K, N in [(512, 518, 1024), (512, 512, 512), (16384, 512, 512), (768, 518, 512), (2048, 2048, 2048)]:
    line = [f"{M}x{K}x{N}:"]
    for name, dtype, mm in (("float32", torch.float32, torch.mm), ("bfloat16", torch.bfloat16, torch.mm),
                            ("bfloat16 by layers.linear", torch.bfloat16, lambda a, b: linear(a, b.t()))):
        a, b = torch.randn(M, K, dtype=dtype), torch.randn(K, N, dtype=dtype)
        mm(a, b)
        t = time.perf_counter()
        mm(a, b)
        t = time.perf_counter() - t
        line.append(f"{name} {t * 1e3:.1f} ms ({2 * M * K * N / t / 1e9:.1f} GFLOP/s)")
    print("  ".join(line), flush=True)
