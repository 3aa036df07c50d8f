"""Is a discrete checkpoint's planner worse than what its own model knows? Plays the same evaluation episodes
(seeds 0..E-1, in parallel) with policies that read the same world model, all acting greedily (not part of the
package):

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
    the mean of symexp over the bins,
    E[symexp(b)], where the model decodes symexp(E[b]) (as the reference does): the two differ where the predicted
    distribution is spread (noisy rewards), symexp(E[b]) shrinking rare large values towards 0

    python results/discrete/planner_diagnosis.py TASK CHECKPOINT [EPISODES] [--no-mppi] [--decode-mean[=reward]]
        [--policies=prior,q,...]
"""

import itertools
import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch

import tdmpc
from tdmpc.model.twohot import symexp

torch.set_num_threads(1)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
task, checkpoint = args[0], args[1]
episodes = int(args[2]) if len(args) > 2 else 10
agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu")
m, n, H = agent.model, agent.dims.action_dim, agent.cfg.horizon  # the fp32 model that training updates
prior_agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu", mpc=False)
decode_mean = next((a.split("=")[1] if "=" in a else "all" for a in sys.argv if a.startswith("--decode-mean")), None)


def mean_decode(logits: torch.Tensor) -> torch.Tensor:
    """E[symexp(b)] over the two-hot bins b, where the model decodes symexp(E[b])."""
    return (torch.softmax(logits.float(), -1) * symexp(agent.model.two_hot.bins)).sum(-1, keepdim=True)


decode_reward = mean_decode if decode_mean else m.decode
if decode_mean == "all":
    m.two_hot.decode = mean_decode
gamma = float(agent.discount)
heads = torch.arange(m.num_q)


def sequences(h: int) -> torch.Tensor:
    """Every sequence of h actions, one-hot: (n^h, h, n)."""
    return torch.eye(n)[torch.tensor(list(itertools.product(range(n), repeat=h)))]


@torch.no_grad()
def values(z: torch.Tensor) -> torch.Tensor:
    """(B, n) Q of each action, mean over every head."""
    return m.action_values(z, None, heads).mean(0)


@torch.no_grad()
def lookahead(z: torch.Tensor, h: int = H, terminations: bool = True, blend: bool = False) -> torch.Tensor:
    """(B,) first action of the best of the n^h sequences, scored as LatentMPPI._value scores a candidate
    (terminations=False: every candidate bootstraps, whatever the termination head says)."""
    seqs = sequences(h)
    B, S = z.shape[0], seqs.shape[0]
    z = z.unsqueeze(1).expand(B, S, -1)
    G, alive = torch.zeros(B, S, 1), torch.ones(B, S, 1)
    estimates = []  # blend: the t-step estimates G_t + gamma^t Q(z_t, a_t), t < h
    for t in range(h):
        a = seqs[:, t].expand(B, S, n)
        if blend:
            estimates.append(G + gamma ** t * alive * (values(z) * a).sum(-1, keepdim=True))
        G = G + gamma ** t * alive * decode_reward(m.reward(z, a))
        z = m.next(z, a)
        if m.episodic and terminations:
            alive = alive * (m.termination(z) <= 0.5).float()
    probs = m._pi(z).float().softmax(-1)
    score = G + gamma ** h * alive * (probs * values(z)).sum(-1, keepdim=True)
    if blend:
        score = torch.stack(estimates + [score]).mean(0)
    return seqs[score.squeeze(-1).argmax(1), 0].argmax(-1)


variants: dict[str, tdmpc.Agent] = {}


def planner(policy: str) -> tdmpc.Agent:
    """The agent for mppi:K=V;K=V, built once: numbers parsed as JSON, the rest kept as strings."""
    if policy not in variants:
        pairs = dict(kv.split("=") for kv in policy.removeprefix("mppi:").split(";"))
        typed = {k: json.loads(v) if v[:1].isdigit() or v[:1] == "-" else v for k, v in pairs.items()}
        variants[policy] = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu", **typed)
    return variants[policy]


def act(policy: str, obs: np.ndarray, first: bool) -> np.ndarray:
    if policy.startswith("mppi:"):
        return np.asarray(planner(policy).act(obs, first_step=first, eval_mode=True))
    if policy in ("mppi", "prior-act"):
        return np.asarray((agent if policy == "mppi" else prior_agent).act(obs, first_step=first, eval_mode=True))
    with torch.no_grad():
        z = m.encode(torch.as_tensor(obs, dtype=torch.float32), None)
        if policy == "prior":
            return m._pi(z).argmax(-1).numpy()
        if policy == "q":
            return values(z).argmax(-1).numpy()
        h = int(policy.removeprefix("lookahead").split("-")[0] or H)  # lookahead, lookahead2, lookahead3-noterm
        return lookahead(z, h, not policy.endswith("-noterm"), policy.endswith("-blend")).numpy()


def play(policy: str) -> tuple[list[float], list[int], float]:
    envs = [gym.make(task) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=i)[0] for i, e in enumerate(envs)])
    ret, length, done = np.zeros(episodes), np.zeros(episodes, int), np.zeros(episodes, bool)
    t0, first = time.time(), True
    while not done.all():
        a = act(policy, obs, first)  # every env planned each step (a finished one's action is ignored): static N
        first = False
        for i, e in enumerate(envs):
            if done[i]:
                continue
            o, r, term, trunc, _ = e.step(int(a[i]))
            obs[i], ret[i], length[i], done[i] = o, ret[i] + r, length[i] + 1, term or trunc
    return ret.tolist(), length.tolist(), time.time() - t0


print(f"{task} {checkpoint}: horizon {H}, {n} actions, discount {gamma:.4f}, {episodes} episodes (seeds 0-"
      f"{episodes - 1})")
chosen = next((a.removeprefix("--policies=").split(",") for a in sys.argv if a.startswith("--policies=")),
              ["prior", "q", "lookahead"] + ([] if "--no-mppi" in sys.argv else ["mppi"]))
for policy in chosen:
    returns, lengths, seconds = play(policy)
    print(f"{policy:10s} return {np.mean(returns):7.1f} ± {np.std(returns):5.1f}  length {np.mean(lengths):6.1f}  "
          f"[{seconds:.0f}s]  returns {[round(r) for r in returns]}", flush=True)
