"""The profiled commit's compiled calls counted as bench --kernels counts them now (in inductor's Triton code for a
GPU), written under "triton" in kernels-h200-2026-11-27.json (beside this script): the count kernel_groups' compiled offsets are taken
against. That commit has no triton_code.py, so this checkout's is loaded from its file:

    git worktree add /tmp/d434 d43446d
    pip install --no-deps --no-build-isolation --target /tmp/d434_site /tmp/d434
    PYTHONPATH=/tmp/d434_site python results/gpu/2026-11-27-h200/triton_counts.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
PROFILE = HERE / "kernels-h200-2026-11-27.json"  # package data until the 2026-11-30 profile replaced it
COMMIT = "d43446d"


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    triton_code = _module("triton_code", HERE.parents[2] / "tdmpc" / "bench" / "triton_code.py")
    try:  # where the commit kept its counter
        from tdmpc.report import kernel_counts  # type: ignore[import-not-found]
    except ImportError:
        from tdmpc.bench import kernel_counts
    from tdmpc.runtime.device import cuda_code_path

    with cuda_code_path(), triton_code.triton_for_gpu():
        plan = kernel_counts.plan_kernels(kernel_counts.counting_agent(5, compile=False), 1, True)
        inside, around = kernel_counts.update_kernels(5, True)
    profile = json.loads(PROFILE.read_text())
    profile["triton"] = {"plan_compiled": dict(plan.most_common()),
                         "update_compiled": dict((inside + around).most_common())}
    profile["triton_how"] = (f"{COMMIT}'s plan_kernels and update_kernels (model size 5, compiled) inside "
                             f"tdmpc/bench/triton_code.py's triton_for_gpu(), torch {torch.__version__}: "
                             f"results/gpu/2026-11-27-h200/triton_counts.py")
    PROFILE.write_text(json.dumps(profile, indent=1) + "\n")
    print(json.dumps(profile["triton"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
