"""The training loop: evaluate, step, log, checkpoint, until cfg.steps; a signal stops it cleanly.

Trainer holds what every run shares: the loop, the agent's updates and their metrics, evaluation,
log rows, checkpoints and exact resume, stop signals and running out of device memory. What a step
is belongs to a subclass: OnlineTrainer (tdmpc.training.online) steps envs into a replay buffer,
OfflineTrainer (tdmpc.training.offline) updates on a dataset. tdmpc.training.setup builds both.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from tdmpc import memory
from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config, save_json
from tdmpc.envs import EnvSource, EnvSpec
from tdmpc.episodes import EvalResult, eval_seed, run_episodes
from tdmpc.errors import (DISK_FULL, EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, DiskError, NonFiniteData, RunDirError,
                          in_command)
from tdmpc.model.checkpoint import load_file
from tdmpc.runtime import distributed
from tdmpc.runtime.args import named
from tdmpc.runtime.distributed import Shard
from tdmpc.runtime.faults import kill_point
from tdmpc.runtime.files import ensure_space, fmt_bytes, free_bytes, keep_previous, saved_size, tensor_bytes
from tdmpc.multitask import TaskSetup
from tdmpc.training.logger import RunLogger
from tdmpc.training.stopping import StopSignals
from tdmpc.training.run_dir import RunDirLock, previous_checkpoint_path, saved_step, set_aside_on_resume

Callback = Callable[[dict], Optional[bool]]  # gets a log or eval row; returning False stops the run


class TrainingDiverged(RuntimeError):
    """Most updates produce non-finite gradients; continuing would waste the allocation."""


@dataclass
class RunSetup:
    """Everything decided before anything is built or written."""

    cfg: Config  # filled in for the task, with the memory plan's changes
    spec: EnvSpec  # what the model is built for
    tasks: TaskSetup | None  # a multi-task run's tasks; None for one task
    run_dir: Path
    device: torch.device
    buffer_storage: torch.device  # where the replay buffer lives
    shard: Shard
    checkpoint: Path | None  # what a resume starts from (latest.pt, or previous.pt when latest.pt is damaged)
    init_from: str | None
    env: EnvSource
    eval_env: EnvSource
    notes: list[str] = field(default_factory=list)
    tensor_envs: bool = False  # the envs speak torch tensors (tdmpc.envs.tensor), not numpy
    init_task_set: tuple[str, ...] = ()  # --task-set as given: a reference multi-task init_from's task names
    from_python: bool = False  # tdmpc.fit's run: messages name its keywords and its resume call, not flags
    resuming: tuple[str, ...] = ()  # what a resume continues and changes, said once the run directory is locked

    @property
    def resume(self) -> bool:
        return self.checkpoint is not None


@dataclass
class Counters:
    """Where a run is; saved in every checkpoint so a resume continues from the same step."""

    step: int = 0  # the run's progress in its unit (Trainer.steps_name): env steps, action repeat included,
    # online; updates offline
    vector_steps: int = 0  # calls to envs.step()
    episodes: int = 0
    updates: int = 0
    pretrain_updates_left: int = -1  # updates on the seed data still to do; -1 until seeding ends
    refill_until: int = 0  # a run resumed without its replay buffer acts, without updates, up to this step
    updates_queued: int = 0  # with overlap_updates: the updates due after the last step, run after the next action
    next_eval: int = 0
    next_log: int = 0
    next_save: int = 0
    last_eval: int = -1
    elapsed: float = 0.0  # seconds of training, over all sessions
    finished: bool = False


class Trainer(StopSignals):
    """One run's loop. A subclass sets its parts (envs and buffer, or a dataset), then calls this __init__,
    which restores a resumed run and opens its logs."""

    steps_name = "env steps"  # what Counters.step counts, in messages

    def __init__(self, setup: RunSetup, agent: Agent, lock: RunDirLock, no_buffer: bool = False,
                 on_log: Callback | None = None, on_eval: Callback | None = None):
        self.cfg = cfg = setup.cfg
        self.run_dir, self.device, self.shard = setup.run_dir, setup.device, setup.shard
        self.spec, self.tasks, self.eval_env = setup.spec, setup.tasks, setup.eval_env
        self.tensor_envs = setup.tensor_envs
        self.agent, self.lock, self.on_log, self.on_eval = agent, lock, on_log, on_eval
        self.rng = np.random.default_rng(cfg.seed)
        self.counters = Counters(next_log=cfg.log_every, next_save=cfg.save_every)  # the first eval at step 0
        self.stop_reason: str | None = None  # a signal's name, or the callback that asked to stop
        self.stop_signal: int | None = None  # the first signal that stopped the run (fit() then acts as it would)
        self.interrupts = 0  # Ctrl-Cs so far: the second aborts at once
        self.aborted_by: int | None = None  # the signal that aborted at once (StopSignals.check_aborted)
        self.looping = False  # run() has begun: a stop signal checkpoints (before it, a command stops at once)
        self.run_ended = False  # the stop's checkpoint is written, or the run finished: nothing left to stop
        self.old_handlers: dict[int, Any] | None = None  # the stop signals' handlers before ours, while ours are set
        self.saved_at: int | None = None  # the step of this session's last checkpoint
        self.phase = "setup"  # "act", "update" or "evaluation": named if the device runs out of memory
        self.callback_error: Exception | None = None  # raised by on_log / on_eval: the run stops, then raises it
        self.error_message = ""  # the first line of the error a run stopped on with exit 1 (fit's RunFailed says it)
        self.from_python = setup.from_python
        # Per-log-interval statistics: metric sums stay on the device until a log row is written.
        self.metric_sum: dict[str, torch.Tensor] | None = None
        self.metric_count = 0
        if setup.checkpoint is not None:
            self._restore(load_file(setup.checkpoint), no_buffer)
            if self.shard.main:
                for line in set_aside_on_resume(self.run_dir, setup.checkpoint):
                    print(line, file=sys.stderr)
        self.row_from = self.counters.step  # the step the log row in progress counts from
        if self.shard.main:
            try:
                save_json(cfg, self.run_dir / "config.json")
            except OSError as e:
                raise RunDirError(f"cannot write {self.run_dir / 'config.json'}: {e.strerror or e} "
                                  f"({fmt_bytes(free_bytes(self.run_dir), decimal=True)} free); choose another "
                                  f"{self.named('run_dir')}") from None
        self.logger = RunLogger(self.run_dir, cfg, cfg.steps, self.counters.step, writes=self.shard.main)
        if setup.resume and self.shard.main:
            self.logger.train_csv.truncate_after(self.counters.step)
            self.logger.eval_csv.truncate_after(self.counters.step)
        self.rate_mark = (time.time(), 0, 0)  # (time, step, updates) at the last log row: rates
        self.last_bar = 0.0
        if in_command():  # a stop signal in the work before the loop (a kernel build) says what it stopped
            self.install_stop_handlers()

    # --- what a subclass provides -------------------------------------------------------
    def step(self) -> None:
        """Advance the run by one step (and the updates due)."""
        raise NotImplementedError

    def sample(self) -> Batch:
        """A training batch."""
        raise NotImplementedError

    def episode_stats(self) -> dict[str, float]:
        """The train.csv columns of the episodes that ended since the last row (and forget them)."""
        return {"episode_return": float("nan"), "episode_length": float("nan")}

    def save_data(self, ckpt_dir: Path) -> dict[str, Any]:
        """Write what a checkpoint needs beside the model (a replay buffer file, say); returns its entries."""
        return {}

    def restore_data(self, obj: dict, no_buffer: bool) -> None:
        """Restore what save_data wrote."""

    def close_data(self) -> None:
        """Release envs, files and workers."""

    # --- the loop -----------------------------------------------------------------
    def run(self) -> int:
        """Train to cfg.steps. Returns an exit code: 0 finished; 3 stopped by a signal or a callback (checkpoint
        written), the final evaluation's interruption included; 1 out of device memory or non-finite data from an
        env (checkpoint written, error_message says which)."""
        self.check_aborted()  # a stop signal before the loop whose exception Python dropped (StopSignals)
        self.looping = True
        self.install_stop_handlers()
        kill_point("startup")
        try:
            try:
                code = self._loop()
                if self.callback_error is not None:  # its checkpoint is written: the user's own error, raised
                    raise self.callback_error
                return code
            except NonFiniteData as e:  # the bad transition was not stored: the run is consistent
                self.save()
                self.error_message = (f"{e}; checkpoint written at step {self.counters.step:,} (resume with "
                                      f"{self.resume_with(nonfinite_data='drop')})")
                self.logger.message(f"error: {self.error_message}")
                return EXIT_ERROR
            except OSError as e:  # a log row, an evaluation's video: the disk filled up (or went away) meanwhile
                if isinstance(e, DiskError) or e.errno not in (*DISK_FULL, errno.EROFS, errno.EIO):
                    raise
                where = f" ({e.filename})" if e.filename else ""
                raise DiskError(f"a write of the run failed{where}: {e.strerror or e} "
                                f"({fmt_bytes(free_bytes(self.run_dir), decimal=True)} free in {self.run_dir}); "
                                f"{self.last_checkpoint()}") from None
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or an error it caused (a graph capture)
                oom = _out_of_memory_error(e)
                if oom is None:
                    raise
                what = str(oom).strip().splitlines()[0] if str(oom).strip() else "CUDA out of memory"
            return self._out_of_memory(what)  # outside the handler: the traceback's tensors are freed
        finally:
            self.close()  # with our handlers still set: a second stop signal meanwhile interrupts nothing
            self.restore_stop_handlers()

    def close(self) -> None:
        """Close the logs and the data, and release the run directory."""
        kill_point("shutdown")
        self.logger.close()
        self.close_data()
        self.lock.release()
        if not self.looping:  # driven by hand (a benchmark), never run(): the signals are the caller's again
            self.restore_stop_handlers()

    def named(self, field: str, value: object = None) -> str:
        """A setting as this run's user gives it: fit()'s keyword, or the command line's flag."""
        return named(field, value, self.from_python)

    def resume_with(self, **settings: object) -> str:
        """How to continue this run, with these settings changed: fit()'s call, or the command (torchrun's for
        data-parallel ranks)."""
        given = [self.named(k, v) for k, v in settings.items()]
        if self.from_python:  # a run on an env object has no task name the command line could rebuild
            return f"tdmpc.fit(env=..., run_dir={str(self.run_dir)!r}, resume=True{''.join(', ' + g for g in given)})"
        return distributed.command(" ".join([f"--resume {self.quoted_run_dir}", *given]), self.shard.world)

    def _loop(self) -> int:
        cfg, c = self.cfg, self.counters
        t_start = time.time() - c.elapsed
        self.rate_mark = (time.time(), c.step, c.updates)
        self.finish_interrupted_work()
        while c.step < cfg.steps and not self._stopping():
            if c.step >= c.next_eval and (not self.evaluate() or self._stopping()):  # on_eval may stop the run
                break
            self.step()
            c.elapsed = time.time() - t_start
            if c.step >= c.next_log:
                self._log()
            if c.step >= c.next_save and self.stop_reason is None:
                # An evaluation due at this step runs first, so that the checkpoint records it as done: a resume
                # from it never evaluates (and logs) this step again.
                if c.step >= c.next_eval and not self.evaluate():
                    break
                if self.stop_reason is None:
                    c.next_save = next_multiple(c.step, cfg.save_every)  # before: the checkpoint records it done
                    self.save()
            self.progress()
        if self.stop_reason is not None:
            self.check_aborted()
            self.save()
            self.check_aborted(checkpoint_written=True)
            self.run_ended = True
            self.progress(force=True)
            self.logger.end(f"stopped by {self.stop_reason} at step {c.step:,}; checkpoint written. "
                            f"Resume with: {self.resume_with()}")
            return EXIT_REQUEUE
        if c.step > self.row_from or self.metric_count:  # the steps since the last row (steps not a multiple)
            self._log()
        if c.last_eval != c.step and not self.evaluate():
            self.save()
            return EXIT_REQUEUE
        c.finished = True
        self.save()
        self.progress(force=True)
        self.logger.end(f"finished {c.step:,} {self.steps_name} in {c.elapsed / 60:.1f} min; results in "
                        f"{self.run_dir}")
        return EXIT_OK

    def finish_interrupted_work(self) -> None:
        """What a stopped run still owed before its next step, done first on resume (OnlineTrainer: the rest of a
        pretraining burst), so a resumed run takes the steps an uninterrupted one would."""

    def _stopping(self) -> bool:
        """A stop signal or callback; with several ranks, one that reached any rank stops them all together."""
        self.check_aborted()
        if self.shard.any(self.stop_reason is not None, self.device) and self.stop_reason is None:
            self.stop_reason = "a stop on another rank"
        return self.stop_reason is not None

    def update(self) -> None:
        """One gradient step on a sampled batch; its metrics are summed on the device until the next log row."""
        self.phase = "update"
        kill_point("update")
        batch = self.sample()
        self.agent.streams.sampled()
        metrics = self.agent.update(batch)
        if self.cfg.debug:
            bad = [k for k, v in metrics.items() if not torch.isfinite(v).all()]
            if bad:
                raise TrainingDiverged(f"--debug: non-finite metrics at update {self.counters.updates}: "
                                       f"{', '.join(bad)}; {self.last_checkpoint()}")
        if self.metric_sum is None:
            self.metric_sum = {k: v.detach().clone().float() for k, v in metrics.items()}
        else:
            torch._foreach_add_(list(self.metric_sum.values()), [v.float() for v in metrics.values()])
        self.metric_count += 1
        self.counters.updates += 1

    def evaluate(self) -> bool:
        """Run the eval episodes (of every task); False if a stop signal arrived meanwhile (redone on resume)."""
        cfg, c = self.cfg, self.counters
        self.agent.streams.join()
        if cfg.eval_episodes == 0:
            c.next_eval = next_multiple(c.step, cfg.eval_freq)
            return True
        if not self.shard.main:  # rank 0 evaluates; the others wait for it
            self.shard.barrier()
            c.next_eval, c.last_eval = next_multiple(c.step, cfg.eval_freq), c.step
            return True
        t0 = time.time()
        self.phase = "evaluation"
        self.logger.evaluating(cfg.eval_episodes * (len(self.tasks.tasks) if self.tasks else 1))
        rows = []
        video = None
        for task in self.tasks.tasks if self.tasks else (self.eval_env,):
            name = f"_{task}" if self.tasks else ""
            video = self.run_dir / "videos" / f"step_{c.step:09d}{name}.mp4" if cfg.save_video else None
            res = self.play_episodes(task, video)
            if res is None:
                return False
            if res.video_error:  # the evaluation stands; a full disk stops the run at its next write
                self.logger.message(f"warning: the evaluation's video was not written: {res.video_error}")
            rows.append(({"task": task} if self.tasks else {}) | res.summary())
        if self.tasks:  # the tasks' mean, as the reference reports multi-task results
            rows.append({"task": "mean", "episodes": sum(r["episodes"] for r in rows),
                         **{k: float(np.mean([r[k] for r in rows])) for k in ("episode_return", "episode_length")}})
        timing = {"eval_seconds": round(time.time() - t0, 1), "elapsed": round(c.elapsed, 1)}
        rows = [{"env_step": c.step, **r, **timing} for r in rows]
        self.logger.eval(rows, video)
        c.next_eval = next_multiple(c.step, cfg.eval_freq)
        c.last_eval = c.step
        kill_point("evaluated")
        self.rate_mark = (time.time(), c.step, c.updates)  # keep eval time out of the step rate
        self._callback(self.on_eval, rows[-1], "on_eval")
        self.shard.barrier()
        return True

    def play_episodes(self, task: EnvSource, video: Path | None) -> EvalResult | None:
        """One evaluation's episodes of `task` (None: a stop signal arrived meanwhile)."""
        cfg = self.cfg
        return run_episodes(self.agent, task, cfg.eval_episodes, seed=eval_seed(cfg.seed), obs=cfg.obs,
                            action_repeat=cfg.action_repeat, video=video, stop=self._eval_interrupted,
                            drop_nonfinite=cfg.nonfinite_data == "drop")

    def _eval_interrupted(self) -> bool:
        """Asked at every evaluation step: has a stop signal arrived?"""
        kill_point("evaluation")
        self.check_aborted()
        return self.stop_reason is not None

    def _log(self) -> None:
        """One train.csv row: the only place device metrics are read back to the host."""
        c = self.counters
        self.agent.streams.join()
        now = time.time()
        t0, s0, u0 = self.rate_mark
        episodes = self.episode_stats()  # first: it counts the episodes ended since the last row
        row: dict[str, Any] = {
            "env_step": c.step, "episodes": c.episodes, "updates": c.updates, "elapsed": round(c.elapsed, 1),
            # no step since the mark (an evaluation just before the run's last row): no rate to give
            "env_steps_per_s": (c.step - s0) / max(now - t0, 1e-9) if c.step > s0 else float("nan"),
            "updates_per_s": (c.updates - u0) / max(now - t0, 1e-9) if c.step > s0 else float("nan"), **episodes}
        if self.device.type == "cuda":  # the run's peak so far, to set beside its --dry-run estimate
            row["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            row["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        if self.metric_sum is not None:
            values = torch.stack(list(self.metric_sum.values())).cpu().tolist()
            row.update({k: v / self.metric_count for k, v in zip(self.metric_sum, values)})
        self.logger.train(row)
        if self.metric_count >= 10 and row.get("skipped", 0.0) > 0.5:
            raise TrainingDiverged(
                f"training diverged: {row['skipped']:.0%} of the last {self.metric_count} updates had non-finite "
                f"gradients and were skipped; {self.last_checkpoint()}. Try a lower "
                f"{self.named('lr')}" + (f" or {self.named('train_precision', 'fp32')}"
                                         if self.cfg.train_precision == "bf16" else ""))
        self.metric_sum, self.metric_count = None, 0
        self.rate_mark, self.row_from = (now, c.step, c.updates), c.step
        c.next_log = next_multiple(c.step, self.cfg.log_every)
        self._callback(self.on_log, row, "on_log")

    def progress(self, force: bool = False) -> None:
        """Redraw the progress bar (at most twice a second unless forced)."""
        now = time.time()
        if not force and now - self.last_bar < 0.5:
            return
        self.last_bar = now
        t0, s0, u0 = self.rate_mark
        dt = max(now - t0, 1e-9)
        c = self.counters
        env_sps = (c.step - s0) / dt if self.steps_name == "env steps" else None  # offline: steps are updates
        ran = c.step != s0 or c.updates != u0
        self.logger.progress(c.step, env_sps, (c.updates - u0) / dt if ran else None)

    def _callback(self, fn: Callback | None, row: dict, name: str) -> None:
        """A user's callback: False stops the run; an exception stops it too, with a checkpoint, and is raised
        once that is written (the steps since the last checkpoint are kept, not lost)."""
        if fn is None:
            return
        try:
            keep = fn(dict(row))
        except Exception as e:
            self.callback_error, self.stop_reason = e, self.stop_reason or f"an exception in the {name} callback"
            return
        if keep is False and self.stop_reason is None:
            self.stop_reason = f"the {name} callback"

    def _out_of_memory(self, what: str) -> int:
        """Free what can be freed, write a checkpoint, set the estimate beside the real peak, advise."""
        c = self.counters
        for optim in (self.agent.optim, self.agent.pi_optim):
            optim.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            self.save()
            saved = f"checkpoint written at step {c.step:,}"
        except Exception as e:  # e.g. the device is unusable after a failed graph capture
            saved = f"no checkpoint could be written ({type(e).__name__}: {e}); the last one in " \
                    f"{self.checkpoint_path.parent} stays"
        target = memory.detect_target(self.cfg, self.device)
        estimate, lowered = memory.out_of_memory_report(
            self.cfg, self.spec.obs_shape, self.spec.action_dim, bool(self.cfg.episodic), target,
            self.buffer_on_device(), self.device, self.spec.discrete, self.tasks, self.tensor_envs)
        advice = (self.resume_with(**lowered) if lowered else
                  f"{self.resume_with()} with a lower {self.named('batch_size')} and {self.named('num_samples')}")
        self.error_message = (f"out of device memory in {self.phase} at step {c.step:,} ({what}); {saved}; resume "
                              f"with lower settings: {advice}")
        self.logger.message(f"error: out of device memory in {self.phase} at step {c.step:,} ({what}); {saved}.\n"
                            f"{estimate}\nadvice: resume with lower settings: {advice}"
                            + ("" if self.from_python else " (--dry-run shows the breakdown)"))
        return EXIT_ERROR

    def buffer_on_device(self) -> bool:
        """Whether a replay buffer lives in device memory (the out-of-memory advice counts it there)."""
        return False

    # --- checkpoints ----------------------------------------------------------------
    def save(self) -> None:
        """Data first (a buffer under a new file name), then latest.pt naming it: a crash leaves a consistent
        pair. A write that cannot be made (full or read-only disk) is refused before it starts where it can be
        foreseen, leaves no partial file, and is a one-line DiskError saying where the last good checkpoint is."""
        if not self.shard.main:  # rank 0 writes the run
            return
        self.agent.streams.join()
        ckpt_dir = self.checkpoint_path.parent
        try:
            self._ensure_checkpoint_space()
            extra = self.save_data(ckpt_dir)
            rng: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": self.rng.bit_generator.state,
                                   **extra.pop("rng", {})}
            if self.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(self.device)
            previous = previous_checkpoint_path(self.run_dir)
            # The last checkpoint becomes the one to fall back to, unless it is of this step (the run's end, just
            # after a periodic save): previous.pt would then be latest.pt again, and the one before it lost.
            if self.checkpoint_path.is_file() and self.saved_at != self.counters.step:
                keep_previous(self.checkpoint_path, previous)
            keep = load_file(previous, mmap=True).get("buffer_file") if previous.is_file() else None
            pending = {"sum": {k: v.cpu() for k, v in (self.metric_sum or {}).items()}, "count": self.metric_count}
            self.agent.save(self.checkpoint_path, {"train": dataclasses.asdict(self.counters), "rng": rng,
                                                   "metrics_since_log": pending, "ranks": self.shard.world, **extra})
            self.saved_at = self.counters.step
        except OSError as e:
            what = str(e) if isinstance(e, DiskError) else \
                f"could not write in {ckpt_dir}: {e.strerror or e} ({fmt_bytes(free_bytes(ckpt_dir), decimal=True)} free)"
            raise DiskError(f"{what}; {self.last_checkpoint()}") from None
        for old in ckpt_dir.glob("buffer_*.h5"):  # the buffers of latest.pt and previous.pt stay
            if old.name not in (extra.get("buffer_file"), keep):
                old.unlink()

    def _ensure_checkpoint_space(self) -> None:
        """Refuse a checkpoint that would not fit before anything of it is written (ensure_space), in one line with
        the real need: the data file (a replay buffer) is written first, then replacing previous.pt frees it, then
        latest.pt is written."""
        ckpt, data = saved_size(tensor_bytes(self.agent.state_dict())), self.data_bytes()
        latest, previous = self.checkpoint_path, previous_checkpoint_path(self.run_dir)
        freed = 0
        if latest.is_file() and previous.is_file() and previous.stat().st_nlink == 1:
            freed = min(previous.stat().st_size, ckpt)
        parts = f"latest.pt {fmt_bytes(ckpt, decimal=True)}, its replay buffer {fmt_bytes(data, decimal=True)}"
        ensure_space(latest, ckpt + data, f"the checkpoint of step {self.counters.step:,} to", freed,
                     parts if data else "")

    def data_bytes(self) -> int:
        """About what save_data() writes (a replay buffer file)."""
        return 0

    def checkpoint_bytes(self) -> int:
        """About the size of latest.pt once training has begun: weights, the optimisers' two Adam moments per
        trained parameter, the rest."""
        moments = sum(2 * p.numel() * p.element_size() for optim in (self.agent.optim, self.agent.pi_optim)
                      for group in optim.param_groups for p in group["params"])
        nbytes, count = tensor_bytes(self.agent.model.state_dict())
        return saved_size((nbytes + moments, 3 * count))

    def _restore(self, obj: dict, no_buffer: bool) -> None:
        self.agent.load_state_dict(obj, str(self.checkpoint_path))
        saved = obj["train"]
        saved.setdefault("pretrain_updates_left", saved.pop("burst_left", -1))  # its name before 0.2
        saved["step"] = saved_step(saved)
        saved.pop("env_step", None)
        self.counters = c = Counters(**saved)
        # The schedule follows this session's --eval-freq/--log-every/--save-every (a resume may change them): the
        # next multiple after the step, which is the saved one when they did not change. An evaluation a stop
        # interrupted stays owed.
        c.next_log, c.next_save = next_multiple(c.step, self.cfg.log_every), next_multiple(c.step, self.cfg.save_every)
        if c.next_eval > c.step:
            c.next_eval = next_multiple(c.step, self.cfg.eval_freq)
        rng = obj["rng"]
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.rng.bit_generator.state = rng["numpy"]
        pending = obj.get("metrics_since_log")  # the updates since the last row: the next row averages them too
        if pending is not None and pending["count"]:
            self.metric_sum = {k: v.to(self.device) for k, v in pending["sum"].items()}
            self.metric_count = pending["count"]
        self.restore_data(obj, no_buffer)


def _out_of_memory_error(e: BaseException | None) -> BaseException | None:
    """The torch.cuda.OutOfMemoryError behind `e`: itself, or the one being handled when `e` was raised
    (a CUDA graph capture that ran out of memory fails again when the capture is closed)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every
