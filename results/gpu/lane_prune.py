"""learning_run.sh's pruning: which lane to stop so that the others finish before the lease ends.

Each lane's time to finish comes from its current run's rate over its last WINDOW seconds of train.csv rows, not
its last two rows: a row that spans an evaluation (ten episodes, about 7 s at a4000.json) reads two to three times
slower than the run, and on 2026-11-28 one such row made a lane look 672 s from its end instead of about 290, so
a lane that would have finished was stopped (pendulum-swingup at 50k env steps; lease-2026-11-28-h200/prune.log).

python results/gpu/lane_prune.py LANES RUNS STEPS SECONDS_LEFT "PID..." START: prints the pid to stop, or nothing.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from tdmpc.cli.reproduce import parse_seeds

WINDOW = 60.0  # seconds of rows the rate is taken over: past one evaluation, short of the rate's real changes
FINAL_EVAL = 30.0  # seconds: the last evaluation after the last row
START_UP = 90.0  # seconds: a lane's next run starts (compile, seeding) before its rows begin


def rate(rows: list[dict], start: int) -> float | None:
    """Env steps per second over the rows of the last WINDOW seconds at or past env step `start`."""
    rows = [r for r in rows if int(r["env_step"]) >= start]
    if len(rows) < 2:
        return None
    last = rows[-1]
    first = next((r for r in reversed(rows[:-1]) if float(last["elapsed"]) - float(r["elapsed"]) >= WINDOW), rows[0])
    seconds = float(last["elapsed"]) - float(first["elapsed"])
    return (int(last["env_step"]) - int(first["env_step"])) / seconds if seconds > 0 else None


def seconds_needed(cells: list[list[dict]], steps: int, start: int) -> float | None:
    """A lane's time to finish: its current run (the first of its cells not done) at its rate, then the rest."""
    todo = [rows for rows in cells if not rows or int(rows[-1]["env_step"]) < steps]
    if not todo:
        return 0.0
    r = rate(todo[0], start)
    if r is None:
        return None  # no rate yet: no decision for this lane
    return (steps - int(todo[0][-1]["env_step"])) / r + FINAL_EVAL + (len(todo) - 1) * (steps / r + START_UP)


def victim(lanes: list[tuple[str, list[list[dict]]]], steps: int, left: float, start: int) -> tuple[str | None, str]:
    """The last-listed lane while the slowest lane would end past `left` seconds (one lane is never stopped)."""
    need = {pid: n for pid, cells in lanes if (n := seconds_needed(cells, steps, start)) is not None}
    line = f"left {left:.0f} s; need " + ", ".join(f"{p}: {n:.0f} s" for p, n in need.items())
    return (lanes[-1][0] if len(lanes) > 1 and need and max(need.values()) > left else None), line


def main(argv: list[str]) -> None:
    lanes_file, root, steps, left, alive, start = argv
    lanes = []
    for line in Path(lanes_file).read_text().splitlines():
        pid, tasks, seeds = line.split()
        if pid in alive.split():
            files = [Path(root) / t / f"seed{s}" / "train.csv" for t in tasks.split(",") for s in parse_seeds(seeds)]
            lanes.append((pid, [list(csv.DictReader(open(f))) if f.is_file() else [] for f in files]))
    pid, line = victim(lanes, int(steps), float(left), int(start))
    print(line, file=sys.stderr)
    if pid:
        print(pid)


if __name__ == "__main__":
    main(sys.argv[1:])
