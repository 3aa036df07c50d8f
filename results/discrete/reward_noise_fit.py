"""How noisy is a discrete run's reward given (observation, action)? A supervised 2x512 Mish MLP fitted to the
buffer's rows (Huber loss, Adam, 6,000 steps), its MAE on 8,000 held-out rows (not part of the package).

    python results/discrete/reward_noise_fit.py BUFFER_FILE
"""
import sys
import h5py, torch, numpy as np
torch.set_num_threads(1); torch.manual_seed(0)
f = h5py.File(sys.argv[1])
obs, act, rew, first = (f[k][0] for k in ('obs', 'action', 'reward', 'first'))
idx = np.arange(1, len(rew)); idx = idx[~first[idx]]
x = torch.cat([torch.as_tensor(obs[idx - 1]), torch.eye(4)[torch.as_tensor(act[idx], dtype=torch.long)]], 1)
y = torch.as_tensor(rew[idx])
perm = torch.randperm(len(idx)); tr, te = perm[:-8000], perm[-8000:]
net = torch.nn.Sequential(torch.nn.Linear(12, 512), torch.nn.Mish(), torch.nn.Linear(512, 512), torch.nn.Mish(), torch.nn.Linear(512, 1))
opt = torch.optim.Adam(net.parameters(), 1e-3)
for step in range(6001):
    b = tr[torch.randint(len(tr), (512,))]
    loss = torch.nn.functional.huber_loss(net(x[b]).squeeze(-1), y[b], delta=5.0)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 2000 == 0:
        with torch.no_grad():
            p = net(x[te]).squeeze(-1); small = y[te].abs() < 20
            print(step, "test MAE", float((p - y[te]).abs().mean()), "on |r|<20", float((p - y[te])[small].abs().mean()))
