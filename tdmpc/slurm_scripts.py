"""`python -m tdmpc.slurm_scripts`: the command lives in tdmpc.cli.slurm_scripts."""

import sys

from tdmpc.cli.slurm_scripts import main

if __name__ == "__main__":
    sys.exit(main())
