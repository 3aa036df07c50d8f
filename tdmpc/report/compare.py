"""Comparing run directories with the published curves: results.md, results.csv and results.png.

What python -m tdmpc.reproduce --gather writes: per task and experiment name, our mean eval return
over seeds beside the published means, the ratio to TD-MPC2's, PASS/FAIL against a bar, and a plot.
"""

from __future__ import annotations

import csv
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from tdmpc.errors import BadInput
from tdmpc.report.curves import Curve, Series, draw, group_series, read_run
from tdmpc.report.published import ALGORITHMS, Published, load_published, solved_threshold
from tdmpc.runtime.files import atomic_write, make_dirs, write_text_atomic


@dataclass
class Group:
    """The seeds of one task and experiment name: one curve in the plot, one table in results.md."""

    task: str
    exp_name: str
    curve: Curve  # steps, returns (seeds x steps, NaN where a seed has no eval)
    sec_per_100k: float | None  # training wall-clock (earlier evals included), mean over seeds
    obs: str = "state"  # Config.obs: compared with the published results from the same observations


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
    check: str  # PASS / FAIL on the row of the check step, "n/a" there without a published value or threshold;
    # "PASS (early)" / "FAIL (early)" where the runs end before the bar's step (judged at their last step)
    threshold: float | None  # without a published TD-MPC2 value: gymnasium's solved threshold, the bar instead
    sec_per_100k: float | None


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Run directories among `paths`: each is one (it holds eval.csv) or is searched for them."""
    paths, found = list(paths), []
    for p in paths:
        if (p / "eval.csv").is_file():
            found.append(p)
        elif p.is_dir():
            for run in sorted(f.parent for f in p.rglob("eval.csv")):
                if set_aside(run.relative_to(p)):
                    print(f"skipping {run}: set aside (a run left without a checkpoint), not a seed", file=sys.stderr)
                else:
                    found.append(run)
        elif p.exists():
            raise BadInput(f"--gather {p}: a file; give run directories or folders holding them")
        else:
            raise BadInput(f"--gather {p}: no such directory")
    if not found:
        raise BadInput(f"no run directories (with eval.csv) in {', '.join(map(str, paths))}")
    return list(dict.fromkeys(found))


def set_aside(relative: Path) -> bool:
    """A directory tdmpc set aside under a searched folder: reproduce's <seed>.stale<n>, the trainer's
    no-checkpoint-<time>/."""
    return any(re.search(r"\.stale\d+$", part) or part.startswith("no-checkpoint-") for part in relative.parts)


def load_groups(run_dirs: list[Path]) -> list[Group]:
    """The evaluation series of the runs (one per task of a multi-task run), grouped by task, exp_name and obs.
    Offline runs (steps that count updates) are left out, and a seed found in several runs counts once (the run that
    got furthest, else the first), each said in a line; none left is a one-line error."""
    by_key: dict[tuple[str, str, str], list[Series]] = defaultdict(list)
    offline = 0
    for d in run_dirs:
        run = read_run(d)
        if not any(len(series.steps) for series in run):
            print(f"skipping {d}: no evaluation yet", file=sys.stderr)
            continue
        if run[0].offline:
            offline += 1
            print(f"skipping {d}: an offline run (its steps count updates, not the env steps of the published "
                  f"curves; python -m tdmpc.plot draws it)", file=sys.stderr)
            continue
        for series in run:
            if len(series.steps) == 0:
                continue
            members = by_key[(series.task, series.exp_name, series.obs)]
            twin = next((m for m in members if series.seed is not None and m.seed == series.seed), None)
            if twin is not None:  # the run that got further counts (an earlier, shorter attempt is left out)
                kept, left = (series, twin) if series.steps[-1] > twin.steps[-1] else (twin, series)
                print(f"skipping {left.run_dir}: seed {series.seed} of {series.label} again (2 runs of one seed; "
                      f"{kept.run_dir} counts: it reached step {int(kept.steps[-1]):,})", file=sys.stderr)
                if kept is twin:
                    continue
                members.remove(twin)
            members.append(series)
    groups = []
    for (task, exp_name, obs), members in sorted(by_key.items()):
        (curve,) = group_series(members)
        curve.label = f"ours ({exp_name}), {len(members)} seed{'s' * (len(members) > 1)}"
        curve.style = {"marker": "o", "markersize": 3}  # eval points, visible even when there is one
        secs = [s for s in (m.seconds_per_100k() for m in members) if s is not None]
        groups.append(Group(task, exp_name, curve, float(np.mean(secs)) if secs else None, obs))
    if not groups:
        raise BadInput(f"none of the run directories is an online run with an evaluation ({offline} offline, left "
                       f"out above)" if offline else "none of the run directories has an evaluation yet")
    return groups


def check_step(steps: np.ndarray, at: int) -> int:
    """Our eval step to judge: the last one at `at` (1% slack for multi-env overshoot) or before it, else the first."""
    before = steps[steps <= at + at // 100]
    return int(before[-1] if before.size else steps[0])


Results = dict[str, dict[tuple[str, str], Published]]  # Config.obs -> (algorithm, task) -> curve


def compare(groups: list[Group], results: Results, at: int, bar: float) -> list[Row]:
    """Each group's evaluations beside the published curves of its kind of observation (results[g.obs]).

    As python -m tdmpc.plot draws it, every row is over all of the group's seeds, each read off the line between
    its own evaluations where it has none at that step, and only the steps all of them reach have a row: a verdict
    from the seeds that got furthest alone would not be the grid's (coverage_notes says what is left out). A seed
    whose evaluation returned NaN (diverged) makes the row's mean NaN, judged FAIL, not a mean over the others."""
    rows = []
    for g in groups:
        shared, values, published = g.curve.shared(), g.curve.seed_values(), results[g.obs]
        if not shared.any():
            continue
        judge = check_step(g.curve.steps[shared], at)
        threshold = solved_threshold(g.task) if not any(alg == "tdmpc2" and t == g.task for alg, t in published) \
            else None
        for j in np.flatnonzero(shared):
            step, col = g.curve.steps[j], values[:, j]
            pub, interp = {}, False
            for alg in ALGORITHMS:
                curve = published.get((alg, g.task))
                value, was_interp = curve.at(int(step)) if curve else (None, False)
                pub[alg] = value
                interp = interp or (alg == "tdmpc2" and was_interp)
            ours, ref = float(col.mean()), pub["tdmpc2"]
            ratio = ours / ref if ref else None
            if step != judge:
                check = ""
            elif ratio is not None:
                check = "PASS" if ratio >= bar else "FAIL"
            else:
                check = "n/a" if threshold is None else "PASS" if ours >= threshold else "FAIL"
            if check in ("PASS", "FAIL") and step < at:  # the curve so far, not the bar: said on every line
                check += " (early)"
            rows.append(Row(g.task, g.exp_name, int(step), len(col), ours, float(col.std()), pub, interp, ratio,
                            check, threshold, g.sec_per_100k))
    return rows


def coverage_notes(groups: list[Group]) -> list[str]:
    """A line for each group whose seeds' evaluations end (or begin) at different steps: the rows cover only the
    steps all of them reach; and for each seed whose evaluation returned NaN within them."""
    notes = []
    for g in groups:
        shared, steps, n = g.curve.shared(), g.curve.steps, len(g.curve.returns)
        for name, row in zip(g.curve.seed_names, np.isnan(g.curve.seed_values()[:, shared])):
            if row.any():
                at = ", ".join(f"{s:,}" for s in steps[shared][row])
                notes.append(f"{g.task} ({g.exp_name}): seed {name} has no finite return at step(s) {at} (an "
                             f"evaluation returned NaN): the mean there is NaN, a FAIL where it is the check step.")
        span = f"their evaluations span steps {steps[0]:,}–{steps[-1]:,}"
        if not shared.any():
            notes.append(f"{g.task} ({g.exp_name}): no step lies within all {n} seeds' evaluations ({span}): not "
                         f"judged.")
        elif not shared.all():
            rows = steps[shared]
            notes.append(f"{g.task} ({g.exp_name}): rows over steps {rows[0]:,}–{rows[-1]:,}, which all {n} seeds "
                         f"reach; {span} (the rest is judged once every seed gets there).")
    return notes


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def write_markdown(rows: list[Row], path: Path, at: int, bar: float, config: str, notes: list[str]) -> None:
    lines = ["# Reproduction of published TD-MPC2 results", "", f"Config: {config}.", "",
             "Published: TD-MPC2 (ICLR 2024), mean over its 3 seeds, from the `results/` folder of "
             "github.com/nicklashansen/tdmpc2 (copy in `tdmpc/data/`); a pixel run (`, pixels`) beside TD-MPC2's "
             "own from pixels (`results/tdmpc2-pixels`; no SAC there). Env steps include action repeat "
             "(DMC: 2, so 100k env steps = 50k agent steps).",
             f"Pass bar: our mean >= {bar:.0%} of the published TD-MPC2 mean at {at:,} env steps"
             + ("; a task without a published TD-MPC2 curve: gymnasium's solved threshold (notes at the end)."
                if any(r.threshold is not None for r in rows if r.check) else "."), "",
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
    if any(r.check.endswith("(early)") for r in checked):
        lines += ["", f"(early): the runs end before the bar's {at:,} env steps, so they are judged at their last "
                      f"step against the published curve there (interpolated between its points): how the curve "
                      f"compares so far, not the bar."]
    if any(r.interpolated for r in rows):
        lines += ["", "\\* Published value linearly interpolated between its points (every 100k env steps), "
                      "because our evaluation falls between them."]
    if any(r.published["tdmpc2"] is None for r in rows):
        lines += ["", "— : no published value (a task outside the 12 published DMC tasks, or a step beyond 1M; "
                      "from pixels: outside the 12 tasks of TD-MPC2's pixel results, or beyond 2M)."]
    for r in (r for r in checked if r.threshold is not None):
        lines += ["", f"{r.task}: no published TD-MPC2 curve; the result is against gymnasium's solved threshold "
                      f"(`reward_threshold`), {r.threshold:g}."]
    for note in notes:
        lines += ["", note]
    write_text_atomic(path, "\n".join(lines) + "\n")


def write_csv(rows: list[Row], path: Path) -> None:
    atomic_write(path, lambda tmp: _write_csv(rows, tmp))


def _write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
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


def write_plot(groups: list[Group], results: Results, path: Path, columns: int = 3) -> None:
    """One panel per task, each drawn by plot.draw, tiled side by side into one image."""
    import matplotlib.image as mpimg  # draw() has checked that matplotlib is there

    tasks = list(dict.fromkeys(g.task for g in groups))
    with tempfile.TemporaryDirectory() as tmp:
        tiles = []
        for i, task in enumerate(tasks):
            curves = [g.curve for g in groups if g.task == task]
            last = int(max(c.steps[-1] for c in curves))
            for obs in dict.fromkeys(g.obs for g in groups if g.task == task):
                for alg, style in PUBLISHED_STYLE.items():
                    if (alg, task) in results[obs]:
                        label = ALGORITHMS[alg] + (", pixels" if obs == "rgb" else "")
                        style = {**style, "linestyle": ":"} if obs == "rgb" else style
                        curves.append(published_curve(results[obs][(alg, task)], label, last, style))
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


def check_results_folder(out: Path) -> None:
    """--out can be the folder results.md, results.csv and results.png go to (checked before runs start, so hours
    of training never end in this error): no file where it or a folder above it would be."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise BadInput(f"--out {out}: {folder} is a file; --out names the folder results.md, results.csv "
                               f"and results.png go to")
            return


def gather(run_dirs: list[Path], out: Path, at: int = 100_000, bar: float = 0.9,
           config: str = "each run's own config.json (a note below names any setting a task's seeds differ in "
                         "that changes what they learn)") \
        -> list[Row]:
    """Compare the runs with the published curves, write results.md/csv/png into `out`, print PASS/FAIL. `config`:
    the settings the runs were made with, for results.md (a grid's, named by tdmpc.reproduce)."""
    groups = load_groups(run_dirs)
    results = {obs: load_published(obs) for obs in dict.fromkeys(g.obs for g in groups)}
    rows = compare(groups, results, at, bar)
    check_results_folder(out)
    make_dirs(out)
    write_markdown(rows, out / "results.md", at, bar, config,
                   coverage_notes(groups) + [g.curve.mixed + "." for g in groups if g.curve.mixed])
    write_csv(rows, out / "results.csv")
    write_plot(groups, results, out / "results.png")
    for r in (r for r in rows if r.check):
        if r.ratio is not None:
            ref = f"published TD-MPC2 {r.published['tdmpc2']:.1f}{' (interpolated)' * r.interpolated}, ratio {r.ratio:.2f}"
        else:
            ref = "no published TD-MPC2 curve" + ("" if r.threshold is None else
                                                  f"; gymnasium's solved threshold {r.threshold:g}")
        print(f"{r.check:4}  {r.task} ({r.exp_name}): ours {r.ours:.1f} at {r.env_step:,} env steps "
              f"({r.seeds} seed{'s' * (r.seeds > 1)}), {ref}")
    print(f"wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'results.png'}")
    return rows
