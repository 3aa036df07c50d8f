"""How much of update()'s transient memory (gradients and activations) compiling removes, measured on the CPU.

The memory estimate (tdmpc.memory) counts an eager update's activations by formula (tdmpc.losses); since
2026-11-27 runs on CUDA compile update() by default, and AOTAutograd's partitioner keeps fewer tensors for
backward (it recomputes pointwise ops). This measures, with torch.profiler's memory events on the CPU, the peak
of live bytes during one update() above what was live before it, eager and compiled, model size 5, batch 256,
walker-walk dims (the bench's), and writes their ratio beside the estimate's transient (gradients + update
activations). Run from the repository root: python results/memory-compiled/measure.py (about 2 minutes cold).
"""

import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tdmpc.bench.timing import make_agent, random_batch
from tdmpc.memory.peak import Target, estimate


def transient_peak(agent, batch) -> int:
    """Peak live bytes allocated during one update() above the live bytes before it (CPU allocator events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        agent.update(batch)
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.cpu_memory_usage:
            live += e.cpu_memory_usage
            peak = max(peak, live)
    return peak


def main() -> None:
    torch.manual_seed(0)
    out: dict = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for compile_ in (False, True):
        agent = make_agent(5, torch.device("cpu"), "fp32", compile=compile_, cuda_graphs=False)
        batch = random_batch(agent)
        for _ in range(3):  # compile, allocate the optimiser states, settle
            agent.update(batch)
        out["compiled" if compile_ else "eager"] = transient_peak(agent, batch)
    cfg, dims = agent.cfg, agent.dims
    target = Target("cpu as cuda", None, True, torch.bfloat16, torch.float32)
    est = estimate(cfg, dims.obs_shape, dims.action_dim, False, target)
    out["estimate_transient"] = est.gradients + est.update_activations
    out["compiled_over_eager"] = out["compiled"] / out["eager"]
    out["eager_over_estimate"] = out["eager"] / out["estimate_transient"]
    Path(sys.argv[1] if len(sys.argv) > 1 else "results/memory-compiled/update-transient.json").write_text(
        json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
