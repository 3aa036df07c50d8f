"""The memory estimate beside the peaks the three H200 runs at a4000.json measured (compiled, CUDA graphs; their
train.csv's largest gpu_peak_allocated_gib and gpu_peak_reserved_gib): peak allocated against the estimate's live
tensors, peak reserved against its total less the CUDA context. python results/gpu/learning/estimate_vs_peaks.py"""

import csv
import dataclasses
from pathlib import Path

from tdmpc import memory
from tdmpc.config import load_json
from tdmpc.envs import make_env

runs = Path(__file__).parent / "runs"
for task in ("walker-walk", "cheetah-run", "cartpole-swingup"):
    rows = list(csv.DictReader(open(runs / task / "seed1" / "train.csv")))
    alloc, reserved = (max(float(r[k]) for r in rows if r.get(k)) for k in ("gpu_peak_allocated_gib",
                                                                             "gpu_peak_reserved_gib"))
    env, spec = make_env(task, seed=1)
    env.close()
    cfg = dataclasses.replace(load_json("a4000.json"), task=task).for_task(spec)
    est = memory.estimate(cfg, spec.obs_shape, spec.action_dim, spec.episodic, memory.detect_target(cfg, None, "16GiB"))
    live, held = est.peak_allocated / 2**30, (est.total - est.cuda_context) / 2**30
    print(f"{task}: estimate {live:.3f} GiB live against {alloc:.3f} allocated ({live / alloc - 1:+.0%}); "
          f"{held:.3f} GiB less the context against {reserved:.3f} reserved ({held / reserved - 1:+.0%})")
