"""`python -m tdmpc.train`: the command lives in tdmpc.cli.train."""

import sys

from tdmpc.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
