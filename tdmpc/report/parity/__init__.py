"""One update and one plan against the reference TD-MPC2's own numbers, from a fixture it wrote.

A fixture (../shared/fixtures/reference-update-ms1/, its README) holds the reference's weights, a batch, three
`_update` calls on it and four `_plan` calls, each with every random draw it made. The agent is built to match
(dims from the checkpoint, settings and episodic flag from meta.json), its draws replaced by the recorded ones
(`Recorded`, through tdmpc/model/random.py's seam), and every quantity compared with a stated tolerance.

Tolerances: the reference against itself moves by up to 1.2e-5 relative in its info values between 1 and 2
threads (the fixture's noise floor, meta.json), float32 reordering alone. Our kernels differ more than a thread
count does (fused Adam, one encoder pass for H+1 observations, fused first layers in planning), so each quantity
gets a bound a few times that floor, and a wrong formula (a scale not updated, a clip at the wrong norm) misses
it by orders of magnitude (tests/test_update_parity.py breaks both on purpose).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .compare import Check, Report, close, moved
from .fixture import FILES, Fixture, ParityError, Recorded, build_agent, read_fixture
from .plan import bf16_distance, check_plan, plan_draws, run_plans
from .update import check_update, rounding_sensitivity, run_updates, update_draws

__all__ = ["DEVIATIONS", "FILES", "Check", "Deviation", "Fixture", "ParityError", "Recorded", "Report",
           "bf16_distance", "build_agent", "check", "check_plan", "check_update", "close", "moved", "plan_draws",
           "read_fixture", "rounding_sensitivity", "run_plans", "run_updates", "update_draws"]

@dataclass(frozen=True)
class Deviation:
    """A deliberate difference from the reference (docs/deviations.md), how to turn it off, and whether a fixture
    exercises it."""

    name: str
    off: dict[str, Any]  # Config fields that give the reference's behaviour ({} when update/plan do not see it)
    exercised: Callable[[Fixture], bool]
    why_not: str  # said when a fixture does not exercise it


DEVIATIONS = (
    Deviation("policy loss masked after a terminal step", {"mask_policy_after_terminal": False},
              lambda fx: bool(fx.cfg.episodic and fx.meta.get("fixture", {}).get("terminated_columns")),
              "no terminal step in the fixture's batch"),
    Deviation("sub-trajectories sampled up to a terminal step, the steps after it masked", {},
              lambda fx: False, "the replay buffer's sampling: a fixture gives its batch"),
    Deviation("discrete actions planned one step ahead", {},
              lambda fx: False, "continuous actions (the reference has no discrete planner)"),
)


def check(path: str | Path, compile: bool = False, keep_deviations: bool = False) -> tuple[Report, list[str]]:
    """Every comparison of a fixture; the lines that say which deliberate differences were off, and bf16's distance."""
    fx = read_fixture(path, compile=compile)
    lines = []
    for dev in DEVIATIONS:
        if not dev.exercised(fx):
            lines.append(f"deviation '{dev.name}': not exercised here ({dev.why_not})")
        elif keep_deviations:
            lines.append(f"deviation '{dev.name}': kept (--keep-deviations): differences below may be it")
        else:
            fx = dataclasses.replace(fx, cfg=dataclasses.replace(fx.cfg, **dev.off))
            lines.append(f"deviation '{dev.name}': off, as the reference (results agree with the reference when it "
                         f"is off)")
    report = check_update(fx)
    plans = check_plan(fx)
    report.checks += plans.checks
    report.notes += plans.notes
    return report, lines + bf16_distance(fx)
