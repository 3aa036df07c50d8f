"""The reward head on a run's own transitions, decoded two ways: symexp(E[b]) (the model's and the reference's
two-hot decode) and E[symexp(b)] (the mean of the predicted distribution in reward space), against the rewards
(not part of the package).

    python results/discrete/reward_decode_calibration.py CHECKPOINT BUFFER_FILE FIRST_ROW END_ROW
"""
import h5py, torch, numpy as np, tdmpc, sys
from tdmpc.model.twohot import symexp
torch.set_num_threads(1)
ck, buf, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
agent = tdmpc.Agent.from_checkpoint(ck, device='cpu'); m = agent.model
f = h5py.File(buf)
obs, act, rew, first = (f[k][0] for k in ('obs', 'action', 'reward', 'first'))
idx = np.arange(lo, hi); idx = idx[~first[idx]]
with torch.no_grad():
    z = m.encode(torch.as_tensor(obs[idx - 1]), None)
    logits = m.reward(z, torch.eye(m.dims.action_dim)[torch.as_tensor(act[idx], dtype=torch.long)])
    p_def = m.decode(logits).squeeze(-1).numpy()
    p_mean = (torch.softmax(logits.float(), -1) * symexp(m.two_hot.bins)).sum(-1).numpy()
r = rew[idx]
print(f"{len(idx)} rows: mean reward {r.mean():.3f}; mean prediction symexp(E[b]) {p_def.mean():.3f}, E[symexp(b)] {p_mean.mean():.3f}")
print(f"MAE symexp(E[b]) {np.abs(p_def - r).mean():.3f}, E[symexp(b)] {np.abs(p_mean - r).mean():.3f}; "
      f"MSE {((p_def - r) ** 2).mean():.2f} vs {((p_mean - r) ** 2).mean():.2f}")
for k in range(m.dims.action_dim):
    s = act[idx] == k
    print(f"  action {k}: {s.sum()} rows, mean reward {r[s].mean():7.3f}, symexp(E[b]) {p_def[s].mean():7.3f}, E[symexp(b)] {p_mean[s].mean():7.3f}")
