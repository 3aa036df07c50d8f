"""`python -m tdmpc.parity`: the command lives in tdmpc.cli.parity."""

import sys

from tdmpc.cli.parity import main

if __name__ == "__main__":
    sys.exit(main())
