"""torch.compile for plan() and update(), with the two things a run needs around it: the compile time said
once, and a failed compile that falls back to eager with one line saying why instead of ending the run."""

from __future__ import annotations

import linecache
import re
import sys
import time
import traceback
from typing import Any, Callable

import torch

InductorOptions = dict[str, str | int | bool | Callable[..., Any]]  # torch.compile's options: inductor config keys


class Compiled:
    """fn through torch.compile (inductor, static shapes). The first call compiles: its time is printed, with how
    many of its graphs inductor's on-disk cache supplied (a warm start takes seconds, a cold one a minute on a
    GPU); if it fails, fn runs eagerly from then on, and the line names the innermost code that raised (often
    inductor's generated code: the one line a report needs). Tracing runs no real computation, so the eager retry
    starts clean.
    Another agent of the same shapes reuses the graphs an earlier one compiled (dynamo guards on the modules'
    structure, not their identity): its first call compiles nothing and prints nothing.
    Tensor arguments never share storage (see unaliased)."""

    def __init__(self, fn: Callable[..., Any], name: str, fullgraph: bool = True,
                 options: InductorOptions | None = None):
        self.eager, self.name = fn, name
        self.fn: Callable[..., Any] = torch.compile(fn, fullgraph=fullgraph, dynamic=False, options=options)
        self.ready = False

    def __call__(self, *args: Any) -> Any:
        if self.fn is not self.eager:
            args = unaliased(args)
        if self.ready:
            return self.fn(*args)
        start, graphs, cached = time.perf_counter(), compiled_graphs(), cache_use()
        try:
            out = self.fn(*args)
        except Exception as e:  # dynamo or inductor could not compile it: the eager function still works
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"compile: {self.name} runs eagerly, its compile failed ({type(e).__name__}: {why}){raised_at(e)}",
                  file=sys.stderr)
            self.fn, self.ready = self.eager, True
            return self.eager(*args)
        if compiled_graphs() > graphs:
            hits, misses = (now - before for now, before in zip(cache_use(), cached))
            source = f", {hits} of {hits + misses} graphs from inductor's cache" if hits else ""
            print(f"compile: {self.name} compiled in {time.perf_counter() - start:.0f} s{source}", file=sys.stderr)
        self.ready = True
        return out


def unaliased(args: tuple) -> tuple:
    """args with each tensor that shares storage with an earlier one copied. Torch 2.11's inductor cache hands a
    graph compiled for separate inputs to a call whose inputs alias (act()'s observations and first-step flags
    are views of one host-to-device copy) and the graph fails ("wrong number of dimensions", the H200's bench
    profile step; reproduced on the CPU: docs/speed.md). Inputs that never alias compile one graph for both."""
    seen: set[int] = set()
    out = list(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            ptr = a.untyped_storage().data_ptr()
            if ptr in seen:
                out[i] = a.clone()
            seen.add(ptr)
    return tuple(out)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (inductor's cache may have supplied their code)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def cache_use() -> tuple[int, int]:
    """Inductor's on-disk graph cache so far in this process: (hits, misses). It lives in TORCHINDUCTOR_CACHE_DIR
    (default /tmp/torchinductor_$USER), keyed by graph, shapes, torch version and device."""
    inductor = torch._dynamo.utils.counters["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]


def raised_at(e: BaseException) -> str:
    """' at FILE:LINE: CODE' where e was raised: the user code dynamo names for a trace it could not compile,
    else the innermost frame of e's traceback (for a compiled graph that failed as it ran, inductor's generated
    code, e.g. its assert_size_stride line); '' when there is neither."""
    _, user_code, named_in = str(e).partition("from user code:")
    named = re.findall(r'File "([^"]+)", line (\d+)', named_in) if user_code else []
    frames = traceback.extract_tb(e.__traceback__)
    if named:
        file, line = named[-1][0], int(named[-1][1])
    elif frames:
        file, line = frames[-1].filename, frames[-1].lineno or 0
    else:
        return ""
    return f" at {file.rsplit('/', 1)[-1]}:{line}: {linecache.getline(file, line).strip()[:160]}"


def compile_enabled(flag: bool | None, device: torch.device) -> bool:
    """Config.compile resolved: None compiles on CUDA, where it measured 1.53x end to end on an H200
    (results/gpu/2026-11-27-h200/), and not on the CPU, where it measured slower (results/compile-default/)."""
    return flag if flag is not None else device.type == "cuda"


# plan() compiles with inductor's realize_reads_threshold at 8 (default 4: a value read more often is stored):
# LayerNorm + SimNorm recomputes each group's values from the row's statistics (fused.py), and at 4 inductor 2.11
# (the H200's torch) stores them in kernels of their own: 293 kernels per plan() instead of 246, counted in Triton
# code for a GPU (torch 2.13: 248 -> 245; results/kernels-torch2.11.json, BENCHMARKS.md). The update would save 2.
PLAN_OPTIONS: InductorOptions = {"realize_reads_threshold": 8}


def compiled_if(enabled: bool, fn: Callable[..., Any], name: str,
                options: InductorOptions | None = None) -> Callable[..., Any]:
    """Compiled(fn, name, options=options) when enabled (Config.compile), else fn itself."""
    return Compiled(fn, name, options=options) if enabled else fn
