"""Eval-return curves read from run directories, grouped by task and experiment, drawn into one figure.

Runs with the same task and experiment name are seeds of one curve (mean, with a band
for min-max across seeds); --no-group draws every run separately. Every point of a curve is over all of its
seeds, as its label counts them: seeds that evaluated at different steps are read off the straight line between
each one's own evaluations, and a curve is drawn only over the steps that all of its seeds reach (a line on stderr
says what is left out). Averaging whichever seeds evaluated at a step made a curve jump wherever the seeds
present changed.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tdmpc.config import ConfigError, from_dict, learning_differences
from tdmpc.errors import BadInput
from tdmpc.runtime.files import atomic_write


@dataclass
class Curve:
    label: str
    steps: np.ndarray
    returns: np.ndarray  # (seeds, len(steps)); NaN where a seed has no point
    style: dict = field(default_factory=dict)
    offline: bool = False  # its steps count updates
    evaluated: np.ndarray | None = None  # (seeds, len(steps)): where each seed evaluated (None: everywhere)
    mixed: str | None = None  # mixed_settings: the settings its seeds differ in, said with it
    seed_names: list[str] = field(default_factory=list)  # each row of returns: its seed (or run directory)

    def own(self) -> np.ndarray:
        """(seeds, len(steps)): where each seed evaluated."""
        return np.ones(self.returns.shape, bool) if self.evaluated is None else self.evaluated

    def shared(self) -> np.ndarray:
        """(len(steps),): the steps every seed reaches, from the latest first evaluation to the earliest last one:
        where a mean over all of them is drawn (and judged, tdmpc.reproduce)."""
        own = self.own()
        first, last = self.steps[own.argmax(1)], self.steps[len(self.steps) - 1 - own[:, ::-1].argmax(1)]
        return (self.steps >= first.max()) & (self.steps <= last.min())

    def seed_values(self) -> np.ndarray:
        """returns, each seed read off the straight line between its own evaluations where it has none: so
        every step's mean is over all seeds. NaN before a seed's first evaluation and after its last (no
        extrapolation), and beside one that returned NaN (a gap, as drawn)."""
        out = np.full(self.returns.shape, np.nan)
        for i, (row, own) in enumerate(zip(self.returns, self.own())):
            steps = self.steps[own]
            inside = (self.steps >= steps[0]) & (self.steps <= steps[-1])
            out[i, inside] = np.interp(self.steps[inside], steps, row[own])
        return out


@dataclass
class Series:
    """One task's evaluations in one run. A multi-task run has one per task; its env steps are the
    task's own (the run's total divided among its tasks, which step equally)."""

    run_dir: Path
    task: str
    exp_name: str  # a multi-task run's gets ", multi-task", a pixel run's ", pixels"
    steps: np.ndarray
    returns: np.ndarray
    elapsed: np.ndarray  # training seconds at each evaluation, over resumed sessions
    obs: str = "state"  # Config.obs: which published results the run is compared with
    seed: int | None = None
    offline: bool = False  # trained on a dataset: its steps count updates, not env steps
    config: dict = field(default_factory=dict)  # the run's config.json, as saved ({} without one)

    @property
    def label(self) -> str:
        return f"{self.task} ({self.exp_name})"

    @property
    def seed_name(self) -> str:
        """How a line names this run among its curve's seeds: its seed, else its directory."""
        return str(self.seed) if self.seed is not None else str(self.run_dir)

    def seconds_per_100k(self) -> float | None:
        """Training wall-clock per 100k env steps of this task, at the last evaluation."""
        ok = (self.steps > 0) & ~np.isnan(self.elapsed)
        return float(self.elapsed[ok][-1] / self.steps[ok][-1] * 100_000) if ok.any() else None


def read_run(run_dir: Path) -> list[Series]:
    """The evaluation series of a run directory: one, or one per task of a multi-task run."""
    eval_csv = run_dir / "eval.csv"
    if not eval_csv.is_file():
        if (run_dir / "config.json").is_file():  # a run that has not evaluated (yet, or ever: eval_episodes 0)
            raise BadInput(f"{run_dir}: no evaluation yet (no eval.csv; python -m tdmpc.evaluate --checkpoint "
                           f"{run_dir} evaluates its checkpoint)")
        if not run_dir.exists():
            raise BadInput(f"{run_dir} does not exist")
        raise BadInput(f"{run_dir}: no eval.csv (is this a tdmpc run directory?)")
    cfg_file = run_dir / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{cfg_file} is damaged ({e}); restore it or move it aside to plot this run by its "
                       f"directory name") from None
    exp_name, obs, offline = cfg.get("exp_name", "default"), cfg.get("obs", "state"), bool(cfg.get("dataset"))
    if obs == "rgb":  # never one curve with state runs of the same name
        exp_name += ", pixels"
    if offline:  # steps that count updates: never one curve with env steps
        exp_name += ", offline"
    by_task: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for task, point in eval_points(eval_csv, cfg.get("task", run_dir.name)):
        by_task[task].append(point)
    by_task.pop("mean", None)
    if len(by_task) > 1:
        exp_name += ", multi-task"
    seed = cfg.get("seed")
    tables = {task: np.array(points) for task, points in by_task.items()}
    # an online multi-task run's steps are all its tasks' together; an offline run's count updates, each over all
    per_task = 1 if offline else len(by_task)
    return [Series(run_dir, task, exp_name, table[:, 0].astype(np.int64) // per_task, table[:, 1], table[:, 2],
                   obs, seed, offline, cfg) for task, table in tables.items()] \
        or [Series(run_dir, cfg.get("task", run_dir.name), exp_name, *(np.zeros(0),) * 3, obs, seed, offline, cfg)]


def eval_points(eval_csv: Path, default_task: str) -> list[tuple[str, tuple[float, float, float]]]:
    """(task, (env step, return, elapsed seconds or NaN)) of each evaluation row; a file that is not a tdmpc
    eval.csv is one line naming it and the row, not a figure of garbage or a traceback."""
    try:
        text = eval_csv.read_text()
    except UnicodeDecodeError:
        raise BadInput(f"{eval_csv}: not a text file (a tdmpc eval.csv is CSV)") from None
    if "\n" in text and not text.endswith("\n"):  # a row cut short as it was written (a crash): no evaluation
        text = text[:text.rindex("\n") + 1]
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {"env_step", "episode_return"} - set(reader.fieldnames or ())
    if missing:
        raise BadInput(f"{eval_csv}: not a tdmpc eval.csv (no {', '.join(sorted(missing))} column)")
    points = []
    for r in reader:
        if not r.get("episode_return"):  # a task's row without a return
            continue
        try:
            point = (float(r["env_step"]), float(r["episode_return"]),
                     float(r["elapsed"]) if r.get("elapsed") else float("nan"))
        except (TypeError, ValueError):
            raise BadInput(f"{eval_csv}, line {reader.line_num}: not a number where env_step, "
                           f"episode_return and elapsed should be") from None
        points.append((r.get("task") or default_task, point))
    return points


def group_runs(runs: list[Path], group: bool = True) -> list[Curve]:
    """The curves of the run directories (one named twice counts once); a run with no evaluation yet is left out
    in a line, and none with any is a one-line error, not an empty figure."""
    series = [s for run in {r.resolve(): r for r in runs}.values() for s in read_run(run)]
    for s in series:
        if len(s.steps) == 0:
            print(f"skipping {s.run_dir}: no evaluation yet", file=sys.stderr)
    if not any(len(s.steps) for s in series):
        raise BadInput(f"no evaluation yet in {', '.join(str(r) for r in runs)}: nothing to plot")
    return group_series([s for s in series if len(s.steps)], group)


def group_series(series_list: list[Series], group: bool = True) -> list[Curve]:
    """Series of the same task and exp_name are seeds of one curve (group=False: a curve each)."""
    grouped: dict[str, list[Series]] = defaultdict(list)
    for one in series_list:
        grouped[one.label if group else f"{one.run_dir}: {one.task}"].append(one)
    curves = []
    for label, series in grouped.items():
        steps = np.unique(np.concatenate([s.steps for s in series]))
        table = np.full((len(series), len(steps)), np.nan)
        evaluated = np.zeros(table.shape, bool)
        for i, s in enumerate(series):
            table[i, np.searchsorted(steps, s.steps)] = s.returns
            evaluated[i, np.searchsorted(steps, s.steps)] = True
        curves.append(Curve(f"{label}, {_seeds(series)}" if group else label, steps, table,
                            offline=series[0].offline, evaluated=evaluated,
                            mixed=mixed_settings(label, series) if group else None,
                            seed_names=[s.seed_name for s in series]))
    return curves


def mixed_settings(label: str, series: list[Series]) -> str | None:
    """A line when a curve's seeds were trained with settings that change what they learn (learning_differences;
    runs of several configs drawn or gathered together): their mean is no one config's. Runs without a
    config.json tdmpc reads are left out of the comparison."""
    runs = []
    for s in (s for s in series if s.config):
        try:
            runs.append((s, from_dict(s.config, str(s.run_dir / "config.json"))))
        except ConfigError:
            pass
    if len(runs) < 2:
        return None
    differ = [learning_differences(s.config, runs[0][1], str(s.run_dir / "config.json")) for s, _ in runs]
    names = list(dict.fromkeys(n for d in differ for n in d))
    settings = [{**cfg.to_dict(), **cfg.sizes()} for _, cfg in runs]
    parts = []
    for name in names:
        by_value: dict[str, list[str]] = defaultdict(list)
        for (s, _), own in zip(runs, settings):
            by_value[repr(own[name])].append(s.seed_name)
        parts.append(f"{name} " + ", ".join(f"{v} (seed{'s' * (len(seeds) > 1)} {', '.join(seeds)})"
                                            for v, seeds in by_value.items()))
    return (f"{label}: its seeds were trained with different settings ({'; '.join(parts)}): the mean mixes "
            f"configs, not seeds of one") if parts else None


def _seeds(series: list[Series]) -> str:
    """'3 seeds', or '2 runs of 1 seed' where runs share a seed (they are not independent seeds)."""
    runs, seeds = len(series), len({s.seed if s.seed is not None else id(s) for s in series})
    plural = (lambda n, word: f"{n} {word}{'s' * (n != 1)}")  # noqa: E731
    return plural(seeds, "seed") if seeds == runs else f"{plural(runs, 'run')} of {plural(seeds, 'seed')}"


def check_figure_path(out: Path) -> None:
    """Before anything is read: a file name whose extension matplotlib writes (it would append .png to a name
    without one, and refuse others after the work)."""
    plt = _pyplot()
    fig = plt.figure()
    formats = fig.canvas.get_supported_filetypes()
    plt.close(fig)
    if out.is_dir():
        raise BadInput(f"--out {out} is a folder: give a file name, e.g. {out / 'eval_return.png'}")
    if out.suffix.lstrip(".").lower() not in formats:
        raise BadInput(f"--out {out}: the name must end in one of {', '.join('.' + f for f in sorted(formats))}")


def _say_what_is_left_out(c: Curve, remedy: str) -> None:
    """A line on stderr when some of a curve's seeds reach steps that not all of them do: those are not drawn."""
    shared = c.shared()
    if shared.all():
        return
    runs, span = len(c.returns), f"their evaluations span steps {c.steps[0]:,}-{c.steps[-1]:,}"
    if not shared.any():
        print(f"note: {c.label}: no step lies within all {runs} runs' evaluations ({span}): nothing drawn"
              f"{remedy}", file=sys.stderr)
    else:
        drawn = c.steps[shared]
        print(f"note: {c.label}: drawn over steps {drawn[0]:,}-{drawn[-1]:,}, which all {runs} runs reach; {span}",
              file=sys.stderr)


def _pyplot():  # matplotlib.pyplot, imported when a figure is drawn (an optional extra)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("plotting needs matplotlib: pip install -e '.[plot]'") from None
    return plt


def draw(curves: list[Curve], out: Path, title: str | None = None, remedy: str = "") -> Path:
    """The curves in one figure at `out`; `remedy`: what the command's user can do about a curve with nothing
    drawn (e.g. "; --no-group draws each run"), said in its note."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for c in curves:
        values = c.seed_values()
        _say_what_is_left_out(c, remedy)
        if c.mixed:
            print(f"note: {c.mixed}", file=sys.stderr)
        mean, low, high = values.mean(0), values.min(0), values.max(0)  # NaN (a gap) where a seed has no value
        (line,) = ax.plot(c.steps, mean, label=c.label, **c.style)
        if c.returns.shape[0] > 1:
            ax.fill_between(c.steps, low, high, alpha=0.15, color=line.get_color())
    online = "environment steps (action repeat included)"
    kinds = {c.offline for c in curves}
    ax.set_xlabel("updates (offline runs)" if kinds == {True} else f"{online}; updates for offline runs"
                  if kinds == {True, False} else online)
    ax.set_ylabel("eval episode return")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(out, fig.savefig, suffix=out.suffix)  # savefig picks the format by the name's extension
    plt.close(fig)
    return out
