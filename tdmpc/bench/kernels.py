"""Counting what a call costs a GPU without one: kernel launches, host-device copies and host waits (the tools
of bench --kernels and of the tests; nothing in the library runs them).

On a GPU, a small kernel costs 3-5 microseconds to launch whatever it computes, so plan() and
update() at the sizes used here are bound by how many kernels they launch, not by FLOPs. These
counters see that on the CPU:

- KernelCounter counts the ATen ops of eager code that launch a kernel: views, allocations
  and metadata ops launch none; a composite op (linear, layer_norm, matmul) is counted as the
  ops it decomposes into, as CUDA runs it. Run it inside runtime.device.cuda_code_path() to count the
  path CUDA takes (no fused C++ ops, no chunked planning).
- compiled_kernels counts the kernels in the code inductor generates for a compiled call:
  its fused kernels, extern kernels (matmuls) and ATen fallbacks.
- TransferCounter counts host-to-device copies and blocking waits by patching the calls that
  make them, since on the CPU host and device are one memory.
"""

from __future__ import annotations

import re
import traceback
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tdmpc.runtime.device import cpu_has_fast_bf16
from tdmpc.runtime.transfer import STAGED

GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm"})

# ATen ops that launch no kernel: allocations and metadata (views are told by their schema).
NO_KERNEL = frozenset({
    "empty", "empty_like", "_unsafe_view", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "lift_fresh_copy",
    "detach", "alias", "set_", "resize_", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_same_size", "_local_scalar_dense", "_record_function_enter", "_record_function_enter_new",
    "_record_function_exit", "is_nonzero", "equal_meta", "_has_compatible_shallow_copy_type",
})


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    return not func.is_view and func._overloadpacket.__name__ not in NO_KERNEL


class KernelCounter(TorchDispatchMode):
    """Kernel-launching ATen ops of the code run inside it, by op name (`counts`) and in all (`total`).

    `waits` counts the ops that make the host wait for the device on CUDA (item(), bool(), a nonzero()
    whose size the host needs); those launch no kernel of their own. With sites=True, `sites` counts each op
    by the line of the package that called it (slower: a stack walk per op). On a CPU that emulates bf16 matmuls
    a bf16 one is counted as itself but computed in fp32 on its bf16 values (tdmpc.model.layers.linear)."""

    SYNCS = frozenset({"_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "unique_consecutive",
                       "_unique2"})

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.emulate_bf16 = not cpu_has_fast_bf16()  # bf16 matmuls in fp32 on this CPU (counted as bf16's)
        self.counts: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str]] | None = Counter() if sites else None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CPU"):
            with self:  # a composite op (linear, matmul, layer_norm): count the ops it runs as
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        name = func._overloadpacket.__name__
        if name in self.SYNCS:
            self.waits[name] += 1
        if launches_kernel(func):
            self.counts[name] += 1
            if self.sites is not None:
                self.sites[(name, _call_site())] += 1
        if name in GEMMS and self.emulate_bf16 and func._overloadname == "default" and all(
                t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in args if isinstance(t, torch.Tensor)):
            # counted as the bf16 matmul CUDA runs; computed as tdmpc.model.layers.linear computes it here
            return func(*(t.float() if isinstance(t, torch.Tensor) else t for t in args), **kwargs).bfloat16()
        return func(*args, **kwargs)


def _call_site() -> str:
    """'file.py:line code' of the innermost frame in tdmpc/ or planners/."""
    for frame in reversed(traceback.extract_stack()):
        if ("/tdmpc/" in frame.filename or "/planners/" in frame.filename) and "/bench/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} {(frame.line or '').strip()[:70]}"
    return "?"


def count_kernels(fn: Callable[[], Any], sites: bool = False) -> KernelCounter:
    """Run fn() once under a KernelCounter (sites: with each op's call site) and return it."""
    with KernelCounter(sites) as counter:
        fn()
    return counter


# A launch in inductor's generated call(): a fused kernel (cpp_fused_* on the CPU, triton_* .run on CUDA),
# an extern kernel (matmuls, convolutions) or an ATen fallback.
_LAUNCH = re.compile(r"^\s+(?:buf\w*\s*=\s*)?(?P<what>(?:cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|"
                     r"torch\.ops\.aten\.\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?))\(", re.M)
_NOT_LAUNCHES = re.compile(r"(?:^|\.)(?:empty_strided\w*|reinterpret_tensor|as_strided|_reinterpret_view|"
                           r"view|alias|empty)(?:\.|$)")


def kernels_in_code(source: str) -> Counter[str]:
    """Launches in the call() of one inductor output module, by kind ('fused', 'extern.mm', 'aten.sort', ...)."""
    body = source.split("def call(", 1)[-1]
    kinds: Counter[str] = Counter()
    for m in _LAUNCH.finditer(body):
        what = m.group("what")
        if what.startswith(("cpp_fused", "triton_")):
            kinds["fused"] += 1
        elif what.startswith("extern_kernels."):
            kinds["extern." + what.split(".", 1)[1]] += 1
        elif not _NOT_LAUNCHES.search(what):
            kinds["aten." + what.split("aten.", 1)[1].split(".")[0]] += 1
    return kinds


def compiled_kernels(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Counter[str]:
    """Kernels one call of the compiled fn launches, by kind, read from the code inductor generated for it.

    fn is compiled (if it was not) on this call, so call it on a fresh torch.compile object."""
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(fn, *args, **kwargs)
    kinds: Counter[str] = Counter()
    for source in sources:
        kinds.update(kernels_in_code(source))
    return kinds


class TransferCounter(TorchDispatchMode):
    """Host-to-device copies and blocking host waits of the code run inside it. On the CPU, host and device are
    one memory, so tensors made from host data are marked as host tensors and followed:

    - marked: torch.from_numpy, torch.as_tensor/torch.tensor of host data without a device, pin_memory() and
      cpu() results, and whatever an op computes from host tensors alone;
    - h2d: torch.as_tensor/torch.tensor of host data with a device, Tensor.to(device) of a host tensor, and an
      op that mixes host tensors (not 0-dim scalars) with device tensors (CUDA copies the host one over);
    - waits: an h2d copy that is not from pinned memory (or a runtime.transfer staging buffer, pinned on a GPU)
      with non_blocking, and Tensor.cpu(), .numpy(), .item(),
      .tolist(), bool(), int() and float() of a device tensor."""

    HOST = "_tdmpc_host"

    def __init__(self) -> None:
        super().__init__()
        self.h2d: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()
        self._saved: list[tuple[Any, str, Any]] = []
        self._marked: list[weakref.ref] = []  # unmarked at exit, so no mark outlives the count

    @property
    def h2d_copies(self) -> int:
        return sum(self.h2d.values())

    @property
    def blocking_waits(self) -> int:
        return sum(self.waits.values())

    def _host(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and getattr(t, self.HOST, False)

    def _mark(self, out: Any) -> Any:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not self._host(t):
                setattr(t, self.HOST, True)
                self._marked.append(weakref.ref(t))
        return out

    def _alias(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor for host tensor t, which a copy to the device returned as it was (on the CPU)."""
        alias = t.view_as(t)
        if self._host(alias):
            delattr(alias, self.HOST)
        return alias

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = [t for t in tensors if self._host(t)]
        if host and len(host) == len(tensors):
            self._mark(out)
        elif any(t.dim() > 0 for t in host):
            self.h2d[f"implicit in {func._overloadpacket.__name__}"] += 1
            self.waits[f"implicit h2d in {func._overloadpacket.__name__}"] += 1
        return out

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def __enter__(self) -> "TransferCounter":
        counter = self

        def from_data(original):
            def call(data, *args, **kwargs):
                on_host = not isinstance(data, torch.Tensor) or counter._host(data)
                out = original(data, *args, **kwargs)
                if on_host and kwargs.get("device") is not None:
                    counter.h2d[original.__name__] += 1
                    counter.waits[f"{original.__name__} from pageable memory"] += 1
                    out = counter._alias(out) if out is data else out
                elif on_host and out is not data:
                    counter._mark(out)
                return out
            return call

        def to(original):
            def call(self, *args, **kwargs):
                out = original(self, *args, **kwargs)
                if counter._host(self):
                    if any(isinstance(a, (torch.device, str)) for a in (*args, kwargs.get("device"))):
                        counter.h2d["Tensor.to"] += 1
                        staged = self.is_pinned() or getattr(self, STAGED, False)  # pinned on a GPU
                        if not (kwargs.get("non_blocking") and staged):
                            counter.waits["blocking Tensor.to"] += 1
                        out = counter._alias(out) if out is self else out
                    else:
                        counter._mark(out)
                return out
            return call

        def marks(original):
            return lambda self, *args, **kwargs: counter._mark(original(self, *args, **kwargs))

        def waits(name):
            def make(original):
                def call(self, *args, **kwargs):
                    if not counter._host(self):
                        counter.waits[name] += 1
                    out = original(self, *args, **kwargs)
                    if name != "cpu":
                        return out
                    # on the CPU, cpu() returns the tensor itself; on a GPU a host copy, which is what is marked
                    return counter._mark(out.view_as(out) if out is self and not counter._host(self) else out)
                return call
            return make

        self._patch(torch, "as_tensor", from_data)
        self._patch(torch, "tensor", from_data)
        self._patch(torch, "from_numpy", lambda original: lambda array: counter._mark(original(array)))
        self._patch(torch.Tensor, "to", to)
        self._patch(torch.Tensor, "pin_memory", marks)
        for name in ("cpu", "numpy", "item", "tolist", "__bool__", "__int__", "__float__"):
            self._patch(torch.Tensor, name, waits(name))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        for ref in self._marked:
            if (t := ref()) is not None and self._host(t):
                delattr(t, self.HOST)
        self._marked.clear()
        super().__exit__(*exc)
