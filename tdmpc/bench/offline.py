"""Offline training's update time with the dataset in memory against streamed from disk (the offline row)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tdmpc.bench.timing import ACTION_DIM, OBS_DIM, make_agent, sync


def bench_offline(size: int, device: torch.device, rows: int, updates: int) -> dict:
    """Offline training's update time with the data in memory vs streamed from disk in prefetched windows
    (a synthetic walker-sized dataset of `rows` rows, written to a temp file), at model size `size`."""
    from tdmpc.offline.format import Episode, open_dataset
    from tdmpc.offline.sampler import InMemoryDataset, StreamingDataset
    from tdmpc.offline.writer import DatasetWriter

    length, rng = 500, np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.h5"
        t0 = time.perf_counter()
        with DatasetWriter(path, (OBS_DIM,), ACTION_DIM, ["walker-walk"], "state", 2, "tdmpc.bench") as w:
            w.commit(Episode(np.cumsum(rng.standard_normal((length + 1, OBS_DIM)), 0).astype(np.float32) * 0.1,
                             rng.uniform(-1, 1, (length, ACTION_DIM)).astype(np.float32),
                             rng.uniform(0, 1, length).astype(np.float32), False, True)
                     for _ in range(rows // (length + 1)))
        write_s = time.perf_counter() - t0
        info = open_dataset(path, check_rows=False)
        agent = make_agent(size, device, "auto")
        # Windows 1/16 of the data, replaced 4 times while timed (training swaps every ~window/batch updates,
        # far less often): each swap's read and copy compete with the updates, as they would on a long run.
        window, swap_every = max(1, info.rows // 16), max(1, updates // 4)
        out: dict = {"rows": info.rows, "file_mb": path.stat().st_size / 1e6, "write_s": write_s, "model_size": size}
        for name, make in (("memory", lambda: InMemoryDataset(info, agent.cfg.horizon, device)),
                           ("stream", lambda: StreamingDataset(info, agent.cfg.horizon, window_rows=window,
                                                               swap_every=swap_every, device=device))):
            sampler = make()
            try:
                for _ in range(5):
                    agent.update(sampler.sample(256))
                sync(device)
                t0 = time.perf_counter()
                for _ in range(updates):
                    agent.update(sampler.sample(256))
                sync(device)
                out[name] = {"update_ms": (time.perf_counter() - t0) / updates * 1e3,
                             "late_samples": getattr(sampler, "late_samples", 0),
                             "windows": getattr(sampler, "windows", 1), "window_rows": window}
            finally:
                sampler.close()
        out["stream_over_memory"] = out["stream"]["update_ms"] / out["memory"]["update_ms"]
        return out
