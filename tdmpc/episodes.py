"""Evaluation episodes: a saved or training agent plays N episodes without exploration noise.

Episodes run in parallel environments, planned for in one batched call per step; the first can be
recorded to a video. Training evaluates with this, and so does python -m tdmpc.evaluate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, cast

import gymnasium as gym
import numpy as np

from tdmpc.agent import Agent
from tdmpc.envs import EnvSource, make_envs
from tdmpc.errors import BadInput
from tdmpc.memory.peak import EVAL_PARALLEL

MAX_PARALLEL = EVAL_PARALLEL  # episodes at once; the memory estimate plans a planner of this size


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    successes: list[float]  # empty when the env reports no success
    action_abs: list[float] = field(default_factory=list)  # mean |action| per episode: is the agent acting?
    # An episodic model's termination head on these (held-out) transitions: counts indexed [terminated, predicted].
    termination: np.ndarray | None = None

    def summary(self) -> dict:
        r = np.asarray(self.returns, dtype=np.float64)
        out = {"episodes": len(r), "episode_return": float(r.mean()), "episode_return_std": float(r.std()),
               "episode_length": float(np.mean(self.lengths)),
               "action_abs_mean": float(np.mean(self.action_abs)) if self.action_abs else float("nan")}
        if self.successes:
            out["success_rate"] = float(np.mean(self.successes))
        if self.termination is not None:  # terminal steps are rare: accuracy alone would hide a head that never fires
            t = self.termination
            out |= {"termination_accuracy": float(np.trace(t) / max(t.sum(), 1)), "terminal_steps": int(t[1].sum()),
                    "termination_recall": float(t[1, 1] / t[1].sum()) if t[1].sum() else float("nan"),
                    "termination_false_alarms": int(t[0, 1])}
        return out


def run_episodes(agent: Agent, env: EnvSource, episodes: int, seed: int, obs: str = "state",
                 action_repeat: int | None = None, video: Path | None = None, video_fps: int = 30,
                 stop: Callable[[], bool] | None = None) -> EvalResult | None:
    """Run `episodes` episodes without exploration noise, up to MAX_PARALLEL at a time. A multi-task agent
    plays task `env` (a name in its task set) with its padded observations and its embedding row.

    Returns None if `stop()` turns true meanwhile (a signal during a training-time eval)."""
    result = EvalResult([], [], [])
    if agent.model.episodic:
        result.termination = np.zeros((2, 2), dtype=np.int64)
    frames: list[np.ndarray] = []
    multitask = agent.dims.multitask
    own_dims = agent.dims.action_dim  # action_abs_mean averages the task's own action dims, not the padding
    if multitask:
        agent.task_ids(cast(str, env), 1)  # a task outside the set is a one-line error before anything is built
        own_dims = agent.dims.action_dims[agent.dims.tasks.index(cast(str, env))]
    while len(result.returns) < episodes:
        n = min(MAX_PARALLEL, episodes - len(result.returns))
        record = video is not None and not frames
        first_seed = seed + len(result.returns)
        envs = make_envs(env, n, seed=first_seed, obs=obs, action_repeat=action_repeat, pad_to=agent.dims.pad_to,
                         render=record)
        assert isinstance(envs, gym.vector.SyncVectorEnv)  # not asynchronous
        try:
            obs_, _ = envs.reset(seed=first_seed)
            done = np.zeros(n, dtype=bool)
            ret, length, act_abs = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n)
            success = np.full(n, np.nan)
            first = np.ones(n, dtype=bool)
            if record:
                frames.append(cast(np.ndarray, envs.envs[0].render()))
            while not done.all():
                if stop is not None and stop():
                    return None
                action = agent.act(obs_, first, eval_mode=True, role=f"eval{n}",
                                   task=cast(str, env) if multitask else None)
                if result.termination is not None:
                    predicted = agent.predicts_termination(obs_, action)
                obs_, reward, terminated, truncated, info = envs.step(action)
                live = ~done
                if result.termination is not None:
                    np.add.at(result.termination, (terminated[live].astype(int), predicted[live].astype(int)), 1)
                ret[live] += reward[live]
                length[live] += 1
                act_abs[live] += np.abs(action[live, :own_dims]).mean(-1)
                ended = (terminated | truncated) & live
                if "success" in info:
                    success[live] = np.asarray(info["success"], dtype=np.float64)[live]
                if ended.any() and "final_info" in info and "success" in info["final_info"]:
                    success[ended] = np.asarray(info["final_info"]["success"], dtype=np.float64)[ended]
                if record and live[0]:
                    frames.append(cast(np.ndarray, envs.envs[0].render()) if not ended[0] else frames[-1])
                done |= ended
                first = terminated | truncated
        finally:
            envs.close()
        result.returns += ret.tolist()
        result.lengths += length.tolist()
        result.action_abs += (act_abs / np.maximum(length, 1)).tolist()
        if not np.isnan(success).all():
            result.successes += np.nan_to_num(success).tolist()
    if video is not None and frames:
        write_video(video, frames, video_fps)
    return result


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise BadInput("videos need imageio: pip install 'tdmpc[video]'") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, fps=fps, macro_block_size=1)  # type: ignore[arg-type]
