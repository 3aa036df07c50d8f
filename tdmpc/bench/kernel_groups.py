"""What a GPU runs beside what the CPU counts: kernels sorted into the same groups on both sides, and the offset per
group that the last GPU profile measured, so that bench --kernels, without a GPU, can say what one would launch.

The CPU count (tdmpc.bench.kernels) sees CUDA's code path: eager, the aten ops a call dispatches; compiled, the
kernels in the Triton code inductor writes for a GPU (tdmpc.bench.triton_code). A GPU runs more than that in known
places: cuBLAS adds a split-K reduction kernel to some GEMMs, top-k is a sort and a gather, eager ops launch fills
and copies the dispatcher does not show, and baddbmm copies its broadcast bias into its output before the GEMM
(counted here as the copy it is: cpu_groups). The profile's per-group differences, against the eager count and the
Triton count of its commit (tdmpc/data/kernels-h200-2026-11-30.json), are that model; BENCHMARKS.md
has the table. A later profile replaces the file."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Callable

GROUPS = ("fused (inductor)", "elementwise and reductions", "GEMM", "split-K reduce", "copy", "fill", "stack and cat",
          "sort and top-k", "random", "foreach and optimizer")
PROFILE = Path(__file__).resolve().parents[1] / "data" / "kernels-h200-2026-11-30.json"  # package data: a wheel has it
CALLS = ("plan_eager", "update_eager", "plan_compiled", "update_compiled")

_RANDOM_CPU = {"normal_", "randint", "randn", "bernoulli_", "exponential_", "uniform_", "normal_functional"}


# A CUDA kernel's group: the first whose name parts its (lower-cased) name contains; else elementwise.
_GPU_RULES = ((("splitkreduce",), "split-K reduce"), (("triton_",), "fused (inductor)"),
              (("gemm", "nvjet", "cutlass", "xmma", "gemv"), "GEMM"),
              (("multi_tensor_apply", "lpnorm_cleanup"), "foreach and optimizer"),
              (("catarraybatchedcopy",), "stack and cat"), (("direct_copy",), "copy"), (("fill",), "fill"),
              (("radixsort", "topk", "sort"), "sort and top-k"), (("distribution_", "randperm", "philox"), "random"))


def gpu_group(name: str) -> str:
    """A CUDA kernel's group, from its name as the profiler reports it."""
    n = name.lower()
    return next((group for keys, group in _GPU_RULES if any(k in n for k in keys)), "elementwise and reductions")


def cpu_groups(op: str) -> tuple[str, ...]:
    """The groups of the kernels CUDA runs for one op of a CPU count: its group; and a copy first for baddbmm
    (ATen's CUDA baddbmm copies the broadcast bias into its output, then runs the GEMM with beta 1), a second
    kernel for topk (a radix sort and a gather, as the H200 ran it)."""
    group, name = cpu_group(op), op.rsplit(".", 1)[-1]
    return (group, "copy") if name == "baddbmm" else (group, group) if name == "topk" else (group,)


def cpu_group(op: str) -> str:
    """A CPU count's entry's group: an aten op (eager), or inductor's 'fused', 'extern.<op>' or 'aten.<op>'."""
    if op == "fused":
        return "fused (inductor)"
    op = op.split(".", 1)[1] if op.startswith(("extern.", "aten.")) else op
    if op in ("addmm", "mm", "bmm", "baddbmm"):
        return "GEMM"
    if op in ("_to_copy", "copy_", "clone"):
        return "copy"
    if op in ("fill_", "zeros_like", "ones_like", "ones", "zeros", "scalar_tensor", "full"):
        return "fill"
    if op in ("stack", "cat"):
        return "stack and cat"
    if op in ("topk", "sort"):
        return "sort and top-k"
    if op in _RANDOM_CPU:
        return "random"
    if op.startswith("_foreach_") or op.startswith("_fused_"):
        return "foreach and optimizer"
    return "elementwise and reductions"


def by_group(counts: dict[str, int], groups: Callable[[str], tuple[str, ...]] = cpu_groups) -> dict[str, int]:
    """Counts per kernel or op name -> counts per group (every group, zeros included)."""
    out = dict.fromkeys(GROUPS, 0)
    for name, n in counts.items():
        for group in groups(name):
            out[group] += n
    return out


def gpu_groups(name: str) -> tuple[str, ...]:
    """by_group's groups for a profile's kernel names: one each."""
    return (gpu_group(name),)


@lru_cache(maxsize=1)
def profile() -> dict:
    return json.loads(PROFILE.read_text())


def counted(call: str) -> dict[str, int]:
    """The profiled commit's count on the CPU of one of CALLS: the eager one, or for a compiled call its Triton
    code's."""
    p = profile()
    return p["triton" if call.endswith("compiled") else "cpu"][call]


def offsets(call: str) -> dict[str, int]:
    """GPU minus CPU per group in the last profile, for one of CALLS."""
    gpu, cpu = by_group(profile()["gpu"][call], gpu_groups), by_group(counted(call))
    return {g: gpu[g] - cpu[g] for g in GROUPS if gpu[g] != cpu[g]}


def gpu_estimate(call: str, cpu_counts: dict[str, int]) -> int:
    """What a GPU would launch for a call the CPU counted as `cpu_counts`: the count plus the last profile's
    offsets (a group the profile's GPU ran none of adds nothing below zero)."""
    cpu, off = by_group(cpu_counts), offsets(call)
    return sum(max(cpu[g] + off.get(g, 0), 0) for g in GROUPS)
