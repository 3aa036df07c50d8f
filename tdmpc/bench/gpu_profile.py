"""--profile on CUDA: the kernels of one plan() and one update() as the GPU ran them (torch.profiler), set beside
the CPU's count of --kernels, and how busy the GPU keeps over end-to-end training steps."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any, Callable

import numpy as np
import torch
from torch.autograd import DeviceType

from tdmpc.bench.kernel_counts import counting_agent, plan_kernels, update_kernels
from tdmpc.bench.timing import OBS_DIM, OVERRIDES, make_agent, random_batch, sync
from tdmpc.runtime import cuda_graphs
from tdmpc.runtime.device import cuda_code_path


def _cuda_kernels(prof: Any) -> list:
    """The kernel launches a torch.profiler run recorded on the GPU (copies and memsets left out)."""
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset", "[memory]"))]


def kernels_by_op(events: Any) -> Counter[str]:
    """GPU kernels per ATen op that launched them (the innermost op, named as KernelCounter names it), from a
    torch.profiler run with CPU and CUDA activities: the profiler links each kernel to the op that launched it."""
    by_op: Counter[str] = Counter()
    for e, launched in _launches(events):
        by_op[e.name.removeprefix("aten::")] += launched
    return by_op


def _launches(events: Any) -> list[tuple[Any, int]]:
    """(CPU op event, the GPU kernels it launched, copies and memsets left out) for each op that launched one."""
    counts = [(e, sum(not k.name.startswith(("Memcpy", "Memset")) for k in e.kernels)) for e in events
              if e.device_type == DeviceType.CPU]
    return [(e, n) for e, n in counts if n]


def kernels_by_site(events: Any, top: int = 40) -> dict[str, int]:
    """GPU kernels per launching op, its input shapes and the Python function that called it (profiled with
    record_shapes and with_stack). For a compiled call that function is inductor's generated code, and the shapes
    tell which buffer a copy or library kernel the CPU count cannot see serves (what the 37 copies of a compiled
    plan() on the H200 still lack)."""
    by_site: Counter[str] = Counter()
    for e, launched in _launches(events):
        shapes = [s for s in (getattr(e, "input_shapes", None) or []) if s]
        by_site[f"{e.name.removeprefix('aten::')} {shapes} <- {call_site(e)}"] += launched
    return dict(by_site.most_common(top))


def call_site(event: Any) -> str:
    """The innermost Python function above a profiled op outside torch's own code, as the profiler names it
    (FILE(LINE OF ITS DEF): NAME), or, where the profiler records no Python frames in compiled code (torch 2.11),
    the compiled graph that ran it ("CompiledFxGraph KEY", inductor's cache key); '?' without either."""
    parent = event.cpu_parent
    while parent is not None:
        if re.match(r".+\.py\(\d+\): ", parent.name) and not parent.name.startswith("torch/"):
            return parent.name.rsplit("/", 1)[-1]
        graph = re.fullmatch(r"## Call (CompiledFxGraph \w+) ##", parent.name)
        if graph:
            return graph[1]
        parent = parent.cpu_parent
    return "?"


def count_differences(gpu: Counter[str], cpu: Counter[str]) -> dict[str, int]:
    """Per op, the GPU's kernels less the CPU count's, where they differ: where the CPU count must learn."""
    return {op: gpu[op] - cpu[op] for op in sorted(gpu.keys() | cpu.keys()) if gpu[op] != cpu[op]}


def profile_kernels(size: int, device: torch.device) -> dict:
    """Kernels of one plan() (1 env) and one update() (batch 256) as the GPU ran them (torch.profiler, CUPTI),
    with CUDA graphs off and on. Graphs off, each kernel is set beside the op that launched it, with its shapes
    and the function that called it (by_site, compiled too), and the ops' counts beside tdmpc.bench --kernels's,
    counted here on the CPU along CUDA's code path: `differences` (for plan() they include act()'s own few ops
    around the planner, which the CPU count leaves out; without --compile, --horizon and --num-samples, whose
    agents the CPU count does not build)."""
    from torch.profiler import ProfilerActivity, profile

    cpu: dict[str, Counter[str]] = {}
    if not {"compile", "horizon", "num_samples"} & OVERRIDES.keys():  # else not the agent the CPU count builds
        with cuda_code_path():
            cpu = {"plan": plan_kernels(counting_agent(size, compile=False), 1, False),
                   "update": update_kernels(size, compiled=False)[1]}
    out: dict = {}
    for graphs in (False, True):
        agent = make_agent(size, device, "auto", cuda_graphs=graphs)
        obs, first = np.random.randn(1, OBS_DIM).astype(np.float32), np.zeros(1, dtype=bool)
        batch = random_batch(agent)
        for name, fn in (("plan", lambda: agent.act(obs, first)), ("update", lambda: agent.update(batch))):
            for _ in range(cuda_graphs.WARMUP + 2):
                fn()
            sync(device)
            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=activities, record_shapes=not graphs, with_stack=not graphs) as prof:
                fn()
                sync(device)
            kernels = _cuda_kernels(prof)
            row = out[f"{name}_graphs_{'on' if graphs else 'off'}"] = {
                "kernels": len(kernels), "kernel_us": sum(e.device_time for e in kernels),
                "by_name": dict(Counter(e.name[:120] for e in kernels).most_common())}
            if not graphs:  # a graph's replay launches its kernels from no op
                by_op = kernels_by_op(prof.events())
                row.update(by_op=dict(by_op.most_common()), unattributed=len(kernels) - sum(by_op.values()),
                           by_site=kernels_by_site(prof.events()))
                if cpu:
                    row.update(cpu_count=sum(cpu[name].values()), differences=count_differences(by_op, cpu[name]))
    return out


def gpu_busy(run: Callable[[], object], device: torch.device) -> dict:
    """The fraction of wall-clock time the GPU ran a kernel while `run` ran (the union of kernel intervals)."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync(device)
    wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in _cuda_kernels(prof))
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return {"wall_ms": wall * 1e3, "kernel_ms": busy / 1e3, "busy_fraction": busy / 1e6 / wall,
            "kernels": len(spans)}
