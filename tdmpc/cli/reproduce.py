"""python -m tdmpc.reproduce --tasks cup-catch --seeds 1-3: train a grid and compare it with the published TD-MPC2 curves.

Runs go to <runs-root>/<task>/seed<seed>, one after another (--jobs N: N at a time, each with its
share of the cores and its output in <runs-root>/<task>/seed<seed>.log), and are compared at the end.
Rerunning the same command after an interruption skips finished runs and resumes the
stopped ones; a run there made with other settings than this command asks is refused, since
one grid's seeds share their config. --slurm submits the grid through slurm/sweep.sh instead; --gather only
compares. Flags after -- go to every tdmpc.train run (e.g. -- --num-envs 4). The
comparison (results.md, results.csv, results.png) uses the published curves packaged in
tdmpc/data (the TD-MPC2 paper's results/ folder, ICLR 2024).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

from tdmpc.config import CPU_CONFIG, SIZE_FIELDS, Config, learning_differences, parse_cli
from tdmpc.errors import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, STOP_SIGNALS, BadInput, RunDirError, run_cli
from tdmpc.runtime.args import flag_names, parse_args
from tdmpc.envs.names import resolve_task
from tdmpc.report.compare import check_results_folder, find_runs, gather
from tdmpc.report.curves import eval_points
from tdmpc.runtime.device import threads_error, usable_cpus
from tdmpc.runtime.files import make_dirs, remove_made_dirs, shipped_dir
from tdmpc.training.run_dir import RunDirLock, has_checkpoint, saved_step

TRAIN = [sys.executable, "-m", "tdmpc.train"]  # module-level so tests can swap in a fake trainer
SET_HERE = ("--task", "--tasks", "--seed", "--steps", "--run-dir", "--resume", "--auto-resume", "--cfg")  # not after --


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
    """CPU threads of every training run (--threads of tdmpc.train). None: each run's own default; with
    --jobs, the cores shared out among the runs."""
    jobs: int = 1
    """Training runs at once on this machine, each its own process: one run's small kernels leave a GPU gaps,
    and on a 2-core CPU two single-thread runs (model size 5) did 13% more agent steps/s in all than one on two
    threads (BENCHMARKS.md; python -m tdmpc.bench --e2e-procs measures it). On one GPU, pass --gpu-mem after -- so
    that each run's memory check and cap is its share of the card."""


# --- the grid -----------------------------------------------------------------------

def parse_tasks(text: str | None) -> list[str]:
    """'cup-catch,walker-walk' -> the tasks. An empty name or one named twice is refused, as slurm/sweep.sh
    refuses them: a typo (a,,b) is not a grid smaller than the one meant."""
    text = text or ""
    if not text.strip(", "):
        raise BadInput("--tasks: give at least one task, e.g. --tasks cup-catch,cartpole-swingup")
    tasks = [t.strip() for t in text.split(",")]
    if "" in tasks:
        raise BadInput(f"--tasks {text!r}: an empty task name between commas")
    _refuse_repeats("--tasks", text, tasks)
    return tasks


def _refuse_repeats(flag: str, text: str, items: list) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise BadInput(f"{flag} {text!r} names {item} twice: one run directory would count as two runs")
        seen.add(item)


MAX_SEEDS = 1000  # per reproduce call: a typo (1-100000000) is refused, not expanded


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
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise BadInput(f"--seeds {text!r}: more than {MAX_SEEDS:,} seeds; a grid that size is a Slurm sweep of "
                           f"its own (slurm/sweep.sh)")
        seeds += range(first, last + 1)
    _refuse_repeats("--seeds", text, seeds)
    return seeds


def seeds_text(seeds: list[int]) -> str:
    """The inverse of parse_seeds, with runs of consecutive seeds as ranges (for sweep.sh)."""
    parts, start = [], 0
    for i in range(1, len(seeds) + 1):
        if i == len(seeds) or seeds[i] != seeds[i - 1] + 1:
            parts.append(f"{seeds[start]}-{seeds[i - 1]}" if i - 1 > start else str(seeds[start]))
            start = i
    return ",".join(parts)


@dataclass
class GridConfig:
    """The config all runs of the grid share: what a new run of it gets, its task, seed and steps aside."""

    cfg: Config
    given: set[str]  # the fields the flags after -- set
    base: str  # where the others come from: --cfg NAME, or tdmpc.train's default here
    extra: list[str]  # the flags after --

    def __str__(self) -> str:
        return self.base + (f", then {shlex.join(self.extra)} (after --)" if self.extra else "")

    def refuse_other(self, run_dir: Path, saved: dict) -> None:
        """A run made with other settings (saved: its config.json; compared as learning_differences does) is not
        this grid's result, to skip or resume: one line naming the first setting that differs."""
        differ = learning_differences(saved, self.cfg, str(run_dir / "config.json"))
        if differ:
            (name, (theirs, mine)), *others = differ.items()
            also = f" (and {', '.join(n for n, _ in others)})" if others else ""
            raise BadInput(f"{run_dir} was trained with {name} {theirs!r}, not the {mine!r} of "
                           f"{self._source(name)}{also}: the seeds of one grid share their config; rerun with the "
                           f"--cfg and flags after -- it was made with, or give this config a new --runs-root")

    def _source(self, name: str) -> str:
        flag = name if name in self.given else "model_size" if name in SIZE_FIELDS and "model_size" in self.given \
            else None
        return f"-- --{flag.replace('_', '-')}" if flag else self.base


def grid_config(extra: list[str], args: ReproduceArgs, task: str) -> GridConfig:
    """The flags after -- as tdmpc.train will read them (for `task`), before any run starts: a typo or a bad
    value is one line now, not an error in the first run (or, with --slurm, in every array element)."""
    import torch

    from tdmpc.training.flags import TrainArgs, base_config

    for flag in flag_names(extra):  # as tdmpc.train reads them: --run_dir too
        if flag in SET_HERE:
            raise BadInput(f"{flag} after --: reproduce sets it itself "
                           f"(use --tasks, --seeds, --steps, --cfg, --runs-root)")
    _, cfg, _, given = parse_cli(TrainArgs, [*(["--cfg", args.cfg] if args.cfg else []), "--task", task, "--steps",
                                             str(args.steps), *extra], base_config, prog="python -m tdmpc.train")
    # tdmpc.train's default, as base_config chooses it
    base = f"--cfg {args.cfg}" if args.cfg else "tdmpc.train's default here, " + (
        f"configs/{CPU_CONFIG}" if not torch.cuda.is_available() else "the reference settings")
    if cfg.dataset:
        raise BadInput("--dataset after --: reproduce compares runs with the published curves, whose steps are env "
                       "steps; an offline run's count updates (train it with python -m tdmpc.train --dataset, and "
                       "draw it with python -m tdmpc.plot)")
    return GridConfig(cfg, given, base, extra)


# --- the runs ---------------------------------------------------------------------------

class Action(str, Enum):
    START = "start"  # nothing there yet
    RESUME = "resume"  # a checkpoint short of the target
    SKIP = "skip"  # already evaluated at the target step
    RESTART = "restart"  # leftovers without a checkpoint: set aside, then a fresh start


def last_eval_step(run_dir: Path) -> int | None:
    """The step of a run's last evaluation (read as the plots read it: a row a crash cut short is none)."""
    eval_csv = run_dir / "eval.csv"
    if not eval_csv.is_file():
        return None
    return max((int(step) for _, (step, _, _) in eval_points(eval_csv, "")), default=None)


def decide(run_dir: Path, task: str, seed: int, steps: int, grid: GridConfig | None = None) -> Action:
    """What to do with one grid cell, so the whole command can simply be rerun after an interruption.

    Finished means evaluated at `steps` or later (the trainer evaluates at its last step), which
    still holds when someone deleted the checkpoints to free disk. A directory with files but no
    checkpoint died before its first save; the trainer would append to its eval.csv, so it is
    set aside rather than reused. A file where the directory (or a folder above it) goes, or a run going on
    there (its lock is held: another tdmpc.reproduce or tdmpc.train writes it), is a one-line error, and so is a
    run to skip or resume that was made with other settings than `grid` (GridConfig.refuse_other).
    """
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise BadInput(f"{path} is a file where the run directory {run_dir} goes; move it away or choose "
                               f"another --runs-root")
            break
    holder = RunDirLock.held(run_dir)
    if holder is not None:
        raise RunDirError(f"{run_dir} is in use by {holder}: a run is going on there (another tdmpc.reproduce or "
                          f"tdmpc.train); wait for it or stop it, or choose another --runs-root")
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return Action.START
    cfg_file, cfg = run_dir / "config.json", None
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except json.JSONDecodeError:
            raise BadInput(f"{cfg_file}: not valid JSON; move {run_dir} away or choose another --runs-root") from None
        if (cfg.get("task"), cfg.get("seed")) != (task, seed):
            raise BadInput(f"{run_dir} holds a run of {cfg.get('task')} seed {cfg.get('seed')}, not {task} "
                           f"seed {seed}; choose another --runs-root")
    last = last_eval_step(run_dir)
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    if last is not None and last >= steps and not _checkpoint_short_of(checkpoint, steps):
        action = Action.SKIP
    elif has_checkpoint(run_dir):  # latest.pt, or previous.pt where latest.pt is gone (tdmpc.train resumes from it)
        action = Action.RESUME
    else:
        return Action.RESTART  # set aside: nothing of it counts
    if grid is not None and cfg is not None:
        grid.refuse_other(run_dir, cfg)
    return action


def _checkpoint_short_of(checkpoint: Path, steps: int) -> bool:
    """Whether the run's checkpoint stops before `steps` although eval.csv reached it: the final checkpoint failed
    (a full disk), so a resume would take those steps again and drop their rows. One that cannot be read, or none
    (deleted to free disk), leaves the answer to eval.csv."""
    if not checkpoint.is_file():
        return False
    from tdmpc.errors import CheckpointError
    from tdmpc.model.checkpoint import load_file  # torch, imported only where a run is there to look at

    try:
        return saved_step(load_file(checkpoint, mmap=True).get("train", {})) < steps
    except (CheckpointError, KeyError, TypeError, ValueError):
        return False


def train_command(action: Action, run_dir: Path, task: str, seed: int, steps: int, cfg: str | None,
                  extra: list[str]) -> list[str]:
    if action is Action.RESUME:  # the run's config.json applies; --steps may extend a finished shorter run
        return [*TRAIN, "--resume", str(run_dir), "--steps", str(steps), *extra]
    return [*TRAIN, *(["--cfg", cfg] if cfg else []), "--task", task, "--seed", str(seed), "--steps", str(steps),
            "--run-dir", str(run_dir), *extra]


def set_aside(run_dir: Path) -> Path:
    """Move a run directory left without a checkpoint to <name>.stale<n>, holding its lock meanwhile: a run that
    started there since it was decided (it holds the lock) is a one-line RunDirError, and is never moved away."""
    lock = RunDirLock(run_dir)
    lock.acquire()
    try:
        n = 1
        while (moved := run_dir.with_name(f"{run_dir.name}.stale{n}")).exists():
            n += 1
        run_dir.rename(moved)
    finally:
        lock.release()
    return moved


@dataclass
class Cell:
    """One (task, seed) of the grid."""
    number: int  # its place in the grid, for the [i/n] lines
    task: str
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.task} seed {self.seed}"

    @property
    def log(self) -> Path:
        """Its output when several run at once: beside its run directory, which tdmpc.train wants empty."""
        return self.run_dir.with_name(f"{self.run_dir.name}.log")


def _ignore_sigint() -> None:
    """In a child, before it runs tdmpc.train: Ctrl-C at the terminal (which reaches the whole process group) is
    ignored until the trainer sets its own handlers, so a child still starting up leaves no KeyboardInterrupt
    traceback; the SIGTERM we pass on stops it instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Runner:
    """Training subprocesses, up to `jobs` at a time.

    A stop signal sent to us is passed on to every child: SIGTERM and SIGUSR1 as they are, SIGINT as SIGTERM (a
    Ctrl-C at the terminal reaches the children too, and a second SIGINT would make a child stop at once,
    without its checkpoint). Each child writes its checkpoint and exits 3, and we wait for that instead of
    killing it. A child that stops by itself (exit 3: someone signalled it) or refuses its input (exit 2) stops
    the others the same way. After a stop no new run starts, and a rerun of the same command resumes.
    """

    def __init__(self, jobs: int, total: int, steps: int):
        self.jobs, self.total, self.steps = jobs, total, steps
        self.running: dict[subprocess.Popen, tuple[Cell, float]] = {}
        self.stop, self.bad_input = False, False
        self.stopped: list[Cell] = []
        self.failed: list[Cell] = []

    def on_signal(self, signum: int, frame) -> None:
        self.stop = True
        for proc in self.running:
            proc.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def _stop_others(self) -> None:
        if not self.stop:
            self.stop = True
            for proc in self.running:
                proc.send_signal(signal.SIGTERM)

    def launch(self, cell: Cell, cmd: list[str]) -> None:
        print(f"  {shlex.join(cmd)}", flush=True)
        if self.jobs == 1:  # the run speaks to the terminal itself
            proc = subprocess.Popen(cmd, preexec_fn=_ignore_sigint)
        else:
            print(f"  output: {cell.log}", flush=True)
            make_dirs(cell.log.parent)
            with open(cell.log, "a") as log:  # appended to: a resumed run's output follows its first
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_ignore_sigint)
        self.running[proc] = (cell, time.monotonic())
        if self.stop:  # a signal came while it started, before on_signal could see it
            proc.send_signal(signal.SIGTERM)

    def stop_all(self) -> None:
        """Stop every running run (each checkpoints) and wait for them: an error here must not leave them
        training unwatched."""
        self._stop_others()
        self.wait(until_free=False)

    def wait(self, until_free: bool) -> None:
        """Reap finished children until a slot is free (until_free) or none runs."""
        while self.running and (len(self.running) >= self.jobs or not until_free):
            done = [p for p in self.running if p.poll() is not None]
            if not done:
                time.sleep(0.2)
                continue
            for proc in done:
                cell, started = self.running.pop(proc)
                self._finished(cell, proc.returncode, (time.monotonic() - started) / 60)

    def _finished(self, cell: Cell, rc: int, minutes: float) -> None:
        where = f"[{cell.number}/{self.total}] {cell.name}"
        if rc != EXIT_OK and (last_eval_step(cell.run_dir) or -1) >= self.steps:
            rc = EXIT_OK  # it reached its steps: finished, however its process ended (a signal on its way out)
        if rc < 0 and self.jobs > 1:  # killed by a signal before it could say anything: its log says so
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
            early = " in its start-up, before it trained (nothing to checkpoint yet)" if -rc in STOP_SIGNALS else ""
            with open(cell.log, "a") as log:
                log.write(f"tdmpc.reproduce: the run was ended by {name}{early}\n")
        if rc == EXIT_REQUEUE or (self.stop and rc != EXIT_OK):  # a run that finished as the stop came is done
            self.stopped.append(cell)
            self._stop_others()
        elif rc == EXIT_BAD_INPUT:  # tdmpc.train printed why; the other runs would fail the same way
            self.bad_input = True
            print(f"{where}: refused its input (exit 2){f'; see {cell.log}' if self.jobs > 1 else ''}",
                  file=sys.stderr)
            self._stop_others()
        elif rc != EXIT_OK:
            self.failed.append(cell)
            print(f"{where}: failed with exit code {rc}{f' (see {cell.log})' if self.jobs > 1 else ''}; going on "
                  f"with the rest", file=sys.stderr)
        elif self.jobs > 1:
            print(f"{where}: finished in {minutes:.1f} min", flush=True)


def run_grid(args: ReproduceArgs, tasks: list[str], seeds: list[int], extra: list[str], grid: GridConfig) -> int:
    cells = [Cell(i, task, seed, args.runs_root / task / f"seed{seed}")
             for i, (task, seed) in enumerate(((t, s) for t in tasks for s in seeds), 1)]
    actions = [decide(c.run_dir, c.task, c.seed, args.steps, grid) for c in cells]  # before any run starts
    resumed = actions.count(Action.RESUME)
    if resumed and args.cfg:
        print(f"note: {resumed} run(s) resume with their own config.json, which matches --cfg {args.cfg} in what it "
              f"learns; its eval, output and hardware settings stay its own (flags after -- still change them)",
              flush=True)
    runner = Runner(args.jobs, len(cells), args.steps)
    old = {s: signal.signal(s, runner.on_signal) for s in STOP_SIGNALS}
    try:
        for cell, action in zip(cells, actions):
            runner.wait(until_free=True)
            if runner.stop:
                break
            cmd = train_command(action, cell.run_dir, cell.task, cell.seed, args.steps, args.cfg, extra)
            print(f"[{cell.number}/{len(cells)}] {cell.name}: {action.value} {cell.run_dir}", flush=True)
            if action is Action.SKIP:
                continue
            if args.dry_run:
                print(f"  {shlex.join(cmd)}")
                continue
            if action is Action.RESTART:
                print(f"  no checkpoint there; set the leftovers aside as {set_aside(cell.run_dir)}")
            runner.launch(cell, cmd)
        runner.wait(until_free=False)
    except BaseException:
        runner.stop_all()
        raise
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if runner.bad_input:
        return EXIT_BAD_INPUT
    if runner.stopped or runner.stop:
        during = f" during {', '.join(c.name for c in runner.stopped)}" if runner.stopped else ""
        print(f"stopped{during}: rerun the same command to continue (finished runs are skipped, stopped ones "
              f"resume)", file=sys.stderr)
        return EXIT_REQUEUE
    if args.dry_run:
        return EXIT_OK
    done = [c.run_dir for c in cells if last_eval_step(c.run_dir) is not None]
    if done:
        gather(done, args.out or args.runs_root, args.at, args.bar, config=f"{grid}; every run checked to match it in "
                                                                          f"what it learns (tdmpc.reproduce)")
    if runner.failed:
        print(f"error: {len(runner.failed)} run(s) failed: {', '.join(c.name for c in runner.failed)}; rerun the "
              f"command to retry them", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# --- Slurm ----------------------------------------------------------------------------

def sweep_script() -> Path:
    """./slurm/sweep.sh (a checkout, or a copy made by python -m tdmpc.slurm_scripts --copy .), else the
    packaged one (its logs go under ./slurm/logs all the same)."""
    packaged = shipped_dir("slurm")
    for script in (Path.cwd() / "slurm" / "sweep.sh", packaged / "sweep.sh"):
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
    # sweep.sh makes ./slurm/logs before it calls sbatch: made here instead, so that a submission that fails (no
    # cluster answers) takes back what it made. Its stderr is held back, to be one line when nothing was submitted.
    logs = Path.cwd() / "slurm" / "logs"
    made = None if args.dry_run else make_dirs(logs)
    done = subprocess.run(cmd, env={**os.environ, "TDMPC_RUNS": str(root)}, stderr=subprocess.PIPE, text=True)
    if done.returncode != EXIT_OK:
        remove_made_dirs(logs, made)
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        print(last if last.startswith("error: ") else f"error: nothing submitted: {shlex.quote(str(cmd[1]))} exited "
              f"with code {done.returncode}{f' ({last.strip()})' if last else ''}", file=sys.stderr)
        return EXIT_BAD_INPUT if done.returncode == EXIT_BAD_INPUT else EXIT_ERROR
    sys.stderr.write(done.stderr)
    out = args.out or args.runs_root
    print(f"\nWhen the jobs have finished (squeue --me lists none), compare with:\n"
          f"  python -m tdmpc.reproduce --gather {shlex.quote(str(root / 'slurm'))} --out {shlex.quote(str(out))}\n"
          f"(or name the run directories printed above). Elements Slurm requeues resume by themselves; one that "
          f"fails or is cancelled goes on with the command the last line of its log prints (TDMPC_RUN_DIR=... "
          f"sbatch slurm/train.sh ...). This command again would start a new grid in a new array's directories "
          f"(gather then counts each seed's furthest run).")
    return EXIT_OK


# --- entry point ------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parse_args(ReproduceArgs, argv, "python -m tdmpc.reproduce", __doc__)
    return run_cli(lambda: _main(args, extra))


def _main(args: ReproduceArgs, extra: list[str]) -> int:
    if not 0 < args.bar <= 10 or args.at <= 0:
        raise BadInput("--bar must be in (0, 10] and --at > 0")
    if args.out is not None:  # the default, --runs-root, is checked with the run directories
        check_results_folder(args.out)
    if args.gather is not None:
        if args.slurm or extra or args.jobs != 1:
            raise BadInput("--gather only compares; it takes no --slurm, no --jobs and no train arguments after --")
        gather(find_runs(args.gather or (args.runs_root,)), args.out or args.runs_root, args.at, args.bar)
        return EXIT_OK
    tasks, seeds = parse_tasks(args.tasks), parse_seeds(args.seeds)
    if args.steps <= 0:
        raise BadInput(f"--steps {args.steps}: must be > 0")
    if args.jobs < 1:
        raise BadInput(f"--jobs must be >= 1, got {args.jobs}")
    if args.jobs > 1 and args.slurm:
        raise BadInput("--jobs runs here; with --slurm, Slurm runs the array's elements side by side itself")
    for task in tasks:  # a typo in the last task should not wait for the first runs to finish
        resolve_task(task)
    grid = grid_config(extra, args, tasks[0])
    threads = args.threads
    if threads is None and args.jobs > 1 and not any(a.split("=")[0] == "--threads" for a in extra):
        # All start at once, each seeing an idle machine: give each its share of the cores this process may use.
        cores = usable_cpus()
        threads = max(1, cores // args.jobs)
        print(f"--jobs {args.jobs}: each run gets --threads {threads} of the {cores} cores; pass --threads to "
              f"choose", flush=True)
    if threads is not None:
        if threads < 1:
            raise BadInput(f"--threads must be >= 1, got {threads}")
        if not args.slurm and (error := threads_error(threads)):  # a Slurm job's CPUs are the cluster's
            raise BadInput(error)
        extra = ["--threads", str(threads), *extra]
    return submit_slurm(args, tasks, seeds, extra) if args.slurm else run_grid(args, tasks, seeds, extra, grid)


if __name__ == "__main__":
    sys.exit(main())
