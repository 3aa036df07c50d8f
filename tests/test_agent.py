import numpy as np
import pytest
import torch

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.model.world_model import ModelDims

CPU = torch.device("cpu")


def make_agent(seed=0, episodic=False, **overrides):
    torch.manual_seed(seed)
    cfg = Config(model_size=1, precision="fp32", num_samples=64, num_elites=8, num_pi_trajs=4,
                 iterations=2, batch_size=32, **overrides)
    return Agent(cfg, ModelDims.from_config(cfg, (10,), 3, episodic), episode_length=100, device=CPU)


def make_batch(seed=0, H=3, B=32, terminal=False):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(H + 1, B, 10, generator=g)
    action = torch.rand(H, B, 3, generator=g) * 2 - 1
    reward = obs[1:, :, 0] + action[..., 0]  # a learnable function of the data
    terminated = torch.zeros(H, B, dtype=torch.bool)
    if terminal:
        terminated[-1, : B // 2] = True
    return Batch(obs, action, reward, terminated)


def world_model_loss(metrics):
    return float(20 * metrics["consistency_loss"] + 0.1 * metrics["reward_loss"] + 0.1 * metrics["value_loss"])


def test_repeated_updates_on_a_fixed_batch_reduce_the_world_model_loss():
    agent = make_agent()
    batch = make_batch()
    first = world_model_loss(agent.update(batch))
    for _ in range(40):
        last = agent.update(batch)
    assert world_model_loss(last) < 0.7 * first
    assert all(torch.isfinite(v).all() for v in last.values())


def test_termination_head_learns_on_episodic_batches():
    agent = make_agent(episodic=True)
    batch = make_batch(terminal=True)
    first = agent.update(batch)["termination_loss"].item()
    for _ in range(30):
        last = agent.update(batch)["termination_loss"].item()
    assert last < 0.5 * first


def test_update_metrics_are_device_tensors():
    metrics = make_agent().update(make_batch())
    assert {"consistency_loss", "reward_loss", "value_loss", "pi_loss", "grad_norm", "pi_scale"} <= set(metrics)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in metrics.values())


def test_act_shapes_and_range_for_a_batch_of_envs():
    agent = make_agent()
    obs = np.random.randn(4, 10).astype(np.float32)
    a = agent.act(obs, np.ones(4, dtype=bool))
    assert a.shape == (4, 3) and a.dtype == np.float32 and np.abs(a).max() <= 1
    agent.cfg.mpc = False
    assert agent.act(obs, np.zeros(4, dtype=bool), eval_mode=True).shape == (4, 3)


def test_same_seed_same_actions_and_losses():
    runs = []
    for _ in range(2):
        agent = make_agent(seed=7)
        torch.manual_seed(123)
        obs = np.ones((2, 10), dtype=np.float32)
        actions = [agent.act(obs, np.array([True, True]))]
        losses = [agent.update(make_batch(1))["total_loss"].item() for _ in range(3)]
        actions.append(agent.act(obs, np.array([False, False])))
        runs.append((actions, losses))
    (a1, l1), (a2, l2) = runs
    assert all(np.array_equal(x, y) for x, y in zip(a1, a2))
    assert l1 == l2


def test_save_then_load_gives_identical_outputs(tmp_path):
    agent = make_agent()
    for _ in range(3):
        agent.update(make_batch())
    agent.save(tmp_path / "agent.pt")
    other = make_agent(seed=99)
    other.load(tmp_path / "agent.pt")
    obs = np.random.randn(3, 10).astype(np.float32)
    for a in (agent, other):
        torch.manual_seed(5)
        a.result = a.act(obs, np.ones(3, dtype=bool), eval_mode=True)
    assert np.array_equal(agent.result, other.result)
    z = torch.randn(3, 128)
    act = torch.rand(3, 3)
    assert torch.equal(agent.model.Q(z, act), other.model.Q(z, act))
    assert torch.equal(agent.model.Q(z, act, target=True), other.model.Q(z, act, target=True))
    assert torch.equal(agent.scale, other.scale)
    # optimiser state continues identically
    torch.manual_seed(3)
    m1 = agent.update(make_batch(2))
    torch.manual_seed(3)
    m2 = other.update(make_batch(2))
    assert m1["total_loss"].item() == m2["total_loss"].item()


def test_non_finite_update_is_skipped_and_counted():
    agent = make_agent()
    agent.update(make_batch())
    before = [p.detach().clone() for p in agent.model.parameters()]
    bad = make_batch()
    bad.reward[0, 0] = float("nan")
    metrics = agent.update(bad)
    assert metrics["skipped"].item() == 1.0 and agent.nonfinite.item() >= 1
    after = list(agent.model._encoder.parameters()) + list(agent.model._dynamics.parameters())
    enc_dyn_before = before[: len(after)]
    assert all(torch.equal(a, b) for a, b in zip(after, enc_dyn_before))
    metrics = agent.update(make_batch())  # and training carries on
    assert torch.isfinite(metrics["total_loss"])


@pytest.mark.parametrize("norm_scale", [0.1, 50.0])  # under the clip norm (20) and over it
def test_step_clips_as_torch_clip_grad_norm_then_adam(norm_scale):
    """_optimizer_step clips inside fused Adam (grad_scale); the weights move as after torch's clip_grad_norm_ and Adam."""
    agent = make_agent()
    params = list(agent.model._pi.parameters())
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=g) for p in params]
    total = torch.linalg.vector_norm(torch.stack([x.norm() for x in grads]))
    grads = [x * (norm_scale / total) for x in grads]
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    plain = torch.optim.Adam(copies, lr=agent.cfg.lr, eps=1e-5)
    for p, c, x in zip(params, copies, grads):
        p.grad, c.grad = x.clone(), x.clone()
    norm, skipped = agent.learner._optimizer_step(agent.pi_optim)
    torch.testing.assert_close(torch.nn.utils.clip_grad_norm_(copies, agent.cfg.grad_clip_norm), norm)
    plain.step()
    assert skipped.item() == 0.0
    for p, c in zip(params, copies):
        torch.testing.assert_close(p.detach(), c.detach(), rtol=1e-5, atol=1e-7)


def test_entropy_bonus_forms_on_a_saturated_policy():
    """Where Q gives the policy no gradient (a fresh Q is flat), the bonus alone shapes it: the reference's
    'gaussian' form drives the std to its maximum and leaves the means saturated; the 2023 release's
    'squashed' form pulls the means out of saturation (RESULTS.md: a saturated prior stalls learning)."""
    after = {}
    for bonus in ("gaussian", "squashed"):
        agent = make_agent(entropy_bonus=bonus, entropy_coef=1.0)
        m = agent.model
        with torch.no_grad():
            m._pi[-1].bias[:3] = 3.0  # means at tanh(3)
        zs = m.encode(torch.randn(4, 32, 10)).detach()
        for _ in range(30):
            agent.learner._update_pi(zs, None)
        with torch.no_grad():
            p = m.pi(zs)
        after[bonus] = (float(p.mean.abs().mean()), float(p.log_std.mean()))
    assert after["gaussian"][0] > 0.95 and after["gaussian"][1] > 1.9  # log_std_max is 2
    assert after["squashed"][0] < 0.5


def test_squashed_entropy_bonus_is_the_2023_release_log_prob():
    """The 2023 release's policy loss used -log_pi with log_pi = A x (sum(-eps^2/2 - log_std) - log(2 pi)/2)
    minus the tanh correction; the 'squashed' bonus equals it up to a constant (no gradient)."""
    agent = make_agent(entropy_bonus="squashed")
    z, eps = agent.model.encode(torch.randn(16, 10)), torch.randn(16, 3)
    p = agent.model.pi(z, eps=eps)
    log_pi = 3 * ((-0.5 * eps.pow(2) - p.log_std).sum(-1, keepdim=True) - 0.9189385175704956)
    log_pi = log_pi - torch.log(torch.relu(1 - p.action.pow(2)) + 1e-6).sum(-1, keepdim=True)
    offset = p.scaled_entropy + p.squash_correction + log_pi
    torch.testing.assert_close(offset, torch.full_like(offset, 3 * 2 * 0.9189385175704956))


def _range(q):
    return max(1.0, float(torch.quantile(q, 0.95) - torch.quantile(q, 0.05)))


def test_the_running_scale_is_the_5_95_range_of_q_shared_or_per_task():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(64, 1, generator=g) * torch.linspace(1, 40, 64).view(-1, 1)
    task = torch.arange(64) % 2  # task 0's rows span less than task 1's; task 2 has none
    shared = make_agent()
    shared.learner._update_scale(q, None)
    assert shared.scale.item() == pytest.approx(1 + 0.01 * (_range(q) - 1), rel=1e-5)
    cfg = Config(model_size=1, precision="fp32", num_samples=64, num_elites=8, num_pi_trajs=4, iterations=2,
                 batch_size=32, task_scales=True)
    dims = ModelDims.from_config(cfg, (10,), 3, False, ("a", "b", "c"), (3, 2, 1))
    per_task = Agent(cfg, dims, episode_length=[100, 100, 100], device=CPU)
    per_task.learner._update_scale(q, task)
    expected = [1 + 0.01 * (_range(q[task == t]) - 1) for t in (0, 1)] + [1.0]
    assert per_task.scale.tolist() == pytest.approx(expected, rel=1e-5) and expected[1] > expected[0] > 1
    batch = make_batch()
    batch.task = torch.arange(32) % 3
    assert torch.isfinite(per_task.update(batch)["pi_loss"])


def test_steps_after_a_terminal_one_get_no_loss():
    """A sub-trajectory that reaches past its episode's end (terminal at step 0 here) learns only from the steps up
    to the terminal one: what lies after it (the next episode's rows, or stale ones) changes nothing."""
    batch = make_batch(terminal=False)
    batch.terminated[0, :8] = True  # these 8 end at their first step
    other = Batch(batch.obs.clone(), batch.action.clone(), batch.reward.clone(), batch.terminated.clone())
    other.obs[2:, :8] = 1e3  # rows after the terminal one: anything
    other.action[1:, :8] = -1.0
    other.reward[1:, :8] = 50.0
    other.terminated[1:, :8] = True
    metrics = [make_agent(episodic=True).update(b) for b in (batch, other)]
    for key in ("consistency_loss", "reward_loss", "value_loss", "termination_loss", "pi_loss"):
        torch.testing.assert_close(metrics[0][key], metrics[1][key], msg=key)
    for b in (batch, other):  # without the terminal flags the same rows do count
        b.terminated[:] = False
    unmasked = [make_agent(episodic=True).update(b)["consistency_loss"] for b in (batch, other)]
    assert not torch.allclose(unmasked[0], unmasked[1])
