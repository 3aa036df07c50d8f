"""What a run directory holds, and the housekeeping around it.

    <run_dir>/config.json        the resolved config
    <run_dir>/train.csv, eval.csv
    <run_dir>/checkpoints/latest.pt and buffer_<step>.h5
    <run_dir>/wandb_id           the run's wandb id, kept across resumes and requeues
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from tdmpc.config import Config, ConfigError, from_dict, read_json


def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest.pt"


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / cfg.task.replace(":", "_") / f"seed{cfg.seed}" / time.strftime("%Y%m%d-%H%M%S")


def saved_config(run_dir: Path) -> Config:
    """The config a run was started with (for --resume); fields added to Config since are said, one line each."""
    path = run_dir / "config.json"
    if not checkpoint_path(run_dir).is_file() or not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no run to continue there (need config.json and checkpoints/latest.pt)")
    raw = read_json(path)
    cfg = from_dict(raw, source=str(path))
    for name in sorted(set(cfg.to_dict()) - set(raw)):
        print(f"resume: {path} has no '{name}' (added to tdmpc since the run started); using the default "
              f"{getattr(cfg, name)!r}", file=sys.stderr)
    return cfg


def set_aside_unfinished(run_dir: Path) -> None:
    """A fresh start in a directory that an earlier session left without a checkpoint (a node
    failure, say): move its files into no-checkpoint-<time>/, so no step appears twice in
    train.csv and nothing is deleted."""
    names = ("train.csv", "eval.csv", "config.json", "tb", "checkpoints", "videos", "wandb_id")
    leftovers = [p for p in run_dir.glob("*") if p.name in names] if run_dir.is_dir() else []
    if not leftovers:
        return
    stale = run_dir / f"no-checkpoint-{time.strftime('%Y%m%d-%H%M%S')}"
    stale.mkdir()
    for p in leftovers:
        p.rename(stale / p.name)
    print(f"{run_dir} held files of a session that left no checkpoint; moved them to {stale}", file=sys.stderr)


def wandb_run_id(run_dir: Path) -> str:
    """A unique wandb run id for this run directory, made at its first start and kept (resumes, requeues)."""
    path = run_dir / "wandb_id"
    if path.is_file():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id + "\n")
    return run_id
