"""Why do CartPole episodes end? Plays the checkpoint (eval mode, as evaluation does) and reports, per episode,
its length and the state at the end: cart position beyond 2.4 or pole angle beyond 12 degrees (a one-off beside
cartpole-episode-ends.log; public API only).

    python results/discrete/sampled-bootstrap/episode_ends.py CHECKPOINT EPISODES [THREADS] [prior]
    OVER='{"temperature": 10}' python results/discrete/sampled-bootstrap/episode_ends.py ...   (Config overrides)
"""
import sys
import numpy as np, torch, gymnasium as gym
import tdmpc
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
import os, json
over = json.loads(os.environ.get("OVER", "{}"))
agent = tdmpc.Agent.from_checkpoint(sys.argv[1], device="cpu", mpc=len(sys.argv) <= 4 or sys.argv[4] != "prior", **over)
episodes = int(sys.argv[2])
env = gym.make("CartPole-v1")
ends = []
for ep in range(episodes):
    obs, _ = env.reset(seed=1000 + ep)
    first, steps, xs = True, 0, []
    while True:
        a = agent.act(obs.astype(np.float32), first_step=first, eval_mode=True, role="diag")
        first = False
        obs, r, term, trunc, _ = env.step(a)
        steps += 1
        xs.append(obs[0])
        if term or trunc:
            break
    x, theta = obs[0], obs[2]
    why = "truncated (500)" if trunc and not term else ("cart out (|x|>2.4)" if abs(x) > 2.4 else "pole fell (|theta|>12deg)")
    ends.append(why)
    print(f"episode {ep}: {steps} steps, {why}; final x {x:+.2f}, theta {np.degrees(theta):+.1f} deg, mean x {np.mean(xs):+.2f}")
from collections import Counter
print(Counter(ends))
