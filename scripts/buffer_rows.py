"""What the discrete-model checks share: their command line (a checkpoint, its replay buffer file, a row range)
and the buffer's transitions. Imported by one_step_check.py and reward_decode_calibration.py, which run from this
folder (python scripts/<name>.py)."""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import torch

import tdmpc


def transitions(path: str, env: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """The buffer file's rows of one env and `idx`, the rows in [lo, hi) that follow a row of the same episode."""
    with h5py.File(path, "r") as f:
        rows = {k: f[k][env] for k in ("obs", "action", "reward", "first", "terminated")}
        ptr = int(f["ptr"][env]) if "ptr" in f else -1
    idx = np.arange(max(lo, 1), min(hi, len(rows["reward"])))
    rows["idx"] = idx[~rows["first"][idx] & (idx != ptr)]  # row ptr: the oldest of a wrapped buffer
    return rows


def discrete_rows(argv: list[str] | None, description: str) -> tuple[argparse.Namespace, tdmpc.Agent,
                                                                     dict[str, np.ndarray]]:
    """Parse `checkpoint buffer_file first_row end_row [--env N]`: the arguments, the discrete agent (one thread,
    CPU) and the rows."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("checkpoint")
    p.add_argument("buffer_file")
    p.add_argument("first_row", type=int)
    p.add_argument("end_row", type=int)
    p.add_argument("--env", type=int, default=0, help="which env's rows (default 0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    agent = tdmpc.Agent.from_checkpoint(args.checkpoint, device="cpu")
    if not agent.model.discrete:
        raise SystemExit(f"{args.checkpoint}: a continuous-action model; this check is for discrete ones")
    return args, agent, transitions(args.buffer_file, args.env, args.first_row, args.end_row)
