"""results/gpu-speed.json (issue 56 point 6) from what device_run.sh brought back: the bench JSONs of the stages
`ours-compile` (the CUDA default: compiled, CUDA graphs), `reference` (its compiled run, or `reference-td012`),
`seed-case-ours` and `seed-case-reference`, and `machine.txt`. A key whose stage did not run or did not reach the
number (the reference's steady rate needs its run past compiling) is null, with the reason under `missing`.

    python results/gpu/speed_json.py /tmp/gpu-out [--out results/gpu-speed.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SIZE = 5


def load(folder: Path, *names: str) -> dict[str, Any] | None:
    """The first of the named stage JSONs that exists (a stage cut while writing its file: an error naming it)."""
    for name in names:
        path = folder / f"{name}.json"
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {path} is not whole JSON ({e}); take that number from its log") from None
    return None


def speed(folder: Path) -> dict[str, Any]:
    ours, ref = load(folder, "ours-compile"), load(folder, "reference", "reference-td012")
    seed_ours = load(folder, "seed-case-ours")
    seed_ref = load(folder, "seed-case-reference", "seed-case-reference-td012")
    out: dict[str, Any] = {"gpu": None, "torch": None}
    missing: dict[str, str] = {}
    if ours is not None:
        out.update(gpu=ours["machine"].get("gpu"), torch=ours["machine"].get("torch"))
        model = next((m for m in ours["models"] if m["model_size"] == SIZE), None)
        if model is not None:
            out["plan_ms_size5_1env"] = model["plan"].get("1", {}).get("ms")
            out["update_ms_size5"] = model["update"].get("fp32", {}).get("ms")  # a4000.json updates in fp32 (TF32)
            kernels = model.get("gpu_kernels", {})
            out["plan_kernels_gpu"] = kernels.get("plan_graphs_on", {}).get("kernels")
            out["update_kernels_gpu"] = kernels.get("update_graphs_on", {}).get("kernels")
        for n in (1, 32):
            out[f"e2e_agent_steps_per_s_{n}env"] = ours.get("end_to_end_by_envs", {}).get(str(n), {}).get(
                "agent_steps_per_s")
        log = folder / "ours-compile.log"
        if log.is_file() and "runs eagerly" in log.read_text():  # a compile fell back: not the compiled default
            missing["compiled"] = "ours-compile.log: a function ran eagerly (its compile failed); see its line"
    else:
        missing["ours"] = "no ours-compile.json"
    if ref is not None:
        out["reference_e2e_agent_steps_per_s"] = ref.get("steady_steps_per_s")
        out["reference_act_ms"], out["reference_update_ms"] = ref.get("act_ms_median_last_half"), ref.get(
            "update_ms_median_last_half")
        if ref.get("steady_steps_per_s") is None:
            missing["reference_e2e_agent_steps_per_s"] = f"its run did not reach a steady rate ({ref.get('stopped')})"
    else:
        missing["reference"] = "no reference.json"
    ratio_of = (out.get("e2e_agent_steps_per_s_1env"), out.get("reference_e2e_agent_steps_per_s"))
    out["ratio_e2e_vs_reference"] = ratio_of[0] / ratio_of[1] if all(ratio_of) else None
    out["seed_case_peak_gib_ours"] = (seed_ours or {}).get("end_to_end", {}).get("peak_allocated_gib")
    out["seed_case_peak_gib_reference"] = (seed_ref or {}).get("peak_allocated_gib")
    keys = ["gpu", "torch", "plan_ms_size5_1env", "update_ms_size5", "e2e_agent_steps_per_s_1env",
            "e2e_agent_steps_per_s_32env", "reference_e2e_agent_steps_per_s", "reference_act_ms", "reference_update_ms",
            "ratio_e2e_vs_reference", "seed_case_peak_gib_ours", "seed_case_peak_gib_reference", "plan_kernels_gpu",
            "update_kernels_gpu"]
    result = {k: out.get(k) for k in keys}
    missing.update({k: "not in the stage's output" for k in keys if result[k] is None and k not in missing})
    return {**result, "missing": missing}


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_dir() or argv[-1] == "--out":
        print("usage: python results/gpu/speed_json.py FOLDER [--out FILE] (FOLDER: device_run.sh's outputs)",
              file=sys.stderr)
        return 2
    text = json.dumps(speed(Path(argv[0])), indent=1) + "\n"
    if "--out" in argv:
        Path(argv[argv.index("--out") + 1]).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
