"""The memory estimate beside the peaks the H200 runs at a4000.json measured (compiled, CUDA graphs; their
train.csv's largest gpu_peak_allocated_gib and gpu_peak_reserved_gib): peak allocated against the estimate's live
tensors, peak reserved against its total less the CUDA context. Every finished run under runs/ (each seed), and
pendulum-swingup as the 2026-11-28 lease stopped it at 50k env steps (four runs at once under MPS). Last, the
-m gpu test's model size 48 (dog-run, compiled; the bytes it measured are in the second lease's
cuda-tests-summary.txt, its assertion message). python results/gpu/learning/estimate_vs_peaks.py"""

import csv
import dataclasses
import re
from pathlib import Path

from tdmpc import memory
from tdmpc.config import load_json
from tdmpc.envs import make_env

here = Path(__file__).parent
runs = [(f.parent.name, f"{f.parent.name} {f.name}", f) for f in sorted((here / "runs").glob("*/seed*/"))]
runs += [("pendulum-swingup", "pendulum-swingup seed1, lease 2026-11-28, stopped",
          here / "lease-2026-11-28-h200" / "stopped" / "pendulum-swingup")]
for task, label, folder in runs:
    rows = list(csv.DictReader(open(folder / "train.csv")))
    alloc, reserved = (max(float(r[k]) for r in rows if r.get(k)) for k in ("gpu_peak_allocated_gib",
                                                                             "gpu_peak_reserved_gib"))
    env, spec = make_env(task, seed=1)
    env.close()
    cfg = dataclasses.replace(load_json("a4000.json"), task=task).for_task(spec)
    est = memory.estimate(cfg, spec.obs_shape, spec.action_dim, spec.episodic, memory.detect_target(cfg, None, "16GiB"))
    live, held = est.peak_allocated / 2**30, (est.total - est.cuda_context) / 2**30
    print(f"{label} (to env step {rows[-1]['env_step']}): estimate {live:.3f} GiB live against {alloc:.3f} allocated "
          f"({live / alloc - 1:+.1%}); {held:.3f} GiB less the context against {reserved:.3f} reserved "
          f"({held / reserved - 1:+.0%})")

# test_estimate_matches_cuda_peak[48]: its assertion message holds (estimate then, measured) in bytes, on the H200
summary = (here / "lease-2026-11-27-h200-b" / "cuda-tests-summary.txt").read_text()
measured = int(re.search(r"AssertionError: \((\d+), (\d+), '  parameters", summary).group(2))
env, dog = make_env("dog-run")
env.close()
cfg = dataclasses.replace(load_json("a4000.json"), task="dog-run", model_size=48).for_task(dog)
target = dataclasses.replace(memory.cuda_target(cfg, 140 * 2**30, "H200"), cublas_workspace=memory.cublas_workspace_bytes(9))
live = memory.estimate(cfg, dog.obs_shape, dog.action_dim, dog.episodic, target).peak_allocated
print(f"dog-run model size 48 (-m gpu test): estimate {live / 2**30:.3f} GiB live against {measured / 2**30:.3f} "
      f"allocated ({live / measured - 1:+.1%})")
