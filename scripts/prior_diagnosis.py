"""Has a discrete checkpoint's policy prior collapsed? Plays one evaluation episode (seed 5, up to 200 steps) with
the planner and reports, over its states: the planner's actions, the prior's most probable action and mean
probabilities, Q's argmax per action and its spread.

    python scripts/prior_diagnosis.py TASK CHECKPOINT [--steps 200] [--seed 5]

Public API only: tdmpc.Agent.from_checkpoint, agent.act and the world model's encode, pi and action_values.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

import tdmpc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task")
    p.add_argument("checkpoint")
    p.add_argument("--steps", type=int, default=200, help="the most steps of the episode (default 200)")
    p.add_argument("--seed", type=int, default=5, help="the episode's reset seed (default 5)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    agent = tdmpc.Agent.from_checkpoint(args.checkpoint, device="cpu")
    m, n = agent.model, agent.dims.action_dim
    if not m.discrete:
        raise SystemExit(f"{args.checkpoint}: a continuous-action model; this diagnosis is for discrete ones")
    env = gym.make(args.task)
    obs, _ = env.reset(seed=args.seed)
    zs, acts = [], []
    for t in range(args.steps):
        a = agent.act(obs, first_step=(t == 0), eval_mode=True)
        with torch.no_grad():
            zs.append(m.encode(torch.as_tensor(obs, dtype=torch.float32)[None], None)[0])
        acts.append(int(a))
        obs, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            break
    env.close()
    z = torch.stack(zs)
    with torch.no_grad():
        probs = m.pi(z).probs  # a discrete model's prior: its probabilities
        assert probs is not None
        q = m.action_values(z, None, torch.arange(m.num_q)).mean(0)
    print(f"{args.task} {args.checkpoint}: {len(acts)} states")
    print("planner's actions      ", np.bincount(acts, minlength=n))
    print("prior's argmax          ", np.bincount(probs.argmax(-1).numpy(), minlength=n),
          "mean probabilities", probs.mean(0).numpy().round(4))
    print("Q's argmax              ", np.bincount(q.argmax(-1).numpy(), minlength=n),
          "mean Q per action", q.mean(0).numpy().round(2))
    print(f"Q: max - min over actions {float((q.max(-1).values - q.min(-1).values).mean()):.3f} (mean over states); "
          f"over states {float(q.min()):.2f} to {float(q.max()):.2f}")


if __name__ == "__main__":
    main()
