"""python -m tdmpc.slurm_scripts [--copy DIR]: where the packaged Slurm scripts are, or a copy to submit from.

The scripts write their logs to slurm/logs/ under the directory you submit from, so submit
from a directory holding slurm/ (the repository, or one made with --copy):

    python -m tdmpc.slurm_scripts --copy .      # ./slurm/train.sh, sweep.sh, local_cluster.sh, logs/
    sbatch slurm/train.sh --cfg a4000.json --task walker-walk
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tdmpc.errors import EXIT_OK, BadInput, parse_args, run_cli
from tdmpc.runtime.files import shipped_dir

SCRIPTS = shipped_dir("slurm")


@dataclass
class SlurmArgs:
    copy: Optional[Path] = None
    """Copy the scripts to DIR/slurm (with an empty logs/ folder) instead of printing where they are."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(SlurmArgs, argv, "python -m tdmpc.slurm_scripts", __doc__.splitlines()[0])
    return run_cli(lambda: _main(args))


def _main(args: SlurmArgs) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
