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
import shlex
import sys
from pathlib import Path

from tdmpc.config import parse_cli
from tdmpc.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, BadInput, run_cli
from tdmpc.training.flags import TrainArgs, base_config, base_note
from tdmpc.training.setup import RunRequest, open_run, run
from tdmpc.training.trainer import TrainingDiverged


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    args, cfg, base, given = parse_cli(TrainArgs, argv, base_config, prog="python -m tdmpc.train",
                                       description=__doc__.splitlines()[0], checked=False)
    named = args.auto_resume or args.resume
    for flag, given_ in (("--no-buffer", args.no_buffer), ("--config-from-checkpoint", args.config_from_checkpoint)):
        if given_ and not named:
            raise BadInput(f"{flag} applies to a resume: pass --resume RUN_DIR (or --auto-resume RUN_DIR)")
    if "run_dir" in given and named and Path(cfg.run_dir or "").resolve() != Path(named).resolve():
        flag = "--auto-resume" if args.auto_resume else "--resume"
        raise BadInput(f"{flag} {named} names the run directory; --run-dir {cfg.run_dir} names another")
    if args.auto_resume and not args.resume:
        cfg = dataclasses.replace(cfg, run_dir=args.auto_resume)
    trainer = open_run(RunRequest(cfg, resume=Path(args.resume) if args.resume else None, no_buffer=args.no_buffer,
                                  resumed_by="--auto-resume" if args.auto_resume else "--resume",
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
              f"(resume with --resume {shlex.quote(str(trainer.run_dir))})", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
