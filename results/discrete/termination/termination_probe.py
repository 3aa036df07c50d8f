"""Why does LunarLander's termination head predict none of the terminal steps? Plays E episodes (seeds 0..E-1)
with a checkpoint's policy prior (greedy) and prints, per episode, how it ended, how many of its last steps had
an observation within 0.01 of the terminal one (every entry: the lander at rest), and the head's probability
that the step ended the episode, read off the dynamics' next latent (as the planner reads it) and off the
encoded next observation (a one-off beside its logs; public API only: the world model's encode, pi, next and
termination):

    python results/discrete/termination/termination_probe.py CHECKPOINT [EPISODES]
"""

import sys

import gymnasium as gym
import numpy as np
import torch

import tdmpc

torch.set_num_threads(1)
checkpoint, episodes = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu")
m, n = agent.model, agent.dims.action_dim
terminal_p, other_p = [], []
for ep in range(episodes):
    env = gym.make("LunarLander-v3")
    obs, _ = env.reset(seed=ep)
    seen, p_dyn, p_enc = [], [], []
    while True:
        with torch.no_grad():
            z = m.encode(torch.as_tensor(obs, dtype=torch.float32)[None])
            a = int(m.pi(z).mean.argmax(-1))  # the prior's most probable action (one-hot `mean`)
            p_dyn.append(float(m.termination(m.next(z, torch.eye(n)[[a]]))))
        obs, r, term, trunc, _ = env.step(a)
        seen.append(obs.copy())
        with torch.no_grad():
            p_enc.append(float(m.termination(m.encode(torch.as_tensor(obs, dtype=torch.float32)[None]))))
        if term or trunc:
            break
    same = next((k for k in range(len(seen)) if not np.allclose(seen[-1 - k], seen[-1], rtol=0, atol=0.01)), len(seen))
    (terminal_p if term else other_p).append(p_dyn[-1])
    other_p.extend(p_dyn[:-1])
    print(f"episode {ep}: {len(seen)} steps, {'terminated' if term else 'truncated'}, last reward {r:.0f}; "
          f"the last {same} observations within 0.01 of it; p(end) at the end {p_dyn[-1]:.3f} (dynamics) "
          f"{p_enc[-1]:.3f} (encoder), max over those {same} steps {max(p_dyn[-same:]):.3f}")
print(f"p(end) off the dynamics: terminal steps max {max(terminal_p, default=float('nan')):.3f}; "
      f"other steps max {max(other_p):.3f}, above 0.5 {sum(p > 0.5 for p in other_p)} of {len(other_p)}")
