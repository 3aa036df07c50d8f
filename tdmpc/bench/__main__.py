"""python -m tdmpc.bench: the benchmark command (cli.py)."""

import sys

from tdmpc.bench.cli import main

if __name__ == "__main__":  # not again in the processes --e2e-procs spawns
    sys.exit(main())
