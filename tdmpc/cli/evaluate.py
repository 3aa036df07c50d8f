"""python -m tdmpc.evaluate --checkpoint PATH: run episodes with a saved agent, report and record them.

Works on our checkpoints and on the reference implementation's (imported on the fly).
Episodes run in parallel environments, planned for in one batched call per step.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Optional

from tdmpc.agent import Agent
from tdmpc.envs import check_observations, make_env
from tdmpc.envs.tensor import is_tensor_task, make_tensor_vector_env
from tdmpc.episodes import PlayArgs, check_video_path, eval_seed, run_episodes
from tdmpc.errors import EXIT_ERROR, EXIT_OK, BadInput, run_cli
from tdmpc.runtime.args import parse_args
from tdmpc.model.checkpoint import check_dims_match, checkpoint_path, load_file, reference_task_set
from tdmpc.runtime.device import set_threads
from tdmpc.runtime.files import file_in_the_way, json_text, read_only_folder, write_text_atomic
from tdmpc.tasks.sets import chosen_task
from tdmpc.training.run_dir import saved_step


@dataclass(kw_only=True)
class EvalArgs(PlayArgs):
    """tdmpc.evaluate's own flags, after those of every command that plays a saved agent."""

    episodes: int = 10
    """Episodes to run (up to 16 in parallel, planned in one batched call)."""
    seed: Optional[int] = None
    """Seeds the envs and the planner: the same seed gives the same episodes. Default: the seed the run's own
    evaluations play with, so a training checkpoint's eval.csv row is played again (same --episodes)."""
    video: Optional[Path] = None
    """Record the first episode to this file, its format by extension (.mp4, .gif, .webm, ...), written whole or
    not at all (MuJoCo offscreen rendering; set MUJOCO_GL=egl or osmesa)."""
    report: Optional[Path] = None
    """Where to write the JSON report; default: beside the checkpoint, named for the task, seed, checkpoint (if not
    latest.pt) and each planning setting given, e.g. eval_walker-walk_seed3_no-mpc.json."""
    precision: Optional[str] = None
    """Planning precision ('fp32', 'bf16', 'auto'); default: the checkpoint's."""
    iterations: Optional[int] = None
    """Planning overrides (this and the next four); default: the checkpoint's config, or the reference
    settings (6 iterations, 512 samples, 64 elites, 24 policy trajectories, horizon 3) for a reference checkpoint."""
    num_samples: Optional[int] = None
    num_elites: Optional[int] = None
    num_pi_trajs: Optional[int] = None
    plan_horizon: Optional[int] = None
    nonfinite_data: Optional[Literal["error", "drop"]] = None
    """NaN or inf in an observation: stop with one line naming the env ('error'), or leave that episode out of
    the report ('drop'); default: the checkpoint's."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(EvalArgs, argv, "python -m tdmpc.evaluate", __doc__.splitlines()[0])
    return run_cli(lambda: evaluate(args))


PLANNING = ("iterations", "num_samples", "num_elites", "num_pi_trajs", "plan_horizon")  # MPPI's overrides


def report_name(task: str, seed: int, checkpoint: Path, args: EvalArgs) -> str:
    """The default report's name: the task and seed, then what else makes it another evaluation (a checkpoint
    other than latest.pt, each planning setting given), so that no report overwrites another's."""
    parts = [f"eval_{task}", f"seed{seed}"] + ([checkpoint.stem] if checkpoint.stem != "latest" else [])
    parts += [] if args.mpc else ["no-mpc"]
    parts += [f"{name.replace('_', '-')}{value}" for name in ("precision", *(PLANNING if args.mpc else ()))
              if (value := getattr(args, name)) is not None]
    return "_".join(parts) + ".json"


def evaluate(args: EvalArgs) -> int:
    if args.episodes < 1:
        raise BadInput(f"--episodes must be >= 1, got {args.episodes}")
    args.check(args.seed)
    if args.video is not None:
        check_video_path(args.video)
    if args.report is not None and args.report.is_dir():
        raise BadInput(f"--report {args.report} is a folder: give a file name, e.g. {args.report / 'eval.json'}")
    if args.report is not None and (blocked := file_in_the_way(args.report)):
        raise BadInput(f"--report {args.report}: {blocked} is a file where a folder goes")
    planning = PLANNING if args.mpc else ()  # without planning they are said to do nothing, and not applied
    overrides = {k: getattr(args, k) for k in ("mpc", "precision", *planning, "nonfinite_data")
                 if getattr(args, k) is not None}
    checkpoint = checkpoint_path(args.checkpoint)  # a run's directory: its latest checkpoint
    saved = load_file(checkpoint, mmap=True)  # what the report names: the task trained on, the step it was saved at
    overrides.update(reference_task_set(checkpoint, args.task_set))
    trained_on = saved["config"].get("task") if isinstance(saved.get("config"), dict) else None
    step = saved_step(saved["train"]) if isinstance(saved.get("train"), dict) else None
    if locked := read_only_folder(args.report or checkpoint):  # before any episode
        raise BadInput(f"--report {args.report}: {locked} is read-only; choose another place" if args.report else
                       f"the report goes beside the checkpoint, and {locked} is read-only: pass --report PATH")
    agent = Agent.from_checkpoint(checkpoint, task=args.task, device=args.device, **overrides)
    cfg = agent.cfg
    if not args.mpc and (unused := [f"--{n.replace('_', '-')}" for n in PLANNING if getattr(args, n) is not None]):
        print(f"note: {', '.join(unused)} do{'es' if len(unused) == 1 else ''} nothing with --no-mpc (the policy "
              f"prior acts alone)", file=sys.stderr)
    if trained_on is not None and not agent.dims.multitask and cfg.task != trained_on:  # allowed: the dims match
        print(f"note: evaluating on {cfg.task} (--task) a model trained on {trained_on}", file=sys.stderr)
    seed = eval_seed(cfg.seed) if args.seed is None else args.seed
    if agent.dims.multitask:
        agent.task_ids(chosen_task(agent.dims.tasks, args.task, args.checkpoint, "evaluate"), 1)
    envs = None  # a GPU simulator's: its episodes all at once, on envs built here
    if not agent.dims.multitask and is_tensor_task(cfg.task):
        if args.video:
            raise BadInput(f"--video is not supported for tensor-native envs ({cfg.task}) yet")
        envs, spec = make_tensor_vector_env(cfg.task, args.episodes, seed=seed, device=agent.device)
    elif not agent.dims.multitask:
        env, spec = make_env(cfg.task, seed=seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
        try:
            check_observations(env, spec)
        finally:
            env.close()
    if not agent.dims.multitask:
        check_dims_match(agent.dims, spec.obs_shape, spec.action_dim, spec.discrete, spec.task,
                         str(args.checkpoint))

    set_threads(args.threads)
    t0 = time.time()
    try:
        res = run_episodes(agent, envs or cfg.task, args.episodes, seed, cfg.obs, cfg.action_repeat, args.video,
                           drop_nonfinite=cfg.nonfinite_data == "drop")
    finally:
        if envs is not None:
            envs.close()
    assert res is not None  # only a stop() callback ends it early
    imported = agent.imported_from_reference
    summary = {"checkpoint": str(checkpoint.resolve()), "checkpoint_step": step, "trained_on": trained_on,
               "imported_reference": imported, "task": cfg.task,
               "seed": seed, "mpc": cfg.mpc, "planning": asdict(agent.planner_cfg) if cfg.mpc else None,
               "precision": str(agent.plan_dtype).removeprefix("torch."),
               "dims": agent.dims.to_dict(), **res.summary(),
               "returns": res.returns, "lengths": res.lengths, "seconds": round(time.time() - t0, 1),
               **({"video": str(args.video)} if args.video and not res.video_error else {})}
    origin = " (imported reference TD-MPC2 checkpoint)" if imported else "" if step is None else f" (step {step:,})"
    success = f", success {summary['success_rate']:.2f}" if "success_rate" in summary else ""
    print(f"{cfg.task}{origin}: return {summary['episode_return']:.1f} ± {summary['episode_return_std']:.1f} "
          f"over {summary['episodes']} episode{'s' if summary['episodes'] != 1 else ''} (seed {seed}), length {summary['episode_length']:.0f}{success} "
          f"[{summary['seconds']}s]" + (f"\nvideo: {args.video}" if "video" in summary else "")
          + (f"\n{res.dropped} episode(s) left out: NaN or inf in an observation (--nonfinite-data drop)"
             if res.dropped else ""), flush=True)
    if res.termination is not None:
        t = res.termination
        print(f"termination head: {summary['termination_accuracy']:.4f} of {t.sum():,} transitions right; "
              f"{t[1, 1]} of {t[1].sum()} terminal steps predicted, {t[0, 1]} false alarms")
    task_name = cfg.task.replace("/", "_").replace(":", "_")  # a namespaced id (phys2d/Pendulum-v0) is one name
    report = args.report or checkpoint.with_name(report_name(task_name, seed, checkpoint, args))
    replaced = " (replaces the report that was there)" if report.is_file() else ""
    try:
        write_text_atomic(report, json_text(summary))
    except OSError as e:
        print(f"error: the report could not be written to {report} ({e.strerror or e}); the result is above. "
              f"Choose another place with --report PATH", file=sys.stderr)
        return EXIT_ERROR
    print(f"report: {report}{replaced}")
    if res.video_error:  # after the result and the report, which the episodes still gave
        print(f"error: the video could not be written: {res.video_error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
