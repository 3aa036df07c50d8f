"""python -m tdmpc.collect --checkpoint PATH --task T --episodes N --out data.h5: episodes of a trained agent, as a dataset.

The agent plans (or acts with its policy prior, --no-mpc), with Gaussian noise of std --noise
added to its actions (clipped to [-1, 1]), or for discrete actions a random action with chance --noise; episodes run up to 16 at a time, planned in one
call per step. They are appended to --out, created if missing: a file that exists must hold
the same task and dims (from a multi-task model, another of its tasks joins the file's list), and a
crash never corrupts what it held (tdmpc.offline.writer).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import h5py
import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.errors import EXIT_OK, EXIT_REQUEUE, BadInput, run_cli, stop_signals
from tdmpc.runtime.args import parse_args
from tdmpc.model.checkpoint import checkpoint_path, reference_task_set
from tdmpc.offline.format import DatasetError, open_h5, read_file
from tdmpc.offline.writer import DatasetWriter, task_action_start
from tdmpc.runtime.device import set_threads
from tdmpc.envs import make_env, make_envs
from tdmpc.envs.names import resolve_task
from tdmpc.episodes import PlayArgs
from tdmpc.tasks.sets import chosen_task, reference_info

PARALLEL = 16


@dataclass(kw_only=True)
class CollectArgs(PlayArgs):
    """tdmpc.collect's own flags, after those of every command that plays a saved agent."""

    out: Path
    """The dataset file to append to (created if missing)."""
    episodes: int = 10
    """Episodes to collect."""
    noise: float = 0.0
    """Std of Gaussian noise added to every action (then clipped to [-1, 1]); for discrete actions, the chance of
    a uniformly random action instead (at most 1)."""
    seed: Optional[int] = None
    """Seeds the envs, the planner and the noise. Default: the number of episodes --out holds already (0 for a new
    file), so collecting into a file again plays new episodes, not the same ones a second time."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(CollectArgs, argv, "python -m tdmpc.collect", __doc__.splitlines()[0])
    return run_cli(lambda: collect(args))


def collect(args: CollectArgs) -> int:
    for flag, value, least in (("episodes", args.episodes, 1), ("noise", args.noise, 0)):
        if not value >= least:
            raise BadInput(f"--{flag} must be >= {least}, got {value}")
    args.check(args.seed)
    agent = Agent.from_checkpoint(args.checkpoint, task=args.task, device=args.device, mpc=args.mpc,
                                  **reference_task_set(checkpoint_path(args.checkpoint), args.task_set))
    cfg, dims = agent.cfg, agent.dims
    task = chosen_task(dims.tasks, args.task, args.checkpoint, "collect") if dims.multitask else args.task or cfg.task
    if dims.discrete and args.noise > 1:
        raise BadInput(f"--noise {args.noise}: for discrete actions it is the chance of a random action, at most 1")
    repeat = cfg.action_repeat or resolve_task(task).default_action_repeat
    tasks, own = [task], (None, None)  # type: tuple[list[str], tuple[list[int] | None, list[int] | None]]
    if dims.multitask:  # obs stay padded to the model's; the file says the task's own dims
        agent.task_ids(task, 1)  # one of its set, or a one-line error
        tasks, obs_dims, action_dims = _file_tasks(args.out)  # another task of the model joins a file's list
        if task not in tasks:
            tasks, obs_dims = tasks + [task], obs_dims + [_own_obs_dim(task)]
            action_dims = action_dims + [dims.action_dims[dims.tasks.index(task)]]
        own = (obs_dims, action_dims)
    start = task_action_start(task, obs=cfg.obs, action_repeat=cfg.action_repeat) if dims.discrete else 0
    seed = _episodes_in(args.out) if args.seed is None else args.seed
    set_threads(args.threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    with stop_signals() as stopped:
        writer = DatasetWriter(args.out, dims.obs_shape, dims.action_dim, tasks, cfg.obs, repeat,
                               _source(args, task, seed), *own, discrete=dims.discrete, action_start=start)
        try:
            with writer:  # an exception drops the batch being played
                while len(returns) < args.episodes:
                    n = min(PARALLEL, args.episodes - len(returns))
                    returns += _play(agent, task, tasks.index(task), n, seed + len(returns), args.noise, rng,
                                     writer, lambda: bool(stopped))
                    writer.commit()  # each batch of episodes on disk before the next is played
        except CollectStopped:
            # the default seed (the file's count) moves on by itself; a given one must, or the rest replays episodes
            more = "" if args.seed is None else f" --seed {seed + len(returns)}"
            held = (f"{args.out} holds {writer.episodes} episodes" if args.out.exists() else
                    f"nothing was written ({args.out} not made)")
            print(f"stopped by {stopped[0]} after {len(returns)} of {args.episodes} episodes: {held}, the batch in "
                  f"play left out. Collect the rest with the same command and --episodes "
                  f"{args.episodes - len(returns)}{more}", file=sys.stderr)
            return EXIT_REQUEUE
    print(f"{task}: {len(returns)} episodes (seed {seed}), return {np.mean(returns):.1f} ± {np.std(returns):.1f}; "
          f"{args.out} holds {writer.episodes} episodes")
    return EXIT_OK


class CollectStopped(Exception):
    """A stop signal arrived while a batch of episodes was played."""


def _episodes_in(path: Path) -> int:
    """Episodes a dataset file holds already (0 if it is missing or cannot be read: the writer says why)."""
    try:
        with h5py.File(path, "r") as f:
            return len(f["episode_length"])
    except (OSError, KeyError, TypeError):
        return 0


def _play(agent: Agent, task: str, task_id: int, n: int, seed: int, noise: float, rng: np.random.Generator,
          writer: DatasetWriter, stop: Callable[[], bool]) -> list[float]:
    """n episodes in parallel; each is handed to the writer (as task `task_id` of the file) as it ends. Returns
    their returns; CollectStopped when stop() turns true."""
    dims, cfg = agent.dims, agent.cfg
    envs = make_envs(task, n, seed=seed, obs=cfg.obs, action_repeat=cfg.action_repeat, pad_to=dims.pad_to)
    task_mask = agent.model.action_mask(agent.task_ids(task, 1)) if dims.multitask else None
    mask = np.ones(dims.action_dim, np.float32) if task_mask is None else task_mask.cpu().numpy()
    try:
        obs, _ = envs.reset(seed=seed)
        # per env: observations, actions, rewards
        history: list[tuple[list[np.ndarray], list[np.ndarray], list[float]]] = [([o], [], []) for o in obs]
        done, first, returns = np.zeros(n, bool), np.ones(n, bool), []
        while not done.all():
            if stop():
                raise CollectStopped
            action = np.asarray(agent.act(obs, first, eval_mode=True, role=f"collect{n}",
                                          task=task if dims.multitask else None))
            if dims.discrete:  # noise: the chance of a uniformly random action instead
                action = np.where(rng.random(n) < noise, rng.integers(0, dims.action_dim, n), action)
            else:
                action = (np.clip(action + noise * rng.standard_normal(action.shape), -1, 1) * mask).astype(np.float32)
            obs, reward, terminated, truncated, info = envs.step(action)
            for i in np.flatnonzero(~done):
                ended = bool(terminated[i] or truncated[i])
                h = history[i]
                h[0].append(info["final_obs"][i] if ended else obs[i])
                h[1].append(action[i])
                h[2].append(float(reward[i]))
                if ended:
                    writer.add_episode(np.stack(h[0]), np.stack(h[1]), np.array(h[2]), bool(terminated[i]),
                                       not terminated[i], task_id)
                    returns.append(sum(h[2]))
                    done[i] = True
            first = terminated | truncated
        return returns
    finally:
        envs.close()


def _source(args: CollectArgs, task: str, seed: int) -> str:
    return (f"tdmpc.collect --checkpoint {args.checkpoint} --task {task} {'' if args.mpc else '--no-mpc '}"
            f"--noise {args.noise} --seed {seed}")


def _file_tasks(path: Path) -> tuple[list[str], list[int], list[int]]:
    """The tasks a dataset file holds, with their own obs and action dims (empty if it is missing or cannot be
    read: the writer says why)."""
    try:
        with open_h5(path) as f:
            schema = read_file(f, path).schema
    except (OSError, DatasetError):
        return [], [], []
    return list(schema.tasks), list(schema.task_obs_dims), list(schema.task_action_dims)


def _own_obs_dim(task: str) -> int:
    known = reference_info(task)
    if known is not None:
        return known.obs_dim
    env, spec = make_env(task)
    env.close()
    return spec.obs_shape[0]


if __name__ == "__main__":
    sys.exit(main())
