"""The suite's one-minute CartPole test (tests/test_discrete.py, its CARTPOLE settings) over seeds and
uniform_prior_coef values (and plan horizons, when given): eval returns at every 500 env steps (5 episodes each).
What stands behind the test's docstring and its threshold:

    python scripts/cartpole_test_seeds.py STEPS COEF[,COEF...] [PLAN_HORIZON[,...]] [--seeds 1,2,3]
    # e.g. 1500 0,1e-3 3,1

Run from a checkout (it reads the settings from tests/test_discrete.py); tdmpc.fit trains each run in a
temporary directory, removed after.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import torch

import tdmpc

TESTS = Path(__file__).resolve().parents[1] / "tests"


def cartpole_settings() -> dict:
    """tests/test_discrete.py's CARTPOLE: the test's model, planner and seeding."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from test_discrete import CARTPOLE

    return dict(CARTPOLE)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", type=int)
    p.add_argument("coefs", help="uniform_prior_coef values, comma-separated")
    p.add_argument("plan_horizons", nargs="?", default=None, help="comma-separated (default: the config's)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated (default 1,2,3)")
    p.add_argument("--eval-freq", type=int, default=500)
    p.add_argument("--eval-episodes", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    coefs = [float(c) for c in args.coefs.split(",")]
    horizons: list[int | None] = [int(h) for h in args.plan_horizons.split(",")] if args.plan_horizons else [None]
    settings = cartpole_settings()
    for seed in (int(s) for s in args.seeds.split(",")):
        for coef in coefs:
            for plan_horizon in horizons:
                with tempfile.TemporaryDirectory() as tmp:
                    run_dir, agent = tdmpc.fit(env="CartPole-v1", run_dir=Path(tmp) / "run",
                                               **{**settings, "steps": args.steps, "eval_freq": args.eval_freq,
                                                  "eval_episodes": args.eval_episodes, "save_every": args.steps,
                                                  "seed": seed, "uniform_prior_coef": coef,
                                                  "plan_horizon": plan_horizon})
                    with open(run_dir / "eval.csv", newline="") as f:
                        returns = [round(float(r["episode_return"]), 1) for r in csv.DictReader(f)]
                print(f"seed {seed} uniform_prior_coef {coef:g} plan_horizon {agent.cfg.plan_horizon}: {returns}",
                      flush=True)


if __name__ == "__main__":
    main()
