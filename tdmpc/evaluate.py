"""`python -m tdmpc.evaluate`: the command lives in tdmpc.cli.evaluate."""

import sys

from tdmpc.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
