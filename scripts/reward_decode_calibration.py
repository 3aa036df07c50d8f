"""The reward head on a run's own transitions (a replay buffer file the run saved,
<run_dir>/checkpoints/buffer_<step>.h5), decoded two ways: symexp(E[b]) (the model's and the reference's two-hot
decode) and E[symexp(b)] (the mean of the predicted distribution in reward space), against the rewards.

    python scripts/reward_decode_calibration.py CHECKPOINT BUFFER_FILE FIRST_ROW END_ROW [--env 0]

Rows FIRST_ROW..END_ROW-1 of one env's rows (--env, default 0), as scripts/one_step_check.py reads them.

Public API only: tdmpc.Agent.from_checkpoint, the world model's encode, reward, action_input, decode and its
two_hot bins, and tdmpc.model.twohot.symexp.
"""

from __future__ import annotations

import numpy as np
import torch

from buffer_rows import discrete_rows
from tdmpc.model.twohot import symexp


def main(argv: list[str] | None = None) -> None:
    args, agent, d = discrete_rows(argv, __doc__.split("\n\n")[0])
    m, n = agent.model, agent.dims.action_dim
    obs, act, rew, idx = d["obs"], d["action"], d["reward"], d["idx"]
    with torch.no_grad():
        z = m.encode(torch.as_tensor(obs[idx - 1]), None)
        logits = m.reward(z, m.action_input(torch.as_tensor(act[idx], dtype=torch.long)))
        p_def = m.decode(logits).squeeze(-1).numpy()
        p_mean = (torch.softmax(logits.float(), -1) * symexp(m.two_hot.bins)).sum(-1).numpy()
    r = rew[idx]
    print(f"{len(idx)} rows: mean reward {r.mean():.3f}; mean prediction symexp(E[b]) {p_def.mean():.3f}, "
          f"E[symexp(b)] {p_mean.mean():.3f}")
    print(f"MAE symexp(E[b]) {np.abs(p_def - r).mean():.3f}, E[symexp(b)] {np.abs(p_mean - r).mean():.3f}; "
          f"MSE {((p_def - r) ** 2).mean():.2f} vs {((p_mean - r) ** 2).mean():.2f}")
    for k in range(n):
        s = act[idx] == k
        if not s.any():
            print(f"  action {k}: 0 rows")
            continue
        print(f"  action {k}: {s.sum()} rows, mean reward {r[s].mean():7.3f}, symexp(E[b]) {p_def[s].mean():7.3f}, "
              f"E[symexp(b)] {p_mean[s].mean():7.3f}")


if __name__ == "__main__":
    main()
