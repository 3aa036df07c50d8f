"""python -m tdmpc.slurm_scripts [--copy DIR]: where the packaged Slurm scripts are, or a copy to submit from.

The scripts write their logs to slurm/logs/ under the directory you submit from, so submit
from a directory holding slurm/ (the repository, or one made with --copy):

    python -m tdmpc.slurm_scripts --copy .      # ./slurm/train.sh, sweep.sh, local_cluster.sh, logs/
    sbatch slurm/train.sh --cfg a4000.json --task walker-walk

--check-job and --check-sweep are the scripts' own checks of the train arguments after --
(one line, exit 2, when one is refused), run by train.sh at a job's start and by sweep.sh before it submits.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tdmpc.errors import EXIT_OK, BadInput, run_cli
from tdmpc.runtime.args import flag_names, parse_args
from tdmpc.runtime.files import shipped_dir

SCRIPTS = shipped_dir("slurm")
# The scripts choose the run directory, the same after every requeue, and resume there: a flag naming
# another would train where the requeued job never looks (as tdmpc.reproduce refuses --run-dir after --).
RUN_DIR_FLAGS = ("--run-dir", "--resume", "--auto-resume")
SWEEP_FLAGS = ("--task", "--tasks", "--seed")  # sweep.sh gives each element its own


@dataclass
class SlurmArgs:
    copy: Optional[Path] = None
    """Copy the scripts to DIR/slurm (with an empty logs/ folder) instead of printing where they are."""
    check_job: bool = False
    """Check slurm/train.sh's train arguments (after --) and exit: train.sh runs this first."""
    check_sweep: Optional[tuple[str, ...]] = None
    """TASK [TASK ...]: check slurm/sweep.sh's tasks and, for each, the train arguments after -- as tdmpc.train
    will read them, and exit: sweep.sh runs this before it submits."""
    sbatch_options: tuple[str, ...] = ()
    """With --check-sweep: the names (without --) of the options sweep.sh passes to sbatch, refused where one is
    a tdmpc.train flag put before -- by mistake (sbatch would refuse it, or take --threads as --threads-per-core)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parse_args(SlurmArgs, argv, "python -m tdmpc.slurm_scripts", __doc__.splitlines()[0])
    return run_cli(lambda: _main(args, train_args))


def _main(args: SlurmArgs, train_args: list[str]) -> int:
    if sum((args.copy is not None, args.check_job, args.check_sweep is not None)) > 1:
        raise BadInput("give one of --copy, --check-job and --check-sweep")
    if args.check_job:
        check_job(train_args)
        return EXIT_OK
    if args.check_sweep is not None:
        check_sweep(list(args.check_sweep), train_args, args.sbatch_options)
        return EXIT_OK
    if args.sbatch_options:
        raise BadInput("--sbatch-options go with --check-sweep")
    if train_args:
        raise BadInput("train arguments after -- go with --check-job or --check-sweep")
    if args.copy is None:
        print(SCRIPTS)
        return EXIT_OK
    target = args.copy / "slurm"
    clashes = [p.name for p in SCRIPTS.glob("*.sh") if (target / p.name).exists()]
    if clashes:
        raise BadInput(f"{target} already holds {', '.join(sorted(clashes))}; nothing was copied")
    (target / "logs").mkdir(parents=True, exist_ok=True)
    for script in sorted(SCRIPTS.glob("*.sh")):
        shutil.copy2(script, target / script.name)
    print(f"copied {', '.join(p.name for p in sorted(SCRIPTS.glob('*.sh')))} to {target}; submit from "
          f"{args.copy}: sbatch slurm/train.sh --cfg a4000.json --task walker-walk")
    return EXIT_OK


def check_job(train_args: list[str]) -> None:
    """slurm/train.sh's arguments: no flag that names the run directory."""
    for flag in flag_names(train_args):
        if flag in RUN_DIR_FLAGS:
            raise BadInput(f"{flag} in train.sh's arguments: the job trains in its own run directory, "
                           f"$TDMPC_RUNS/slurm/<job name>/<job id> (TDMPC_RUNS defaults to runs), where a requeue "
                           f"resumes it; set TDMPC_RUNS before sbatch to choose the root, or TDMPC_RUN_DIR for the "
                           f"directory itself (an earlier job's, to resume its run)")


def check_sweep(tasks: list[str], train_args: list[str], sbatch_options: tuple[str, ...] = ()) -> None:
    """slurm/sweep.sh's tasks and train arguments, before anything is submitted: a typo is one line now, not a
    failure of every array element once it has waited in the queue (tdmpc.reproduce --slurm checks the same).
    sbatch_options: the names of the options before --, which sweep.sh passes to sbatch."""
    import dataclasses

    from tdmpc.config import FIELD_NAMES
    from tdmpc.training.flags import TrainArgs

    train_flags = {n.replace("_", "-") for n in (*FIELD_NAMES, *(f.name for f in dataclasses.fields(TrainArgs)))}
    for name in sbatch_options:
        if name in train_flags or name.startswith("no-") and name[3:] in train_flags:
            raise BadInput(f"--{name} before --: it is a tdmpc.train flag, so it goes after -- (sweep.sh passes "
                           f"the options before -- to sbatch)")
    for flag in flag_names(train_args):
        if flag in SWEEP_FLAGS:
            raise BadInput(f"{flag} after --: the sweep gives each element its task and seed (--tasks, --seeds "
                           f"before --)")
        if flag in RUN_DIR_FLAGS:
            raise BadInput(f"{flag} after --: each element trains in its own run directory, "
                           f"$TDMPC_RUNS/slurm/<name>/<array job id>/<task>/seed<seed> (TDMPC_RUNS defaults to "
                           f"runs), where a requeue resumes it; set TDMPC_RUNS to choose the root, or TDMPC_RUN_DIR "
                           f"for the folder holding <task>/seed<seed>")
    from tdmpc.config import parse_cli  # the envs: only once the flags above pass
    from tdmpc.envs.names import resolve_task
    from tdmpc.training.flags import base_config

    for task in tasks:  # every task before any flag: a typo in the last task is named as such
        resolve_task(task)
    for task in tasks:  # train.sh puts --task last, so that it wins over a config's
        parse_cli(TrainArgs, [*train_args, "--task", task], base_config, prog="python -m tdmpc.train")


if __name__ == "__main__":
    sys.exit(main())
