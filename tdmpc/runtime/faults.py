"""A test hook: the process kills itself (SIGKILL, as the OOM killer or a node failure would) at a named point.

TDMPC_KILL_AT=<point>[:<n>] kills at the n-th pass (default the first) through kill_point(<point>), so a test
can stop a run in each phase on purpose (start-up, seeding, an update, an evaluation, a file write) and check
that the next start recovers. Unset, which is always outside the tests, a pass costs one comparison.
"""

from __future__ import annotations

import os
import signal

_POINT, _, _AT = os.environ.get("TDMPC_KILL_AT", "").partition(":")
_passes = 0


def kill_point(point: str) -> None:
    """Die here if TDMPC_KILL_AT names this point and this is its n-th pass."""
    global _passes
    if point != _POINT:
        return
    _passes += 1
    if _passes == int(_AT or 1):
        os.kill(os.getpid(), signal.SIGKILL)
