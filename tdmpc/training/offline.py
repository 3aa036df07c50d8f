"""Offline training: the agent updates on a dataset; a step is one update, and no env is stepped but to evaluate.

Data-parallel ranks (torchrun, slurm/train_multi.sh) each sample their part of every batch; rank 0
evaluates, logs and writes the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.offline.sampler import DatasetSampler
from tdmpc.training.run_dir import RunDirLock
from tdmpc.training.trainer import Callback, RunSetup, Trainer


class OfflineTrainer(Trainer):
    steps_name = "updates"

    def __init__(self, setup: RunSetup, agent: Agent, data: DatasetSampler, lock: RunDirLock,
                 on_log: Callback | None = None, on_eval: Callback | None = None):
        self.data = data
        super().__init__(setup, agent, lock, on_log=on_log, on_eval=on_eval)

    def step(self) -> None:
        """One update; steps count updates."""
        self.update()
        self.counters.step += 1

    def sample(self) -> Batch:
        return self.data.sample(self.cfg.batch_size)

    def save_data(self, ckpt_dir: Path) -> dict[str, Any]:
        return {"rng": {"sampler": self.data.generator.get_state()}, "buffer_file": None, "data_episodes": None}

    def restore_data(self, obj: dict, no_buffer: bool) -> None:
        if "sampler" in obj["rng"]:
            self.data.generator.set_state(obj["rng"]["sampler"])

    def close_data(self) -> None:
        self.data.close()
