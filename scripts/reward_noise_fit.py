"""How noisy is a discrete run's reward given (observation, action)? A supervised 2x512 Mish MLP fitted to a
replay buffer file's transitions (<run_dir>/checkpoints/buffer_<step>.h5: Huber loss, Adam, 6,000 steps of 512
rows), its MAE on 8,000 held-out rows, printed every 2,000 steps. A floor for the world model's reward head: what
a network reaches on the observation and action alone.

    python scripts/reward_noise_fit.py BUFFER_FILE [--steps 6000] [--held-out 8000] [--env 0]

Reads the file with h5py alone (no checkpoint).
"""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import torch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("buffer_file")
    p.add_argument("--steps", type=int, default=6000, help="Adam steps (default 6000)")
    p.add_argument("--held-out", type=int, default=8000, help="rows held out for the MAE (default 8000)")
    p.add_argument("--batch", type=int, default=512, help="rows per step (default 512)")
    p.add_argument("--every", type=int, default=2000, help="print the held-out MAE every this many steps")
    p.add_argument("--env", type=int, default=0, help="which env's rows (default 0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with h5py.File(args.buffer_file, "r") as f:
        obs, act, rew, first = (f[k][args.env] for k in ("obs", "action", "reward", "first"))
        ptr = int(f["ptr"][args.env]) if "ptr" in f else -1
        n = int(f.attrs.get("num_actions", 0))
    if n <= 0 or act.ndim != 1:
        raise SystemExit(f"{args.buffer_file}: not a discrete run's buffer (integer actions)")
    idx = np.arange(1, len(rew))
    idx = idx[~first[idx] & (idx != ptr)]  # a row is the transition from the row before it; ptr: a wrapped buffer's oldest
    if len(idx) <= args.held_out:
        raise SystemExit(f"{args.buffer_file}: {len(idx)} transitions, not more than --held-out {args.held_out}")
    x = torch.cat([torch.as_tensor(obs[idx - 1]).float(), torch.eye(n)[torch.as_tensor(act[idx], dtype=torch.long)]], 1)
    y = torch.as_tensor(rew[idx]).float()
    perm = torch.randperm(len(idx))
    tr, te = perm[:-args.held_out], perm[-args.held_out:]
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 512), torch.nn.Mish(), torch.nn.Linear(512, 512),
                              torch.nn.Mish(), torch.nn.Linear(512, 1))
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    print(f"{len(idx)} transitions, {len(te)} held out; inputs: {obs.shape[-1]} observation dims and {n} actions")
    for step in range(args.steps + 1):
        b = tr[torch.randint(len(tr), (args.batch,))]
        loss = torch.nn.functional.huber_loss(net(x[b]).squeeze(-1), y[b], delta=5.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0 or step == args.steps:
            with torch.no_grad():
                pred = net(x[te]).squeeze(-1)
                small = y[te].abs() < 20
                print(step, "test MAE", float((pred - y[te]).abs().mean()), "on |r|<20",
                      float((pred - y[te])[small].abs().mean()), flush=True)


if __name__ == "__main__":
    main()
