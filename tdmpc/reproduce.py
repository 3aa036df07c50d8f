"""python -m tdmpc.reproduce --tasks cup-catch --seeds 1-3: train a grid and compare it with the published TD-MPC2 curves.

Runs go to <runs-root>/<task>/seed<seed>, one after another, and are compared at the end.
Rerunning the same command after an interruption skips finished runs and resumes the
stopped one. --slurm submits the grid through slurm/sweep.sh instead; --gather only
compares. Flags after -- go to every tdmpc.train run (e.g. -- --num-envs 4). The
comparison (results.md, results.csv, results.png) uses the published curves packaged in
tdmpc/data (the TD-MPC2 paper's results/ folder, ICLR 2024).
"""

from __future__ import annotations

import csv
import importlib.resources
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import tyro

from tdmpc.cli import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, BadInput, run_cli
from tdmpc.envs.tasks import resolve_task
from tdmpc.plot import Curve, Series, draw, group_series, read_run

TRAIN = [sys.executable, "-m", "tdmpc.train"]  # module-level so tests can swap in a fake trainer
ALGORITHMS = {"tdmpc2": "TD-MPC2", "sac": "SAC", "dreamerv3": "DreamerV3"}
SET_HERE = ("--task", "--seed", "--steps", "--run-dir", "--resume", "--cfg")  # not allowed after --
STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, s))


@dataclass
class ReproduceArgs:
    tasks: Optional[str] = None
    """Comma-separated tasks to train, e.g. cup-catch,cartpole-swingup."""
    seeds: str = "1-3"
    """Seeds as a list, a range or both: 1,2,3 or 1-3 or 1-3,7."""
    steps: int = 100_000
    """Env steps per run, action repeat included (the published curves' convention)."""
    cfg: Optional[str] = None
    """Config for tdmpc.train (a4000.json: reference settings). Default: tdmpc.train's (cpu.json without a GPU)."""
    runs_root: Path = field(default_factory=lambda: Path(os.environ.get("TDMPC_RUNS", "runs")) / "reproduce")
    """Run directories go to <runs-root>/<task>/seed<seed> (with --slurm: under <runs-root>/slurm)."""
    slurm: bool = False
    """Submit the grid as a Slurm job array (slurm/sweep.sh) instead of training here."""
    gather: Optional[tuple[Path, ...]] = None
    """Only compare: run directories, or folders searched for them (none given: --runs-root)."""
    out: Optional[Path] = None
    """Folder for results.md, results.csv and results.png. Default: --runs-root."""
    at: int = 100_000
    """Env step of the PASS/FAIL check."""
    bar: float = 0.9
    """PASS when our mean >= bar x the published TD-MPC2 mean at --at."""
    dry_run: bool = False
    """Print what would run (with --slurm: pass --dry-run to sweep.sh) and exit."""
    threads: Optional[int] = None
    """CPU threads of every training run (--threads of tdmpc.train). None: each run's own default."""


# --- the grid -----------------------------------------------------------------------

def parse_tasks(text: str | None) -> list[str]:
    tasks = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not tasks:
        raise BadInput("--tasks: give at least one task, e.g. --tasks cup-catch,cartpole-swingup")
    return list(dict.fromkeys(tasks))


def parse_seeds(text: str) -> list[int]:
    """'1,2,3', '1-3' or '1-3,7' -> [1, 2, 3(, 7)]."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise BadInput(f"--seeds {text!r}: expected non-negative integers like 1,2,3 or 1-3") from None
        if first < 0 or last < first:
            raise BadInput(f"--seeds {text!r}: {part.strip()!r} is not an increasing range of seeds >= 0")
        seeds += range(first, last + 1)
    return list(dict.fromkeys(seeds))


def seeds_text(seeds: list[int]) -> str:
    """The inverse of parse_seeds, with runs of consecutive seeds as ranges (for sweep.sh)."""
    parts, start = [], 0
    for i in range(1, len(seeds) + 1):
        if i == len(seeds) or seeds[i] != seeds[i - 1] + 1:
            parts.append(f"{seeds[start]}-{seeds[i - 1]}" if i - 1 > start else str(seeds[start]))
            start = i
    return ",".join(parts)


def check_train_args(extra: list[str]) -> None:
    for arg in extra:
        if arg.split("=", 1)[0] in SET_HERE:
            raise BadInput(f"{arg.split('=', 1)[0]} after --: reproduce sets it itself "
                           f"(use --tasks, --seeds, --steps, --cfg, --runs-root)")


# --- sequential runs --------------------------------------------------------------------

class Action(str, Enum):
    START = "start"  # nothing there yet
    RESUME = "resume"  # a checkpoint short of the target
    SKIP = "skip"  # already evaluated at the target step
    RESTART = "restart"  # leftovers without a checkpoint: set aside, then a fresh start


def last_eval_step(run_dir: Path) -> int | None:
    try:
        with open(run_dir / "eval.csv", newline="") as f:
            steps = [int(float(r["env_step"])) for r in csv.DictReader(f) if r.get("episode_return")]
    except FileNotFoundError:
        return None
    return max(steps, default=None)


def decide(run_dir: Path, task: str, seed: int, steps: int) -> Action:
    """What to do with one grid cell, so the whole command can simply be rerun after an interruption.

    Finished means evaluated at `steps` or later (the trainer evaluates at its last step), which
    still holds when someone deleted the checkpoints to free disk. A directory with files but no
    checkpoint died before its first save; the trainer would append to its eval.csv, so it is
    set aside rather than reused.
    """
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return Action.START
    cfg_file = run_dir / "config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except json.JSONDecodeError:
            raise BadInput(f"{cfg_file}: not valid JSON; move {run_dir} away or choose another --runs-root") from None
        if (cfg.get("task"), cfg.get("seed")) != (task, seed):
            raise BadInput(f"{run_dir} holds a run of {cfg.get('task')} seed {cfg.get('seed')}, not {task} "
                           f"seed {seed}; choose another --runs-root")
    last = last_eval_step(run_dir)
    if last is not None and last >= steps:
        return Action.SKIP
    if (run_dir / "checkpoints" / "latest.pt").is_file():
        return Action.RESUME
    return Action.RESTART


def train_command(action: Action, run_dir: Path, task: str, seed: int, steps: int, cfg: str | None,
                  extra: list[str]) -> list[str]:
    if action is Action.RESUME:  # the run's config.json applies; --steps may extend a finished shorter run
        return [*TRAIN, "--resume", str(run_dir), "--steps", str(steps), *extra]
    return [*TRAIN, *(["--cfg", cfg] if cfg else []), "--task", task, "--seed", str(seed), "--steps", str(steps),
            "--run-dir", str(run_dir), *extra]


def set_aside(run_dir: Path) -> Path:
    n = 1
    while (moved := run_dir.with_name(f"{run_dir.name}.stale{n}")).exists():
        n += 1
    run_dir.rename(moved)
    return moved


def run_child(cmd: list[str]) -> tuple[int, bool]:
    """(exit code, whether we were asked to stop) for one training subprocess.

    Ctrl-C reaches the child from the terminal by itself; SIGTERM and SIGUSR1 sent to us are
    passed on. Either way the child writes its checkpoint and exits 3, and we wait for that
    instead of killing it (which is what subprocess.run would do on KeyboardInterrupt).
    """
    state: dict = {"proc": None, "stop": False}

    def on_signal(signum: int, frame) -> None:
        state["stop"] = True
        if signum != signal.SIGINT and state["proc"] is not None:
            state["proc"].send_signal(signum)

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        state["proc"] = subprocess.Popen(cmd)
        rc = state["proc"].wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return rc, state["stop"]


def run_grid(args: ReproduceArgs, tasks: list[str], seeds: list[int], extra: list[str]) -> int:
    cells = [(task, seed, args.runs_root / task / f"seed{seed}") for task in tasks for seed in seeds]
    failed = []
    for i, (task, seed, run_dir) in enumerate(cells, 1):
        action = decide(run_dir, task, seed, args.steps)
        cmd = train_command(action, run_dir, task, seed, args.steps, args.cfg, extra)
        print(f"[{i}/{len(cells)}] {task} seed {seed}: {action.value} {run_dir}", flush=True)
        if action is Action.SKIP:
            continue
        if args.dry_run:
            print(f"  {shlex.join(cmd)}")
            continue
        if action is Action.RESTART:
            print(f"  no checkpoint there; set the leftovers aside as {set_aside(run_dir)}")
        print(f"  {shlex.join(cmd)}", flush=True)
        rc, stopped = run_child(cmd)
        if rc == EXIT_REQUEUE or stopped:
            print(f"stopped during {task} seed {seed}: rerun the same command to continue (finished runs are "
                  f"skipped, this one resumes)", file=sys.stderr)
            return EXIT_REQUEUE
        if rc == EXIT_BAD_INPUT:  # tdmpc.train printed why; the other runs would fail the same way
            return EXIT_BAD_INPUT
        if rc != EXIT_OK:
            failed.append(f"{task} seed {seed}")
            print(f"  {task} seed {seed} failed with exit code {rc}; going on with the rest", file=sys.stderr)
    if args.dry_run:
        return EXIT_OK
    done = [d for _, _, d in cells if last_eval_step(d) is not None]
    if done:
        gather(done, args.out or args.runs_root, args.at, args.bar)
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}; rerun the command to retry them",
              file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# --- Slurm ----------------------------------------------------------------------------

def sweep_script() -> Path:
    """./slurm/sweep.sh (a checkout, or a copy made by python -m tdmpc.slurm_scripts --copy .), else the
    packaged one (its logs then go beside it)."""
    from tdmpc.slurm_scripts import SCRIPTS

    for script in (Path.cwd() / "slurm" / "sweep.sh", SCRIPTS / "sweep.sh"):
        if script.is_file():
            return script
    raise BadInput("--slurm needs slurm/sweep.sh: run python -m tdmpc.slurm_scripts --copy . first")


def submit_slurm(args: ReproduceArgs, tasks: list[str], seeds: list[int], extra: list[str]) -> int:
    """One array element per (task, seed) via sweep.sh; TDMPC_RUNS puts the run dirs under --runs-root."""
    root = args.runs_root.resolve()
    train_args = [*(["--cfg", args.cfg] if args.cfg else []), "--steps", str(args.steps), *extra]
    cmd = ["bash", str(sweep_script()), "--tasks", ",".join(tasks), "--seeds", seeds_text(seeds),
           *(["--dry-run"] if args.dry_run else []), "--", *train_args]
    print(f"$ TDMPC_RUNS={shlex.quote(str(root))} {shlex.join(cmd)}", flush=True)
    rc = subprocess.run(cmd, env={**os.environ, "TDMPC_RUNS": str(root)}).returncode
    if rc != EXIT_OK:
        print(f"error: slurm/sweep.sh exited with code {rc}", file=sys.stderr)
        return EXIT_BAD_INPUT if rc == EXIT_BAD_INPUT else EXIT_ERROR
    out = args.out or args.runs_root
    print(f"\nWhen the jobs have finished (squeue --me lists none), compare with:\n"
          f"  python -m tdmpc.reproduce --gather {shlex.quote(str(root / 'slurm'))} --out {shlex.quote(str(out))}\n"
          f"(or name the run directories printed above). Requeued or failed elements can be resubmitted "
          f"with the same command; see slurm/.")
    return EXIT_OK


# --- published curves -----------------------------------------------------------------

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


def load_published() -> dict[tuple[str, str], Published]:
    """(algorithm, task) -> Published, from the packaged copy of the paper's results."""
    text = (importlib.resources.files("tdmpc") / "data" / "dmc_published.csv").read_text()
    values: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[tuple[str, str], set] = defaultdict(set)
    for r in csv.DictReader(io.StringIO(text)):
        if r["episode_return"]:
            values[(r["algorithm"], r["task"])][int(r["env_step"])].append(float(r["episode_return"]))
            seeds[(r["algorithm"], r["task"])].add(r["seed"])
    return {key: Published(np.array(sorted(by_step)), np.array([np.mean(by_step[s]) for s in sorted(by_step)]),
                           len(seeds[key]))
            for key, by_step in values.items()}


# --- gathering --------------------------------------------------------------------------

@dataclass
class Group:
    """The seeds of one task and experiment name: one curve in the plot, one table in results.md."""

    task: str
    exp_name: str
    curve: Curve  # steps, returns (seeds x steps, NaN where a seed has no eval)
    sec_per_100k: float | None  # training wall-clock (earlier evals included), mean over seeds


@dataclass
class Row:
    task: str
    exp_name: str
    env_step: int
    seeds: int
    ours: float
    ours_std: float
    published: dict[str, float | None]  # algorithm -> mean at env_step
    interpolated: bool  # the TD-MPC2 value lies between published points
    ratio: float | None  # ours / published TD-MPC2
    check: str  # PASS / FAIL on the row of the check step, "n/a" there without a published value
    sec_per_100k: float | None


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Run directories among `paths`: each is one (it holds eval.csv) or is searched for them."""
    paths, found = list(paths), []
    for p in paths:
        if (p / "eval.csv").is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(f.parent for f in p.rglob("eval.csv"))
        else:
            raise BadInput(f"--gather {p}: no such directory")
    if not found:
        raise BadInput(f"no run directories (with eval.csv) in {', '.join(map(str, paths))}")
    return list(dict.fromkeys(found))


def load_groups(run_dirs: list[Path]) -> list[Group]:
    """The evaluation series of the runs (one per task of a multi-task run), grouped by task and exp_name."""
    by_key: dict[tuple[str, str], list[Series]] = defaultdict(list)
    for d in run_dirs:
        for series in read_run(d):
            if len(series.steps) == 0:
                print(f"skipping {d}: no evaluation yet", file=sys.stderr)
                continue
            by_key[(series.task, series.exp_name)].append(series)
    groups = []
    for (task, exp_name), members in sorted(by_key.items()):
        (curve,) = group_series(members)
        curve.label = f"ours ({exp_name}), {len(members)} seed{'s' * (len(members) > 1)}"
        curve.style = {"marker": "o", "markersize": 3}  # eval points, visible even when there is one
        secs = [s for s in (m.seconds_per_100k() for m in members) if s is not None]
        groups.append(Group(task, exp_name, curve, float(np.mean(secs)) if secs else None))
    return groups


def check_step(steps: np.ndarray, at: int) -> int:
    """Our eval step to judge: the last one at `at` (1% slack for multi-env overshoot) or before it, else the first."""
    before = steps[steps <= at + at // 100]
    return int(before[-1] if before.size else steps[0])


def compare(groups: list[Group], published: dict[tuple[str, str], Published], at: int, bar: float) -> list[Row]:
    rows = []
    for g in groups:
        judge = check_step(g.curve.steps, at)
        for j, step in enumerate(g.curve.steps):
            col = g.curve.returns[:, j]
            col = col[~np.isnan(col)]
            pub, interp = {}, False
            for alg in ALGORITHMS:
                curve = published.get((alg, g.task))
                value, was_interp = curve.at(int(step)) if curve else (None, False)
                pub[alg] = value
                interp = interp or (alg == "tdmpc2" and was_interp)
            ours, ref = float(col.mean()), pub["tdmpc2"]
            ratio = ours / ref if ref else None
            check = "" if step != judge else "n/a" if ratio is None else "PASS" if ratio >= bar else "FAIL"
            rows.append(Row(g.task, g.exp_name, int(step), len(col), ours, float(col.std()), pub, interp, ratio,
                            check, g.sec_per_100k))
    return rows


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def write_markdown(rows: list[Row], path: Path, at: int, bar: float) -> None:
    lines = ["# Reproduction of published TD-MPC2 results", "",
             "Published: TD-MPC2 (ICLR 2024), mean over its 3 seeds, from the `results/` folder of "
             "github.com/nicklashansen/tdmpc2 (copy in `tdmpc/data/`). Env steps include action repeat "
             "(DMC: 2, so 100k env steps = 50k agent steps).",
             f"Pass bar: our mean >= {bar:.0%} of the published TD-MPC2 mean at {at:,} env steps.", "",
             "## Summary", "",
             "| task | run | env step | seeds | ours | TD-MPC2 | ours / TD-MPC2 | result | s per 100k env steps |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    checked = [r for r in rows if r.check]
    for r in checked:
        star = "*" if r.interpolated else ""
        lines.append(f"| {r.task} | {r.exp_name} | {r.env_step:,} | {r.seeds} | {r.ours:.1f} | "
                     f"{_num(r.published['tdmpc2'])}{star} | {_num(r.ratio, '.2f')} | {r.check} | "
                     f"{_num(r.sec_per_100k, ',.0f')} |")
    for c in checked:
        block = [r for r in rows if (r.task, r.exp_name) == (c.task, c.exp_name)]
        lines += ["", f"## {c.task} ({c.exp_name})", "",
                  f"Wall-clock: {_num(c.sec_per_100k, ',.0f')} s per 100k env steps (mean over seeds, from "
                  "`elapsed`: training and earlier evaluations).", "",
                  "| env step | seeds | ours (mean ± std over seeds) | TD-MPC2 | SAC | ours / TD-MPC2 | result |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for r in block:
            star = "*" if r.interpolated else ""
            lines.append(f"| {r.env_step:,} | {r.seeds} | {r.ours:.1f} ± {r.ours_std:.1f} | "
                         f"{_num(r.published['tdmpc2'])}{star} | {_num(r.published['sac'])}{star} | "
                         f"{_num(r.ratio, '.2f')} | {r.check} |")
    if any(r.interpolated for r in rows):
        lines += ["", "\\* Published value linearly interpolated between its points (every 100k env steps), "
                      "because our evaluation falls between them."]
    if any(r.published["tdmpc2"] is None for r in rows):
        lines += ["", "— : no published value (a task outside the 12 published DMC tasks, or a step beyond 1M)."]
    path.write_text("\n".join(lines) + "\n")


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "exp_name", "env_step", "seeds", "ours_mean", "ours_std",
                    *(f"{a}_mean" for a in ALGORITHMS), "published_interpolated", "ratio", "check",
                    "seconds_per_100k"])
        for r in rows:
            w.writerow([r.task, r.exp_name, r.env_step, r.seeds, f"{r.ours:.2f}", f"{r.ours_std:.2f}",
                        *("" if r.published[a] is None else f"{r.published[a]:.2f}" for a in ALGORITHMS),
                        int(r.interpolated), "" if r.ratio is None else f"{r.ratio:.4f}", r.check,
                        "" if r.sec_per_100k is None else f"{r.sec_per_100k:.1f}"])


def published_curve(pub: Published, label: str, last: int, style: dict) -> Curve:
    """The published mean from 0 to our last step, ending on an interpolated point if needed."""
    keep = pub.steps <= last
    steps, mean = pub.steps[keep], pub.mean[keep]
    value, interp = pub.at(last)
    if interp:
        assert value is not None
        steps, mean = np.append(steps, last), np.append(mean, value)
    return Curve(f"{label} (published, {pub.seeds} seeds)", steps, mean[None, :], style)


PUBLISHED_STYLE = {"tdmpc2": {"linestyle": "--", "color": "black"}, "sac": {"linestyle": "--", "color": "tab:gray"}}


def write_plot(groups: list[Group], published: dict[tuple[str, str], Published], path: Path,
               columns: int = 3) -> None:
    """One panel per task, each drawn by plot.draw, tiled side by side into one image."""
    import matplotlib.image as mpimg  # draw() has checked that matplotlib is there

    tasks = list(dict.fromkeys(g.task for g in groups))
    with tempfile.TemporaryDirectory() as tmp:
        tiles = []
        for i, task in enumerate(tasks):
            curves = [g.curve for g in groups if g.task == task]
            last = int(max(c.steps[-1] for c in curves))
            for alg, style in PUBLISHED_STYLE.items():
                if (alg, task) in published:
                    curves.append(published_curve(published[(alg, task)], ALGORITHMS[alg], last, style))
            tiles.append(mpimg.imread(draw(curves, Path(tmp) / f"{i}.png", title=task)))
    h, w = max(t.shape[0] for t in tiles), max(t.shape[1] for t in tiles)
    blank = np.ones((h, w, 4), dtype=np.float32)
    padded = []
    for t in tiles:
        tile = blank.copy()
        tile[:t.shape[0], :t.shape[1], :t.shape[2]] = t
        padded.append(tile)
    columns = min(columns, len(padded))
    padded += [blank] * (-len(padded) % columns)
    grid = np.concatenate([np.concatenate(padded[r:r + columns], axis=1) for r in range(0, len(padded), columns)])
    mpimg.imsave(path, grid)


def gather(run_dirs: list[Path], out: Path, at: int = 100_000, bar: float = 0.9) -> list[Row]:
    """Compare the runs with the published curves, write results.md/csv/png into `out`, print PASS/FAIL."""
    groups = load_groups(run_dirs)
    if not groups:
        raise BadInput("none of the run directories has an evaluation yet")
    published = load_published()
    rows = compare(groups, published, at, bar)
    out.mkdir(parents=True, exist_ok=True)
    write_markdown(rows, out / "results.md", at, bar)
    write_csv(rows, out / "results.csv")
    write_plot(groups, published, out / "results.png")
    for r in (r for r in rows if r.check):
        ref = "no published TD-MPC2 curve" if r.ratio is None else \
            f"published TD-MPC2 {r.published['tdmpc2']:.1f}{' (interpolated)' * r.interpolated}, ratio {r.ratio:.2f}"
        print(f"{r.check:4}  {r.task} ({r.exp_name}): ours {r.ours:.1f} at {r.env_step:,} env steps "
              f"({r.seeds} seed{'s' * (r.seeds > 1)}), {ref}")
    print(f"wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'results.png'}")
    return rows


# --- entry point ------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = tyro.cli(ReproduceArgs, args=argv, prog="python -m tdmpc.reproduce", description=__doc__)
    return run_cli(lambda: _main(args, extra))


def _main(args: ReproduceArgs, extra: list[str]) -> int:
    if not 0 < args.bar <= 10 or args.at <= 0:
        raise BadInput("--bar must be in (0, 10] and --at > 0")
    if args.gather is not None:
        if args.slurm or extra:
            raise BadInput("--gather only compares; it takes no --slurm and no train arguments after --")
        gather(find_runs(args.gather or (args.runs_root,)), args.out or args.runs_root, args.at, args.bar)
        return EXIT_OK
    tasks, seeds = parse_tasks(args.tasks), parse_seeds(args.seeds)
    if args.steps <= 0:
        raise BadInput(f"--steps {args.steps}: must be > 0")
    check_train_args(extra)
    if args.threads is not None:
        if args.threads < 1:
            raise BadInput(f"--threads must be >= 1, got {args.threads}")
        extra = ["--threads", str(args.threads), *extra]
    for task in tasks:  # a typo in the last task should not wait for the first runs to finish
        resolve_task(task)
    return (submit_slurm if args.slurm else run_grid)(args, tasks, seeds, extra)


if __name__ == "__main__":
    sys.exit(main())
