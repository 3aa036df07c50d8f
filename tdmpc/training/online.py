"""Online training: N vector envs step into a replay buffer, and the agent updates every k agent steps.

Every env speaks one step form (tdmpc.envs.tensor.TensorStep): a tensor-native vector env as it is, a numpy one
through tdmpc.envs.host.HostVectorEnv. One step reads top to bottom: act on each env's newest row of the replay
buffer, already on the device (random actions while seeding), step the envs, store the step's rows (the buffer
sends host data over in one copy), book the episodes that ended, then the updates due: a burst of pretraining
updates on the seed data once seeding ends, then updates_per_round every update_every steps. With
overlap_updates (CUDA's default for numpy envs) a round waits for the next step's actions, so the GPU runs it
while the host steps the envs.

NaN or inf: a numpy env's is named at once, at its source (HostVectorEnv); a tensor env's is flagged on the
device (its transition is not stored, and that env's episode stores nothing more) and reported at the next log
row or checkpoint, an error naming the env ('error') or a note ('drop').
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tdmpc.agent import Agent
from tdmpc.buffer import Batch, ReplayBuffer
from tdmpc.envs import EnvSource
from tdmpc.envs.host import HostVectorEnv, LockstepEnv
from tdmpc.envs.tensor import TensorStep, TensorVectorEnv, make_tensor_vector_env
from tdmpc.episodes import EvalResult, eval_seed, run_episodes
from tdmpc.errors import BufferFileError, NonFiniteData, TaskError
from tdmpc.offline.writer import EpisodeRecorder
from tdmpc.runtime.faults import kill_point
from tdmpc.runtime.files import fmt_bytes, free_bytes, write_margin
from tdmpc.training.run_dir import RunDirLock, set_aside_damaged
from tdmpc.training.trainer import Callback, RunSetup, Trainer


HDF5_RECORDS = 16_000  # bytes a replay buffer file holds beside its rows: HDF5's own records, about


class OnlineTrainer(Trainer):
    """Steps N envs in lockstep: a tensor-native vector env (TensorVectorEnv) or a numpy one behind HostVectorEnv,
    one TensorStep per step. The step's bookkeeping (episode returns and lengths, non-finite rows) lives with the
    buffer's rows: nothing in a step reads a device value on the host but a numpy env's actions."""

    def __init__(self, setup: RunSetup, agent: Agent, envs: LockstepEnv, buffer: ReplayBuffer,
                 recorder: EpisodeRecorder | None, lock: RunDirLock, no_buffer: bool = False,
                 on_log: Callback | None = None, on_eval: Callback | None = None):
        self.envs, self.buffer, self.recorder = envs, buffer, recorder
        self.num_envs = envs.num_envs
        self.env_tasks = None if setup.tasks is None else setup.tasks.env_tasks(setup.cfg.num_envs)
        # each env's task id and own action dims on the device, sent once
        self.env_task_ids = None if self.env_tasks is None else agent.task_ids(self.env_tasks, self.num_envs)
        self.action_masks = None if setup.tasks is None or self.env_tasks is None or envs.on_host else \
            torch.as_tensor(setup.tasks.action_masks(self.env_tasks), device=agent.device)
        self.warned_termination = self.warned_nonfinite = False
        if isinstance(envs, HostVectorEnv):  # host data: NaN or inf is handled at once, at its source
            envs.on_nonfinite = self._on_nonfinite
        # The step's bookkeeping lives with the buffer's rows, where each step's data arrives.
        dev, N = buffer.storage, self.num_envs
        self.ep_return = torch.zeros(N, device=dev)
        self.ep_length = torch.zeros(N, dtype=torch.long, device=dev)
        self.ended = torch.zeros((3, N), dtype=torch.float64, device=dev)  # per env since the last log row:
        # episodes ended, their returns and lengths summed
        self.unbooked = torch.zeros((), dtype=torch.long, device=dev)  # ended, not yet in counters.episodes
        self.terminated_seen = torch.zeros(N, dtype=torch.bool, device=dev)  # for a note if not episodic
        self.bad_env = torch.full((), -1, dtype=torch.long, device=dev)  # the first env with non-finite data, or -1
        self.bad_step = torch.zeros((), dtype=torch.long, device=dev)
        self.bad_reward = torch.zeros((), dtype=torch.bool, device=dev)  # its reward was the non-finite value
        super().__init__(setup, agent, lock, no_buffer, on_log, on_eval)
        try:  # the agent acts on each env's newest row of the buffer: these first observations, then each step's
            obs = envs.reset(seed=None if setup.resume else self.cfg.seed)
        except NonFiniteData as e:  # before the run starts: bad input, and the run directory is left as it was
            raise TaskError(str(e)) from None
        self._begin(obs)

    def _begin(self, obs: Tensor) -> None:
        """Every env starts an episode with these observations (a fresh or resumed run, or after an evaluation
        played on the training envs)."""
        self.buffer.start(obs)
        if self.recorder is not None:
            self.recorder.start(obs.numpy(), np.arange(self.num_envs))
        self.ep_return.zero_()
        self.ep_length.zero_()

    def step(self) -> None:
        """One step of all N envs, its rows into the buffer, then any updates due."""
        cfg, c = self.cfg, self.counters
        if c.step < cfg.seed_steps:  # type: ignore[operator]
            kill_point("seeding")
            action = self._random_actions()
        else:
            self.phase = "act"
            action = self.agent.act_on_device(*self.buffer.newest(), task=self.env_task_ids)
            if self.envs.on_host:  # before the updates are queued: on one CUDA stream the copy would wait for them
                action = action.cpu()
        self.run_queued_updates()  # with overlap_updates: queued on the GPU, run while the envs step
        s = self.envs.step(action)
        self._store(s, action)
        c.vector_steps += 1
        c.step += self.num_envs * (cfg.action_repeat or 1)
        self._updates_due()

    def _random_actions(self) -> Tensor:
        """Uniform random actions where the envs live: for host envs from the trainer's numpy RNG (no device work;
        the draws of the numpy path before the step paths were one), for tensor envs on the device from torch's
        (no numpy on that path); checkpoints save both. A multi-task env's are zero past its own action dims, as
        the policy's and the planner's are."""
        n, a = self.num_envs, self.spec.action_dim
        if self.envs.on_host:
            drawn = self.spec.random_actions(self.rng, n)
            if self.tasks is not None and self.env_tasks is not None and not self.spec.discrete:
                drawn *= self.tasks.action_masks(self.env_tasks)
            return torch.from_numpy(drawn)
        if self.spec.discrete:
            return torch.randint(0, a, (n,), device=self.device)
        action = torch.rand(n, a, device=self.device) * 2 - 1
        return action if self.action_masks is None else action * self.action_masks

    def _store(self, step: TensorStep, action: Tensor) -> None:
        """A step's rows into the buffer, its episodes booked, its non-finite rows flagged. On host data what is
        known for free is used: a host env reports NaN or inf itself, and most steps end no episode."""
        self.agent.streams.before_store()
        s = self.buffer.record(step, action)  # the step where the buffer is
        self.agent.streams.inputs_ready()  # a round queued before the next plan (evaluate()'s) samples these rows
        if self.recorder is not None:
            self._record_data(step, action.cpu().numpy())
        counted = s.transition & s.finite
        self.ep_return += torch.where(counted, s.reward, 0.0)  # not reward * counted: NaN * 0 is NaN
        self.ep_length += counted.long()
        if not step.on_host:
            self._flag_nonfinite(s)
        elif not bool((step.terminated | step.truncated | step.started).any()):
            return  # no episode ended or began
        ended = (s.terminated | s.truncated) & counted
        self.ended += torch.stack([ended, self.ep_return * ended, self.ep_length * ended]).double()
        self.unbooked += ended.sum()
        self.ep_return = torch.where(ended | s.started, 0.0, self.ep_return)
        self.ep_length = torch.where(ended | s.started, 0, self.ep_length)
        self.terminated_seen |= s.terminated

    def _flag_nonfinite(self, s: TensorStep) -> None:
        """The first env with a non-finite observation or reward, its step and which, kept on the device for the
        next log row or checkpoint to report (_check_finite)."""
        bad = s.transition & ~s.finite
        first_bad = bad.long().argmax()
        fresh_bad = bad.any() & (self.bad_env < 0)
        self.bad_env = torch.where(fresh_bad, first_bad, self.bad_env)
        self.bad_step = torch.where(fresh_bad, self.counters.step, self.bad_step)
        self.bad_reward = torch.where(fresh_bad, ~torch.isfinite(s.reward[first_bad]), self.bad_reward)

    def _record_data(self, s: TensorStep, action: np.ndarray) -> None:
        """train --save-data: the step's transitions and the episodes that ended or began (host envs' data)."""
        assert self.recorder is not None
        counted, terminated, started = (s.transition & s.finite).numpy(), s.terminated.numpy(), s.started.numpy()
        self.recorder.add(s.next_obs.numpy(), action, s.reward.numpy(), counted)
        self.recorder.end(np.flatnonzero((terminated | s.truncated.numpy()) & counted), terminated)
        if started.any():
            self.recorder.start(s.obs.numpy()[started], np.flatnonzero(started))

    def _updates_due(self) -> None:
        """After a vector step: a burst of pretraining updates on the seed data once seeding ends, then
        updates_per_round every update_every vector steps."""
        cfg, c = self.cfg, self.counters
        if c.step < cfg.seed_steps or c.step < c.refill_until:  # type: ignore[operator]
            return
        if c.pretrain_updates_left < 0:  # seeding just ended: pretrain on the seed data
            c.pretrain_updates_left = c.vector_steps // cfg.update_every * cfg.updates_per_round  # type: ignore[operator]
            self.logger.message(f"seeding done at step {c.step:,}: {c.pretrain_updates_left:,} pretraining updates")
        if c.pretrain_updates_left > 0:
            self._pretrain()
        elif c.vector_steps % cfg.update_every == 0:
            c.updates_queued = cfg.updates_per_round  # type: ignore[assignment]
            if not cfg.overlap_updates:
                self.run_queued_updates()

    def finish_interrupted_work(self) -> None:
        """A run stopped during its pretraining burst ends the burst before it acts or evaluates again, as it would
        have without the stop (acting first would also skip the next step's own round of updates)."""
        if self.counters.pretrain_updates_left > 0:
            self._pretrain()

    def run_queued_updates(self) -> None:
        """The round of updates due after the last step. With overlap_updates, step() calls this once the next
        actions are chosen: the GPU runs the updates while the host steps the envs."""
        c = self.counters
        if c.updates_queued == 0:
            return
        with self.agent.streams.round():  # with --update-stream beside the next plan, else where the rest runs
            while c.updates_queued > 0:
                self.update()
                c.updates_queued -= 1

    def evaluate(self) -> bool:
        self.run_queued_updates()  # the agent evaluated (and saved after) has every update due, overlap or not
        return super().evaluate()

    def _pretrain(self) -> None:
        """The updates on the seed data, with a progress bar of their own (no env steps pass meanwhile)."""
        c = self.counters
        total = c.pretrain_updates_left + c.updates
        while c.pretrain_updates_left > 0 and self.stop_reason is None:
            self.update()
            c.pretrain_updates_left -= 1
            if c.pretrain_updates_left % 50 == 0:
                self.logger.pretraining(c.updates, total, c.step)
        self.logger.pretraining(c.updates, total, c.step, done=c.pretrain_updates_left == 0)

    def sample(self) -> Batch:
        return self.buffer.sample(self.cfg.batch_size)

    def warn_if_disk_short(self) -> None:
        """Before the run: the space its checkpoints take once the replay buffer is full, beside the free space and
        what the run directory holds of them already (a resume). Two checkpoints are kept, each with its buffer, and
        a third buffer is written before the oldest is removed."""
        ckpt, buffer = self.checkpoint_bytes(), (self.buffer.nbytes + HDF5_RECORDS if self.cfg.save_buffer else 0)
        peak = 2 * ckpt + 3 * buffer
        ckpt_dir = self.checkpoint_path.parent
        files = {(st.st_dev, st.st_ino): st.st_size for p in (ckpt_dir.glob("*") if ckpt_dir.is_dir() else ())
                 if p.name.endswith((".pt", ".h5")) and p.is_file() and (st := p.stat())}
        held = sum(files.values())
        needed = max(peak - held, 0)
        margin = write_margin(needed)
        free = free_bytes(ckpt_dir)
        if free < needed + margin:
            what = "checkpoints with the full replay buffer" if buffer else "checkpoints"
            parts = f"2 x {fmt_bytes(ckpt, decimal=True)} for latest.pt and previous.pt" + (
                f", 3 x {fmt_bytes(buffer, decimal=True)} for replay buffers" if buffer else "")
            there = f", {fmt_bytes(held, decimal=True)} of it on the disk already" if held else ""
            fix = "free some space" + (" or pass --no-save-buffer" if buffer else "")
            self.logger.message(f"warning: {fmt_bytes(free, decimal=True)} are free on {ckpt_dir}, and {what} need "
                                f"about {fmt_bytes(peak, decimal=True)} ({parts}{there}), and "
                                f"{fmt_bytes(margin, decimal=True)} more kept free as a margin; {fix}")

    def data_bytes(self) -> int:
        """The replay buffer file a checkpoint writes: its filled rows, and HDF5's own records."""
        return self.buffer.saved_bytes + HDF5_RECORDS if self.cfg.save_buffer else 0

    def buffer_on_device(self) -> bool:
        return self.buffer.storage.type == "cuda"

    def _save_buffer(self, ckpt_dir: Path) -> str | None:
        """The replay buffer under a new file name (None with --no-save-buffer)."""
        if not self.cfg.save_buffer:
            return None
        buffer_file = f"buffer_{self.counters.step:010d}.h5"  # its space is checked with the checkpoint's
        self.buffer.save(ckpt_dir / buffer_file)
        return buffer_file

    def _restore_buffer(self, buffer_file: str | None, no_buffer: bool) -> None:
        """A checkpoint's replay buffer (a damaged file set aside, with how to resume without it), or without one
        acting without updates until the buffer holds seed_steps again. The episodes in flight at the stop are
        discarded (docs/resuming.md)."""
        if buffer_file and not no_buffer:
            path = self.checkpoint_path.parent / buffer_file
            try:
                self.buffer.load(path)
            except BufferFileError as e:
                kept = set_aside_damaged(path)
                raise BufferFileError(f"{e}{f'; kept as {kept.name}' if kept else ''}. Resume without it: "
                                      f"{self.resume_with(no_buffer=True)} (weights, optimisers and counters are "
                                      f"restored, the buffer refills by acting)") from None
        elif self.counters.step >= (self.cfg.seed_steps or 0):  # no buffer to resume with: refill it first
            self.counters.refill_until = self.counters.step + (self.cfg.seed_steps or 0)
            why = (self.named("no_buffer", True) if buffer_file
                   else f"the checkpoint holds no replay buffer ({self.named('save_buffer', False)})")
            print(f"resume: {why}: acting without updates until step {self.counters.refill_until:,} to refill the "
                  f"replay buffer", file=sys.stderr)
        self.buffer.end_episodes()


    # --- log rows ---------------------------------------------------------------------
    def episode_stats(self) -> dict[str, float]:
        """The episodes ended since the last row (each task's own return too, multi-task), read from the device
        with the flags a log row checks: non-finite data, terminations on a task trained as non-episodic."""
        self._check_finite()
        self._book_episodes()
        if not self.cfg.episodic and not self.warned_termination and bool(self.terminated_seen.any()):
            self.warned_termination = True
            remedy = ("multi-task models have none: train a task that terminates alone, with --episodic"
                      if self.tasks is not None else "if the task can terminate, train with --episodic")
            self.logger.message(f"note: {self.cfg.task} ended an episode in a terminal state, but episodic is off, "
                                f"so the world model learns no termination head (values still stop there); {remedy}")
        count, returns, lengths = (np.asarray(x) for x in self.ended.tolist())
        self.ended.zero_()
        mean = (lambda x, n: float(x.sum() / n.sum()) if n.sum() else float("nan"))  # noqa: E731
        row = {"episode_return": mean(returns, count), "episode_length": mean(lengths, count)}
        if self.tasks is not None and self.env_tasks is not None:  # each task's own training return
            names = np.asarray(self.tasks.task_set)[self.env_tasks]
            for t in self.tasks.tasks:
                row[f"episode_return_{t}"] = mean(returns[names == t], count[names == t])
        return row

    def _book_episodes(self) -> None:
        """The episodes ended since the last call into counters.episodes (at a log row or a checkpoint)."""
        self.counters.episodes += int(self.unbooked)
        self.unbooked.zero_()

    # --- non-finite data ----------------------------------------------------------------
    def _on_nonfinite(self, env: int, what: str, remedy: str, done: str, step: int | None = None) -> None:
        """NaN or inf in `what` of env `env` (at `step`, this one by default): a NonFiniteData naming the env, its
        task and the step ('error'), or a note the first time, saying what was `done` ('drop')."""
        task = self.spec.task if self.tasks is None or self.env_tasks is None else self.tasks.task_set[self.env_tasks[env]]
        where = f"env {env} ({task}) returned a non-finite {what} at env step {self.counters.step if step is None else step:,}"
        if self.cfg.nonfinite_data == "error":
            self.bad_env.fill_(-1)  # reported once: the checkpoint written on the way out is consistent
            raise NonFiniteData(f"{where}; pass {self.named('nonfinite_data', 'drop')} to {remedy}")
        if not self.warned_nonfinite:
            self.warned_nonfinite = True
            self.logger.message(f"note: {where}; {done} ({self.named('nonfinite_data', 'drop')})")

    def _check_finite(self) -> None:
        """At a log row or a checkpoint: non-finite data flagged on the device since the start (tensor envs; host
        envs report it at once)."""
        env = int(self.bad_env)
        if env >= 0:
            self._on_nonfinite(env, "reward" if bool(self.bad_reward) else "observation", "skip such transitions",
                               "its transitions are dropped until its episode ends", int(self.bad_step))

    # --- evaluation -------------------------------------------------------------------
    def play_episodes(self, task: EnvSource, video: Path | None) -> EvalResult | None:
        """Tensor envs: a task id gets eval_episodes envs of its own, played at once; a vector env object given to
        train on (there is no other to copy) plays on the training envs, whose episodes in flight then end (as
        truncated). Numpy envs: as any run evaluates."""
        if not isinstance(self.envs, TensorVectorEnv):
            return super().play_episodes(task, video)
        cfg, seed = self.cfg, eval_seed(self.cfg.seed)
        if isinstance(task, str):
            envs, _ = make_tensor_vector_env(task, cfg.eval_episodes, seed=seed, device=self.device)
            try:
                return run_episodes(self.agent, envs, cfg.eval_episodes, seed, stop=self._eval_interrupted)
            finally:
                envs.close()
        result = run_episodes(self.agent, self.envs, cfg.eval_episodes, seed, stop=self._eval_interrupted)
        self.buffer.end_episodes()
        self._begin(self.envs.reset())
        return result

    # --- checkpoints ----------------------------------------------------------------
    def save_data(self, ckpt_dir: Path) -> dict[str, Any]:
        """The replay buffer under a new file name, the recorded episodes, the envs' RNG states (host envs)."""
        self._check_finite()
        self._book_episodes()
        buffer_file = self._save_buffer(ckpt_dir)
        if self.recorder is not None:  # the finished episodes, before the checkpoint that counts them
            self.recorder.writer.commit()
        state = self.envs.rng_state()
        return {**({"rng": {"envs": state}} if state is not None else {}), "buffer_file": buffer_file,
                "data_episodes": self.recorder.writer.episodes if self.recorder is not None else None,
                "episodes_since_log": self.ended.cpu()}  # a resume's first row counts them, as one run's would

    def restore_data(self, obj: dict, no_buffer: bool) -> None:
        state = obj["rng"].get("envs")
        if state is not None and isinstance(self.envs, HostVectorEnv):
            self.envs.set_rng_state(state)
        if self.recorder is not None and obj.get("data_episodes") is not None:
            self.recorder.writer.drop_own_after(obj["data_episodes"])  # its own after this checkpoint: played again
        self._restore_buffer(obj.get("buffer_file"), no_buffer)
        if obj.get("episodes_since_log") is not None:  # checkpoints before 2026-11-29 hold none
            self.ended.copy_(obj["episodes_since_log"])

    def close_data(self) -> None:
        self.envs.close()
        if self.recorder is not None:
            self.recorder.writer.close()
            if not self.recorder.writer.path.exists():  # else a later --dataset finds no file, unexplained
                print(f"note: no episode finished, so {self.named('save_data')} wrote nothing to "
                      f"{self.recorder.writer.path}", file=sys.stderr)
