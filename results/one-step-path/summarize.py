"""The bench runs of bench.sh side by side: agent steps/s end to end (1 and 8 envs) and the numpy path's seeding
and acting env steps/s (64 and 256 envs), each round's and the mean per side. Writes summary.json beside them:
python results/one-step-path/summarize.py [FOLDER] (default: this one; v1/ and v2/ hold earlier runs)"""

import json
import sys
from pathlib import Path

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def runs_and_mean(values: list[float]) -> dict | None:
    return {"runs": [round(v, 3) for v in values], "mean": round(sum(values) / len(values), 3)} if values else None


out: dict = {"commits": (here / "commits.txt").read_text().strip()}
for side in ("before", "after"):
    e2e = [json.loads(p.read_text()) for p in sorted(here.glob(f"e2e-{side}-*.json"))]
    paths = [json.loads(p.read_text()) for p in sorted(here.glob(f"paths-{side}-*.json"))]
    row: dict = {"rounds": len(e2e), "e2e_threads": e2e[0]["machine"]["torch_threads"]}
    for n in ("1", "8"):
        row[f"e2e_{n}env_agent_steps_per_s"] = runs_and_mean([r["end_to_end_by_envs"][n]["agent_steps_per_s"]
                                                              for r in e2e])
    for n in (64, 256):
        for what in ("seeding", "acting"):
            row[f"numpy_{n}env_{what}_env_steps_per_s"] = runs_and_mean([
                x[f"{what}_env_steps_per_s"] for r in paths for x in r["rows"]
                if x["path"] == "numpy" and x["num_envs"] == n])
    out[side] = row
(here / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
