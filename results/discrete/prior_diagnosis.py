"""Has a discrete checkpoint's policy prior collapsed? Plays one evaluation episode (seed 5, up to 200 steps) with
the planner and reports, over its states: the planner's actions, the prior's most probable action and mean
probabilities, Q's argmax per action and its spread (not part of the package).

    python results/discrete/prior_diagnosis.py TASK CHECKPOINT
"""

import sys

import gymnasium as gym
import numpy as np
import torch

import tdmpc

torch.set_num_threads(1)
task, checkpoint = sys.argv[1], sys.argv[2]
agent = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu")
m, n = agent.model, agent.dims.action_dim
env = gym.make(task)
obs, _ = env.reset(seed=5)
zs, acts = [], []
for t in range(200):
    a = agent.act(obs, first_step=(t == 0), eval_mode=True)
    with torch.no_grad():
        zs.append(m.encode(torch.as_tensor(obs, dtype=torch.float32)[None], None)[0])
    acts.append(int(a))
    obs, _, term, trunc, _ = env.step(int(a))
    if term or trunc:
        break
z = torch.stack(zs)
with torch.no_grad():
    probs = m._pi(z).float().softmax(-1)
    q = m.action_values(z, None, torch.arange(m.num_q)).mean(0)
print(f"{task} {checkpoint}: {len(acts)} states")
print("planner's actions      ", np.bincount(acts, minlength=n))
print("prior's argmax          ", np.bincount(probs.argmax(-1).numpy(), minlength=n),
      "mean probabilities", probs.mean(0).numpy().round(4))
print("Q's argmax              ", np.bincount(q.argmax(-1).numpy(), minlength=n),
      "mean Q per action", q.mean(0).numpy().round(2))
print(f"Q: max - min over actions {float((q.max(-1).values - q.min(-1).values).mean()):.3f} (mean over states); "
      f"over states {float(q.min()):.2f} to {float(q.max()):.2f}")
