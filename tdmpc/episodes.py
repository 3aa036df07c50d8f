"""Evaluation episodes: a saved or training agent plays N episodes without exploration noise.

Episodes run in parallel environments, planned for in one batched call per step, through one loop whatever the
envs speak (numpy ones behind tdmpc.envs.host.HostVectorEnv, tensor-native ones as they are); the first can be
recorded to a video (numpy envs). Training evaluates with this, and so does python -m tdmpc.evaluate.
"""

from __future__ import annotations

import errno
import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, cast

import gymnasium as gym
import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.envs import EnvSource, make_envs
from tdmpc.envs.host import HostVectorEnv, LockstepEnv
from tdmpc.envs.tensor import TensorVectorEnv, is_tensor_task, make_tensor_vector_env
from tdmpc.errors import BadInput, NonFiniteData
from tdmpc.model.checkpoint import describe_sizes
from tdmpc.memory.peak import EVAL_PARALLEL
from tdmpc.runtime.device import resolve_device, threads_error
from tdmpc.runtime.files import atomic_write, file_in_the_way, fmt_bytes, free_bytes
from tdmpc.runtime.transfer import to_device


@dataclass(kw_only=True)
class PlayArgs:
    """The flags of the commands that play a saved agent's episodes (tdmpc.evaluate, tdmpc.collect): one source
    for both, each command's own flags in a subclass after these."""

    checkpoint: Path
    """A tdmpc checkpoint (run_dir/checkpoints/latest.pt, or the run directory itself) or a reference TD-MPC2 .pt
    file."""
    task: Optional[str] = None
    """The task to play; default: the checkpoint's (required for reference and multi-task checkpoints)."""
    task_set: tuple[str, ...] = ()
    """A reference multi-task checkpoint's tasks in id order (a,b,c): its file does not name them, and only
    mt30's and mt80's are known by their count."""
    mpc: bool = True
    """Plan with MPPI; --no-mpc acts with the policy prior alone."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    threads: Optional[int] = None
    """CPU threads for torch. None: the cores other processes leave idle."""

    def check(self, seed: int | None) -> None:
        """What is refused before the checkpoint is read, in the flags' words (Agent.from_checkpoint's are
        Python's): the threads, a device not here, a seed torch and gymnasium cannot take."""
        if error := threads_error(self.threads):
            raise BadInput(error)
        resolve_device(self.device)
        if seed is not None and not 0 <= seed < 2**62:
            raise BadInput(f"--seed must be >= 0 and < 2**62 (gymnasium and torch seed with it), got {seed}")


@dataclass
class EvalResult:
    """What run_episodes played: per episode its return, length, success (where the env reports one) and mean
    |action|; summary() gives the means a report and eval.csv hold."""

    returns: list[float]
    lengths: list[int]
    successes: list[float]  # empty when the env reports no success
    action_abs: list[float] = field(default_factory=list)  # mean |action| per episode: is the agent acting?
    # An episodic model's termination head on these (held-out) transitions: counts indexed [terminated, predicted].
    termination: np.ndarray | None = None
    dropped: int = 0  # episodes left out for non-finite observations (drop_nonfinite)
    video_error: str | None = None  # why the video was not written (a full disk): the episodes still count

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


def eval_seed(run_seed: int) -> int:
    """The seed a training run's evaluations play with (python -m tdmpc.evaluate's default for its checkpoints, so
    that it plays eval.csv's episodes again); far from the training envs' seeds, which count up from run_seed."""
    return 1_000_003 * (run_seed + 1)


def run_episodes(agent: Agent, env: EnvSource | LockstepEnv, episodes: int, seed: int | None, obs: str = "state",
                 action_repeat: int | None = None, video: Path | None = None, video_fps: int = 30,
                 stop: Callable[[], bool] | None = None, drop_nonfinite: bool = False) -> EvalResult | None:
    """Run `episodes` episodes without exploration noise, in rounds of parallel envs that each play one episode
    from a reset: numpy envs (a task name, a gymnasium env or a function making one) EVAL_PARALLEL at a time, a
    tensor-native task all at once, or the given lockstep envs (a training run's) in rounds of their size. A
    multi-task agent plays task `env` (a name in its task set) with its padded observations and its embedding row.

    NaN or inf in an observation or reward is a NonFiniteData naming the env, or with drop_nonfinite its episode
    is left out (counted in `dropped`). Returns None if `stop()` turns true meanwhile (a signal during a
    training-time eval).

    A seed seeds the envs and, for these episodes only, torch's generators the planner draws from: the same seed
    plays the same episodes wherever it is called (a training run's evaluation, python -m tdmpc.evaluate), and the
    caller's random stream is left as it was. Without one, each call plays new episodes (envs seeded from the OS's
    entropy) on the caller's torch stream. Seed s plays env seeds s, s+1, ...: seeds a few apart share episodes."""
    with _seeded_torch(seed, agent.device):
        return _run_episodes(agent, env, episodes, seed, obs, action_repeat, video, video_fps, stop, drop_nonfinite)


@contextmanager
def _seeded_torch(seed: int | None, device: torch.device) -> Iterator[None]:
    """torch's generators (the host's and `device`'s) seeded with `seed` inside, and as they were after; no seed:
    left alone."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _run_episodes(agent: Agent, env: EnvSource | LockstepEnv, episodes: int, seed: int | None, obs: str,
                  action_repeat: int | None, video: Path | None, video_fps: int, stop: Callable[[], bool] | None,
                  drop_nonfinite: bool) -> EvalResult | None:
    result = EvalResult([], [], [])
    if agent.model.episodic:
        result.termination = np.zeros((2, 2), dtype=np.int64)
    frames: list[np.ndarray] = []
    multitask = agent.dims.multitask
    own_dims = agent.dims.action_dim  # action_abs_mean averages the task's own action dims, not the padding
    if multitask:
        agent.task_ids(cast(str, env), 1)  # a task outside the set is a one-line error before anything is built
        own_dims = agent.dims.action_dims[agent.dims.tasks.index(cast(str, env))]
    name = env.task if isinstance(env, (HostVectorEnv, TensorVectorEnv)) else env if isinstance(env, str) else \
        "the user's env"

    tensor_task = isinstance(env, str) and not multitask and is_tensor_task(env)
    while len(result.returns) + result.dropped < episodes:
        left = episodes - len(result.returns) - result.dropped
        record = video is not None and not frames
        first_seed = None if seed is None else seed + len(result.returns) + result.dropped
        if isinstance(env, (HostVectorEnv, TensorVectorEnv)):
            envs: LockstepEnv = env
        elif tensor_task:
            envs = make_tensor_vector_env(cast(str, env), left, seed=first_seed, device=agent.device)[0]
        else:
            env_seed = int(np.random.default_rng().integers(2**62)) if first_seed is None else first_seed
            envs = HostVectorEnv(make_envs(env, min(EVAL_PARALLEL, left), seed=env_seed,
                                           obs=obs, action_repeat=action_repeat, pad_to=agent.dims.pad_to,
                                           render=record), name)
        if record and not isinstance(envs, HostVectorEnv):
            raise BadInput(f"--video is not supported for tensor-native envs ({name}) yet")
        try:
            played = _play_round(agent, envs, first_seed, own_dims, cast(str, env) if multitask else None,
                                 result.termination, frames if record else None, stop, drop_nonfinite)
        finally:
            if envs is not env:
                envs.close()
        if played is None:
            return None
        take = min(envs.num_envs, left)
        ret, length, act_abs, success, bad = (x[:take] for x in played)
        if bad.any() and not drop_nonfinite:
            raise NonFiniteData(f"evaluation env {int(np.flatnonzero(bad)[0])} ({name}) returned a non-finite "
                                f"observation or reward; pass --nonfinite-data drop to leave such episodes out")
        kept = ~bad
        result.dropped += int(bad.sum())
        result.returns += ret[kept].tolist()
        result.lengths += length[kept].tolist()
        if not agent.dims.discrete:  # integer actions have no magnitude: action_abs_mean stays NaN
            result.action_abs += (act_abs / np.maximum(length, 1))[kept].tolist()
        if not np.isnan(success[kept]).all():
            result.successes += np.nan_to_num(success[kept]).tolist()
    if video is not None and frames:
        try:
            write_video(video, frames, video_fps)
        except OSError as e:
            result.video_error = f"{e.filename or video}: {e.strerror or e}"
    return result


def _play_round(agent: Agent, envs: LockstepEnv, seed: int | None, own_dims: int, task: str | None,
                termination: np.ndarray | None, frames: list[np.ndarray] | None, stop: Callable[[], bool] | None,
                drop: bool) -> tuple[np.ndarray, ...] | None:
    """Each env plays one episode from a reset: its return, length, summed mean |action|, success (NaN where the
    env says nothing) and whether it held non-finite data, read back once all have ended (asked every step for
    host envs, every CHECK_EVERY steps for tensor ones); the termination head's confusion counts are added to
    `termination`. None if `stop()` turned true. Host envs name non-finite data at once (unless `drop`)."""
    N, dev = envs.num_envs, envs.device
    live, bad = torch.ones(N, dtype=torch.bool, device=dev), torch.zeros(N, dtype=torch.bool, device=dev)
    ret, act_abs = torch.zeros(N, dtype=torch.float64, device=dev), torch.zeros(N, dtype=torch.float64, device=dev)
    length = torch.zeros(N, dtype=torch.long, device=dev)
    confusion = torch.zeros(4, dtype=torch.long, device=dev)  # [terminated, predicted], flattened
    success = np.full(N, np.nan)
    stepping = False

    def on_nonfinite(i: int, what: str, remedy: str, done: str) -> None:
        """A host env's NaN or inf in an episode played is an error (unless `drop`); in the start of one after it
        (autoreset) it is not."""
        if drop or stepping and (what.endswith("reset()") or not bool(live[i])):
            return
        raise NonFiniteData(f"evaluation env {i} ({envs.task}) returned a non-finite {what} at step "
                            f"{int(length[i]) + stepping} of its episode; pass --nonfinite-data drop to leave such "
                            f"episodes out")

    saved = envs.on_nonfinite if isinstance(envs, HostVectorEnv) else None
    if isinstance(envs, HostVectorEnv):
        envs.on_nonfinite = on_nonfinite
    try:
        obs = envs.reset(seed=seed)
        if tuple(obs.shape[1:]) != tuple(agent.dims.obs_shape):  # else a matmul's shape error, deep in the model
            raise BadInput(f"{envs.task} has obs {tuple(obs.shape[1:])}, but the agent's model is for "
                           f"{describe_sizes(agent.dims.obs_shape, agent.dims.action_dim, agent.dims.discrete)}")
        stepping = True
        task_ids = agent.task_ids(task, N) if task is not None else None
        first = torch.ones(N, dtype=torch.bool, device=dev)
        if frames is not None:
            frames.append(_frame(cast(HostVectorEnv, envs)))
        for t in itertools.count(1):
            if stop is not None and stop():
                return None
            obs_d, first_d = to_device(agent.device, obs, first) if envs.on_host else (obs, first)
            action = agent.act_on_device(obs_d, first_d, eval_mode=True, role=f"eval{N}", task=task_ids)
            predicted = agent.predicts_termination(obs_d, action) if termination is not None else None
            s = envs.step(action)
            counted = live & s.transition
            ret += torch.where(counted, s.reward, 0.0)
            length += counted.long()
            if not agent.dims.discrete:
                act_abs += torch.where(counted, action[:, :own_dims].abs().mean(-1).to(act_abs), 0.0)
            if predicted is not None:
                pairs = s.terminated.long() * 2 + predicted.to(dev).long()
                confusion += (torch.nn.functional.one_hot(pairs, 4) * counted[:, None]).sum(0)
            bad |= counted & ~s.finite
            ended = (s.terminated | s.truncated) & counted
            if isinstance(envs, HostVectorEnv):
                _success(envs.info, success, live.numpy(), ended.numpy())
                if frames is not None and bool(live[0]):
                    frames.append(_frame(envs) if not bool(ended[0]) else frames[-1])
            live &= ~(ended | ~s.finite)
            obs, first = s.obs, s.started
            if (envs.on_host or t % CHECK_EVERY == 0) and not bool(live.any()):
                break
    finally:
        if isinstance(envs, HostVectorEnv):
            envs.on_nonfinite = saved  # type: ignore[assignment]
    if termination is not None:
        termination += confusion.view(2, 2).cpu().numpy()
    return ret.cpu().numpy(), length.cpu().numpy(), act_abs.cpu().numpy(), success, bad.cpu().numpy()


def _success(info: dict, success: np.ndarray, live: np.ndarray, ended: np.ndarray) -> None:
    """What a host env's info says of success: every step's, or the final one of an ended episode."""
    if "success" in info:
        success[live] = np.asarray(info["success"], dtype=np.float64)[live]
    if ended.any() and "final_info" in info and "success" in info["final_info"]:
        success[ended] = np.asarray(info["final_info"]["success"], dtype=np.float64)[ended]


def _frame(envs: HostVectorEnv) -> np.ndarray:
    """The first env's rendered frame; a renderer that is not installed (pygame, for gymnasium's classic-control
    tasks) is a one-line BadInput."""
    try:
        return envs.render()
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
    if blocked := file_in_the_way(path):
        raise BadInput(f"--video {path}: {blocked} is a file where a folder goes")


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """Written whole or not at all: a file already at `path` stays as it was if the write fails."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise BadInput("videos need imageio: pip install 'tdmpc[video]'") from None
    try:
        atomic_write(path, lambda tmp: imageio.mimsave(tmp, frames, fps=fps, macro_block_size=1),  # type: ignore[arg-type]
                     suffix=f".tmp{path.suffix}")
    except OSError as e:
        if e.errno is not None:
            raise
        # imageio's word for a writer (ffmpeg) that stopped: "[Errno 32] Broken pipe" and ffmpeg's command line
        why = e.strerror or str(e).splitlines()[0]
        raise OSError(errno.EIO, f"the video writer stopped ({why}; ffmpeg's lines above say why, "
                                 f"{fmt_bytes(free_bytes(path.parent), decimal=True)} free)", str(path)) from None


CHECK_EVERY = 50  # tensor evaluation steps between reads of whether every episode has ended
