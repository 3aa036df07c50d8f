"""`python -m tdmpc.plot`: the command lives in tdmpc.cli.plot."""

import sys

from tdmpc.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
