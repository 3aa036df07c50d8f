"""python -m tdmpc.parity DIR: one update and one plan against the numbers the reference TD-MPC2 wrote into DIR.

DIR is a fixture in the format of ../shared/fixtures/reference-update-ms1 (its README): the reference's weights, a
batch, its _update and _plan calls with every random draw. The agent is built from the fixture's meta.json and
checkpoint, given the same draws, and each quantity is printed with its largest absolute and relative difference
and its tolerance. Exit 0 when all are inside, 1 when not, 2 for a directory that is not such a fixture.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from tdmpc.errors import run_cli
from tdmpc.runtime.args import parse_args


@dataclass
class ParityArgs:
    fixture: Annotated[Path, tyro.conf.Positional]
    """A fixture directory (meta.json, checkpoint_before.pt, batch.pt, update_io.pt, plan_io.pt, ...)."""
    compile: bool = False
    """Run update() and plan() through torch.compile, as --compile trains."""
    keep_deviations: bool = False
    """Keep this package's deliberate differences from the reference on (docs/deviations.md) where the fixture
    exercises them, instead of turning them off to compare."""
    sensitivity: bool = False
    """Also measure how much the weights after the updates hang on float32 rounding here (the updates rerun from
    start weights moved by about one ulp), the scale against which the weights' tolerance is set."""
    threads: int = 1
    """torch's CPU threads (the fixtures are written with one)."""
    failures_only: bool = False
    """Print only the quantities outside their tolerance (and the summary)."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(ParityArgs, argv, "python -m tdmpc.parity", __doc__.splitlines()[0])

    def go() -> int:
        from tdmpc.report.parity import ParityError, check, read_fixture, rounding_sensitivity
        from tdmpc.runtime.device import set_threads

        set_threads(args.threads)
        try:
            report, lines = check(args.fixture, compile=args.compile, keep_deviations=args.keep_deviations)
        except ParityError as e:
            print(f"FAIL: {e}")
            return 1
        if args.sensitivity:
            lines += rounding_sensitivity(read_fixture(args.fixture))
        for line in lines:
            print(line)
        for note in report.notes:
            print(f"note: {note}")
        for c in report.checks:
            if not (args.failures_only and c.ok):
                print(c.line())
        failed = report.failed()
        print(f"{len(report.checks) - len(failed)} of {len(report.checks)} quantities inside their tolerance"
              + (f"; outside: {', '.join(c.name for c in failed[:5])}{' ...' if len(failed) > 5 else ''}"
                 if failed else ": agrees with the reference"))
        return 0 if not failed else 1

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
