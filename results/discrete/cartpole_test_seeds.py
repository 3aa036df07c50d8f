"""The suite's one-minute CartPole test (tests/test_discrete.py, its CARTPOLE settings) over seeds and
uniform_prior_coef values (and plan horizons, when given): eval returns at every 500 env steps (5 episodes each).
Behind the test's docstring and its threshold (not part of the package):

    python results/discrete/cartpole_test_seeds.py STEPS COEF[,COEF...] [PLAN_HORIZON[,...]]   # e.g. 1500 0,1e-3 3,1
"""

import csv
import sys
import tempfile

import torch

sys.path.insert(0, "tests")
import tdmpc  # noqa: E402
from test_discrete import CARTPOLE  # noqa: E402

torch.set_num_threads(1)
steps, coefs = int(sys.argv[1]), [float(c) for c in sys.argv[2].split(",")]
horizons = [int(h) for h in sys.argv[3].split(",")] if len(sys.argv) > 3 else [None]  # None: the default
for seed in (1, 2, 3):
    for coef in coefs:
        for plan_horizon in horizons:
            run_dir, agent = tdmpc.fit(env="CartPole-v1", run_dir=tempfile.mkdtemp() + "/run",
                                       **{**CARTPOLE, "steps": steps, "eval_freq": 500, "eval_episodes": 5,
                                          "save_every": steps, "seed": seed, "uniform_prior_coef": coef,
                                          "plan_horizon": plan_horizon})
            returns = [round(float(r["episode_return"]), 1) for r in csv.DictReader(open(run_dir / "eval.csv"))]
            print(f"seed {seed} uniform_prior_coef {coef:g} plan_horizon {agent.cfg.plan_horizon}: {returns}",
                  flush=True)
