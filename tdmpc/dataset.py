"""`python -m tdmpc.dataset`: the command lives in tdmpc.cli.dataset."""

import sys

from tdmpc.cli.dataset import main

if __name__ == "__main__":
    sys.exit(main())
