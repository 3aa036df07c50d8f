"""torch.compile for plan() and update(), with the two things a run needs around it: the compile time said
once, and a failed compile that falls back to eager with one line saying why instead of ending the run."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import torch


class Compiled:
    """fn through torch.compile (inductor, static shapes). The first call compiles: its time is printed; if it
    fails, fn runs eagerly from then on. Tracing runs no real computation, so the eager retry starts clean.
    Another agent of the same shapes reuses the graphs an earlier one compiled (dynamo guards on the modules'
    structure, not their identity): its first call compiles nothing and prints nothing."""

    def __init__(self, fn: Callable[..., Any], name: str, fullgraph: bool = True):
        self.eager, self.name = fn, name
        self.fn: Callable[..., Any] = torch.compile(fn, fullgraph=fullgraph, dynamic=False)
        self.ready = False

    def __call__(self, *args: Any) -> Any:
        if self.ready:
            return self.fn(*args)
        start, graphs = time.perf_counter(), compiled_graphs()
        try:
            out = self.fn(*args)
        except Exception as e:  # dynamo or inductor could not compile it: the eager function still works
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"compile: {self.name} runs eagerly, its compile failed ({type(e).__name__}: {why})", file=sys.stderr)
            self.fn, self.ready = self.eager, True
            return self.eager(*args)
        if compiled_graphs() > graphs:
            print(f"compile: {self.name} compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        self.ready = True
        return out


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (inductor's cache may have supplied their code)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def compile_enabled(flag: bool | None, device: torch.device) -> bool:
    """Config.compile resolved: None compiles on CUDA, where it measured 1.53x end to end on an H200
    (results/gpu/2026-11-27-h200/), and not on the CPU, where it measured slower (results/compile-default/)."""
    return flag if flag is not None else device.type == "cuda"


def compiled_if(enabled: bool, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Compiled(fn, name) when enabled (Config.compile), else fn itself."""
    return Compiled(fn, name) if enabled else fn
