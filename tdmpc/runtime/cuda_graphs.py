"""Replay plan() and update() as CUDA graphs: one launch instead of thousands of small kernels.

Both calls already use static shapes, preallocated buffers and no host syncs, which is
what capture needs. The first `warmup` calls run eagerly (real work) on a side stream,
as PyTorch requires; the next call captures the graph once and every later call copies
its inputs into the static buffers and replays it. Eager mode stays the CPU path and
the fallback (Config.cuda_graphs = False).

Every graphed function warms up and captures on one side stream per device: cuBLAS keeps a
workspace per stream it ran on (32 MiB each on Hopper), so each extra stream would cost one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor


WARMUP = 3  # eager calls before the capture


@functools.cache
def side_stream(device: int) -> torch.cuda.Stream:
    """The one stream every graphed function warms up and is captured on (per device)."""
    return torch.cuda.Stream(device)


class CUDAGraphed:
    def __init__(self, fn: Callable[..., Any], warmup: int = WARMUP):
        self.fn, self.warmup = fn, warmup
        self.calls = 0
        self.inputs: list[Tensor] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: Any = None

    def __call__(self, *args: Tensor) -> Any:
        if self.inputs is None:
            self.inputs = [torch.empty_like(a) for a in args]
        for buf, a in zip(self.inputs, args):
            buf.copy_(a, non_blocking=True)
        if self.graph is None:
            side = side_stream(torch.cuda.current_device())
            if self.calls < self.warmup:
                self.calls += 1
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = self.fn(*self.inputs)
                torch.cuda.current_stream().wait_stream(side)
                return out
            graph = torch.cuda.CUDAGraph()  # a failed capture leaves self.graph None: the next call retries
            with torch.cuda.graph(graph, stream=side):
                self.output = self.fn(*self.inputs)
            self.graph = graph
        self.graph.replay()  # capture records without running: the first replay does the work
        return self.output
