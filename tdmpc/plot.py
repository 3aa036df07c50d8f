"""python -m tdmpc.plot RUN_DIR... : eval return against environment steps, several runs in one figure.

Runs with the same task and experiment name are seeds of one curve (mean, with a band
for min-max across seeds); --no-group draws every run separately.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import tyro

from tdmpc.cli import BadInput, run_cli


@dataclass
class Curve:
    label: str
    steps: np.ndarray
    returns: np.ndarray  # (seeds, len(steps)); NaN where a seed has no point
    style: dict = field(default_factory=dict)


def read_run(run_dir: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    """(task, label, env steps, eval returns) from a run directory."""
    eval_csv = run_dir / "eval.csv"
    if not eval_csv.is_file():
        raise BadInput(f"{run_dir}: no eval.csv (is this a tdmpc run directory?)")
    cfg_file = run_dir / "config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    with open(eval_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("episode_return")]
    steps = np.array([int(float(r["env_step"])) for r in rows])
    returns = np.array([float(r["episode_return"]) for r in rows])
    task = cfg.get("task", run_dir.name)
    return task, f"{task} ({cfg.get('exp_name', 'default')})", steps, returns


def group_runs(runs: list[Path], group: bool = True) -> list[Curve]:
    grouped: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for run in runs:
        _, label, steps, returns = read_run(run)
        grouped[label if group else str(run)].append((steps, returns))
    curves = []
    for label, series in grouped.items():
        steps = np.unique(np.concatenate([s for s, _ in series]))
        table = np.full((len(series), len(steps)), np.nan)
        for i, (s, r) in enumerate(series):
            table[i, np.searchsorted(steps, s)] = r
        curves.append(Curve(f"{label}, {len(series)} seed{'s' * (len(series) > 1)}" if group else label,
                            steps, table))
    return curves


def draw(curves: list[Curve], out: Path, title: str | None = None) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("plotting needs matplotlib: pip install -e '.[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for c in curves:
        mean = np.nanmean(c.returns, axis=0)
        (line,) = ax.plot(c.steps, mean, label=c.label, **c.style)
        if c.returns.shape[0] > 1:
            ax.fill_between(c.steps, np.nanmin(c.returns, 0), np.nanmax(c.returns, 0), alpha=0.15,
                            color=line.get_color())
    ax.set_xlabel("environment steps (action repeat included)")
    ax.set_ylabel("eval episode return")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


@dataclass
class PlotArgs:
    runs: Annotated[tuple[Path, ...], tyro.conf.Positional]
    """Run directories (each with eval.csv and config.json)."""
    out: Path = Path("eval_return.png")
    group: bool = True
    """Average runs of the same task and exp_name as seeds of one curve."""
    title: Optional[str] = None


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(PlotArgs, args=argv, description=__doc__.splitlines()[0])

    def go() -> int:
        out = draw(group_runs(list(args.runs), args.group), args.out, args.title)
        print(f"wrote {out}")
        return 0

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
