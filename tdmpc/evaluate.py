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
from typing import Callable, Optional

import numpy as np
import torch

from tdmpc import checkpoint
from tdmpc.agent import Agent
from tdmpc.cli import BadInput, run_cli
from tdmpc.config import Config, from_dict, validate
from tdmpc.device import resolve_device
from tdmpc.envs import make_vector_env
from tdmpc.world_model import ModelDims

MAX_PARALLEL = 16


@dataclass
class EvalResult:
    returns: list[float]
    lengths: list[int]
    successes: list[float]  # empty when the env reports no success
    action_abs: list[float] = field(default_factory=list)  # mean |action| per episode: is the agent acting?

    def summary(self) -> dict:
        r = np.asarray(self.returns, dtype=np.float64)
        out = {"episodes": len(r), "episode_return": float(r.mean()), "episode_return_std": float(r.std()),
               "episode_length": float(np.mean(self.lengths)),
               "action_abs_mean": float(np.mean(self.action_abs)) if self.action_abs else float("nan")}
        if self.successes:
            out["success_rate"] = float(np.mean(self.successes))
        return out


def run_episodes(agent: Agent, task: str, episodes: int, seed: int, obs: str = "state",
                 action_repeat: int | None = None, video: Path | None = None, video_fps: int = 30,
                 stop: Callable[[], bool] | None = None) -> EvalResult | None:
    """Run `episodes` episodes without exploration noise, up to MAX_PARALLEL at a time.

    Returns None if `stop()` turns true meanwhile (a signal during a training-time eval)."""
    result = EvalResult([], [], [])
    frames: list[np.ndarray] = []
    while len(result.returns) < episodes:
        n = min(MAX_PARALLEL, episodes - len(result.returns))
        envs, _ = make_vector_env(task, n, seed=seed + len(result.returns), obs=obs, action_repeat=action_repeat)
        record = video is not None and not frames
        try:
            obs_, _ = envs.reset(seed=seed + len(result.returns))
            done = np.zeros(n, dtype=bool)
            ret, length, act_abs = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n)
            success = np.full(n, np.nan)
            first = np.ones(n, dtype=bool)
            if record:
                frames.append(envs.envs[0].render())
            while not done.all():
                if stop is not None and stop():
                    return None
                action = agent.act(obs_, first, eval_mode=True, role=f"eval{n}")
                obs_, reward, terminated, truncated, info = envs.step(action)
                live = ~done
                ret[live] += reward[live]
                length[live] += 1
                act_abs[live] += np.abs(action[live]).mean(-1)
                ended = (terminated | truncated) & live
                if "success" in info:
                    success[live] = np.asarray(info["success"], dtype=np.float64)[live]
                if ended.any() and "final_info" in info and "success" in info["final_info"]:
                    success[ended] = np.asarray(info["final_info"]["success"], dtype=np.float64)[ended]
                if record and live[0]:
                    frames.append(envs.envs[0].render() if not ended[0] else frames[-1])
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
        raise SystemExit("error: videos need imageio (pip install -e '.[video]')") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, fps=fps, macro_block_size=1)


@dataclass
class LoadedCheckpoint:
    cfg: Config
    dims: ModelDims
    state: dict  # our state-dict layout (model, and optimisers when present)
    episode_length: int | None  # None for reference checkpoints: taken from the task
    imported: bool  # a reference TD-MPC2 checkpoint


def read_checkpoint(path: Path, overrides: dict, mmap: bool = False) -> LoadedCheckpoint:
    """Our checkpoint or a reference one, as config + dims + state; overrides apply to the config.

    `mmap=True` maps the tensors rather than reading them: cheap when only the dims are needed."""
    obj = checkpoint.load_file(path, mmap=mmap)
    if checkpoint.is_reference(obj):
        dims, state = checkpoint.reference_to_ours(obj.get("model", obj), str(path))
        base = Config(model_size=None, enc_dim=dims.enc_dim, mlp_dim=dims.mlp_dim, latent_dim=dims.latent_dim,
                      num_enc_layers=dims.num_enc_layers, num_q=dims.num_q, num_bins=dims.num_bins,
                      num_channels=dims.num_channels, log_std_min=dims.log_std_min,
                      log_std_max=dims.log_std_max, episodic=dims.episodic,
                      obs="rgb" if dims.pixels else "state")
        return LoadedCheckpoint(validate(from_dict(overrides, base=base)), dims, {"model": state}, None, True)
    if obj.get("format") != checkpoint.FORMAT or "dims" not in obj:
        keys = [str(k) for k in list(obj)[:4]]
        raise checkpoint.CheckpointError(f"{path}: neither a tdmpc checkpoint nor a TD-MPC2 state dict "
                                         f"(it holds keys {keys}{' ...' if len(obj) > 4 else ''})")
    cfg = validate(from_dict(overrides, base=from_dict(obj["config"], source=str(path))))
    return LoadedCheckpoint(cfg, ModelDims.from_dict(obj["dims"]), obj, int(obj["episode_length"]), False)


def check_dims_match(dims: ModelDims, spec, source: str) -> None:
    """A model made for other observation/action sizes than the task's is a one-line error."""
    if (tuple(dims.obs_shape), dims.action_dim) != (tuple(spec.obs_shape), spec.action_dim):
        raise checkpoint.CheckpointError(
            f"{source}: model is for obs {tuple(dims.obs_shape)} / action dim {dims.action_dim}, but task "
            f"'{spec.task}' has obs {tuple(spec.obs_shape)} / action dim {spec.action_dim}")


@dataclass
class EvalArgs:
    checkpoint: Path
    """A tdmpc checkpoint (run_dir/checkpoints/latest.pt) or a reference TD-MPC2 .pt file."""
    task: str | None = None
    """Task to evaluate on; default: the checkpoint's. Required for reference checkpoints."""
    episodes: int = 10
    seed: int = 0
    video: Path | None = None
    """Record the first episode to this .mp4 (MuJoCo offscreen rendering; set MUJOCO_GL=egl or osmesa)."""
    report: Path | None = None
    """Where to write the JSON report; default: beside the checkpoint."""
    device: str = "auto"
    mpc: bool = True
    """Plan with MPPI; --no-mpc acts with the policy prior alone."""
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
    device = resolve_device(args.device)
    planning = {k: getattr(args, k) for k in ("iterations", "num_samples", "num_elites", "num_pi_trajs")}
    overrides = {"device": args.device, "mpc": args.mpc, **({"task": args.task} if args.task else {}),
                 **{k: v for k, v in planning.items() if v is not None}}
    ck = read_checkpoint(args.checkpoint, overrides)
    if ck.imported and not args.task:
        raise BadInput("a reference TD-MPC2 checkpoint does not name its task: pass --task (e.g. walker-walk)")
    cfg = ck.cfg
    envs, spec = make_vector_env(cfg.task, 1, seed=args.seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
    envs.close()
    check_dims_match(ck.dims, spec, str(args.checkpoint))
    agent = Agent(cfg, ck.dims, ck.episode_length or spec.episode_length, device)
    agent.load_state_dict(ck.state, str(args.checkpoint))

    t0 = time.time()
    res = run_episodes(agent, cfg.task, args.episodes, args.seed, cfg.obs, cfg.action_repeat, args.video)
    summary = {"checkpoint": str(args.checkpoint), "imported_reference": ck.imported, "task": cfg.task,
               "seed": args.seed, "mpc": cfg.mpc, "dims": ck.dims.to_dict(), **res.summary(), "returns": res.returns,
               "lengths": res.lengths, "seconds": round(time.time() - t0, 1),
               **({"video": str(args.video)} if args.video else {})}
    report = args.report or args.checkpoint.with_name(f"eval_{cfg.task}_seed{args.seed}.json")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(summary, indent=2) + "\n")
    origin = " (imported reference TD-MPC2 checkpoint)" if ck.imported else ""
    success = f", success {summary['success_rate']:.2f}" if "success_rate" in summary else ""
    print(f"{cfg.task}{origin}: return {summary['episode_return']:.1f} ± {summary['episode_return_std']:.1f} "
          f"over {summary['episodes']} episodes, length {summary['episode_length']:.0f}{success} "
          f"[{summary['seconds']}s]")
    print(f"report: {report}" + (f"\nvideo: {args.video}" if args.video else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
