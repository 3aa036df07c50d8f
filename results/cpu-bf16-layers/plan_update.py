"""plan() of one env and update() at batch 256, fp32 (precision auto on an AVX2 CPU), model sizes 1 and 5, 2 threads,
each timed for 4 s after one call: run alternately with the earlier package installed apart (PYTHONPATH) and the
current one; the first field names which was imported.

    PYTHONPATH=/tmp/before_site python results/cpu-bf16-layers/plan_update.py; python results/cpu-bf16-layers/plan_update.py
"""
import time, torch, numpy as np
torch.set_num_threads(2)
import tdmpc
from tdmpc.bench.timing import make_agent, random_batch
out = [tdmpc.__file__.split('/')[2]]
for size in (1, 5):
    agent = make_agent(size, torch.device("cpu"), "auto")
    obs = np.zeros((1, *agent.dims.obs_shape), np.float32)
    agent.act(obs)
    s = time.perf_counter(); n = 0
    while time.perf_counter() - s < 4: agent.act(obs); n += 1
    out.append(f"size {size} plan {(time.perf_counter()-s)/n*1e3:.1f} ms")
    batch = random_batch(agent, B=256)
    agent.update(batch)
    s = time.perf_counter(); n = 0
    while time.perf_counter() - s < 4: agent.update(batch); n += 1
    out.append(f"update {(time.perf_counter()-s)/n*1e3:.1f} ms")
print(", ".join(out), flush=True)
