"""python -m tdmpc.train --cfg cpu.json: online TD-MPC2 training with evaluation, checkpoints, exact resume.

Steps are environment steps, action repeat included (the convention of published curves).
SIGTERM, SIGINT or SIGUSR1 finish the current step, write a checkpoint and exit with code 3.
Before starting, the peak device memory is estimated (tdmpc.memory) and checked against the
card; running out of device memory anyway writes a checkpoint and exits with code 1.

From Python: `run_dir, agent = tdmpc.train(env="Pendulum-v1", steps=20_000, model_size=1)`.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np
import torch

from tdmpc import checkpoint, distributed, memory, run_dir as runs, speed_probe
from tdmpc.agent import Agent
from tdmpc.buffer import BufferFileError, ReplayBuffer
from tdmpc.cli import EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, BadInput, run_cli
from tdmpc.config import Config, ConfigError, changed_fields, from_dict, load_json, parse_cli, save_json, validate
from tdmpc.device import DeviceError, resolve_device, set_threads
from tdmpc.envs import EnvSource, EnvSpec, env_rng_state, make_env, make_task_envs, make_vector_env, set_env_rng_state
from tdmpc.envs.make import VectorEnvs
from tdmpc.evaluate import run_episodes
from tdmpc.logger import RunLogger
from tdmpc.multitask import TaskSetup, model_dims, task_setup
from tdmpc.offline import offline_spec, open_offline
from tdmpc.dataset_sampler import DatasetSampler
from tdmpc.dataset_writer import DatasetWriter, EpisodeRecorder
from tdmpc.distributed import SINGLE, Shard
from tdmpc.world_model import ModelDims

CPU_DEFAULT = "cpu.json"  # the config a machine without a GPU starts from when no --cfg is given
STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, s))
Callback = Callable[[dict], Optional[bool]]  # gets a log or eval row; returning False stops the run


class TrainingDiverged(RuntimeError):
    """Most updates produce non-finite gradients; continuing would waste the allocation."""


class NonFiniteData(RuntimeError):
    """An env returned NaN or inf; the message names the env, the step and the field."""


@dataclass
class Counters:
    """Where a run is; saved in every checkpoint so a resume continues from the same step."""

    env_step: int = 0  # environment steps, action repeat included
    vector_steps: int = 0  # calls to envs.step()
    episodes: int = 0
    updates: int = 0
    pretrain_updates_left: int = -1  # updates on the seed data still to do; -1 until seeding ends
    refill_until: int = 0  # a run resumed without its replay buffer acts, without updates, up to this step
    next_eval: int = 0
    next_log: int = 0
    next_save: int = 0
    last_eval: int = -1
    elapsed: float = 0.0  # seconds of training, over all sessions
    finished: bool = False


class Trainer:
    """One run: vector envs, the agent, its replay buffer, and the loop that ties them together."""

    def __init__(self, cfg: Config, run_dir: Path, device: torch.device, buffer_storage: torch.device | None = None,
                 resume: bool = False, init_from: str | None = None, env: EnvSource | None = None,
                 eval_env: EnvSource | None = None, on_log: Callback | None = None, on_eval: Callback | None = None,
                 no_buffer: bool = False, shard: Shard = SINGLE):
        """buffer_storage: where the replay buffer lives (None: on `device`). env: what to train on (None:
        cfg.task); eval_env: what to evaluate on (None: the same). no_buffer: resume without the saved
        replay buffer (it refills by acting). shard: this process's rank in data-parallel (offline) training:
        rank 0 evaluates, logs and writes the run."""
        self.shard = shard
        self.lock = runs.RunDirLock(run_dir)  # one writer per run directory, before anything is written
        if shard.main:
            self.lock.acquire()
            for stale in runs.remove_stale_temp_files(run_dir):
                print(f"removed {stale}, left by a write that was killed", file=sys.stderr)
            if not resume:
                runs.set_aside_unfinished(run_dir)
        try:  # a fresh run directory whose setup fails is removed: a bad input leaves nothing behind
            self.env, self.eval_env = env or cfg.task, eval_env or env or cfg.task
            self.envs: VectorEnvs | None = None
            self.data: DatasetSampler | None = None  # offline training's data, in place of envs and a replay buffer
            if cfg.dataset:
                offline = open_offline(cfg, device, cfg.seed, (shard.rank, shard.world))
                self.data, self.tasks, self.spec = offline.sampler, offline.tasks, offline.spec
            else:
                if shard.world > 1:
                    raise ConfigError("data-parallel training (torchrun, slurm/train_multi.sh) is offline only: pass "
                                      "--dataset")
                self.tasks = task_setup(cfg) if env is None else None  # a multi-task model's tasks, None for one task
                self.envs, self.spec = _make_envs(self.env, cfg, self.tasks)
            self.cfg = cfg = validate(cfg.for_task(self.spec, len(self.tasks.tasks) if self.tasks else 1))
            self.run_dir, self.device = run_dir, device
            self.on_log, self.on_eval = on_log, on_eval
            torch.manual_seed(cfg.seed)
            self.rng = np.random.default_rng(cfg.seed)
            assert cfg.episodic is not None
            self.dims = model_dims(cfg, self.spec, self.tasks)  # the multi-task model's task set and masks too
            self.agent = Agent(cfg, self.dims, self.tasks.episode_lengths if self.tasks else self.spec.episode_length,
                               device, shard)
            self.counters = Counters(next_log=cfg.log_every, next_save=cfg.save_every)  # the first eval at step 0
            self.stop_reason: str | None = None  # a signal's name, or the callback that asked to stop
            self.doing = "setup"  # "act", "update" or "evaluation": named if the device runs out of memory
            self.num_envs = 0 if self.envs is None else self.envs.num_envs
            self.env_tasks = None if self.tasks is None or self.envs is None else self.tasks.env_tasks(cfg.num_envs)
            self.buffer = None if self.envs is None else ReplayBuffer(
                cfg.buffer_size, self.num_envs, self.spec.obs_shape, self.spec.action_dim, cfg.horizon,
                obs_dtype=torch.uint8 if cfg.obs == "rgb" else torch.float32, device=device,
                storage=buffer_storage or device, env_tasks=self.env_tasks)
            self.recorder = None if not cfg.save_data or not shard.main else EpisodeRecorder(DatasetWriter(
                cfg.save_data, self.spec.obs_shape, self.spec.action_dim, self.tasks.task_set if self.tasks else (cfg.task,),
                cfg.obs, cfg.action_repeat or 1, f"tdmpc.train --save-data, run {run_dir}",
                *((self.tasks.obs_dims, self.tasks.action_dims) if self.tasks else ())),
                self.env_tasks if self.env_tasks is not None else np.zeros(self.num_envs, dtype=np.int64))
            if init_from:
                print(checkpoint.init_weights(self.agent.model, init_from, self.spec.obs_shape, self.spec.action_dim,
                                              self.spec.task), file=sys.stderr)
            if resume:
                self._restore(checkpoint.load_file(self.checkpoint_path), no_buffer)
            if shard.main:
                try:
                    save_json(cfg, run_dir / "config.json")
                except OSError as e:
                    raise runs.RunDirError(f"cannot write {run_dir / 'config.json'}: {e.strerror or e} "
                                           f"({runs.fmt_size(runs.free_bytes(run_dir))} free); choose another "
                                           f"--run-dir") from None
            self.logger = RunLogger(run_dir, cfg, cfg.steps, self.counters.env_step, writes=shard.main)
            if resume and shard.main:
                self.logger.train_csv.truncate_after(self.counters.env_step)
                self.logger.eval_csv.truncate_after(self.counters.env_step)
            # Per-log-interval statistics: metric sums stay on the device until a log row is written.
            self.metric_sum: dict[str, torch.Tensor] | None = None
            self.metric_count = 0
            self.ended_episodes: list[tuple[float, int, int]] = []  # (return, length, env) since the last log row
            self.ep_return = np.zeros(self.num_envs)
            self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
            self.rate_mark = (time.time(), 0, 0)  # (time, env_step, updates) at the last log row: rates
            self.last_bar = 0.0
            self.warned_termination = self.warned_nonfinite = False
            if self.envs is not None:
                self.obs, _ = self.envs.reset(seed=None if resume else cfg.seed)
                self.first = np.ones(self.num_envs, dtype=bool)
                self._start_episodes(np.arange(self.num_envs))
            set_threads(cfg.threads)
            if shard.main:
                self._warn_if_disk_short()
        except BaseException:
            self.lock.abandon()
            raise

    @property
    def checkpoint_path(self) -> Path:
        return runs.checkpoint_path(self.run_dir)

    # --- the loop -----------------------------------------------------------------
    def run(self) -> int:
        """Train to cfg.steps. Returns an exit code: 0 finished, 3 stopped (checkpoint written), 1 out of memory."""
        handlers = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            try:
                return self._loop()
            except NonFiniteData as e:  # the bad transition was not stored: the run is consistent
                self.save()
                self.logger.message(f"error: {e}; checkpoint written at step {self.counters.env_step:,} "
                                    f"(resume with --resume {self.run_dir} --nonfinite-data drop)")
                return EXIT_ERROR
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or an error it caused (a graph capture)
                oom = _out_of_memory_error(e)
                if oom is None:
                    raise
                what = str(oom).strip().splitlines()[0] if str(oom).strip() else "CUDA out of memory"
            return self._out_of_memory(what)  # outside the handler: the traceback's tensors are freed
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.logger.close()
            for resource in (self.envs, self.data):
                if resource is not None:
                    resource.close()
            if self.recorder is not None:
                self.recorder.writer.close()
            self.lock.release()

    def _loop(self) -> int:
        cfg, c = self.cfg, self.counters
        t_start = time.time() - c.elapsed
        self.rate_mark = (time.time(), c.env_step, c.updates)
        while c.env_step < cfg.steps and not self._stopping():
            if c.env_step >= c.next_eval and not self.evaluate():
                break
            self.step()
            c.elapsed = time.time() - t_start
            if c.env_step >= c.next_log:
                self._log()
            if c.env_step >= c.next_save and self.stop_reason is None:
                self.save()
                c.next_save = _next_multiple(c.env_step, cfg.save_every)
            self._progress()
        if self.stop_reason is not None:
            self.save()
            self.logger.message(f"stopped by {self.stop_reason} at step {c.env_step:,}; checkpoint written. "
                                f"Resume with: python -m tdmpc.train --resume {self.run_dir}")
            return EXIT_REQUEUE
        if c.last_eval != c.env_step and not self.evaluate():
            self.save()
            return EXIT_REQUEUE
        c.finished = True
        self.save()
        unit = "updates" if self.data is not None else "env steps"
        self.logger.message(f"finished {c.env_step:,} {unit} in {c.elapsed / 60:.1f} min; results in {self.run_dir}")
        return EXIT_OK

    def _stopping(self) -> bool:
        """A stop signal or callback; with several ranks, one that reached any rank stops them all together."""
        if self.shard.any(self.stop_reason is not None, self.device) and self.stop_reason is None:
            self.stop_reason = "a stop on another rank"
        return self.stop_reason is not None

    def step(self) -> None:
        """One step of all N envs, its transitions into the buffer, then any updates due; offline, one update
        (steps count updates)."""
        cfg, c = self.cfg, self.counters
        if self.envs is None:
            self.update()
            c.env_step += 1
            return
        if c.env_step < cfg.seed_steps:  # type: ignore[operator]
            action = self.rng.uniform(-1, 1, (self.num_envs, self.spec.action_dim)).astype(np.float32)
            if self.tasks is not None and self.env_tasks is not None:
                action *= self.tasks.action_masks(self.env_tasks)
        else:
            self.doing = "act"
            action = self.agent.act(self.obs, self.first, task=self.env_tasks)
        obs, reward, terminated, truncated, info = self.envs.step(action)
        done = terminated | truncated
        stored = obs
        if done.any():  # SAME_STEP autoreset: obs already holds the next episode's first observation
            stored = obs.copy()
            for i in np.flatnonzero(done):
                stored[i] = info["final_obs"][i]
            self._note_terminations(terminated)
        bad = ~(np.isfinite(stored.reshape(len(stored), -1)).all(1) & np.isfinite(reward))
        if bad.any():  # one vectorised check on host data: no device sync
            obs, reward, terminated, done = self._nonfinite(bad, stored, reward, obs, terminated, done)
            stored = np.where(bad.reshape(-1, *[1] * (obs.ndim - 1)), obs, stored)
        keep = ~bad
        assert self.buffer is not None
        self.buffer.add(torch.from_numpy(stored), torch.from_numpy(action),
                        torch.from_numpy(reward.astype(np.float32)), torch.from_numpy(terminated), keep)
        if self.recorder is not None:
            self.recorder.add(stored, action, reward, keep)
        self.ep_return += reward
        self.ep_length += 1
        if done.any():
            ended = np.flatnonzero(done)
            if self.recorder is not None:
                self.recorder.end(ended[keep[ended]], terminated)
            self._start_episodes(ended, obs[ended])
            self.ended_episodes += [(float(self.ep_return[i]), int(self.ep_length[i]), int(i)) for i in ended if keep[i]]
            self.ep_return[ended], self.ep_length[ended] = 0, 0
            c.episodes += len(ended)
        self.obs, self.first = obs, done
        c.vector_steps += 1
        c.env_step += self.num_envs * cfg.action_repeat  # type: ignore[operator]

        if c.env_step < cfg.seed_steps or c.env_step < c.refill_until:  # type: ignore[operator]
            return
        if c.pretrain_updates_left < 0:  # seeding just ended: pretrain on the seed data
            c.pretrain_updates_left = c.vector_steps // cfg.update_every * cfg.updates_per_round  # type: ignore[operator]
            self.logger.message(f"seeding done at step {c.env_step:,}: {c.pretrain_updates_left:,} pretraining updates")
        if c.pretrain_updates_left > 0:
            while c.pretrain_updates_left > 0 and self.stop_reason is None:
                self.update()
                c.pretrain_updates_left -= 1
                if c.pretrain_updates_left % 50 == 0:
                    self._progress(force=True)
        elif c.vector_steps % cfg.update_every == 0:
            for _ in range(cfg.updates_per_round):  # type: ignore[arg-type]
                self.update()

    def _start_episodes(self, envs: np.ndarray, obs: np.ndarray | None = None) -> None:
        """Episodes begin in `envs` (with these first observations; default: the current ones)."""
        first = self.obs[envs] if obs is None else obs
        assert self.buffer is not None
        self.buffer.start(torch.from_numpy(first), envs)
        if self.recorder is not None:
            self.recorder.start(first, envs)

    def update(self) -> None:
        """One gradient step on a sampled batch; its metrics are summed on the device until the next log row."""
        self.doing = "update"
        source = self.data if self.data is not None else self.buffer
        assert source is not None
        metrics = self.agent.update(source.sample(self.cfg.batch_size))
        if self.cfg.debug:
            bad = [k for k, v in metrics.items() if not torch.isfinite(v).all()]
            if bad:
                raise FloatingPointError(f"non-finite metrics at update {self.counters.updates}: {bad}")
        if self.metric_sum is None:
            self.metric_sum = {k: v.detach().clone().float() for k, v in metrics.items()}
        else:
            torch._foreach_add_(list(self.metric_sum.values()), [v.float() for v in metrics.values()])
        self.metric_count += 1
        self.counters.updates += 1

    def evaluate(self) -> bool:
        """Run the eval episodes (of every task); False if a stop signal arrived meanwhile (redone on resume)."""
        cfg, c = self.cfg, self.counters
        if cfg.eval_episodes == 0:
            c.next_eval = _next_multiple(c.env_step, cfg.eval_freq)
            return True
        if not self.shard.main:  # rank 0 evaluates; the others wait for it
            self.shard.barrier()
            c.next_eval, c.last_eval = _next_multiple(c.env_step, cfg.eval_freq), c.env_step
            return True
        t0 = time.time()
        self.doing = "evaluation"
        rows = []
        for task in self.tasks.tasks if self.tasks else (self.eval_env,):
            name = f"_{task}" if self.tasks else ""
            video = self.run_dir / "videos" / f"step_{c.env_step:09d}{name}.mp4" if cfg.save_video else None
            res = run_episodes(self.agent, task, cfg.eval_episodes, seed=1_000_003 * (cfg.seed + 1), obs=cfg.obs,
                               action_repeat=cfg.action_repeat, video=video, stop=lambda: self.stop_reason is not None)
            if res is None:
                return False
            rows.append(({"task": task} if self.tasks else {}) | res.summary())
        if self.tasks:  # the tasks' mean, as the reference reports multi-task results
            rows.append({"task": "mean", "episodes": sum(r["episodes"] for r in rows),
                         **{k: float(np.mean([r[k] for r in rows])) for k in ("episode_return", "episode_length")}})
        timing = {"eval_seconds": round(time.time() - t0, 1), "elapsed": round(c.elapsed, 1)}
        rows = [{"env_step": c.env_step, **r, **timing} for r in rows]
        self.logger.eval(rows, video)
        c.next_eval = _next_multiple(c.env_step, cfg.eval_freq)
        c.last_eval = c.env_step
        self.rate_mark = (time.time(), c.env_step, c.updates)  # keep eval time out of the step rate
        self._callback(self.on_eval, rows[-1], "on_eval")
        self.shard.barrier()
        return True

    def _log(self) -> None:
        """One train.csv row: the only place device metrics are read back to the host."""
        c = self.counters
        now = time.time()
        t0, s0, u0 = self.rate_mark
        ended = self.ended_episodes
        row: dict[str, Any] = {
            "env_step": c.env_step, "episodes": c.episodes, "updates": c.updates, "elapsed": round(c.elapsed, 1),
            "env_steps_per_s": (c.env_step - s0) / max(now - t0, 1e-9),
            "updates_per_s": (c.updates - u0) / max(now - t0, 1e-9),
            "episode_return": float(np.mean([r for r, _, _ in ended])) if ended else float("nan"),
            "episode_length": float(np.mean([n for _, n, _ in ended])) if ended else float("nan")}
        if self.tasks is not None and self.env_tasks is not None:  # each task's own training return
            for t in self.tasks.tasks:
                own = [r for r, _, e in ended if self.tasks.task_set[self.env_tasks[e]] == t]
                row[f"episode_return_{t}"] = float(np.mean(own)) if own else float("nan")
        if self.metric_sum is not None:
            values = torch.stack(list(self.metric_sum.values())).cpu().tolist()
            row.update({k: v / self.metric_count for k, v in zip(self.metric_sum, values)})
        self.logger.train(row)
        if self.metric_count >= 10 and row.get("skipped", 0.0) > 0.5:
            raise TrainingDiverged(
                f"training diverged: {row['skipped']:.0%} of the last {self.metric_count} updates had non-finite "
                f"gradients and were skipped; the last checkpoint is in {self.checkpoint_path.parent}. Try a lower "
                f"--lr" + (" or --train-precision fp32" if self.cfg.train_precision == "bf16" else ""))
        self.metric_sum, self.metric_count, self.ended_episodes = None, 0, []
        self.rate_mark = (now, c.env_step, c.updates)
        c.next_log = _next_multiple(c.env_step, self.cfg.log_every)
        self._callback(self.on_log, row, "on_log")

    def _progress(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_bar < 0.5:
            return
        self.last_bar = now
        t0, s0, u0 = self.rate_mark
        dt = max(now - t0, 1e-9)
        c = self.counters
        env_sps = None if self.envs is None else (c.env_step - s0) / dt  # offline: steps are updates
        self.logger.progress(c.env_step, env_sps, (c.updates - u0) / dt)

    def _callback(self, fn: Callback | None, row: dict, name: str) -> None:
        if fn is not None and fn(dict(row)) is False and self.stop_reason is None:
            self.stop_reason = f"the {name} callback"

    def _note_terminations(self, terminated: np.ndarray) -> None:
        """A terminating env with episodic False: planning ignores terminations; say so once."""
        if terminated.any() and not self.cfg.episodic and not self.warned_termination:
            self.warned_termination = True
            self.logger.message(f"note: {self.cfg.task} ended an episode in a terminal state, but episodic is off, "
                                f"so the world model learns no termination head (values still stop there). If the "
                                f"task can terminate, train with --episodic")

    def _nonfinite(self, bad: np.ndarray, stored: np.ndarray, reward: np.ndarray, obs: np.ndarray,
                   terminated: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """NaN or inf from an env: named at its source ('error'), or the transition dropped and the env's
        episode restarted ('drop'). Returns obs, reward, terminated and done with the dropped envs reset."""
        i = int(np.flatnonzero(bad)[0])
        field = "reward" if not np.isfinite(reward[i]) else "observation"
        task = self.spec.task if self.tasks is None or self.env_tasks is None else self.tasks.task_set[self.env_tasks[i]]
        where = f"env {i} ({task}) returned a non-finite {field} at env step {self.counters.env_step:,}"
        if self.cfg.nonfinite_data == "error":
            raise NonFiniteData(f"{where}; pass --nonfinite-data drop to skip such transitions")
        if not self.warned_nonfinite:
            self.warned_nonfinite = True
            self.logger.message(f"note: {where}; dropped (--nonfinite-data drop), its episode restarts")
        assert self.envs is not None
        fresh, _ = self.envs.reset(options={"reset_mask": bad})
        obs = np.where(bad.reshape(-1, *[1] * (obs.ndim - 1)), fresh, obs)
        return obs, np.where(bad, 0.0, reward), terminated & ~bad, done | bad

    def _warn_if_disk_short(self) -> None:
        """A checkpoint and a full buffer, twice (old and new coexist while a write is made atomic)."""
        params = sum(p.numel() * p.element_size() for p in self.agent.model.parameters())
        needed = 2 * (4 * params + (self.buffer.nbytes if self.cfg.save_buffer and self.buffer is not None else 0))
        free = runs.free_bytes(self.checkpoint_path.parent)
        if free < needed:
            self.logger.message(f"warning: {runs.fmt_size(free)} are free on {self.run_dir}, and checkpoints with the "
                                f"full replay buffer need about {runs.fmt_size(needed)}; free some space or pass "
                                f"--no-save-buffer")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_reason = f"signal {signal.Signals(signum).name}"
        if signum == signal.SIGINT:  # a second Ctrl-C aborts at once
            signal.signal(signal.SIGINT, signal.default_int_handler)

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
            saved = f"checkpoint written at step {c.env_step:,}"
        except Exception as e:  # e.g. the device is unusable after a failed graph capture
            saved = f"no checkpoint could be written ({type(e).__name__}: {e}); the last one in " \
                    f"{self.checkpoint_path.parent} stays"
        target = memory.detect_target(self.cfg, self.device)
        estimate, flags = memory.out_of_memory_report(
            self.cfg, self.spec.obs_shape, self.spec.action_dim, bool(self.cfg.episodic), target,
            self.buffer is not None and self.buffer.storage.type == "cuda", self.device)
        self.logger.message(f"error: out of device memory in {self.doing} at step {c.env_step:,} ({what}); {saved}.\n"
                            f"{estimate}\nadvice: resume with lower settings: python -m tdmpc.train --resume "
                            f"{self.run_dir} {flags} (--dry-run shows the breakdown)")
        return EXIT_ERROR

    # --- checkpoints ----------------------------------------------------------------
    def save(self) -> None:
        """Buffer first (new file name), then latest.pt naming it: a crash leaves a consistent pair. A write
        that cannot be made (full or read-only disk) is refused before it starts where it can be foreseen,
        leaves no partial file, and is a one-line DiskError saying where the last good checkpoint is."""
        if not self.shard.main:  # rank 0 writes the run
            return
        c = self.counters
        buffer_file = None
        ckpt_dir = self.checkpoint_path.parent
        try:
            if self.cfg.save_buffer and self.buffer is not None:
                buffer_file = f"buffer_{c.env_step:010d}.h5"
                runs.ensure_space(ckpt_dir / buffer_file, self.buffer.saved_bytes, "the replay buffer")
                self.buffer.save(ckpt_dir / buffer_file)
            if self.recorder is not None:  # the finished episodes, before the checkpoint that counts them
                self.recorder.writer.commit()
            rng: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": self.rng.bit_generator.state}
            if self.envs is not None:
                rng["envs"] = env_rng_state(self.envs)
            if self.data is not None:
                rng["sampler"] = self.data.generator.get_state()
            if self.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(self.device)
            state_bytes = sum(t.numel() * t.element_size() for t in self.agent.model.state_dict().values())
            runs.ensure_space(self.checkpoint_path, 4 * state_bytes, "the checkpoint")  # weights and Adam states
            self.agent.save(self.checkpoint_path, {
                "train": dataclasses.asdict(c), "rng": rng, "buffer_file": buffer_file,
                "data_episodes": self.recorder.writer.episodes if self.recorder is not None else None})
        except OSError as e:
            last = f"the last good checkpoint is {self.checkpoint_path}" if self.checkpoint_path.is_file() \
                else "no checkpoint was written yet"
            what = str(e) if isinstance(e, runs.DiskError) else \
                f"could not write in {ckpt_dir}: {e.strerror or e} ({runs.fmt_size(runs.free_bytes(ckpt_dir))} free)"
            raise runs.DiskError(f"{what}; {last}") from None
        for old in ckpt_dir.glob("buffer_*.h5"):
            if old.name != buffer_file:
                old.unlink()

    def _restore(self, obj: dict, no_buffer: bool) -> None:
        self.agent.load_state_dict(obj, str(self.checkpoint_path))
        saved = obj["train"]
        saved.setdefault("pretrain_updates_left", saved.pop("burst_left", -1))  # its name before 0.2
        self.counters = Counters(**saved)
        rng = obj["rng"]
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.rng.bit_generator.state = rng["numpy"]
        if self.data is not None:
            if "sampler" in rng:
                self.data.generator.set_state(rng["sampler"])
            return
        assert self.envs is not None and self.buffer is not None
        set_env_rng_state(self.envs, rng["envs"])
        if self.recorder is not None and obj.get("data_episodes") is not None:
            self.recorder.writer.truncate(obj["data_episodes"])  # appended after this checkpoint: played again
        buffer_file = obj.get("buffer_file")
        if buffer_file and not no_buffer:
            path = self.checkpoint_path.parent / buffer_file
            try:
                self.buffer.load(path)
            except BufferFileError as e:
                kept = runs.set_aside_damaged(path)
                raise BufferFileError(f"{e}{f'; kept as {kept.name}' if kept else ''}. Resume without it: --resume "
                                      f"{self.run_dir} --no-buffer (weights, optimisers and counters are restored, "
                                      f"the buffer refills by acting)") from None
        elif self.counters.env_step >= (self.cfg.seed_steps or 0):  # no buffer to resume with: refill it first
            self.counters.refill_until = self.counters.env_step + (self.cfg.seed_steps or 0)
            why = "--no-buffer" if buffer_file else "the checkpoint holds no replay buffer (--no-save-buffer)"
            print(f"resume: {why}: acting without updates until step {self.counters.refill_until:,} to refill the "
                  f"replay buffer", file=sys.stderr)
        self.buffer.end_episodes()  # the episode in flight at the stop is discarded, see README


def _make_envs(env: EnvSource, cfg: Config, tasks: TaskSetup | None) -> tuple[VectorEnvs, EnvSpec]:
    """Vector envs (num_envs of each task of a multi-task run), and the spec the model is built for;
    async workers ignore SIGINT/SIGTERM so only the trainer handles a stop."""
    ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} \
        if cfg.vectorization == "async" else {}
    asynchronous = cfg.vectorization == "async"
    try:
        if tasks is None:
            return make_vector_env(env, cfg.num_envs, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat,
                                   asynchronous=asynchronous)
        envs, _ = make_task_envs(tasks.tasks, cfg.num_envs, seed=cfg.seed, obs_dim=tasks.obs_dim,
                                 action_dim=tasks.action_dim, action_repeat=tasks.action_repeat,
                                 asynchronous=asynchronous)
        return envs, tasks.spec(cfg)
    finally:
        for s, h in ignored.items():
            signal.signal(s, h)


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


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


# --- from Python ----------------------------------------------------------------------

def train(env: EnvSource | None = None, *, cfg: Config | None = None, run_dir: str | Path | None = None,
          resume: bool = False, init_from: str | Path | None = None, on_log: Callback | None = None,
          on_eval: Callback | None = None, **overrides: Any) -> tuple[Path, Agent]:
    """Train an agent and return (run_dir, agent).

    env: a task name ('walker-walk', 'Pendulum-v1'), a gymnasium env, or a zero-argument function making
    one (default: cfg.task). An env object is used as it is for the first environment; more environments
    (num_envs > 1) and evaluation use deep copies of it. Every Config field is a keyword (steps=20_000,
    model_size=1, ...), applied over `cfg` (default: Config()). resume=True continues the run in run_dir.
    on_log / on_eval get each train.csv / eval.csv row as a dict; returning False stops the run (a
    checkpoint is written, so it can be resumed)."""
    if run_dir is not None:
        overrides["run_dir"] = str(run_dir)
    if isinstance(env, str):
        overrides.setdefault("task", env)
    if resume:
        if run_dir is None:
            raise BadInput("resume=True needs the run_dir of the run to continue")
        base = runs.saved_config(Path(run_dir))
    else:
        base = cfg or Config()
    config = validate(from_dict(overrides, source="train() keywords", base=base))
    source: EnvSource = config.task if env is None else env
    eval_source: EnvSource = (lambda: copy.deepcopy(env)) if isinstance(env, gym.Env) else source
    device = resolve_device(config.device)
    spec, tasks = _env_spec(source, config)
    plan = memory.assess_run(config.for_task(spec), spec.obs_shape, spec.action_dim, spec.episodic, device,
                             resuming=resume, tasks=tasks)
    if not plan.fits:
        raise BadInput(plan.error())
    path = Path(config.run_dir) if config.run_dir else runs.default_run_dir(config.for_task(spec))
    if not resume:
        runs.check_fresh(path)
    trainer = Trainer(dataclasses.replace(config, run_dir=str(path)), path, device,
                      memory.buffer_storage(plan, device), resume=resume,
                      init_from=str(init_from) if init_from else None, env=source, eval_env=eval_source,
                      on_log=on_log, on_eval=on_eval)
    trainer.counters.finished = False
    trainer.run()
    return path, trainer.agent


def _env_spec(env: EnvSource, cfg: Config) -> tuple[EnvSpec, TaskSetup | None]:
    """What the model is built for: a multi-task run's padded dims, or the task's from one environment
    (closed at once, unless it is the user's own env object)."""
    if cfg.dataset:
        return offline_spec(cfg)
    tasks = task_setup(cfg) if isinstance(env, str) and env == cfg.task else None
    if tasks is not None:
        return tasks.spec(cfg), tasks
    built, spec = make_env(env, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
    if not isinstance(env, gym.Env):
        built.close()
    return spec, None


# --- the command line ----------------------------------------------------------------

@dataclass
class TrainArgs:
    cfg: Optional[str] = None
    """JSON config: a name in configs/ (cpu.json, a4000.json) or a path. Flags below override it. Default:
    cpu.json on a machine without a GPU, else the reference settings."""
    resume: Optional[str] = None
    """Continue the run in this directory from its latest checkpoint (flags override its config.json)."""
    no_buffer: bool = False
    """With --resume: leave the saved replay buffer (damaged or missing, say) aside and refill it by acting."""
    config_from_checkpoint: bool = False
    """With --resume: take the config the checkpoint holds (when config.json is damaged or missing)."""
    auto_resume: Optional[str] = None
    """Resume the run in this directory if it holds a checkpoint, else start one there: one command for every
    (re)start of a job (torchrun restarts, requeued jobs)."""
    init_from: Optional[str] = None
    """Start from these weights: a tdmpc checkpoint or a reference TD-MPC2 one."""
    dry_run: bool = False
    """Print the peak memory estimate (a breakdown) and a verdict for this device or --gpu-mem, and exit
    without training."""
    gpu_mem: Optional[str] = None
    """Plan memory for a card of this size instead of the detected one: 16GB, 16000MB, 8GiB (GB = 10^9
    bytes, GiB = 2^30). Budget = that less a 10% safety margin."""
    fit_memory: bool = False
    """When the estimate exceeds the budget, lower settings until it fits, logging each change, in this
    order: 1. buffer_device device -> host; 2. CUDA graphs off; 3. halve num_envs (not on resume);
    4. halve batch_size (not below 64); 5. halve num_samples (not below 256); 6. the next smaller
    model_size (not on resume). Without it, the run stops and says what to lower."""


def base_config(args: TrainArgs) -> Config:
    """What the flags override: the run's own config.json (--resume), a --cfg file, or the default for
    this machine (base_note says which)."""
    if args.auto_resume and runs.checkpoint_path(Path(args.auto_resume)).is_file():
        args.resume = args.auto_resume
    if args.resume:
        return runs.saved_config(Path(args.resume), args.config_from_checkpoint)
    if args.cfg:
        return load_json(args.cfg)
    return load_json(CPU_DEFAULT) if not torch.cuda.is_available() else Config()


def base_note(args: TrainArgs) -> str | None:
    """The line that says where the config came from when it is not what the user named."""
    if args.resume and args.cfg:
        return f"resume: --cfg {args.cfg} ignored; the run's own config.json applies (other flags still override)"
    if not args.resume and not args.cfg and not torch.cuda.is_available():
        return (f"no GPU here: starting from the CPU default, configs/{CPU_DEFAULT} (pass --cfg a4000.json for "
                f"the reference GPU settings)")
    return None


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    args, cfg, base, given = parse_cli(TrainArgs, argv, base_config, prog="python -m tdmpc.train",
                                       description=__doc__.splitlines()[0])
    if args.auto_resume and not args.resume:
        cfg = dataclasses.replace(cfg, run_dir=args.auto_resume)
    if args.resume:
        changed = changed_fields(base, cfg)
        if "num_envs" in changed:
            raise BadInput(f"--num-envs cannot change on --resume: the replay buffer is laid out for the run's "
                           f"{base.num_envs} env(s)")
        for name, (old, new) in changed.items():
            print(f"resume: {name} changed from {old!r} to {new!r} by the command line", file=sys.stderr)
        if args.init_from:
            print(f"resume: --init-from {args.init_from} ignored; the run's own checkpoint applies", file=sys.stderr)
            args.init_from = None
    init_note = ""
    if args.init_from:
        cfg, init_note = checkpoint.architecture_from_checkpoint(cfg, args.init_from, given)
    shard = distributed.from_environment(cfg.device)  # torchrun / srun ranks, or a single process
    try:
        device: torch.device | None = resolve_device(distributed.device_for(shard, cfg.device))
    except DeviceError:
        if not args.dry_run:
            raise
        device = None  # a dry run still estimates (for --gpu-mem, or to say there is no GPU)
    spec, tasks = _env_spec(cfg.task, cfg)
    run_dir = Path(args.resume) if args.resume else Path(cfg.run_dir) if cfg.run_dir \
        else runs.default_run_dir(cfg.for_task(spec))
    if not args.resume:
        runs.check_fresh(run_dir)  # early, before the memory plan; the trainer checks again under the lock
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    plan = memory.assess_run(cfg.for_task(spec), spec.obs_shape, spec.action_dim, spec.episodic, device,
                             args.gpu_mem, args.fit_memory, resuming=bool(args.resume), tasks=tasks)
    if plan.applied:
        cfg = dataclasses.replace(cfg, **{k: new for ch in plan.changes for k, (_, new) in ch.values.items()})
    if args.dry_run:
        print(memory.dry_run_report(plan, spec.obs_shape, spec.action_dim, device))
        if init_note:
            print(init_note, file=sys.stderr)
    if not plan.fits:
        raise BadInput(plan.error())
    if args.dry_run:
        return EXIT_OK
    assert device is not None
    trainer = Trainer(cfg, run_dir, device, memory.buffer_storage(plan, device), resume=bool(args.resume),
                      init_from=args.init_from, no_buffer=args.no_buffer, shard=shard)
    for line in (base_note(args), memory.summary_line(plan), init_note):  # the input is known good now
        if line and shard.main:
            print(line, file=sys.stderr)
    if device.type == "cpu" and trainer.envs is not None:
        _warn_if_slow(trainer)
    c = trainer.counters
    if c.finished and c.env_step >= trainer.cfg.steps:
        print(f"run in {run_dir} already finished at step {c.env_step:,}; pass --steps N to extend it",
              file=sys.stderr)
        return EXIT_OK
    c.finished = False
    try:
        return trainer.run()
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


def _warn_if_slow(trainer: Trainer, limit_hours: float = 3.0) -> None:
    """A config sized for a GPU on a CPU takes days; say so before it starts."""
    c, cfg = trainer.counters, trainer.cfg
    plan_s, update_s, hours = speed_probe.hours_left(trainer.agent, cfg.steps - c.env_step, trainer.env_tasks)
    if hours > limit_hours:
        cpu = load_json(CPU_DEFAULT)
        if all((getattr(cfg, f) or 0) <= getattr(cpu, f) for f in ("model_size", "num_samples", "iterations", "batch_size")):
            advice = (f"The config is no bigger than {CPU_DEFAULT}: the cores are busy (load average "
                      f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores) or slow; fewer --steps end sooner")
        else:
            advice = f"This config is sized for a GPU; for CPU training use --cfg {CPU_DEFAULT}"
        trainer.logger.message(
            f"warning: on this CPU one plan takes {plan_s * 1e3:.0f} ms and one update {update_s * 1e3:.0f} ms, "
            f"so {cfg.steps - c.env_step:,} env steps would take about {hours:.0f} hours. {advice}")

if __name__ == "__main__":
    sys.exit(main())
