"""python -m tdmpc.plot RUN_DIR... : eval return against environment steps, several runs in one figure.

Runs with the same task and experiment name are seeds of one curve (mean, with a band
for min-max across seeds); --no-group draws every run separately.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import tyro

from tdmpc.errors import BadInput, run_cli
from tdmpc.runtime.args import parse_args
from tdmpc.report.curves import check_figure_path, draw, group_runs


@dataclass
class PlotArgs:
    runs: Annotated[tuple[Path, ...], tyro.conf.Positional]
    """Run directories (each with eval.csv and config.json)."""
    out: Path = Path("eval_return.png")
    """The figure; its extension picks the format (.png, .pdf, .svg, ...). Missing folders on its way are made, as
    for every command's output (collect --out, evaluate --report, reproduce --gather --out)."""
    group: bool = True
    """Average runs of the same task and exp_name as seeds of one curve. Each point is the mean of all of them:
    where they evaluated at different steps, each is read off the straight line between its own evaluations, and
    the curve covers only the steps that all of them reach (a line says what is left out)."""
    title: Optional[str] = None
    """The figure's title; default: none."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(PlotArgs, argv, "python -m tdmpc.plot", __doc__.splitlines()[0])

    def go() -> int:
        if not args.runs:
            raise BadInput("give one or more run directories: python -m tdmpc.plot RUN_DIR [RUN_DIR ...]")
        check_figure_path(args.out)
        out = draw(group_runs(list(args.runs), args.group), args.out, args.title,
                   remedy="; --no-group draws each run" if args.group else "")
        print(f"wrote {out}")
        return 0

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
