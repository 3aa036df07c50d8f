"""Is a discrete checkpoint's planner worse than what its own model knows? Plays the same evaluation episodes
(seeds 0..E-1, in parallel) with policies that read the same world model, all acting greedily:

    prior      the policy prior's most probable action (evaluate --no-mpc)
    q          argmax over actions of Q(z, a), the mean over every head
    lookahead  every one of the n^H action sequences rolled out in the model, scored as the planner scores them
               (discounted rewards until a predicted termination, then the prior's expected Q after the horizon,
               mean over every head); the first action of the best. MPPI's answer if it found the best sequence.
    mppi       agent.act(eval_mode=True): the planner as trained (slow; --no-mppi leaves it out)
    mppi:K=V;K=V  the planner with those Config fields overridden (mppi:plan_horizon=1;temperature=0.05; the
               planner looks plan_horizon steps ahead: overriding horizon moves it only where plan_horizon is unset)

    lookaheadH, lookaheadH-noterm, lookaheadH-blend: the same over H steps; without termination masking; scored
               by the mean of the t-step estimates G_t + gamma^t Q(z_t, a_t) for t < H and the H-step one

    prior-act  agent.act(eval_mode=True) with mpc=False: `prior` through the acting path (its planning copy of the
               model, bf16 where the CPU has AVX512-BF16 and precision is 'auto'), as evaluate --no-mpc acts

    --decode-mean[=reward]: the fp32 model's two-hot outputs (rewards and Q; =reward: rewards alone) decoded as
    the mean of symexp over the bins, E[symexp(b)], where the model decodes symexp(E[b]) (as the reference does):
    the two differ where the predicted distribution is spread (noisy rewards), symexp(E[b]) shrinking rare large
    values towards 0. It applies to this script's own policies (q, lookahead...), not to agent.act's (mppi,
    prior-act), which plan with the model as it is.

    python scripts/planner_diagnosis.py TASK CHECKPOINT [EPISODES] [--no-mppi] [--decode-mean[=reward]]
        [--policies=prior,q,...]

Public API only: tdmpc.Agent.from_checkpoint, agent.act and the world model's encode, next, reward, termination,
pi, Q, action_values and decode.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

import tdmpc
from tdmpc.model.twohot import symexp


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task")
    p.add_argument("checkpoint")
    p.add_argument("episodes", nargs="?", type=int, default=10)
    p.add_argument("--no-mppi", action="store_true", help="leave mppi out of the default policies")
    p.add_argument("--decode-mean", nargs="?", const="all", choices=["all", "reward"], default=None)
    p.add_argument("--policies", default=None, help="comma-separated (default: prior,q,lookahead,mppi)")
    return p.parse_args(argv)


class Diagnosis:
    """The policies that read one checkpoint's fp32 world model (the one training updates)."""

    def __init__(self, checkpoint: str, decode_mean: str | None):
        self.checkpoint = checkpoint
        self.agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu")
        self.prior_agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu", mpc=False)
        m = self.m = self.agent.model
        if not m.discrete:
            raise SystemExit(f"{checkpoint}: a continuous-action model; this diagnosis is for discrete ones")
        self.n, self.H = self.agent.dims.action_dim, self.agent.cfg.horizon
        self.gamma = float(self.agent.discount)
        self.heads = torch.arange(m.num_q)
        self.decode_mean = decode_mean
        self.decode_reward: Callable[[torch.Tensor], torch.Tensor] = self.mean_decode if decode_mean else m.decode
        self.variants: dict[str, tdmpc.Agent] = {}

    def mean_decode(self, logits: torch.Tensor) -> torch.Tensor:
        """E[symexp(b)] over the two-hot bins b, where the model decodes symexp(E[b])."""
        return (torch.softmax(logits.float(), -1) * symexp(self.m.two_hot.bins)).sum(-1, keepdim=True)

    def sequences(self, h: int) -> torch.Tensor:
        """Every sequence of h actions, one-hot: (n^h, h, n)."""
        return torch.eye(self.n)[torch.tensor(list(itertools.product(range(self.n), repeat=h)))]

    @torch.no_grad()
    def values(self, z: torch.Tensor) -> torch.Tensor:
        """(..., n) Q of each action, mean over every head (--decode-mean: each action's logits decoded as the
        mean, through WorldModel.Q with the n one-hot actions)."""
        if self.decode_mean != "all":
            return self.m.action_values(z, None, self.heads).mean(0)
        every = torch.eye(self.n, dtype=z.dtype).expand(*z.shape[:-1], self.n, self.n)
        zs = z.unsqueeze(-2).expand(*z.shape[:-1], self.n, z.shape[-1])
        return self.mean_decode(self.m.Q(zs, every, None, self.heads)).squeeze(-1).mean(0)

    @torch.no_grad()
    def probs(self, z: torch.Tensor) -> torch.Tensor:
        """The policy prior's probabilities of the n actions (WorldModel.pi of a discrete model)."""
        probs = self.m.pi(z).probs
        assert probs is not None
        return probs

    @torch.no_grad()
    def lookahead(self, z: torch.Tensor, h: int, terminations: bool = True, blend: bool = False) -> torch.Tensor:
        """(B,) first action of the best of the n^h sequences, scored as the planner scores a candidate
        (terminations=False: every candidate bootstraps, whatever the termination head says)."""
        m, n, gamma = self.m, self.n, self.gamma
        seqs = self.sequences(h)
        B, S = z.shape[0], seqs.shape[0]
        z = z.unsqueeze(1).expand(B, S, -1)
        G, alive = torch.zeros(B, S, 1), torch.ones(B, S, 1)
        estimates = []  # blend: the t-step estimates G_t + gamma^t Q(z_t, a_t), t < h
        for t in range(h):
            a = seqs[:, t].expand(B, S, n)
            if blend:
                estimates.append(G + gamma ** t * alive * (self.values(z) * a).sum(-1, keepdim=True))
            G = G + gamma ** t * alive * self.decode_reward(m.reward(z, a))
            z = m.next(z, a)
            if m.episodic and terminations:
                alive = alive * (m.termination(z) <= 0.5).float()
        score = G + gamma ** h * alive * (self.probs(z) * self.values(z)).sum(-1, keepdim=True)
        if blend:
            score = torch.stack(estimates + [score]).mean(0)
        return seqs[score.squeeze(-1).argmax(1), 0].argmax(-1)

    def planner(self, policy: str) -> tdmpc.Agent:
        """The agent for mppi:K=V;K=V, built once: numbers parsed as JSON, the rest kept as strings."""
        if policy not in self.variants:
            pairs = dict(kv.split("=") for kv in policy.removeprefix("mppi:").split(";"))
            typed = {k: json.loads(v) if v[:1].isdigit() or v[:1] == "-" else v for k, v in pairs.items()}
            self.variants[policy] = tdmpc.Agent.from_checkpoint(self.checkpoint, device="cpu", **typed)
        return self.variants[policy]

    def act(self, policy: str, obs: np.ndarray, first: bool) -> np.ndarray:
        if policy.startswith("mppi:"):
            return np.asarray(self.planner(policy).act(obs, first_step=first, eval_mode=True))
        if policy in ("mppi", "prior-act"):
            agent = self.agent if policy == "mppi" else self.prior_agent
            return np.asarray(agent.act(obs, first_step=first, eval_mode=True))
        with torch.no_grad():
            z = self.m.encode(torch.as_tensor(obs, dtype=torch.float32), None)
            if policy == "prior":
                return self.probs(z).argmax(-1).numpy()
            if policy == "q":
                return self.values(z).argmax(-1).numpy()
            if not policy.startswith("lookahead"):
                raise SystemExit(f"unknown policy {policy!r}")
            h = int(policy.removeprefix("lookahead").split("-")[0] or self.H)  # lookahead, lookahead2, ...-noterm
            return self.lookahead(z, h, not policy.endswith("-noterm"), policy.endswith("-blend")).numpy()

    def play(self, task: str, policy: str, episodes: int) -> tuple[list[float], list[int], float]:
        envs = [gym.make(task) for _ in range(episodes)]
        obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(envs)])
        ret, length, done = np.zeros(episodes), np.zeros(episodes, int), np.zeros(episodes, bool)
        t0, first = time.time(), True
        while not done.all():
            a = self.act(policy, obs, first)  # every env planned each step (a finished one's is ignored): static N
            first = False
            for i, e in enumerate(envs):
                if done[i]:
                    continue
                o, r, term, trunc, _ = e.step(int(a[i]))
                obs[i], ret[i], length[i], done[i] = o, ret[i] + r, length[i] + 1, term or trunc
        for e in envs:
            e.close()
        return ret.tolist(), length.tolist(), time.time() - t0


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    d = Diagnosis(args.checkpoint, args.decode_mean)
    print(f"{args.task} {args.checkpoint}: horizon {d.H}, {d.n} actions, discount {d.gamma:.4f}, {args.episodes} "
          f"episodes (seeds 0-{args.episodes - 1})")
    chosen = (args.policies.split(",") if args.policies
              else ["prior", "q", "lookahead"] + ([] if args.no_mppi else ["mppi"]))
    for policy in chosen:
        returns, lengths, seconds = d.play(args.task, policy, args.episodes)
        print(f"{policy:10s} return {np.mean(returns):7.1f} ± {np.std(returns):5.1f}  length {np.mean(lengths):6.1f}"
              f"  [{seconds:.0f}s]  returns {[round(r) for r in returns]}", flush=True)


if __name__ == "__main__":
    main()
