"""learning_run.sh's lanes: how many runs at once, which runs each lane trains, and which lane to stop.

A cell is one (task, seed) run. Pending cells are taken seed by seed (every task's seed 1, in TASKS order, before
any seed 2), so a lease finishes one seed of each task before the extra seeds, and the first-listed task's extra
seeds come first. Lanes take the chosen cells in turn; each lane trains its cells one after another.

Pruning: each lane's time to finish comes from its current run's rate over its last WINDOW seconds of train.csv
rows, not its last two rows: a row that spans an evaluation (ten episodes, about 7 s at a4000.json) reads two to
three times slower than the run, and on 2026-11-28 one such row made a lane look 672 s from its end instead of
about 290, so a lane that would have finished was stopped (pendulum-swingup at 50k env steps;
learning/lease-2026-11-28-h200/prune.log).

  python lanes.py choose OUT SECONDS AGENT_STEPS STEPS TASKS SEEDS RUNS  -> "jobs mps cells" (the probe's choice)
  python lanes.py split TASKS SEEDS JOBS CELLS STEPS RUNS                -> one line per lane: task:seed,task:seed
  python lanes.py prune LANES RUNS STEPS SECONDS_LEFT "PID..." START      -> the pid to stop, or nothing
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from tdmpc.cli.reproduce import last_eval_step, parse_seeds, parse_tasks

WINDOW = 60.0  # seconds of rows a rate is taken over: past one evaluation, short of the rate's real changes
FINAL_EVAL = 30.0  # seconds: the last evaluation after the last row
START_UP = 90.0  # seconds: a run's start (compile, first evaluation, seeding) before its rate holds

Cell = tuple[str, int]


def pending(tasks: list[str], seeds: list[int], root: Path, steps: int) -> list[Cell]:
    """The cells without an evaluation at `steps` under `root`, seed by seed."""
    return [(t, s) for s in seeds for t in tasks if (last_eval_step(root / t / f"seed{s}") or -1) < steps]


def split(cells: list[Cell], jobs: int) -> list[list[Cell]]:
    """`jobs` lanes (fewer if there are fewer cells), taking the cells in turn."""
    return [cells[i::jobs] for i in range(min(jobs, len(cells)))]


def choose(rates: dict[tuple[int, int], float], n_pending: int, seconds: float, agent_steps: int) -> tuple[int, int, int]:
    """(jobs, mps, cells): of the ways measured ((mps, runs at once) -> each run's agent steps/s), the one that
    finishes the most pending runs in `seconds` (fewer at once on a tie); one run if none can finish, as it still
    gives a curve up to where it stops."""
    finish = {k: min(n_pending, k[1] * int(seconds // (agent_steps / r + START_UP))) for k, r in rates.items()}
    mps, n = max(finish, key=lambda k: (finish[k], -k[1], rates[k])) if finish else (0, 1)
    k = max(1, finish.get((mps, n), 0))
    return min(n, k), mps, k


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
    """A lane's time to finish (each cell its train.csv rows): its current run at its rate, then the rest."""
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


def _cells(text: str) -> list[Cell]:
    return [(t, int(s)) for t, s in (c.rsplit(":", 1) for c in text.split(","))]


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "choose":
        out, seconds, agent_steps, steps, tasks, seeds, root = args
        todo = pending(parse_tasks(tasks), parse_seeds(seeds), Path(root), int(steps))
        rates = {}  # (mps, n) -> per-run agent steps/s (the slowest run's)
        for mps, name in ((0, "procs.json"), (1, "procs-mps.json")):
            if (Path(out) / name).is_file():
                for n, p in json.loads((Path(out) / name).read_text()).get("end_to_end_by_procs", {}).items():
                    rates[mps, int(n)] = min(p["agent_steps_per_s_each"])
        jobs, mps, k = choose(rates, len(todo), float(seconds), int(agent_steps))
        print(jobs, mps, k)
        json.dump({"rates": {f"{'mps' if m else 'sliced'} x{j}": r for (m, j), r in rates.items()},
                   "seconds_left": float(seconds), "pending": len(todo), "jobs": jobs, "mps": bool(mps), "cells": k},
                  open(Path(out) / "choice.json", "w"), indent=1)
    elif command == "split":
        tasks, seeds, jobs, k, steps, root = args
        cells = pending(parse_tasks(tasks), parse_seeds(seeds), Path(root), int(steps))[:int(k)]
        for lane in split(cells, int(jobs)):
            print(",".join(f"{t}:{s}" for t, s in lane))
    elif command == "prune":
        lanes_file, root, steps, left, alive, start = args
        lanes = []
        for line in Path(lanes_file).read_text().splitlines():
            pid, cells = line.split()
            if pid in alive.split():
                files = [Path(root) / t / f"seed{s}" / "train.csv" for t, s in _cells(cells)]
                lanes.append((pid, [list(csv.DictReader(open(f))) if f.is_file() else [] for f in files]))
        pid, line = victim(lanes, int(steps), float(left), int(start))
        print(line, file=sys.stderr)
        if pid:
            print(pid)
    else:
        raise SystemExit(f"lanes.py: unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
