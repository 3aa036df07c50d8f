"""Q of every action of a discrete model: the one-pass WorldModel.action_values against the one-hot loop it replaced
(n copies of [z, one-hot] through every layer), interleaved in one process on one thread, cpu.json's model on
LunarLander-v3 (4 actions) at its batch x horizon + 1 latents (not part of the package).

    python results/discrete/action_values_ab.py        (needs the box2d extra)
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
cfg = validate(Config(**{**base, "task": "LunarLander-v3", "device": "cpu", "steps": 10**6, "eval_episodes": 0,
                         "progress": False, "tensorboard": False, "threads": 1}))
with tempfile.TemporaryDirectory() as tmp:
    trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
    m, n = trainer.agent.model, trainer.agent.dims.action_dim

    def one_hot_loop(z: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        every = torch.eye(n, dtype=z.dtype).expand(*z.shape[:-1], n, n)
        zs = z.unsqueeze(-2).expand(*z.shape[:-1], n, z.shape[-1])
        return m.decode(m.Q(zs, every, None, heads, detach=True)).squeeze(-1)

    z = torch.randn(cfg.horizon + 1, cfg.batch_size, m.latent_dim)
    heads = torch.tensor([0, 1])
    with torch.no_grad():
        diff = (one_hot_loop(z, heads) - m.action_values(z, None, heads, detach=True)).abs().max().item()
    times: dict[str, list[float]] = {"one-hot loop": [], "one pass": []}
    for _ in range(30):
        for name, fn in (("one-hot loop", lambda: one_hot_loop(z, heads)),
                         ("one pass", lambda: m.action_values(z, None, heads, detach=True))):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    print(f"latents {tuple(z.shape)}, {n} actions, 2 heads; largest difference {diff:.2e}")
    for name, ts in times.items():
        print(f"{name}: median {sorted(ts)[len(ts) // 2] * 1e3:.1f} ms over {len(ts)} calls")
    trainer.close()
