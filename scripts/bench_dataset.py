"""Time offline sampling: sample(256) at horizon 3 from memory vs streamed, on a file of ~1M rows.

python -m scripts.bench_dataset [--rows 1000000] [--dir /tmp]   (from the repository root)

Writes a state dataset (obs 24, action 6, 500-step episodes, smooth random-walk observations),
then reports: write and validation throughput; per-sample time in memory and streaming
(median, p99, max over all calls, window swaps included); the time to read one window; and
the time of a stand-in update step (a CPU matmul loop of ~`--update-ms`) with a sample before
each, in memory vs streaming, i.e. how much the prefetch thread slows training down.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tdmpc.dataset import Episode, open_dataset
from tdmpc.dataset_sampler import InMemoryDataset, StreamingDataset
from tdmpc.dataset_writer import DatasetWriter

OBS, ACT, EP_LEN, H, B = 24, 6, 500, 3, 256


def episodes(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        obs = np.cumsum(rng.standard_normal((EP_LEN + 1, OBS), dtype=np.float32) * 0.1, axis=0)
        yield Episode(obs, rng.uniform(-1, 1, (EP_LEN, ACT)).astype(np.float32),
                      rng.uniform(0, 1, EP_LEN).astype(np.float32), False, True)


def timed_samples(sampler, n: int) -> np.ndarray:
    times = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        sampler.sample(B)
        times[i] = time.perf_counter() - t
    return times


def fake_update(ms: float) -> None:
    """A CPU-bound stand-in for one training update of about `ms` milliseconds."""
    a = torch.randn(256, 256)
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a * 1e-2)


def train_loop(sampler, steps: int, ms: float) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        sampler.sample(B)
        fake_update(ms)
    return (time.perf_counter() - t) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--window-rows", type=int, default=1 << 18)
    p.add_argument("--swap-every", type=int, default=256)
    p.add_argument("--update-ms", type=float, default=30.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    path = args.dir / "bench_dataset.h5"
    path.unlink(missing_ok=True)
    n_eps = args.rows // (EP_LEN + 1)

    t = time.perf_counter()
    with DatasetWriter(path, (OBS,), ACT, ["bench"], "state", 2, "scripts/bench_dataset.py") as w:
        w.commit(episodes(n_eps))
    write_s = time.perf_counter() - t
    raw_mb = n_eps * (EP_LEN + 1) * (OBS * 4 + ACT * 4 + 4 + 2) / 1e6
    size_mb = path.stat().st_size / 1e6
    print(f"file: {n_eps * (EP_LEN + 1):,} rows, {raw_mb:.0f} MB raw, {size_mb:.0f} MB on disk "
          f"({raw_mb / size_mb:.2f}x); written in {write_s:.1f} s ({raw_mb / write_s:.0f} MB/s)")

    t = time.perf_counter()
    info = open_dataset(path)
    check_s = time.perf_counter() - t
    print(f"open_dataset with the row check: {check_s:.2f} s ({raw_mb / check_s:.0f} MB/s)")

    t = time.perf_counter()
    memory = InMemoryDataset(info, H)
    print(f"InMemoryDataset load: {time.perf_counter() - t:.2f} s")
    stream = StreamingDataset(info, H, window_rows=args.window_rows, swap_every=args.swap_every)
    loads = []
    for _ in range(3):
        t = time.perf_counter()
        stream._load(stream._take())
        loads.append(time.perf_counter() - t)
    print(f"one streaming window ({args.window_rows:,} rows, 16 segments): read in {np.median(loads) * 1e3:.0f} ms "
          f"(median of 3, in the main thread)")

    for name, sampler in (("memory", memory), ("streaming", stream)):
        timed_samples(sampler, 200)  # warm up
        s = timed_samples(sampler, 5000) * 1e3
        print(f"sample({B}), H={H}, {name:9s}: median {np.median(s):.3f} ms, p99 {np.percentile(s, 99):.3f} ms, "
              f"max {s.max():.2f} ms")
    print(f"  streaming: {stream.windows} windows swapped in, {stream.late_samples} samples past due")

    steps = max(50, int(8000 / args.update_ms))
    base = train_loop(memory, steps, args.update_ms)
    late = stream.late_samples
    streamed = train_loop(stream, steps, args.update_ms)
    print(f"update ~{args.update_ms:.0f} ms + sample, {steps} steps: memory {base * 1e3:.1f} ms/step, "
          f"streaming {streamed * 1e3:.1f} ms/step ({(streamed / base - 1) * 100:+.1f}%), "
          f"{stream.late_samples - late} samples past due")
    stream.close()
    path.unlink()


if __name__ == "__main__":
    main()
