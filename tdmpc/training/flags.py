"""The training command's own flags (those that are not Config fields), and the config they start from: read by
tdmpc.train, and by tdmpc.reproduce to check the flags it passes on before any run starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import torch
import tyro

from tdmpc.config import CPU_CONFIG, Config, load_json
from tdmpc.errors import BadInput
from tdmpc.training import run_dir as runs


@dataclass
class TrainArgs:
    cfg: Optional[str] = None
    """JSON config: a name in configs/ (cpu.json, a4000.json) or a path. Flags below override it. Default:
    cpu.json on a machine without a GPU, else the reference settings."""
    resume: Optional[str] = None
    """Continue the run in this directory from its latest checkpoint (flags override its config.json)."""
    no_buffer: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False  # not --no-no-buffer
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
    if args.auto_resume and args.resume:
        raise BadInput(f"--resume {args.resume} and --auto-resume {args.auto_resume} both name the run to continue: "
                       f"give one (--auto-resume continues a run that has a checkpoint and starts one otherwise)")
    if args.auto_resume and runs.has_checkpoint(Path(args.auto_resume)):
        args.resume = args.auto_resume
    if args.resume:
        args.resume = str(runs.resume_dir(Path(args.resume)))
        return runs.saved_config(Path(args.resume), args.config_from_checkpoint)
    if args.cfg is not None:
        return load_json(args.cfg)
    return load_json(CPU_CONFIG) if not torch.cuda.is_available() else Config()


def base_note(args: TrainArgs, gpu_settings: str = "pass --cfg a4000.json") -> str | None:
    """The line that says where the config came from when it is not what the user named; gpu_settings: how the
    caller asks for the reference settings instead."""
    if args.resume and args.cfg is not None:
        return f"resume: --cfg {args.cfg} ignored; the run's own config.json applies (other flags still override)"
    if not args.resume and args.cfg is None and not torch.cuda.is_available():
        return (f"no GPU here: starting from the CPU default, configs/{CPU_CONFIG} ({gpu_settings} for the "
                f"reference GPU settings)")
    return None
