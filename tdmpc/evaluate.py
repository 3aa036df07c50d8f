"""python -m tdmpc.evaluate --checkpoint PATH: run episodes with a saved agent, report and record them.

Works on our checkpoints and on the reference implementation's (imported on the fly).
Episodes run in parallel environments, planned for in one batched call per step.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, cast

import gymnasium as gym
import numpy as np
import torch

from tdmpc.agent import Agent
from tdmpc.checkpoint import check_dims_match
from tdmpc.cli import EXIT_ERROR, EXIT_OK, BadInput, run_cli
from tdmpc.device import set_threads
from tdmpc.task_sets import task_set_name
from tdmpc.envs import EnvSource, make_task_envs, make_vector_env

MAX_PARALLEL = 16


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
        if multitask:
            assert isinstance(env, str)
            envs, _ = make_task_envs([env], n, seed=first_seed, obs_dim=agent.dims.obs_shape[0],
                                     action_dim=agent.dims.action_dim, action_repeat=action_repeat, render=record)
        else:
            envs, _ = make_vector_env(env, n, seed=first_seed, obs=obs, action_repeat=action_repeat, render=record)
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


@dataclass
class EvalArgs:
    checkpoint: Path
    """A tdmpc checkpoint (run_dir/checkpoints/latest.pt) or a reference TD-MPC2 .pt file."""
    task: Optional[str] = None
    """Task to evaluate on; default: the checkpoint's. Required for reference checkpoints."""
    episodes: int = 10
    """Episodes to run (up to 16 in parallel, planned in one batched call)."""
    seed: int = 0
    """Seeds the envs and the planner: the same seed gives the same episodes."""
    video: Optional[Path] = None
    """Record the first episode to this .mp4 (MuJoCo offscreen rendering; set MUJOCO_GL=egl or osmesa)."""
    report: Optional[Path] = None
    """Where to write the JSON report; default: beside the checkpoint."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    threads: Optional[int] = None
    """CPU threads for torch. None: the cores other processes leave idle."""
    mpc: bool = True
    """Plan with MPPI; --no-mpc acts with the policy prior alone."""
    precision: Optional[str] = None
    """Planning precision ('fp32', 'bf16', 'auto'); default: the checkpoint's."""
    iterations: Optional[int] = None
    """Planning overrides (this and the next three); default: the checkpoint's config, or the reference
    settings (6 iterations, 512 samples, 64 elites, 24 policy trajectories) for a reference checkpoint."""
    num_samples: Optional[int] = None
    num_elites: Optional[int] = None
    num_pi_trajs: Optional[int] = None


def main(argv: list[str] | None = None) -> int:
    import tyro

    args = tyro.cli(EvalArgs, args=argv, description=__doc__.splitlines()[0])
    return run_cli(lambda: evaluate(args))


def evaluate(args: EvalArgs) -> int:
    if args.episodes < 1:
        raise BadInput(f"--episodes must be >= 1, got {args.episodes}")
    if args.threads is not None and args.threads < 1:
        raise BadInput(f"--threads must be >= 1, got {args.threads}")
    overrides = {k: getattr(args, k) for k in ("mpc", "precision", "iterations", "num_samples", "num_elites",
                                                "num_pi_trajs") if getattr(args, k) is not None}
    agent = Agent.from_checkpoint(args.checkpoint, task=args.task, device=args.device, **overrides)
    cfg = agent.cfg
    if agent.dims.multitask:
        if args.task is None or "," in args.task or args.task in ("mt30", "mt80"):
            raise BadInput(f"{args.checkpoint} is a multi-task model: choose the task to evaluate with --task, one "
                           f"of {task_set_name(agent.dims.tasks)}")
        agent.task_ids(args.task, 1)
    else:
        envs, spec = make_vector_env(cfg.task, 1, seed=args.seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
        envs.close()
        check_dims_match(agent.dims, spec.obs_shape, spec.action_dim, spec.task, str(args.checkpoint))

    set_threads(args.threads)
    torch.manual_seed(args.seed)  # the planner's samples: the same seed repeats the same evaluation
    t0 = time.time()
    res = run_episodes(agent, cfg.task, args.episodes, args.seed, cfg.obs, cfg.action_repeat, args.video)
    assert res is not None  # only a stop() callback ends it early
    imported = agent.imported_from_reference
    summary = {"checkpoint": str(args.checkpoint), "imported_reference": imported, "task": cfg.task,
               "seed": args.seed, "mpc": cfg.mpc, "dims": agent.dims.to_dict(), **res.summary(),
               "returns": res.returns, "lengths": res.lengths, "seconds": round(time.time() - t0, 1),
               **({"video": str(args.video)} if args.video else {})}
    origin = " (imported reference TD-MPC2 checkpoint)" if imported else ""
    success = f", success {summary['success_rate']:.2f}" if "success_rate" in summary else ""
    print(f"{cfg.task}{origin}: return {summary['episode_return']:.1f} ± {summary['episode_return_std']:.1f} "
          f"over {summary['episodes']} episodes, length {summary['episode_length']:.0f}{success} "
          f"[{summary['seconds']}s]" + (f"\nvideo: {args.video}" if args.video else ""), flush=True)
    if res.termination is not None:
        t = res.termination
        print(f"termination head: {summary['termination_accuracy']:.4f} of {t.sum():,} transitions right; "
              f"{t[1, 1]} of {t[1].sum()} terminal steps predicted, {t[0, 1]} false alarms")
    report = args.report or args.checkpoint.with_name(f"eval_{cfg.task}_seed{args.seed}.json")
    try:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        print(f"error: the report could not be written to {report} ({e.strerror or e}); the result is above. "
              f"Choose another place with --report PATH", file=sys.stderr)
        return EXIT_ERROR
    print(f"report: {report}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
