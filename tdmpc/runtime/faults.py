"""A test hook: the process kills itself (SIGKILL, as the OOM killer or a node failure would) at a named point.

TDMPC_KILL_AT=<point>[:<n>] kills at the n-th pass (default the first) through kill_point(<point>), so a test
can stop a run in each phase on purpose (start-up, seeding, an update, an evaluation, a file write) and check
that the next start recovers. <point>:<n>:<SIGNAL> (TERM, INT, USR1) sends that signal instead, as a scheduler or
a Ctrl-C would at that very moment; several, comma-separated, each at its own point (a stop signal, then a
second one in the shutdown the first one started). Unset, which is always outside the tests, a pass costs one
lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter


def _parse(spec: str) -> dict[str, list[tuple[int, str]]]:
    points: dict[str, list[tuple[int, str]]] = {}
    for item in filter(None, spec.split(",")):
        point, _, rest = item.partition(":")
        at, _, name = rest.partition(":")
        points.setdefault(point, []).append((int(at or 1), f"SIG{(name or 'KILL').upper().removeprefix('SIG')}"))
    return points


_POINTS = _parse(os.environ.get("TDMPC_KILL_AT", ""))
_passes: Counter[str] = Counter()


def kill_point(point: str) -> None:
    """Die here (or send the named signal) if TDMPC_KILL_AT names this point and this is its n-th pass."""
    if point not in _POINTS:
        return
    _passes[point] += 1
    for at, name in _POINTS[point]:
        if _passes[point] == at:
            os.kill(os.getpid(), getattr(signal, name))
