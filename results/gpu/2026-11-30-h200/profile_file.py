"""tdmpc/data/kernels-h200-2026-11-30.json, the GPU profile bench --kernels takes its offsets per group from: the
kernels this lease's H200 ran per call (CUDA graphs on: `ours.json`, `ours-compile.json`,
models[0].gpu_kernels.*_graphs_on.by_name) beside the CPU count of the same code with the GPU's torch
(results/kernels-torch2.11.json: eager, and compiled in inductor's Triton code), so that the offsets are the
device's alone, not a torch release's; then each results/kernels*.json's gpu_estimate
recomputed from its own counts with the new offsets (no recount). From the repository root:

    python results/gpu/2026-11-30-h200/profile_file.py
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
OUT = ROOT / "tdmpc" / "data" / "kernels-h200-2026-11-30.json"
COMMIT = "a357de1"


def gpu_lists(name: str) -> dict[str, dict[str, int]]:
    model = next(m for m in json.loads((HERE / f"{name}.json").read_text())["models"] if m["model_size"] == 5)
    return {call: model["gpu_kernels"][f"{call}_graphs_on"]["by_name"] for call in ("plan", "update")}


def main() -> None:
    eager, compiled = gpu_lists("ours"), gpu_lists("ours-compile")
    counts = json.loads((ROOT / "results" / "kernels-torch2.11.json").read_text())
    detail = counts["detail"]["size5"]
    profile = {
        "what": (f"Kernels per call on an NVIDIA H200 (torch 2.11.0+cu130, CUDA graphs on, 2026-11-30) beside the CPU "
                 f"count of the same code ({COMMIT}, results/kernels-torch2.11.json, torch {counts['torch']}): walker-walk dims, "
                 f"model size 5, bf16 planning for 1 env, fp32 update of batch 256. From "
                 f"results/gpu/2026-11-30-h200/ (ours.json, ours-compile.json), by "
                 f"results/gpu/2026-11-30-h200/profile_file.py."),
        "gpu": {"plan_eager": eager["plan"], "update_eager": eager["update"], "plan_compiled": compiled["plan"],
                "update_compiled": compiled["update"]},
        "cpu": {"plan_eager": detail["plan_eager"], "update_eager": detail["update_eager"]},
        "triton": {"plan_compiled": detail["plan_compiled"],
                   "update_compiled": dict((Counter(detail["update_compiled_graphs"])
                                            + Counter(detail["update_compiled_around"])).most_common())},
        "triton_how": f"results/kernels-torch2.11.json's detail.size5 at {COMMIT} (python -m tdmpc.bench --kernels, torch "
                      f"{counts['torch']})"}
    OUT.write_text(json.dumps(profile, indent=1) + "\n")
    from tdmpc.bench import kernel_groups
    from tdmpc.bench.kernel_counts import gpu_estimates
    from tdmpc.runtime.files import json_text

    assert kernel_groups.PROFILE == OUT, kernel_groups.PROFILE
    for path in sorted((ROOT / "results").glob("kernels*.json")):
        result = json.loads(path.read_text())
        result["gpu_estimate"] = gpu_estimates(result["detail"]["size5"])
        path.write_text(json_text(result))
        print(path.name, {k: v for k, v in result["gpu_estimate"].items() if k.endswith(("eager", "compiled"))})


if __name__ == "__main__":
    main()
