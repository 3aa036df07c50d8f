"""Which training episodes of pendulum-swingup start within the reward's 8 degrees of upright, per seed: its reward
is nonzero only there (dm_control's _ANGLE_BOUND) and random torques cannot swing the pole up, so a run's first
reward comes from such a start until its planner finds a swing. The training env is built as tdmpc.train builds
it (make_env with the run's seed, reset with the seed once, then reset at each episode's end); also 40 episodes of
uniform random actions from seed 1's first starts. python results/gpu/learning/pendulum_starts.py"""

import numpy as np

from tdmpc.envs import make_env

BOUND = np.cos(np.deg2rad(8))
EPISODES = 200

for seed in (1, 2, 3):
    env, _ = make_env("pendulum-swingup", seed=seed)
    starts = [env.reset(seed=seed)[0]] + [env.reset()[0] for _ in range(EPISODES - 1)]
    env.close()
    lucky = [i + 1 for i, obs in enumerate(starts) if obs[0] > BOUND]  # obs[0]: the pole's cosine to upright
    print(f"seed {seed}: {len(lucky)} of the first {EPISODES} episodes start within 8 degrees of upright; "
          f"episodes {lucky[:8]} (an episode is 1,000 env steps)")

env, spec = make_env("pendulum-swingup", seed=1)
rng = np.random.default_rng(0)
returns = []
for episode in range(40):
    env.reset(seed=1) if episode == 0 else env.reset()
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(rng.uniform(-1, 1, spec.action_dim).astype(np.float32))
        total, done = total + float(reward), terminated or truncated
    returns.append(total)
env.close()
print(f"seed 1, uniform random actions: returns of its first 40 episodes {sorted(set(returns))}")
