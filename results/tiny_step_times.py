"""Per-call times of plan() and update() at the tests' tiny size (tests/helpers.py: TINY), one thread: what each
test run is made of. python results/tiny_step_times.py (from the repository root); its output is appended to
results/suite-avx2-2026-11-29.txt with the machine."""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import TINY  # noqa: E402

from tdmpc.bench.timing import agent_for, random_batch  # noqa: E402
from tdmpc.config import Config, validate  # noqa: E402

torch.set_num_threads(1)
cfg = validate(Config(**{k: v for k, v in TINY.items() if k != "task"}))
agent = agent_for(cfg, torch.device("cpu"))
planner = agent.planner(1)
args = (torch.randn(1, agent.dims.obs_shape[0]), torch.zeros(1, dtype=torch.bool), False)
with torch.no_grad():
    for _ in range(5):
        planner.plan_graph(*args)
    start = time.perf_counter()
    for _ in range(100):
        planner.plan_graph(*args)
    plan = (time.perf_counter() - start) / 100
batch = random_batch(agent, cfg.batch_size)
for _ in range(5):
    agent.update(batch)
start = time.perf_counter()
for _ in range(50):
    agent.update(batch)
update = (time.perf_counter() - start) / 50
print(f"tiny plan() {plan * 1e3:.1f} ms, update() {update * 1e3:.1f} ms (batch {cfg.batch_size}, torch "
      f"{torch.__version__}, 1 thread)")
