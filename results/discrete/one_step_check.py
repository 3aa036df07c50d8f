"""A discrete checkpoint's one-step estimates on its run's own transitions: the reward head against the rewards
(with the stored action and with each other action), r + gamma V(next(z, a)) against Q(z, a), and V at the
predicted latent against V at the encoded next observation (not part of the package; the LunarLander figures in
planner_diagnosis.log).

    python results/discrete/one_step_check.py CHECKPOINT BUFFER_FILE FIRST_ROW END_ROW
"""
import h5py, torch, numpy as np, tdmpc
torch.set_num_threads(1)
import sys
agent = tdmpc.Agent.from_checkpoint(sys.argv[1], device='cpu'); m = agent.model
f = h5py.File(sys.argv[2])
obs, act, rew, first, term = (f[k][0] for k in ('obs', 'action', 'reward', 'first', 'terminated'))
idx = np.arange(int(sys.argv[3]), int(sys.argv[4])); idx = idx[~first[idx]]
eye = torch.eye(4)
with torch.no_grad():
    z = m.encode(torch.as_tensor(obs[idx - 1]), None)
    def pred(a): return m.decode(m.reward(z, eye[torch.as_tensor(a, dtype=torch.long)])).squeeze(-1).numpy()
    p = pred(act[idx])
    allr = np.stack([pred(np.full(len(idx), k)) for k in range(4)], 1)
    q = m.action_values(z, None, torch.arange(m.num_q)).mean(0).numpy()
r = rew[idx]
print("actions stored:", np.bincount(act[idx], minlength=4))
print("corr(pred with stored action, reward)", np.corrcoef(p, r)[0, 1], "MAE", np.abs(p - r).mean())
for k in range(4):
    print(f"  pred with action {k}: MAE {np.abs(allr[:, k] - r).mean():.3f}")
print("shift: pred(obs[i-1], act[i-1]) vs reward[i]: MAE", np.abs(np.take_along_axis(allr, act[idx-1][:, None], 1)[:, 0] - r).mean())
small = np.abs(r) < 20
print("on |r|<20:", small.mean(), "MAE", np.abs(p - r)[small].mean(), "reward std", r[small].std(),
      "spread of pred over actions", (allr.max(1) - allr.min(1))[small].mean(), "Q spread", (q.max(1)-q.min(1)).mean())
# true reward spread over actions unknown; how well do predicted action differences match?
print("big rewards:", np.round(r[~small][:10], 1), np.round(p[~small][:10], 1))
with torch.no_grad():
    heads = torch.arange(m.num_q)
    def V(zz):
        pr = m._pi(zz).float().softmax(-1); return (pr * m.action_values(zz, None, heads).mean(0)).sum(-1)
    g = float(agent.discount)
    one = np.stack([(m.decode(m.reward(z, eye[[k]].expand(len(idx), 4))).squeeze(-1) + g * V(m.next(z, eye[[k]].expand(len(idx), 4)))).numpy() for k in range(4)], 1)
    zn = m.encode(torch.as_tensor(obs[idx]), None)
    vn_real = V(zn).numpy()
    a_t = torch.as_tensor(act[idx], dtype=torch.long)
    vn_model = V(m.next(z, eye[a_t])).numpy()
print("Q(z,a) mean", q.mean(), " r+gV(next) mean", one.mean(), " mean diff", (one - q).mean(), "abs diff", np.abs(one - q).mean())
print("argmax agreement Q vs 1-step", (q.argmax(1) == one.argmax(1)).mean())
print("per-action centered: corr", np.corrcoef((q - q.mean(1, keepdims=True)).ravel(), (one - one.mean(1, keepdims=True)).ravel())[0, 1])
print("V(next model) - V(enc real next): mean", (vn_model - vn_real).mean(), "MAE", np.abs(vn_model - vn_real).mean(),
      "std V real", vn_real.std())
print("consistency |next(z,a)-enc(s')|^2 mean", float(((m.next(z, eye[a_t]) - zn) ** 2).sum(-1).mean()), "|zn|^2", float((zn ** 2).sum(-1).mean()))
