"""python -m tdmpc.train --cfg cpu.json: online TD-MPC2 training with evaluation, checkpoints, exact resume.

Steps are environment steps, action repeat included (the convention of published curves).
SIGTERM, SIGINT or SIGUSR1 finish the current step, write a checkpoint and exit with code 3.
Before starting, the peak device memory is estimated (tdmpc.memory) and checked against the
card; running out of device memory anyway writes a checkpoint and exits with code 1.

The flags become a RunRequest for the one setup pipeline (tdmpc.training.setup), which Python's
tdmpc.fit(...) uses too: `run_dir, agent = tdmpc.fit(env="Pendulum-v1", steps=20_000, model_size=1)`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from tdmpc.config import CPU_CONFIG, Config, load_json, parse_cli
from tdmpc.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, BadInput, run_cli
from tdmpc.training import run_dir as runs
from tdmpc.training.setup import RunRequest, open_run, run
from tdmpc.training.trainer import TrainingDiverged


@dataclass
class TrainArgs:
    cfg: Optional[str] = None
    """JSON config: a name in configs/ (cpu.json, a4000.json) or a path. Flags below override it. Default:
    cpu.json on a machine without a GPU, else the reference settings."""
    resume: Optional[str] = None
    """Continue the run in this directory from its latest checkpoint (flags override its config.json)."""
    no_buffer: bool = False
    """With --resume: leave the saved replay buffer (damaged or missing, say) aside and refill it by acting."""
    config_from_checkpoint: bool = False
    """With --resume: take the config the checkpoint holds (when config.json is damaged or missing)."""
    auto_resume: Optional[str] = None
    """Resume the run in this directory if it holds a checkpoint, else start one there: one command for every
    (re)start of a job (torchrun restarts, requeued jobs)."""
    init_from: Optional[str] = None
    """Start from these weights: a tdmpc checkpoint or a reference TD-MPC2 one."""
    dry_run: bool = False
    """Print the peak memory estimate (a breakdown) and a verdict for this device or --gpu-mem, and exit
    without training."""
    gpu_mem: Optional[str] = None
    """Plan memory for a card of this size instead of the detected one: 16GB, 16000MB, 8GiB (GB = 10^9
    bytes, GiB = 2^30). Budget = that less a 10% safety margin. On a larger GPU the run's allocator is also
    capped at this size, so a config that would not fit the smaller card runs out of memory here too."""
    fit_memory: bool = False
    """When the estimate exceeds the budget, lower settings until it fits, logging each change, in this
    order: 1. buffer_device device -> host; 2. CUDA graphs off; 3. halve num_envs (not on resume);
    4. halve batch_size (not below 64); 5. halve num_samples (not below 256); 6. the next smaller
    model_size (not on resume). Without it, the run stops and says what to lower."""


def base_config(args: TrainArgs) -> Config:
    """What the flags override: the run's own config.json (--resume), a --cfg file, or the default for
    this machine (base_note says which)."""
    if args.auto_resume and runs.checkpoint_path(Path(args.auto_resume)).is_file():
        args.resume = args.auto_resume
    if args.resume:
        return runs.saved_config(Path(args.resume), args.config_from_checkpoint)
    if args.cfg is not None:
        return load_json(args.cfg)
    return load_json(CPU_CONFIG) if not torch.cuda.is_available() else Config()


def base_note(args: TrainArgs) -> str | None:
    """The line that says where the config came from when it is not what the user named."""
    if args.resume and args.cfg is not None:
        return f"resume: --cfg {args.cfg} ignored; the run's own config.json applies (other flags still override)"
    if not args.resume and args.cfg is None and not torch.cuda.is_available():
        return (f"no GPU here: starting from the CPU default, configs/{CPU_CONFIG} (pass --cfg a4000.json for "
                f"the reference GPU settings)")
    return None


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    args, cfg, base, given = parse_cli(TrainArgs, argv, base_config, prog="python -m tdmpc.train",
                                       description=__doc__.splitlines()[0])
    named = args.auto_resume or args.resume
    if "run_dir" in given and named and Path(cfg.run_dir or "").resolve() != Path(named).resolve():
        flag = "--auto-resume" if args.auto_resume else "--resume"
        raise BadInput(f"{flag} {named} names the run directory; --run-dir {cfg.run_dir} names another")
    if args.auto_resume and not args.resume:
        cfg = dataclasses.replace(cfg, run_dir=args.auto_resume)
    trainer = open_run(RunRequest(cfg, resume=Path(args.resume) if args.resume else None, no_buffer=args.no_buffer,
                                  init_from=args.init_from, given=frozenset(given),
                                  base=base if args.resume else None, gpu_mem=args.gpu_mem,
                                  fit_memory=args.fit_memory, dry_run=args.dry_run, notes=(base_note(args),)))
    if trainer is None:  # a dry run
        return EXIT_OK
    try:
        return run(trainer)
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # a second Ctrl-C: the first asked for a checkpoint, this one stops at once
        print(f"error: interrupted again, so stopped at once without a new checkpoint; {trainer.last_checkpoint()} "
              f"(resume with --resume {trainer.run_dir})", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
