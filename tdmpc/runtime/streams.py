"""Rounds of updates on a CUDA stream of their own, beside planning on the default stream (--update-stream).

With overlap_updates a step's round of updates is queued after the next step's plan; on one stream the GPU then
runs them one after the other. Here the round runs on a side stream (the CUDA graphs' own, so cuBLAS keeps no
extra workspace) and events order what the two streams share, with no host wait:

- a round starts once the default stream has refreshed the planning copy (so the round never writes weights the
  copy is reading) and stored the last rows (so it samples no half-written row); the plan queued after the
  refresh runs beside the round;
- the planning copy is refreshed once the last round queued has finished: a plan reads every round but the one
  queued after it, as with overlap_updates on one stream;
- the next rows are stored once the round has drawn its batches;
- log rows, evaluations and checkpoints join the side stream before they read what the rounds wrote.

On the CPU, or when off, every method does nothing.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from tdmpc.runtime.cuda_graphs import side_stream


class UpdateStream:
    def __init__(self, device: torch.device, enabled: bool):
        self.stream = side_stream(device.index or 0) if enabled and device.type == "cuda" else None
        if self.stream is not None:
            self._inputs, self._done, self._sampled = torch.cuda.Event(), torch.cuda.Event(), torch.cuda.Event()

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """A round of updates (sampling included) on the side stream, after the inputs it reads."""
        if self.stream is None:
            yield
            return
        self.stream.wait_event(self._inputs)
        with torch.cuda.stream(self.stream):
            yield
            self._done.record()

    def inputs_ready(self) -> None:
        """The default stream has queued the planning copy's refresh and the rows a round samples."""
        if self.stream is not None:
            self._inputs.record()

    def before_refresh(self) -> None:
        """The planning copy is about to read the weights: after the last round queued."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_event(self._done)

    def sampled(self) -> None:
        """A batch is drawn (on the side stream inside a round)."""
        if self.stream is not None:
            self._sampled.record()

    def before_store(self) -> None:
        """The buffer is about to be written: after the round's batches are drawn."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_event(self._sampled)

    def join(self) -> None:
        """What the rounds wrote (weights, metrics) is about to be read on the default stream."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
