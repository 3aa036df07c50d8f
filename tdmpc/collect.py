"""`python -m tdmpc.collect`: the command lives in tdmpc.cli.collect."""

import sys

from tdmpc.cli.collect import main

if __name__ == "__main__":
    sys.exit(main())
