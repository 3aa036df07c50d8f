"""What a run writes while it trains: train.csv, eval.csv, TensorBoard, wandb, a progress bar.

Rows arrive once per log interval as plain Python numbers (the trainer fetches device
metrics once per interval), so nothing here touches the hot path.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from pathlib import Path

from tqdm import tqdm

from tdmpc.config import Config
from tdmpc.errors import ConfigError
from tdmpc.runtime.files import write_text_atomic
from tdmpc.training.run_dir import wandb_run_id


class CSVLog:
    """Append-only CSV; a row with new keys widens the header (rewriting the file, a rare event). Unix line ends:
    the files are read with tail and awk while a run writes them."""

    def __init__(self, path: Path):
        self.path = path
        self.columns: list[str] | None = None
        if path.exists() and path.stat().st_size > 0:
            with open(path, newline="") as f:
                self.columns = next(csv.reader(f), None)

    def write(self, row: dict) -> None:
        if self.columns is None:
            self._rewrite(list(row), [])
        elif set(row) - set(self.columns):
            self._rewrite(self.columns + [k for k in row if k not in self.columns], self._rows())
        assert self.columns is not None
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, lineterminator="\n").writerow({k: _fmt(row.get(k)) for k in self.columns})

    def _rows(self) -> list[dict]:
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, columns: list[str], rows: list[dict]) -> None:
        """The whole file anew, atomically: a full disk keeps the rows it held."""
        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=columns, restval="", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        write_text_atomic(self.path, text.getvalue())
        self.columns = columns

    def truncate_after(self, step: int, key: str = "env_step") -> None:
        """Drop rows logged after `step` (written after the checkpoint a resume starts from)."""
        if self.columns is not None:
            self._rewrite(self.columns, [r for r in self._rows() if r.get(key) and int(float(r[key])) <= step])


def _fmt(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else v


class RunLogger:
    def __init__(self, run_dir: Path, cfg: Config, total_steps: int, start_step: int = 0, writes: bool = True):
        """writes=False: a data-parallel rank other than 0, which logs nothing (rank 0 speaks for the run)."""
        self.run_dir, self.writes = run_dir, writes
        self.train_csv = CSVLog(run_dir / "train.csv")
        self.eval_csv = CSVLog(run_dir / "eval.csv")
        self.tb = None
        if cfg.tensorboard and writes:
            try:
                from torch.utils.tensorboard import SummaryWriter
                # a resume from step S drops the events after S (those at S came before its checkpoint, and stay,
                # as train.csv's rows do)
                self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=start_step + 1 if start_step else None)
            except ImportError:
                pass  # tensorboard is optional
        self.wandb = _wandb_run(run_dir, cfg) if cfg.wandb and writes else None
        self.show, self.task, self.total_steps = cfg.progress and writes, cfg.task, total_steps
        self.bar = self._bar(total_steps, start_step, "step", cfg.task)
        self.bar_from = start_step  # the step the bar started at
        self.pretrain_bar: tqdm | None = None
        self.last_eval: float | None = None
        self.rates: dict[str, str] = {}  # the rates the bar shows, as last measured
        logged = getattr(self.wandb, "step", 0)  # where wandb's run (the same id) goes on from
        if start_step and isinstance(logged, int) and logged > start_step + 1:
            # wandb has no purge (its rewind is a private preview): it ignores steps below the ones it holds
            self.message(f"note: wandb's run goes on from step {logged:,}, logged before this resume from the "
                         f"checkpoint at step {start_step:,}: wandb ignores this run's rows before step {logged:,} "
                         f"(it keeps the earlier ones); train.csv, eval.csv and TensorBoard hold this run's")

    def _bar(self, total: int, initial: int, unit: str, desc: str) -> tqdm:
        """A progress bar whose rate (and ETA) is over its own lifetime (smoothing 0): a resumed run's counts only
        this session's steps."""
        return tqdm(total=total, file=sys.stderr, initial=initial, unit=unit, dynamic_ncols=True, disable=not self.show,
                    mininterval=0.5 if sys.stderr.isatty() else 60, smoothing=0, desc=desc)

    def train(self, row: dict) -> None:
        if not self.writes:
            return
        self.train_csv.write(row)
        self._scalars("train", row)

    def eval(self, rows: list[dict], video: Path | None = None) -> None:
        """One evaluation: one row, or a multi-task run's row per task and their mean (the last)."""
        if not self.writes:
            return
        for row in rows:
            self.eval_csv.write(row)
            prefix = f"eval/{row['task']}" if "task" in row and row["task"] != "mean" else "eval"
            self._scalars(prefix, {k: v for k, v in row.items() if k != "task"})
        step, mean = rows[-1]["env_step"], rows[-1]
        if self.wandb is not None and video is not None and video.is_file():
            import wandb

            self.wandb.log({"eval/video": wandb.Video(str(video), format="mp4")}, step=step)
        self.last_eval = mean["episode_return"]
        per_task = "  (" + ", ".join(f"{r['task']} {r['episode_return']:.1f}" for r in rows[:-1]) + ")" \
            if len(rows) > 1 else f" ± {mean['episode_return_std']:.1f}"
        self.message(f"eval  step {step:>9,}  return {mean['episode_return']:8.1f}{per_task}  "
                     f"({mean['episodes']} episode{'s' if mean['episodes'] != 1 else ''})")
        if self.bar.n == self.bar_from:  # before the bar's first step (step 0's evaluation, or a resume's): not the
            self.bar.unpause()  # steps' time, else the first rate is one step per evaluation and the ETA reads hours

    def _scalars(self, prefix: str, row: dict) -> None:
        step = row["env_step"]
        values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "env_step"
                  and not (isinstance(v, float) and math.isnan(v))}
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(f"{prefix}/{k}", v, step)
        if self.wandb is not None:
            self.wandb.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def progress(self, env_step: int, env_sps: float | None, ups: float | None) -> None:
        """env_sps None: no env steps (offline training), only updates/s is shown; ups None: nothing ran since the
        rates were last measured (just after an evaluation), the rates shown stay."""
        if ups is not None:
            self.rates = {"upd/s": f"{ups:.1f}"} if env_sps is None else {"env/s": f"{env_sps:.0f}",
                                                                         "upd/s": f"{ups:.1f}"}
        shown = {} if self.last_eval is None else {"eval": f"{self.last_eval:.1f}"}
        self.bar.set_postfix(self.rates | shown, refresh=False)
        if env_step > self.bar.n:
            self.bar.update(env_step - self.bar.n)
        else:  # no env step since the last call (pretraining updates): redraw, as update(0) would not
            self.bar.refresh()

    def evaluating(self, episodes: int) -> None:
        """Said on the bar while an evaluation plays (minutes at the reference settings on a CPU), not a bar that
        seems stuck; the next progress() call shows the rates again."""
        self.bar.set_postfix(self.rates | {"eval": f"playing {episodes} episode{'s' if episodes != 1 else ''}"},
                             refresh=sys.stderr.isatty())

    def pretraining(self, updates: int, total: int, step: int, done: bool = False) -> None:
        """The burst of updates on the seed data, where no env step passes: a bar of its own counts updates, and
        the step bar starts afresh after it, so that its rate and ETA are not those of the burst."""
        if self.pretrain_bar is None:
            self.bar.close()
            self.pretrain_bar = self._bar(total, updates, "update", f"{self.task}: pretraining on the seed data")
        if updates > self.pretrain_bar.n:
            self.pretrain_bar.update(updates - self.pretrain_bar.n)
        if done:
            self.pretrain_bar.close()
            self.pretrain_bar = None
            self.bar, self.bar_from = self._bar(self.total_steps, step, "step", self.task), step

    def message(self, text: str) -> None:
        """Human-readable lines go to stderr, with the progress bar, so stdout stays clean."""
        if self.writes:
            tqdm.write(text, file=sys.stderr)

    def end(self, text: str) -> None:
        """The run's last line, after its progress bars' last frame (a message would draw them again below it)."""
        self._close_bars()
        self.message(text)

    def _close_bars(self) -> None:
        if self.pretrain_bar is not None:
            self.pretrain_bar.close()
        self.bar.close()

    def close(self) -> None:
        self._close_bars()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_run(run_dir: Path, cfg: Config):
    """A wandb run with an id unique to this run directory (the same after a resume or requeue); runs of
    one slurm/sweep.sh array are grouped by its job unless --wandb-group says otherwise."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("config field 'wandb' = True: needs the wandb package (pip install wandb)") from None
    group = cfg.wandb_group
    if group is None and os.environ.get("SLURM_ARRAY_JOB_ID"):
        group = f"{os.environ.get('SLURM_JOB_NAME', 'sweep')}-{os.environ['SLURM_ARRAY_JOB_ID']}"
    return wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity, group=group, tags=list(cfg.wandb_tags),
                      name=f"{cfg.task}-seed{cfg.seed}-{cfg.exp_name}", config=cfg.to_dict(), dir=str(run_dir),
                      id=wandb_run_id(run_dir), resume="allow")
