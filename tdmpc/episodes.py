"""Evaluation episodes: a saved or training agent plays N episodes without exploration noise.

Episodes run in parallel environments, planned for in one batched call per step; the first can be
recorded to a video. Training evaluates with this, and so does python -m tdmpc.evaluate.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, cast

import gymnasium as gym
import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.envs import EnvSource, make_envs
from tdmpc.envs.tensor import TensorVectorEnv
from tdmpc.errors import BadInput, NonFiniteData
from tdmpc.memory.peak import EVAL_PARALLEL
from tdmpc.runtime.files import atomic_write

MAX_PARALLEL = EVAL_PARALLEL  # episodes at once; the memory estimate plans a planner of this size


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    successes: list[float]  # empty when the env reports no success
    action_abs: list[float] = field(default_factory=list)  # mean |action| per episode: is the agent acting?
    # An episodic model's termination head on these (held-out) transitions: counts indexed [terminated, predicted].
    termination: np.ndarray | None = None
    dropped: int = 0  # episodes left out for non-finite observations (drop_nonfinite)

    def summary(self) -> dict:
        """Means over the episodes (NaN where there is none: JSON writes null)."""
        r = np.asarray(self.returns, dtype=np.float64)
        mean = (lambda x: float(np.mean(x)) if len(x) else float("nan"))  # noqa: E731
        out = {"episodes": len(r), "episode_return": mean(r), "episode_return_std": float(r.std()) if len(r) else
               float("nan"), "episode_length": mean(self.lengths),
               "action_abs_mean": float(np.mean(self.action_abs)) if self.action_abs else float("nan")}
        if self.successes:
            out["success_rate"] = float(np.mean(self.successes))
        if self.dropped:
            out["dropped_episodes"] = self.dropped
        if self.termination is not None:  # terminal steps are rare: accuracy alone would hide a head that never fires
            t = self.termination
            out |= {"termination_accuracy": float(np.trace(t) / max(t.sum(), 1)), "terminal_steps": int(t[1].sum()),
                    "termination_recall": float(t[1, 1] / t[1].sum()) if t[1].sum() else float("nan"),
                    "termination_false_alarms": int(t[0, 1])}
        return out


def run_episodes(agent: Agent, env: EnvSource, episodes: int, seed: int, obs: str = "state",
                 action_repeat: int | None = None, video: Path | None = None, video_fps: int = 30,
                 stop: Callable[[], bool] | None = None, drop_nonfinite: bool = False) -> EvalResult | None:
    """Run `episodes` episodes without exploration noise, up to MAX_PARALLEL at a time. A multi-task agent
    plays task `env` (a name in its task set) with its padded observations and its embedding row.

    NaN or inf in an observation is a NonFiniteData naming the env, or with drop_nonfinite its episode is left
    out (counted in `dropped`). Returns None if `stop()` turns true meanwhile (a signal during a training-time
    eval)."""
    result = EvalResult([], [], [])
    if agent.model.episodic:
        result.termination = np.zeros((2, 2), dtype=np.int64)
    frames: list[np.ndarray] = []
    multitask = agent.dims.multitask
    own_dims = agent.dims.action_dim  # action_abs_mean averages the task's own action dims, not the padding
    if multitask:
        agent.task_ids(cast(str, env), 1)  # a task outside the set is a one-line error before anything is built
        own_dims = agent.dims.action_dims[agent.dims.tasks.index(cast(str, env))]
    while len(result.returns) + result.dropped < episodes:
        n = min(MAX_PARALLEL, episodes - len(result.returns) - result.dropped)
        record = video is not None and not frames
        first_seed = seed + len(result.returns) + result.dropped
        envs = make_envs(env, n, seed=first_seed, obs=obs, action_repeat=action_repeat, pad_to=agent.dims.pad_to,
                         render=record)
        assert isinstance(envs, gym.vector.SyncVectorEnv)  # not asynchronous
        try:
            obs_, _ = envs.reset(seed=first_seed)
            done = np.zeros(n, dtype=bool)
            ret, length, act_abs = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n)
            success = np.full(n, np.nan)
            first = np.ones(n, dtype=bool)
            dropped = np.zeros(n, dtype=bool)
            if record:
                frames.append(_frame(envs))
            while True:
                obs_, bad = _finite(obs_, done, drop_nonfinite, env, length)
                dropped |= bad
                done |= bad
                if done.all():
                    break
                if stop is not None and stop():
                    return None
                action = np.asarray(agent.act(obs_, first, eval_mode=True, role=f"eval{n}",
                                              task=cast(str, env) if multitask else None))
                if result.termination is not None:
                    predicted = agent.predicts_termination(obs_, action)
                obs_, reward, terminated, truncated, info = envs.step(action)
                live = ~done
                if result.termination is not None:
                    np.add.at(result.termination, (terminated[live].astype(int), predicted[live].astype(int)), 1)
                ret[live] += reward[live]
                length[live] += 1
                if not agent.dims.discrete:  # integer actions have no magnitude: action_abs_mean stays NaN
                    act_abs[live] += np.abs(action[live, :own_dims]).mean(-1)
                ended = (terminated | truncated) & live
                if "success" in info:
                    success[live] = np.asarray(info["success"], dtype=np.float64)[live]
                if ended.any() and "final_info" in info and "success" in info["final_info"]:
                    success[ended] = np.asarray(info["final_info"]["success"], dtype=np.float64)[ended]
                if record and live[0]:
                    frames.append(_frame(envs) if not ended[0] else frames[-1])
                done |= ended
                first = terminated | truncated
        finally:
            envs.close()
        kept = ~dropped
        result.dropped += int(dropped.sum())
        result.returns += ret[kept].tolist()
        result.lengths += length[kept].tolist()
        if not agent.dims.discrete:
            result.action_abs += (act_abs / np.maximum(length, 1))[kept].tolist()
        if not np.isnan(success[kept]).all():
            result.successes += np.nan_to_num(success[kept]).tolist()
    if video is not None and frames:
        write_video(video, frames, video_fps)
    return result


def _finite(obs: np.ndarray, done: np.ndarray, drop: bool, env: EnvSource, length: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """NaN or inf in an observation an episode still acts on is a NonFiniteData naming the env, or with drop=True
    that episode is dropped (returned mask); rows of finished episodes are zeroed (their actions are not used)."""
    bad = ~np.isfinite(obs.reshape(len(obs), -1)).all(1)
    if not bad.any():
        return obs, bad
    live = bad & ~done
    if live.any() and not drop:
        i = int(np.flatnonzero(live)[0])
        name = env if isinstance(env, str) else "the user's env"
        raise NonFiniteData(f"evaluation env {i} ({name}) returned a non-finite observation at step {int(length[i]):,} "
                            f"of its episode; pass --nonfinite-data drop to leave such episodes out")
    return np.where(bad.reshape(-1, *[1] * (obs.ndim - 1)), np.zeros_like(obs), obs), live


def _frame(envs: gym.vector.SyncVectorEnv) -> np.ndarray:
    """The first env's rendered frame; a renderer that is not installed (pygame, for gymnasium's classic-control
    tasks) is a one-line BadInput."""
    try:
        return cast(np.ndarray, envs.envs[0].render())
    except gym.error.DependencyNotInstalled as e:
        raise BadInput(f"cannot render this task for a video: {str(e).splitlines()[0]} (pip install "
                       f"'tdmpc[video]' installs it)") from None


VIDEO_SUFFIXES = (".mp4", ".gif", ".webm", ".mkv", ".avi", ".mov")  # imageio picks the format by extension


def check_video_path(path: Path) -> None:
    """Before any episode runs: a file name whose extension names a video format, not a folder."""
    if path.is_dir():
        raise BadInput(f"--video {path} is a folder: give a file name, e.g. {path / 'episode.mp4'}")
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise BadInput(f"--video {path}: the name must end in {', '.join(VIDEO_SUFFIXES)} (the format follows it)")


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """Written whole or not at all: a file already at `path` stays as it was if the write fails."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise BadInput("videos need imageio: pip install 'tdmpc[video]'") from None
    atomic_write(path, lambda tmp: imageio.mimsave(tmp, frames, fps=fps, macro_block_size=1),  # type: ignore[arg-type]
                 suffix=f".tmp{path.suffix}")


def run_tensor_episodes(agent: Agent, envs: TensorVectorEnv, episodes: int, seed: int | None,
                        stop: Callable[[], bool] | None = None) -> EvalResult | None:
    """run_episodes for tensor-native envs (tdmpc.envs.tensor): each of `envs`' N envs plays its first episode
    from a reset, rounds of N until `episodes` have ended; returns and lengths are summed on the device and read
    once a round has ended (asked every CHECK_EVERY steps). A non-finite observation or reward is a NonFiniteData."""
    result = EvalResult([], [], [])
    N = envs.num_envs
    while len(result.returns) < episodes:
        obs = envs.reset(seed=None if seed is None else seed + len(result.returns))
        first = torch.ones(N, dtype=torch.bool, device=obs.device)
        live = torch.ones_like(first)
        ret, length = torch.zeros(N, device=obs.device), torch.zeros(N, dtype=torch.long, device=obs.device)
        finite = torch.ones_like(first)
        for t in itertools.count(1):
            if stop is not None and stop():
                return None
            step = envs.step(agent.act_on_device(obs, first, eval_mode=True, role=f"eval{N}"))
            counted = live & step.transition
            ret += step.reward * counted
            length += counted.long()
            finite &= step.finite | ~counted
            live &= ~((step.terminated | step.truncated) & counted)
            obs, first = step.obs, step.started
            if t % CHECK_EVERY == 0 and not bool(live.any()):
                break
        if not bool(finite.all()):
            raise NonFiniteData(f"env {int((~finite).nonzero()[0])} ({envs.task}) returned a non-finite observation "
                                f"or reward in evaluation")
        take = min(N, episodes - len(result.returns))
        result.returns += ret[:take].tolist()
        result.lengths += length[:take].tolist()
    return result


CHECK_EVERY = 50  # tensor evaluation steps between reads of whether every episode has ended
