"""What is live at a run's CUDA memory peak, and where it was made: a short tdmpc.train run (the arguments given)
with the caching allocator's history recorded, replayed to its largest total of live blocks. Lease D's runs
(2026-11-29) peaked above the estimate from their first row on, by about the replay buffer's size
(docs/results/dmc-gpu.md, "Memory against the estimate"); this names the allocations on the device.

    python results/gpu/learning/peak_allocations.py OUT.txt -- --cfg a4000.json --task cheetah-run ...
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

OURS = ("/tdmpc/", "/planners/")


def where(frames: list[dict]) -> str:
    """The innermost frames in the package's own code (a few), else the innermost frame."""
    own = [f for f in frames if any(p in f["filename"] for p in OURS)][:3]
    return " < ".join(f"{f['filename'].rsplit('/', 2)[-2]}/{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
                      for f in own or frames[:1]) or "?"


def at_peak(trace: list[dict]) -> tuple[int, list[dict]]:
    """The peak's bytes and the blocks live then (allocations not freed by that point of the trace)."""
    live: dict[int, dict] = {}
    total = peak = peak_index = 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, peak_index = total, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    live = {}
    for e in trace[:peak_index + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return peak, list(live.values())


def main() -> int:
    out, args = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1:]
    from tdmpc.cli.train import main as train

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    code = train(args)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks = at_peak(snapshot["device_traces"][torch.cuda.current_device()])
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for b in blocks:
        g = groups[where(b.get("frames", []))]
        g[0] += b["size"]
        g[1] += 1
    lines = [f"tdmpc.train {' '.join(args)}: exit {code}",
             f"max_memory_allocated {torch.cuda.max_memory_allocated() / 2**30:.4f} GiB; the trace's peak "
             f"{peak / 2**30:.4f} GiB in {len(blocks)} blocks (blocks made before the recording started are not in it)"]
    for name, (size, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:25]:
        lines.append(f"{size / 2**20:10.2f} MiB  {n:5d} blocks  {name}")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
