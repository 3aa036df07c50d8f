"""Online training: N vector envs step into a replay buffer, and the agent updates every k agent steps.

One step reads top to bottom: act on each env's newest row of the replay buffer, already on the device (random
actions while seeding), step the envs, check the data, store the transitions, book the episodes that ended,
then the updates due: a burst of pretraining updates on the seed data once seeding ends, then
updates_per_round every update_every steps. With overlap_updates (CUDA's default) a round waits for the next
step's actions, so the GPU runs it while the host steps the envs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.buffer import Batch, ReplayBuffer
from tdmpc.envs import VectorEnvs, env_rng_state, set_env_rng_state
from tdmpc.errors import BufferFileError, NonFiniteData, TaskError
from tdmpc.offline.writer import EpisodeRecorder
from tdmpc.runtime.faults import kill_point
from tdmpc.runtime.files import fmt_bytes, free_bytes, write_margin
from tdmpc.training.run_dir import RunDirLock, set_aside_damaged
from tdmpc.training.trainer import Callback, RunSetup, Trainer


class ReplayTrainer(Trainer):
    """What online training shares, whatever the envs speak: the replay buffer, the update schedule, the
    pretraining burst. OnlineTrainer steps numpy envs; TensorOnlineTrainer (tdmpc.training.tensor_online)
    tensor-native ones."""

    buffer: ReplayBuffer
    env_tasks: np.ndarray | None
    warned_termination: bool

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

    def _note_terminations(self, terminated: np.ndarray) -> None:
        """A terminating env with episodic False: planning ignores terminations; say so once."""
        if terminated.any() and not self.cfg.episodic and not self.warned_termination:
            self.warned_termination = True
            self.logger.message(f"note: {self.cfg.task} ended an episode in a terminal state, but episodic is off, "
                                f"so the world model learns no termination head (values still stop there). If the "
                                f"task can terminate, train with --episodic")

    def warn_if_disk_short(self) -> None:
        """Before the run: the space its checkpoints take once the replay buffer is full, beside the free space and
        what the run directory holds of them already (a resume). Two checkpoints are kept, each with its buffer, and
        a third buffer is written before the oldest is removed."""
        ckpt, buffer = self.checkpoint_bytes(), (self.buffer.nbytes + 16_000 if self.cfg.save_buffer else 0)
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
        return self.buffer.saved_bytes + 16_000 if self.cfg.save_buffer else 0

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
                raise BufferFileError(f"{e}{f'; kept as {kept.name}' if kept else ''}. Resume without it: --resume "
                                      f"{self.quoted_run_dir} --no-buffer (weights, optimisers and counters are "
                                      f"restored, the buffer refills by acting)") from None
        elif self.counters.step >= (self.cfg.seed_steps or 0):  # no buffer to resume with: refill it first
            self.counters.refill_until = self.counters.step + (self.cfg.seed_steps or 0)
            why = "--no-buffer" if buffer_file else "the checkpoint holds no replay buffer (--no-save-buffer)"
            print(f"resume: {why}: acting without updates until step {self.counters.refill_until:,} to refill the "
                  f"replay buffer", file=sys.stderr)
        self.buffer.end_episodes()


class OnlineTrainer(ReplayTrainer):
    def __init__(self, setup: RunSetup, agent: Agent, envs: VectorEnvs, buffer: ReplayBuffer,
                 recorder: EpisodeRecorder | None, lock: RunDirLock, no_buffer: bool = False,
                 on_log: Callback | None = None, on_eval: Callback | None = None):
        self.envs, self.buffer, self.recorder = envs, buffer, recorder
        self.num_envs = envs.num_envs
        self.env_tasks = None if setup.tasks is None else setup.tasks.env_tasks(setup.cfg.num_envs)
        # each env's task id on the device, sent once
        self.env_task_ids = None if self.env_tasks is None else agent.task_ids(self.env_tasks, self.num_envs)
        self.ended_episodes: list[tuple[float, int, int]] = []  # (return, length, env) since the last log row
        self.ep_return = np.zeros(self.num_envs)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.warned_termination = self.warned_nonfinite = False
        super().__init__(setup, agent, lock, no_buffer, on_log, on_eval)
        obs, _ = self.envs.reset(seed=None if setup.resume else self.cfg.seed)
        try:  # the agent acts on each env's newest row of the buffer: these first observations, then each step's
            self._start_episodes(np.arange(self.num_envs), obs)
        except NonFiniteData as e:  # before the run starts: bad input, and the run directory is left as it was
            raise TaskError(str(e)) from None

    def step(self) -> None:
        """One step of all N envs, its transitions into the buffer, then any updates due."""
        cfg, c = self.cfg, self.counters
        if c.step < cfg.seed_steps:  # type: ignore[operator]
            kill_point("seeding")
            action = self.spec.random_actions(self.rng, self.num_envs)
            if self.tasks is not None and self.env_tasks is not None:
                action *= self.tasks.action_masks(self.env_tasks)
        else:
            self.phase = "act"
            action = self.agent.act_on_device(*self.buffer.newest(), task=self.env_task_ids).cpu().numpy()
        self.run_queued_updates()  # with overlap_updates: queued on the GPU, run while the envs step
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
        c.vector_steps += 1
        c.step += self.num_envs * cfg.action_repeat  # type: ignore[operator]
        self._updates_due()

    def _start_episodes(self, envs: np.ndarray, first: np.ndarray) -> None:
        """Episodes begin in `envs` with these first observations (checked as step() checks what it stores, an env
        reset again if need be): the buffer's newest rows, which the agent acts on next."""
        first = self._checked_resets(envs, first)
        self.buffer.start(torch.from_numpy(first), envs)
        if self.recorder is not None:
            self.recorder.start(first, envs)

    def _checked_resets(self, envs: np.ndarray, first: np.ndarray, tries: int = 3) -> np.ndarray:
        """NaN or inf in a reset's observation is an error naming the env ('error'), or the env is reset again
        ('drop'), a few times at most."""
        for _ in range(tries):
            bad = ~np.isfinite(first.reshape(len(first), -1)).all(1)
            if not bad.any():
                return first
            self._on_nonfinite(int(envs[np.flatnonzero(bad)[0]]), "observation from reset()", "reset such envs again",
                               "reset again")
            mask = np.zeros(self.num_envs, dtype=bool)
            mask[envs[bad]] = True
            fresh, _ = self.envs.reset(options={"reset_mask": mask})
            first = first.copy()
            first[bad] = fresh[envs[bad]]
        raise NonFiniteData(f"env {int(envs[np.flatnonzero(bad)[0]])} returned non-finite observations at {tries} "
                            f"resets in a row")

    def episode_stats(self) -> dict[str, float]:
        ended, self.ended_episodes = self.ended_episodes, []
        row = {"episode_return": float(np.mean([r for r, _, _ in ended])) if ended else float("nan"),
               "episode_length": float(np.mean([n for _, n, _ in ended])) if ended else float("nan")}
        if self.tasks is not None and self.env_tasks is not None:  # each task's own training return
            for t in self.tasks.tasks:
                own = [r for r, _, e in ended if self.tasks.task_set[self.env_tasks[e]] == t]
                row[f"episode_return_{t}"] = float(np.mean(own)) if own else float("nan")
        return row

    def _nonfinite(self, bad: np.ndarray, stored: np.ndarray, reward: np.ndarray, obs: np.ndarray,
                   terminated: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """NaN or inf from an env: named at its source ('error'), or the transition dropped and the env's
        episode restarted ('drop'). Returns obs, reward, terminated and done with the dropped envs reset."""
        i = int(np.flatnonzero(bad)[0])
        self._on_nonfinite(i, "reward" if not np.isfinite(reward[i]) else "observation", "skip such transitions",
                           "dropped, and its episode restarts")
        fresh, _ = self.envs.reset(options={"reset_mask": bad})
        obs = np.where(bad.reshape(-1, *[1] * (obs.ndim - 1)), fresh, obs)
        return obs, np.where(bad, 0.0, reward), terminated & ~bad, done | bad

    def _on_nonfinite(self, env: int, what: str, remedy: str, done: str) -> None:
        """NaN or inf from env `env`: a NonFiniteData naming the env, its task, the step and `what` ('error'), or a
        note the first time, saying what was `done` ('drop')."""
        task = self.spec.task if self.tasks is None or self.env_tasks is None else self.tasks.task_set[self.env_tasks[env]]
        where = f"env {env} ({task}) returned a non-finite {what} at env step {self.counters.step:,}"
        if self.cfg.nonfinite_data == "error":
            raise NonFiniteData(f"{where}; pass --nonfinite-data drop to {remedy}")
        if not self.warned_nonfinite:
            self.warned_nonfinite = True
            self.logger.message(f"note: {where}; {done} (--nonfinite-data drop)")

    # --- checkpoints ----------------------------------------------------------------
    def save_data(self, ckpt_dir: Path) -> dict[str, Any]:
        """The replay buffer under a new file name, the recorded episodes, the envs' RNG states."""
        buffer_file = self._save_buffer(ckpt_dir)
        if self.recorder is not None:  # the finished episodes, before the checkpoint that counts them
            self.recorder.writer.commit()
        return {"rng": {"envs": env_rng_state(self.envs)}, "buffer_file": buffer_file,
                "data_episodes": self.recorder.writer.episodes if self.recorder is not None else None}

    def restore_data(self, obj: dict, no_buffer: bool) -> None:
        set_env_rng_state(self.envs, obj["rng"]["envs"])
        if self.recorder is not None and obj.get("data_episodes") is not None:
            self.recorder.writer.truncate(obj["data_episodes"])  # appended after this checkpoint: played again
        self._restore_buffer(obj.get("buffer_file"), no_buffer)

    def close_data(self) -> None:
        self.envs.close()
        if self.recorder is not None:
            self.recorder.writer.close()
