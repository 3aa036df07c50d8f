"""Which device and precision to run on; nothing else in the package hard-codes CUDA."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Iterator

import torch

from tdmpc.errors import BadInput, DeviceError
from tdmpc.runtime.args import named

_cuda_code_path = False


def cpu_fast_paths(device: torch.device) -> bool:
    """Whether the CPU's own fast paths run (the fused C++ kernels, cheap dropout bits, chunked planning):
    on the CPU, unless inside cuda_code_path()."""
    return device.type == "cpu" and not _cuda_code_path


@contextlib.contextmanager
def cuda_code_path() -> Iterator[None]:
    """Run the code path CUDA takes while on the CPU, so that its kernels can be counted without a GPU
    (tdmpc.bench.kernels)."""
    global _cuda_code_path
    saved, _cuda_code_path = _cuda_code_path, True
    try:
        yield
    finally:
        _cuda_code_path = saved


def resolve_device(name: str, from_python: bool = False) -> torch.device:
    """'auto' (CUDA when there is one), 'cpu', 'cuda' or 'cuda:N' as a torch.device; one requested that is not here
    is a DeviceError naming the way out (tdmpc.fit's keyword with from_python, else the flag)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device '{name}' requested but CUDA is not available here; use "
                              f"{named('device', 'cpu', from_python)}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device '{name}' requested but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls run 3-7x faster than fp32 there."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_matmuls_emulated(device: torch.device) -> bool:
    """A CPU without AVX512-BF16 or AMX, on its own code path: torch's bf16 matmuls there are emulated, 90-450x
    slower than fp32 on an AVX2 EPYC (results/bf16-emulated), so tdmpc.model.layers runs them in fp32 on the
    bf16 values instead."""
    return device.type == "cpu" and not _cuda_code_path and not cpu_has_fast_bf16()


@functools.cache
def _warn_emulated_bf16() -> None:
    """Once per process: without AVX512-BF16 or AMX (most laptops, AVX2 servers) bf16 buys no speed: its matmuls
    run in fp32 on bf16-rounded values (tdmpc.model.layers.linear), bf16's numerics at about fp32's cost."""
    print("precision: this CPU has no AVX512-BF16 or AMX, so bf16 is not faster than fp32 here (its matmuls run in "
          "fp32 on bf16-rounded values); --precision auto and --train-precision fp32 skip the rounding",
          file=sys.stderr)


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: 'auto' picks bf16 where it is fast (CUDA, bf16-capable CPUs), else fp32; 'mixed'
    autocasts in bf16 (the agent keeps its value computations in fp32)."""
    if precision == "fp32":
        return torch.float32
    if precision in ("bf16", "mixed"):
        if device.type == "cpu" and not cpu_has_fast_bf16():
            _warn_emulated_bf16()
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def set_matmul_precision(precision: str | None, device: torch.device) -> str:
    """torch's fp32 matmul precision for this process ('high': TF32 on GPUs that have it); None picks 'high' on
    CUDA and 'highest' elsewhere. Returns what was set."""
    chosen = precision or ("high" if device.type == "cuda" else "highest")
    torch.set_float32_matmul_precision(chosen)
    return chosen


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a Slurm job's share, taskset's), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_error(requested: int | None, from_python: bool = False) -> str | None:
    """Why --threads `requested` cannot be, or would run badly here, or None: fewer than 1, or more threads than
    the CPUs this process may use.
    OpenMP's threads spin while they wait for each other, so with fewer CPUs than threads every parallel region
    waits on threads that are not running (on 2 cores, --threads 999 had not finished a training run's first
    step in 5 minutes)."""
    if requested is not None and requested < 1:
        return f"{named('threads', None, from_python)} must be >= 1, got {requested}"
    cpus = usable_cpus()
    if requested is not None and requested > cpus:
        return (f"{named('threads', requested, from_python)}: this process may use {cpus} CPU{'s' * (cpus != 1)}; "
                f"more threads than CPUs wait on each other (OpenMP's threads spin), which slows every step: give at "
                f"most {cpus}")
    return None


def set_threads(requested: int | None, from_python: bool = False) -> int:
    """Set torch's CPU threads: `requested` (at most the CPUs this process may use, threads_error); else
    OMP_NUM_THREADS when set (Slurm jobs set it), capped at those CPUs with a line; else those CPUs less the ones
    other processes keep busy (OpenMP threads spin, so two processes each using every core run several times
    slower than with their share each), saying so when that is fewer. Returns the count. from_python: messages
    name tdmpc.fit's keyword, not the flag."""
    if error := threads_error(requested, from_python):
        raise BadInput(error)
    cpus = usable_cpus()
    if requested is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        requested = max(1, int(os.environ["OMP_NUM_THREADS"]))
        if requested > cpus:
            print(f"threads: {cpus}, the CPUs this process may use, not OMP_NUM_THREADS={requested} (more threads "
                  f"than CPUs wait on each other); pass {'threads=N' if from_python else '--threads N'} to choose",
                  file=sys.stderr)
            requested = cpus
    if requested is None:
        machine = os.cpu_count() or cpus
        # the load average is the machine's: within a share of it (Slurm's, taskset's) it counts others' CPUs
        busy = round(os.getloadavg()[0]) if hasattr(os, "getloadavg") and cpus == machine else 0
        requested = max(1, cpus - busy)
        if requested < cpus:
            print(f"threads: {requested} of {cpus} cores (the machine's load is {busy}: other processes use the "
                  f"rest); pass --threads N to choose", file=sys.stderr)
    torch.set_num_threads(requested)
    return requested


def cap_cuda_memory(device: torch.device, capacity: int, from_python: bool = False) -> str:
    """Cap this process's CUDA caching allocator at `capacity` bytes (torch.cuda.set_per_process_memory_fraction),
    so that a config which would not fit a smaller card runs out of memory here as it would there. The CUDA
    context (a few hundred MiB) is outside the allocator's count. Returns the line saying what was set."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, capacity / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return (f"memory: allocator capped at {capacity / 2**30:.1f} GiB of this card's {total / 2**30:.1f} GiB "
            f"(fraction {fraction:.3f}, {named('gpu_mem', None, from_python)})")
