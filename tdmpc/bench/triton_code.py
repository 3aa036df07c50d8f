"""The Triton code inductor writes for a GPU, written on a machine without one: what bench --kernels reads to count
the kernels a compiled call launches on CUDA.

Inductor's C++ code for the CPU fuses more per kernel than its Triton code for a GPU (a stack, a reduction and what
follows it), so counting the C++ code missed about 90 kernels of the compiled plan() and 160 of the update on an
H200. Inductor can write Triton code for the CPU too (`cpu_backend="triton"`), with the scheduler, the fusion
rules and the kernel split it uses for CUDA; told it runs on an H100's 132 SMs, it also splits reductions as it
would there. The kernels are written, never compiled or run: each is a stand-in whose launch does nothing, so a
call's outputs are garbage and only its code counts. Triton itself must be installed (`pip install
'tdmpc[kernels]'`) for its code generator; no GPU or Triton CPU backend is needed.

A few lowerings test for the CPU device. The cat's is given CUDA's choice here (on the CPU a cat is always copied
input by input, on CUDA it may be computed pointwise in one kernel: the compiled plan()'s per-step stack, 5 kernels
on an H200 that the CPU's code wrote in place); what stays different (the online softmax is CUDA's only) the
offsets per group carry, taken from the last GPU profile against this count at its commit.
"""

from __future__ import annotations

import importlib.util
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator
from unittest import mock

import torch

from tdmpc.errors import BadInput

# An H100's (and an H200's): what inductor's reduction split and Triton heuristics read.
GPU_PROPERTIES = dict(multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536,
                      max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32)


class _KernelStandIn:
    """A Triton kernel as the generated module holds it, launched as a no-op."""

    def run(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def require_triton() -> None:
    if importlib.util.find_spec("triton") is None:
        raise BadInput("counting a compiled call's GPU kernels needs Triton's code generator (no GPU): "
                         "pip install 'tdmpc[kernels]'")


@contextmanager
def triton_for_gpu(combo_kernels: bool = False) -> Iterator[None]:
    """Inside it, torch.compile on the CPU writes Triton code as for an H100 and runs none of it. Dynamo's caches
    are cleared on entry and exit, so no stand-in kernel outlives it. combo_kernels: with inductor's combo kernels
    (independent kernels launched as one; experimental), which it forms for GPU nodes only: here the CPU's nodes
    are grouped as a GPU's would be."""
    require_triton()
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._inductor.scheduler import ForeachKernelSchedulerNode

    def gpu_properties(device: torch.device) -> DeviceProperties:
        return DeviceProperties(type=device.type, index=device.index, **GPU_PROPERTIES)

    with ExitStack() as stack:
        stack.enter_context(inductor_config.patch(cpu_backend="triton", compile_threads=1, fx_graph_cache=False))
        # The code generator stamps each kernel with the active Triton driver's hash; on the CPU there is none.
        stack.enter_context(mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "no-gpu"))
        stack.enter_context(mock.patch.object(DeviceProperties, "create", gpu_properties))
        stack.enter_context(mock.patch.object(AsyncCompile, "triton", lambda self, *a, **k: _KernelStandIn()))
        if combo_kernels:
            stack.enter_context(inductor_config.patch(combo_kernels=True))
            stack.enter_context(mock.patch.object(ForeachKernelSchedulerNode, "group_algorithm_for_combo_kernels",
                                                  _combo_groups_on_any_device))
        stack.enter_context(_cuda_cat_lowering())
        torch._dynamo.reset()
        try:
            yield
        finally:
            torch._dynamo.reset()


# The CPU branch of inductor's cat lowering (torch 2.11 to 2.13): without it the lowering chooses as on CUDA.
_CPU_CAT = "    if cpu_device:\n        return TensorBox(ir.ConcatKernel.create(inputs, dim))\n"


@contextmanager
def _cuda_cat_lowering() -> Iterator[None]:
    """Inductor's cat lowering without its CPU branch, inside: its code recompiled from its source less those two
    lines. A torch whose lowering reads otherwise keeps its own (the count then copies each cat input)."""
    import inspect
    import textwrap

    import torch._inductor.lowering as lowering

    cat: Any = getattr(lowering.cat, "__wrapped__", None)
    source = textwrap.dedent(inspect.getsource(cat)) if cat is not None else ""
    if cat is None or _CPU_CAT not in source:
        yield
        return
    source = "\n".join(line for line in source.replace(_CPU_CAT, "").splitlines() if not line.startswith("@"))
    namespace: dict[str, Any] = {}
    exec(compile(source, inspect.getsourcefile(cat) or "<cat>", "exec"), lowering.__dict__, namespace)
    original = cat.__code__
    cat.__code__ = namespace["cat"].__code__
    try:
        yield
    finally:
        cat.__code__ = original


def _combo_groups_on_any_device(scheduler: Any) -> list[list[Any]]:
    """Inductor's default grouping for combo kernels (nodes of one topological level, in chunks of
    combo_kernel_max_num_nodes), without its exclusion of CPU nodes; one device and one stream here."""
    import torch._inductor.config as inductor_config

    size = getattr(inductor_config, "combo_kernel_max_num_nodes", 8)  # before torch 2.13 a constant 8 in inductor
    return [level[i:i + size] for level in map(list, scheduler._topological_sort_nodes())
            for i in range(0, len(level), size)]
