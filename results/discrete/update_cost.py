"""Time one update and one plan of the cpu.json agent on a discrete task (LunarLander-v3, 4 actions) and a
continuous one (Pendulum-v1), on one thread, after 300 env steps of seeding (not part of the package).

    python results/discrete/update_cost.py        (needs the box2d extra)
"""

import json
import tempfile
import time
from pathlib import Path

import torch

from tdmpc.config import CONFIG_DIR, Config, validate
from tdmpc.training.setup import trainer_for

torch.set_num_threads(1)
base = {k: v for k, v in json.loads((CONFIG_DIR / "cpu.json").read_text()).items() if not k.startswith("_")}
for task in ("LunarLander-v3", "Pendulum-v1"):
    cfg = validate(Config(**{**base, "task": task, "device": "cpu", "seed_steps": 300, "steps": 10**6,
                             "eval_freq": 10**9, "eval_episodes": 0, "progress": False, "tensorboard": False,
                             "threads": 1}))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
        while trainer.counters.env_step < 300:
            trainer.step()
        for _ in range(3):
            trainer.agent.update(trainer.sample())
        t = time.perf_counter()
        for _ in range(10):
            trainer.agent.update(trainer.sample())
        update = (time.perf_counter() - t) / 10
        obs, first = trainer.buffer.newest()
        t = time.perf_counter()
        for _ in range(10):
            trainer.agent.act_on_device(obs, first)
        plan = (time.perf_counter() - t) / 10
        print(f"{task}: update {update * 1e3:.1f} ms, plan {plan * 1e3:.1f} ms", flush=True)
        trainer.close()
