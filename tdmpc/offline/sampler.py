"""Training batches from offline datasets, all in memory or streamed from disk through a window.

Both samplers keep ReplayBuffer.sample's contract: B sub-trajectories of H+1 consecutive rows
inside one episode, uniform over valid starts, time-major, on the requested device.
A start s is valid when rows s..s+H are one episode, i.e. s <= episode start + length - H, or,
in an episode that terminates, s <= its last row - 1: the steps past the terminal one are masked
in the update (as ReplayBuffer's), and read whatever rows follow.

The streaming sampler holds a window of about W rows: 16 segments of consecutive rows, each
a whole number of chunks (so each chunk is decompressed once) plus the H rows after it (so
every start a segment owns has its whole sub-trajectory). Every start belongs to exactly one
segment. Segments are visited in a random order, each once per pass over the data; a
background thread reads the next window (h5py releases the GIL while it reads) and sample()
swaps it in after at least K samples, as soon as it is ready: sample() never waits on disk.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, Iterator

import h5py
import numpy as np
import torch
from torch import Tensor

from tdmpc.buffer import Batch
from tdmpc.offline.format import DatasetError, DatasetFile, DatasetInfo, open_h5

SEGMENTS_PER_WINDOW = 16
SAMPLED_FIELDS = ("obs", "action", "reward", "terminated")


@dataclass(frozen=True)
class _Segment:
    file: int  # index into DatasetInfo.files
    lo: int  # first row whose start it owns
    hi: int  # end of the rows whose starts it owns
    end: int  # end of the rows it reads: hi + H, within the file


@dataclass
class _Window:
    """Rows on the storage device and the window row of each valid start (and its task)."""

    rows: dict[str, Tensor]
    starts: Tensor  # (V,) int64
    task: Tensor | None  # (V,) int64, multi-task data only
    num_starts: int


class _ValidStarts:
    """One file's valid starts as sorted disjoint row intervals [a, b), one per long enough episode."""

    def __init__(self, file: DatasetFile, horizon: int):
        n = np.maximum(np.where(file.episode_terminated, file.episode_length, file.episode_length - horizon + 1), 0)
        keep = n > 0
        self.a = file.episode_start[keep]
        self.b = self.a + n[keep]
        self.task = file.task_ids[file.episode_task[keep]]

    def _overlap(self, lo: int, hi: int) -> tuple[slice, np.ndarray, np.ndarray]:
        """The intervals meeting rows [lo, hi), and the first row and number of starts of each inside them."""
        k = slice(np.searchsorted(self.b, lo, side="right"), np.searchsorted(self.a, hi, side="left"))
        a = np.maximum(self.a[k], lo)
        return k, a, np.minimum(self.b[k], hi) - a

    def within(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Valid starts in rows [lo, hi) and their (merged) task ids."""
        k, a, n = self._overlap(lo, hi)
        return np.arange(n.sum()) + np.repeat(a - (np.cumsum(n) - n), n), np.repeat(self.task[k], n)

    def count(self, lo: int, hi: int) -> int:
        return int(self._overlap(lo, hi)[2].sum())


class DatasetSampler:
    """Base of the two samplers: reads segments of rows into windows and samples from a window.

    Start indices come from the sampler's own generator (seeded; its state goes into checkpoints). With
    `shard` (rank, world size) every rank draws the same world x batch indices and takes its own slice:
    the ranks' batches together are exactly the batch of one process with the same seed."""

    def __init__(self, info: DatasetInfo, horizon: int, device: torch.device | str = "cpu",
                 storage: torch.device | str | None = None, seed: int = 0, shard: tuple[int, int] = (0, 1)):
        self.info, self.H = info, horizon
        self.shard = shard
        self.device = torch.device(device)
        self.storage = torch.device(storage) if storage is not None else self.device
        self.multitask = len(info.schema.tasks) > 1
        self._pin = "cuda" in (self.storage.type, self.device.type)  # host rows bound for a GPU
        self._copy_stream = torch.cuda.Stream(self.storage) if self.storage.type == "cuda" else None
        self._valid = [_ValidStarts(file, horizon) for file in info.files]
        self._offsets = torch.arange(horizon + 1, device=self.storage)
        self._h5: list[h5py.File] = []
        self.generator = torch.Generator(device=self.storage)
        self.generator.manual_seed(seed)

    def _segments(self, rows_per_segment: int | None) -> list[_Segment]:
        """Each file cut into segments of whole chunks (None: one per file); those without valid starts left out."""
        out = []
        for i, file in enumerate(self.info.files):
            step = (file.rows if rows_per_segment is None
                    else file.chunk_rows * max(1, rows_per_segment // file.chunk_rows))
            for lo in range(0, file.rows, max(step, 1)):
                hi = min(lo + step, file.rows)
                if self._valid[i].count(lo, hi):
                    out.append(_Segment(i, lo, hi, min(hi + self.H, file.rows)))
        if not out:
            raise DatasetError(f"{', '.join(str(f.path) for f in self.info.files)}: no episode has {self.H} or more "
                               f"transitions (the horizon): nothing to sample")
        return out

    def _load(self, segments: list[_Segment]) -> _Window:
        """Read segments into one window (pinned when bound for a GPU), then onto the storage device."""
        schema = self.info.schema
        n = sum(s.end - s.lo for s in segments)
        host = {name: torch.empty((n, *shape), dtype=_torch_dtype(dtype), pin_memory=self._pin)
                for name, (shape, dtype) in schema.row_fields().items() if name in SAMPLED_FIELDS}
        starts, tasks, off = [], [], 0
        for seg in segments:
            file, f, m = self.info.files[seg.file], self._h5[seg.file], seg.end - seg.lo
            for name, t in host.items():
                _read_into(f, file, name, seg.lo, seg.end, t[off:off + m].numpy())
            rows, task = self._valid[seg.file].within(seg.lo, seg.hi)
            starts.append(rows - seg.lo + off)
            tasks.append(task)
            off += m
        host["starts"] = torch.from_numpy(np.concatenate(starts))
        if self.multitask:
            host["task"] = torch.from_numpy(np.concatenate(tasks))
        if self._copy_stream is not None:
            with torch.cuda.stream(self._copy_stream):
                host = {k: v.to(self.storage, non_blocking=True) for k, v in host.items()}
            self._copy_stream.synchronize()
        return _Window({name: host[name] for name in SAMPLED_FIELDS}, host["starts"], host.get("task"),
                       len(host["starts"]))

    def _open(self) -> None:
        self._h5 = [open_h5(file.path) for file in self.info.files]

    def _close_files(self) -> None:
        for f in self._h5:
            f.close()
        self._h5 = []

    def _sample(self, w: _Window, batch_size: int) -> Batch:
        rank, world = self.shard
        j = torch.randint(w.num_starts, (batch_size * world,), device=self.storage, generator=self.generator)
        j = j[rank * batch_size:(rank + 1) * batch_size]
        # (H+1, B); a start near a terminal row reads past it (masked in the update), at most to the window's end
        rows = (w.starts[j] + self._offsets[:, None]).clamp(max=len(w.rows["reward"]) - 1)
        act = rows[1:]
        batch = Batch(w.rows["obs"][rows], w.rows["action"][act], w.rows["reward"][act], w.rows["terminated"][act],
                      None if w.task is None else w.task[j])
        return batch if self.storage == self.device else _to_device(batch, self.device)

    def sample(self, batch_size: int) -> Batch:
        raise NotImplementedError

    def close(self) -> None:
        """Release the files (and a streaming sampler's prefetch thread)."""
        self._close_files()


class InMemoryDataset(DatasetSampler):
    """Every row in memory: host tensors (pinned when sampling for a GPU) or device tensors (`storage`)."""

    def __init__(self, info: DatasetInfo, horizon: int, device: torch.device | str = "cpu",
                 storage: torch.device | str | None = None, seed: int = 0, shard: tuple[int, int] = (0, 1)):
        super().__init__(info, horizon, device, storage, seed, shard)
        self._open()
        try:
            self._window = self._load(self._segments(None))
        finally:
            self._close_files()

    @property
    def num_starts(self) -> int:
        return self._window.num_starts

    def sample(self, batch_size: int) -> Batch:
        return self._sample(self._window, batch_size)


class StreamingDataset(DatasetSampler):
    """Data larger than memory: samples from a window of about `window_rows` rows while the next loads.

    A window is replaced after `swap_every` samples if the next one is read by then, else as
    soon as it is; `late_samples` counts the samples taken meanwhile (the disk fell behind).
    `deterministic=True` waits for a late window instead, so that the batches depend on the
    seeds alone, not on disk timing. Memory: two windows. Batches from one window are
    correlated (16 segments of consecutive episodes); `swap_every` ~ window_rows / batch_size
    draws each start about once per window.
    """

    def __init__(self, info: DatasetInfo, horizon: int, window_rows: int = 1 << 18, swap_every: int = 1024,
                 device: torch.device | str = "cpu", storage: torch.device | str | None = None, seed: int = 0,
                 deterministic: bool = False, shard: tuple[int, int] = (0, 1)):
        super().__init__(info, horizon, device, storage, seed, shard)
        deterministic = deterministic or shard[1] > 1  # every rank must sample from the same window
        if window_rows < 1 or swap_every < 1:
            raise ValueError(f"window_rows ({window_rows}) and swap_every ({swap_every}) must be positive")
        self.window_rows, self.swap_every, self.deterministic = window_rows, swap_every, deterministic
        self._all = self._segments(max(1, window_rows // SEGMENTS_PER_WINDOW))
        self._rng = np.random.default_rng(seed)
        self._queue: list[_Segment] = []
        self.windows, self.late_samples, self._since_swap = 1, 0, 0
        self._open()
        self._pool: ThreadPoolExecutor | None = None
        self._next: Future | None = None
        try:
            fits = sum(s.hi - s.lo for s in self._all) <= window_rows
            self._window = self._load(self._all if fits else self._take())
            if not fits:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="dataset-prefetch")
                self._next = self._pool.submit(self._load, self._take())
        except BaseException:
            self.close()
            raise

    def _take(self) -> list[_Segment]:
        """The next window's segments: the next ones of a random order of all, renewed after each pass."""
        if not self._queue:
            self._queue = [self._all[i] for i in self._rng.permutation(len(self._all))]
        taken = [self._queue.pop()]
        rows = taken[0].hi - taken[0].lo
        while self._queue and rows + self._queue[-1].hi - self._queue[-1].lo <= self.window_rows:
            taken.append(self._queue.pop())
            rows += taken[-1].hi - taken[-1].lo
        return taken

    def sample(self, batch_size: int) -> Batch:
        if self._next is not None and self._since_swap >= self.swap_every:
            if self._next.done() or self.deterministic:
                self._swap()
            else:
                self.late_samples += 1
        self._since_swap += 1
        return self._sample(self._window, batch_size)

    def _swap(self) -> None:
        assert self._next is not None and self._pool is not None
        window = self._next.result()
        if self.storage.type == "cuda":  # made on the copy stream, used on this one from now on
            for t in (*window.rows.values(), window.starts, window.task):
                if t is not None:
                    t.record_stream(torch.cuda.current_stream(self.storage))
        self._window, self._since_swap = window, 0
        self.windows += 1
        self._next = self._pool.submit(self._load, self._take())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._next = None, None
        self._close_files()

    def __enter__(self) -> StreamingDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_into(f: h5py.File, file: DatasetFile, name: str, lo: int, hi: int, out: np.ndarray) -> None:
    """Rows [lo, hi) of a field into `out`, zero-padding narrower (multi-task) obs and actions at the end, and
    reading a padded single task's own columns of wider ones."""
    width = f[name].shape[1:]
    cols = (slice(min(width[0], out.shape[1])),) if width else ()  # a row's columns, none for a scalar field
    try:
        f[name].read_direct(out, (slice(lo, hi), *cols), (slice(None), *cols))
    except OSError as e:
        raise DatasetError(f"{file.path}: cannot read '{name}' rows {lo}..{hi}: the file is corrupt "
                           f"({str(e).splitlines()[0][:120]})") from None
    if width and width[0] < out.shape[1]:
        out[:, width[0]:] = 0


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _to_device(batch: Batch, device: torch.device) -> Batch:
    """Gathered on the host, sent to the device (through pinned memory, asynchronously, for a GPU)."""
    def move(t: Tensor) -> Tensor:
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    moved: Iterator[Any] = (None if (t := getattr(batch, f.name)) is None else move(t) for f in fields(batch))
    return Batch(*moved)  # each field's own type: a Tensor, or None for a single-task batch's task
