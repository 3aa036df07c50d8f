"""Online training on tensor-native envs (tdmpc.envs.tensor): the env, the agent and the replay buffer on one
device, the host touched only to log.

The same loop as OnlineTrainer's, in tensors: act on each env's newest buffer row (random actions, drawn on the
device, while seeding), step the envs, store the step's rows by mask (a transition, or the first observation of
an episode: one row per env per step with next-step autoreset), book returns and lengths on the device, then the
updates due. Nothing in a step reads a device value on the host: a non-finite observation or reward is flagged
on the device (its transition is not stored and that env's episode stores nothing more) and reported at the next
log row or checkpoint, an error naming the env ('error') or a note ('drop').
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tdmpc.agent import Agent
from tdmpc.buffer import TensorReplayBuffer
from tdmpc.envs import EnvSource
from tdmpc.envs.tensor import TensorStep, TensorVectorEnv, make_tensor_vector_env
from tdmpc.episodes import EvalResult, run_tensor_episodes
from tdmpc.errors import NonFiniteData
from tdmpc.training.online import ReplayTrainer
from tdmpc.training.run_dir import RunDirLock
from tdmpc.training.trainer import Callback, RunSetup


class TensorOnlineTrainer(ReplayTrainer):
    buffer: TensorReplayBuffer

    def __init__(self, setup: RunSetup, agent: Agent, envs: TensorVectorEnv, buffer: TensorReplayBuffer,
                 lock: RunDirLock, no_buffer: bool = False, on_log: Callback | None = None,
                 on_eval: Callback | None = None):
        self.envs, self.buffer = envs, buffer
        self.num_envs = envs.num_envs
        self.env_tasks = None
        dev = setup.device  # where the envs' steps arrive (TensorVectorEnv moves them there)
        self.ep_return = torch.zeros(self.num_envs, device=dev)
        self.ep_length = torch.zeros(self.num_envs, dtype=torch.long, device=dev)
        # Ended episodes since the last log row: count, summed returns and lengths.
        self.ended = torch.zeros(3, dtype=torch.float64, device=dev)
        self.terminated_seen = torch.zeros(self.num_envs, dtype=torch.bool, device=dev)  # for a note if not episodic
        self.bad_env = torch.full((), -1, dtype=torch.long, device=dev)  # the first env with non-finite data, or -1
        self.bad_step = torch.zeros((), dtype=torch.long, device=dev)
        self.warned_termination = self.warned_nonfinite = False
        super().__init__(setup, agent, lock, no_buffer, on_log, on_eval)
        self._begin(envs.reset(seed=None if setup.resume else self.cfg.seed))

    def _begin(self, obs: torch.Tensor) -> None:
        """Every env starts an episode with these observations (a fresh or resumed run, or after an
        evaluation played on the training envs)."""
        self.buffer.start(obs)
        self.ep_return.zero_()
        self.ep_length.zero_()

    def step(self) -> None:
        cfg, c = self.cfg, self.counters
        if c.step < cfg.seed_steps:  # type: ignore[operator]
            action = self._random_actions()
        else:
            self.phase = "act"
            action = self.agent.act_on_device(*self.buffer.newest())
        s = self.envs.step(action)
        self._store(s, action)
        c.vector_steps += 1
        c.step += self.num_envs
        self._updates_due()

    def _random_actions(self) -> torch.Tensor:
        """Uniform random actions on the device, from torch's RNG (which checkpoints save)."""
        n, a, dev = self.num_envs, self.spec.action_dim, self.device
        if self.spec.discrete:
            return torch.randint(0, a, (n,), device=dev)
        return torch.rand(n, a, device=dev) * 2 - 1

    def _store(self, s: TensorStep, action: torch.Tensor) -> None:
        """A step's rows into the buffer by mask, its episodes booked, its non-finite rows flagged."""
        bad = s.transition & ~s.finite
        fresh_bad = bad.any() & (self.bad_env < 0)
        self.bad_env = torch.where(fresh_bad, bad.long().argmax(), self.bad_env)
        self.bad_step = torch.where(fresh_bad, self.counters.step, self.bad_step)
        counted = s.transition & s.finite
        self.buffer.stop(bad)  # that env's episode stores nothing more
        self.buffer.add(s.next_obs, action, s.reward, s.terminated, counted)
        self.buffer.start(s.obs, s.started)
        self.ep_return += torch.where(counted, s.reward, 0.0)  # not reward * counted: NaN * 0 is NaN
        self.ep_length += counted.long()
        ended = (s.terminated | s.truncated) & counted
        self.ended += torch.stack([ended.sum(), (self.ep_return * ended).sum(), (self.ep_length * ended).sum()]).double()
        self.ep_return = torch.where(ended | s.started, 0.0, self.ep_return)
        self.ep_length = torch.where(ended | s.started, 0, self.ep_length)
        self.terminated_seen |= s.terminated

    def _check_finite(self) -> None:
        """At a log row or a checkpoint: NaN or inf seen since the start is an error ('error') or a note ('drop')."""
        env = int(self.bad_env)
        if env >= 0:
            self._on_nonfinite_tensor(env, int(self.bad_step))

    def _on_nonfinite_tensor(self, env: int, step: int) -> None:
        where = f"env {env} ({self.spec.task}) returned a non-finite observation or reward at env step {step:,}"
        if self.cfg.nonfinite_data == "error":
            self.bad_env.fill_(-1)  # reported once: the checkpoint written on the way out is consistent
            raise NonFiniteData(f"{where}; pass --nonfinite-data drop to skip such transitions")
        if not self.warned_nonfinite:
            self.warned_nonfinite = True
            self.logger.message(f"note: {where}; its transitions are dropped until its episode ends "
                                f"(--nonfinite-data drop)")

    def episode_stats(self) -> dict[str, float]:
        self._check_finite()
        if not self.cfg.episodic and not self.warned_termination:
            self._note_terminations(self.terminated_seen.cpu().numpy())
        n, ret, length = self.ended.tolist()
        self.ended.zero_()
        return {"episode_return": ret / n if n else float("nan"), "episode_length": length / n if n else float("nan")}

    def play_episodes(self, task: EnvSource, video: Path | None) -> EvalResult | None:
        """Evaluation on tensor envs: a task id gets envs of its own, eval_episodes of them; a vector env object
        (there is no other) plays on the training envs, whose episodes in flight then end (as truncated)."""
        cfg = self.cfg
        seed = 1_000_003 * (cfg.seed + 1)
        if isinstance(task, str):
            envs, _ = make_tensor_vector_env(task, cfg.eval_episodes, seed=seed, device=self.device)
            try:
                return run_tensor_episodes(self.agent, envs, cfg.eval_episodes, seed, self._eval_interrupted)
            finally:
                envs.close()
        result = run_tensor_episodes(self.agent, self.envs, cfg.eval_episodes, seed, self._eval_interrupted)
        self.buffer.end_episodes()
        self._begin(self.envs.reset())
        return result

    # --- checkpoints ----------------------------------------------------------------
    def save_data(self, ckpt_dir: Path) -> dict[str, Any]:
        """The replay buffer; tensor envs have no RNG state to save (a resume resets them)."""
        self._check_finite()
        return {"buffer_file": self._save_buffer(ckpt_dir), "data_episodes": None}

    def restore_data(self, obj: dict, no_buffer: bool) -> None:
        self._restore_buffer(obj.get("buffer_file"), no_buffer)

    def close_data(self) -> None:
        self.envs.close()
