"""update() of model size 1, batch 256, in each train precision on this CPU, one thread, before and after the
package ran emulated bf16 matmuls in fp32 (tdmpc.model.layers.linear): the mean of up to 20 calls in 6 s after one
warm-up. Run from a checkout at the commit named (the earlier code from `git worktree add`):

    python results/bf16-emulated/updates.py >> results/bf16-emulated/updates.txt
"""

import subprocess
import time

import torch

from tdmpc.bench.timing import machine_info, make_agent, random_batch

torch.set_num_threads(1)
info = machine_info(torch.device("cpu"))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
line = [f"{info['cpu']}, isa {' '.join(info['isa'])}, torch {info['torch']}, at {commit}:"]
for precision in ("fp32", "mixed", "bf16"):
    agent = make_agent(1, torch.device("cpu"), "fp32", train_precision=precision)
    batch = random_batch(agent, B=256)
    agent.update(batch)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 6 and n < 20:
        agent.update(batch)
        n += 1
    line.append(f"{precision} {(time.perf_counter() - start) / n * 1e3:.0f} ms (n={n})")
print("  ".join(line), flush=True)
