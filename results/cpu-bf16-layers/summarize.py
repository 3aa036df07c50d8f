"""The CPU path before and after bf16 matmuls moved into tdmpc.model.layers.linear: per-call plan() and update()
times and end-to-end agent steps/s from bench --quick, each run's value beside its side's mean.

    python results/cpu-bf16-layers/summarize.py results/cpu-bf16-layers > results/cpu-bf16-layers/summary.txt
"""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {side: [json.loads(p.read_text()) for p in sorted(out.glob(f"{side}-*.json"))] for side in ("before", "after")}
rows: dict[str, dict[str, list[float]]] = {}
for side, results in runs.items():
    for r in results:
        for m in r["models"]:
            size = m["model_size"]
            for envs, p in m["plan"].items():
                rows.setdefault(f"plan() ms, size {size}, {envs} env(s)", {}).setdefault(side, []).append(p["ms"])
            rows.setdefault(f"update() ms, size {size}, fp32", {}).setdefault(side, []).append(m["update"]["fp32"]["ms"])
        for envs, e in r["end_to_end_by_envs"].items():
            rows.setdefault(f"end to end agent steps/s, {envs} env(s)", {}).setdefault(side, []).append(
                e["agent_steps_per_s"])
print(f"{runs['after'][0]['machine']}")
print(f"{'':45s} {'before (runs)':>28s} {'after (runs)':>28s}")
for name, sides in rows.items():
    cells = []
    for side in ("before", "after"):
        v = sides.get(side, [])
        cells.append(f"{sum(v) / len(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})" if v else "-")
    print(f"{name:45s} {cells[0]:>28s} {cells[1]:>28s}")
