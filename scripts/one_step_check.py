"""A discrete checkpoint's one-step estimates on its run's own transitions (a replay buffer file the run saved,
<run_dir>/checkpoints/buffer_<step>.h5): the reward head against the rewards (with the stored action and with each
other action), r + gamma V(next(z, a)) against Q(z, a), and V at the predicted latent against V at the encoded next
observation, V being the prior's expected Q over every head.

    python scripts/one_step_check.py CHECKPOINT BUFFER_FILE FIRST_ROW END_ROW [--env 0]

Rows FIRST_ROW..END_ROW-1 of one env's rows (--env, default 0); a row is a transition from the row before it, so
the first row of an episode (and the oldest row of a buffer that wrapped) is left out.

Public API only: tdmpc.Agent.from_checkpoint and the world model's encode, next, reward, decode, pi and
action_values.
"""

from __future__ import annotations

import numpy as np
import torch

from buffer_rows import discrete_rows


def corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation; nan where either is constant (CartPole's rewards, +1 a step)."""
    return float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")


def main(argv: list[str] | None = None) -> None:
    args, agent, d = discrete_rows(argv, __doc__.split("\n\n")[0])
    m, n = agent.model, agent.dims.action_dim
    obs, act, rew, idx = d["obs"], d["action"], d["reward"], d["idx"]
    eye = torch.eye(n)
    heads = torch.arange(m.num_q)
    g = float(agent.discount)

    def V(zz: torch.Tensor) -> torch.Tensor:
        """The prior's expected Q, mean over every head."""
        probs = m.pi(zz).probs
        assert probs is not None
        return (probs * m.action_values(zz, None, heads).mean(0)).sum(-1)

    with torch.no_grad():
        z = m.encode(torch.as_tensor(obs[idx - 1]), None)

        def pred(a: np.ndarray) -> np.ndarray:
            return m.decode(m.reward(z, eye[torch.as_tensor(a, dtype=torch.long)])).squeeze(-1).numpy()

        p_ = pred(act[idx])
        allr = np.stack([pred(np.full(len(idx), k)) for k in range(n)], 1)
        q = m.action_values(z, None, heads).mean(0).numpy()
        every = [eye[[k]].expand(len(idx), n) for k in range(n)]
        one = np.stack([(m.decode(m.reward(z, a)).squeeze(-1) + g * V(m.next(z, a))).numpy() for a in every], 1)
        zn = m.encode(torch.as_tensor(obs[idx]), None)
        vn_real = V(zn).numpy()
        z_next = m.next(z, eye[torch.as_tensor(act[idx], dtype=torch.long)])
        vn_model = V(z_next).numpy()
        consistency = float(((z_next - zn) ** 2).sum(-1).mean())
        zn_norm = float((zn ** 2).sum(-1).mean())
    r = rew[idx]
    print(f"{len(idx)} transitions of rows {args.first_row}-{args.end_row - 1}")
    print("actions stored:", np.bincount(act[idx], minlength=n))
    print("corr(pred with stored action, reward)", corr(p_, r), "MAE", np.abs(p_ - r).mean())
    for k in range(n):
        print(f"  pred with action {k}: MAE {np.abs(allr[:, k] - r).mean():.3f}")
    print("shift: pred(obs[i-1], act[i-1]) vs reward[i]: MAE",
          np.abs(np.take_along_axis(allr, act[idx - 1][:, None], 1)[:, 0] - r).mean())
    small = np.abs(r) < 20
    print("on |r|<20:", small.mean(), "MAE", np.abs(p_ - r)[small].mean(), "reward std", r[small].std(),
          "spread of pred over actions", (allr.max(1) - allr.min(1))[small].mean(), "Q spread",
          (q.max(1) - q.min(1)).mean())
    print("big rewards:", np.round(r[~small][:10], 1), np.round(p_[~small][:10], 1))
    print("Q(z,a) mean", q.mean(), " r+gV(next) mean", one.mean(), " mean diff", (one - q).mean(), "abs diff",
          np.abs(one - q).mean())
    print("argmax agreement Q vs 1-step", (q.argmax(1) == one.argmax(1)).mean())
    print("per-action centered: corr",
          corr((q - q.mean(1, keepdims=True)).ravel(), (one - one.mean(1, keepdims=True)).ravel()))
    print("V(next model) - V(enc real next): mean", (vn_model - vn_real).mean(), "MAE",
          np.abs(vn_model - vn_real).mean(), "std V real", vn_real.std())
    print("consistency |next(z,a)-enc(s')|^2 mean", consistency, "|zn|^2", zn_norm)


if __name__ == "__main__":
    main()
