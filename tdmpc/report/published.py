"""The published TD-MPC2 curves (and the baselines beside them), packaged from the paper's results/ folder.

tdmpc/data/dmc_published.csv holds the TD-MPC2 paper's DMControl results (ICLR 2024): TD-MPC2, SAC and
DreamerV3, per task, seed and env step (action repeat included); dmc_pixels_published.csv TD-MPC2's from 64x64
frames (the reference's results/tdmpc2-pixels), what a run with obs "rgb" is compared with.
"""

from __future__ import annotations

import csv
import importlib.resources
import io
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

ALGORITHMS = {"tdmpc2": "TD-MPC2", "sac": "SAC", "dreamerv3": "DreamerV3"}


@dataclass
class Published:
    """One algorithm's mean curve on one task, over the seeds present at each step."""

    steps: np.ndarray
    mean: np.ndarray
    seeds: int

    def at(self, step: int) -> tuple[float | None, bool]:
        """(value, interpolated): linear between published points, None outside them."""
        hit = np.flatnonzero(self.steps == step)
        if hit.size:
            return float(self.mean[hit[0]]), False
        if step < self.steps[0] or step > self.steps[-1]:
            return None, False
        return float(np.interp(step, self.steps, self.mean)), True


def solved_threshold(task: str) -> float | None:
    """A gymnasium task's `reward_threshold` (CartPole-v1 475, Acrobot-v1 -100, LunarLander-v3 200: the return at
    which gymnasium calls it solved), the bar of a task without a published TD-MPC2 curve; None for others."""
    import gymnasium as gym

    try:
        spec = gym.spec(task)
    except gym.error.Error:  # not a registered gymnasium id (DMC names, user envs)
        return None
    return None if spec.reward_threshold is None else float(spec.reward_threshold)


DATA = {"state": "dmc_published.csv", "rgb": "dmc_pixels_published.csv"}  # Config.obs -> its published results


def load_published(obs: str = "state") -> dict[tuple[str, str], Published]:
    """(algorithm, task) -> Published, from the packaged copy of the paper's results for that kind of
    observation (Config.obs)."""
    text = (importlib.resources.files("tdmpc") / "data" / DATA[obs]).read_text()
    values: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[tuple[str, str], set] = defaultdict(set)
    for r in csv.DictReader(io.StringIO(text)):
        if r["episode_return"]:
            values[(r["algorithm"], r["task"])][int(r["env_step"])].append(float(r["episode_return"]))
            seeds[(r["algorithm"], r["task"])].add(r["seed"])
    return {key: Published(np.array(sorted(by_step)), np.array([np.mean(by_step[s]) for s in sorted(by_step)]),
                           len(seeds[key]))
            for key, by_step in values.items()}
