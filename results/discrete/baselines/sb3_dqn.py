"""rl-baselines3-zoo's tuned DQN at the env steps of RESULTS.md's discrete runs (not part of the package).

The zoo publishes one trained agent per task at its own budget (benchmark.md: CartPole-v1 50k, Acrobot-v1 and
LunarLander-v2 100k). To set a standard method beside ours at the same step count, this trains stable-baselines3's
DQN with the zoo's hyperparameters (hyperparams/dqn.yml at ce95481, the version whose budgets benchmark.md lists),
over the zoo's budget (it sets the exploration schedule), and evaluates it deterministically (10 episodes, as ours)
every `every` env steps up to `stop`: CartPole-v1 to 30k, Acrobot-v1 to 50k, LunarLander-v3 to 100k.

    python results/discrete/baselines/sb3_dqn.py TASK SEED OUT.csv     (needs stable-baselines3)
"""

import csv
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

ZOO = {  # hyperparams/dqn.yml at ce95481 (LunarLander-v2's entry for LunarLander-v3)
    "CartPole-v1": dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                        learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                        gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04),
    "Acrobot-v1": dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                       learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                       exploration_fraction=0.12, exploration_final_eps=0.1),
    "LunarLander-v3": dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                           learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4,
                           gradient_steps=-1, exploration_fraction=0.12, exploration_final_eps=0.1),
}
SCHEDULE = {"CartPole-v1": (2_500, 30_000), "Acrobot-v1": (5_000, 50_000), "LunarLander-v3": (10_000, 100_000)}


def evaluate(model: DQN, task: str, episodes: int, seed: int) -> list[float]:
    env = gym.make(task)
    returns = []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        done, ret = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(action)
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    env.close()
    return returns


class EvalEvery(BaseCallback):
    def __init__(self, task: str, every: int, stop: int, seed: int, rows: list):
        super().__init__()
        self.task, self.every, self.stop, self.seed, self.rows = task, every, stop, seed, rows
        self.t0 = time.time()

    def _record(self) -> None:
        r = evaluate(self.model, self.task, 10, 1_000_000 + 100 * self.seed)
        self.rows.append({"env_step": self.num_timesteps, "episode_return": float(np.mean(r)),
                          "episode_return_std": float(np.std(r)), "episodes": len(r),
                          "elapsed": round(time.time() - self.t0, 1)})
        print(self.task, self.seed, self.rows[-1], flush=True)

    def _on_training_start(self) -> None:
        self._record()

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every == 0:
            self._record()
        return self.num_timesteps < self.stop


def main() -> None:
    task, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    hp = dict(ZOO[task])
    budget = hp.pop("n_timesteps")
    every, stop = SCHEDULE[task]
    rows: list = []
    model = DQN("MlpPolicy", gym.make(task), policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu", **hp)
    model.learn(total_timesteps=budget, callback=EvalEvery(task, every, stop, seed, rows))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
