"""`python -m tdmpc.reproduce`: the command lives in tdmpc.cli.reproduce."""

import sys

from tdmpc.cli.reproduce import main

if __name__ == "__main__":
    sys.exit(main())
