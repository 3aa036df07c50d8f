import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tdmpc.config import Config
from tdmpc.model.world_model import ModelDims, WorldModel


def make(model_size=1, episodic=False, obs=24, act=6):
    return WorldModel(ModelDims.from_config(Config(model_size=model_size), (obs,), act, episodic))


@pytest.mark.parametrize("size,expected", [(5, 4_960_618), (1, 1_214_651)])
def test_parameter_counts_equal_reference(size, expected):
    assert make(size).num_learnable_params == expected


def test_output_shapes():
    m = make(1, episodic=True).eval()
    obs, a = torch.randn(7, 24), torch.rand(7, 6) * 2 - 1
    z = m.encode(obs)
    assert z.shape == (7, 128)
    assert torch.allclose(z.view(7, 16, 8).sum(-1), torch.ones(7, 16), atol=1e-5)  # SimNorm latent
    assert m.next(z, a).shape == (7, 128)
    assert m.reward(z, a).shape == (7, 101)
    assert m.termination(z).shape == (7, 1) and ((m.termination(z) >= 0) & (m.termination(z) <= 1)).all()
    assert m.Q(z, a).shape == (2, 7, 101)
    p = m.pi(z)
    assert p.action.shape == p.mean.shape == p.log_std.shape == (7, 6)
    assert p.entropy.shape == p.scaled_entropy.shape == (7, 1)
    assert p.action.abs().max() <= 1 and (p.log_std >= -10).all() and (p.log_std <= 2).all()
    # time-major batches work too
    assert m.Q(torch.randn(3, 7, 128), torch.randn(3, 7, 6)).shape == (2, 3, 7, 101)


def test_reward_and_q_heads_start_at_zero():
    m = make(1).eval()
    z, a = m.encode(torch.randn(4, 24)), torch.zeros(4, 6)
    assert torch.allclose(m.decode(m.reward(z, a)), torch.zeros(4, 1), atol=1e-6)
    assert torch.allclose(m.decode(m.Q(z, a)), torch.zeros(2, 4, 1), atol=1e-6)
    assert torch.equal(m._target_Qs[0].weight, m._Qs[0].weight)


def test_ensemble_subset_matches_per_head_and_costs_only_those_heads():
    m = make(5).eval()
    for p in m._Qs.parameters():
        torch.nn.init.normal_(p, std=0.05)
    z, a = torch.randn(64, 512), torch.randn(64, 6)
    full = m.Q(z, a)
    heads = torch.tensor([3, 1])
    with FlopCounterMode(display=False) as all_flops:
        m.Q(z, a)
    with FlopCounterMode(display=False) as two_flops:
        sub = m.Q(z, a, heads=heads)
    assert torch.allclose(sub, full[heads], atol=1e-5)
    assert two_flops.get_total_flops() * 5 == all_flops.get_total_flops() * 2


def test_prior_value_detaches_the_q_weights_but_not_the_action():
    m = make(1).train()
    for p in m._Qs.parameters():
        torch.nn.init.normal_(p, std=0.05)
    z = torch.randn(4, 128)
    a = torch.randn(4, 6, requires_grad=True)
    m.prior_value(z, m.pi(z)._replace(action=a)).sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0
    assert all(p.grad is None for p in m._Qs.parameters())


def test_soft_update_moves_targets_toward_online():
    m = make(1)
    with torch.no_grad():
        m._Qs[0].weight.add_(1.0)
    before = m._target_Qs[0].weight.clone()
    m.soft_update_targets(0.01)
    assert torch.allclose(m._target_Qs[0].weight, before + 0.01 * (m._Qs[0].weight - before))


def test_entropy_bonus_is_the_references_pre_squash_scaled_entropy():
    """scaled_entropy = -A x the Gaussian log-prob before the tanh correction (reference world_model.pi);
    with saturated means the squash correction would otherwise dominate it."""
    m = make(1).eval()
    z, eps = m.encode(torch.randn(32, 24)), torch.randn(32, 6)
    with torch.no_grad():
        m._pi[-1].bias[:6] = 3.0  # saturated means: tanh(3)
        p = m.pi(z, eps=eps)
    gaussian = (-0.5 * eps.pow(2) - p.log_std - 0.9189385175704956).sum(-1, keepdim=True)
    assert torch.allclose(p.scaled_entropy, -6 * gaussian, rtol=1e-4, atol=1e-3)
    squash = torch.log(torch.relu(1 - p.action.pow(2)) + 1e-6).sum(-1, keepdim=True)
    assert torch.allclose(p.entropy, -(gaussian - squash), rtol=1e-5, atol=1e-4)
    assert (p.entropy * 6 - p.scaled_entropy).abs().mean() > 10  # the tanh-corrected version differs a lot here


def test_sample_heads_draws_two_distinct_heads_uniformly():
    """Every ordered pair of distinct heads, equally often (as the first two of a random permutation)."""
    cfg = Config(model_size=1, num_q=5)
    m = WorldModel(ModelDims.from_config(cfg, (4,), 2, False))
    torch.manual_seed(0)
    heads = m.sample_heads("test", 40_000)
    assert heads.shape == (40_000, 2) and (heads[:, 0] != heads[:, 1]).all()
    counts = torch.bincount(heads[:, 0] * 5 + heads[:, 1], minlength=25).view(5, 5)
    assert counts.diagonal().sum() == 0
    off = counts[~torch.eye(5, dtype=torch.bool)].float()
    assert (off / 2000 - 1).abs().max() < 0.1, counts  # 2,000 expected per pair; sd ~44
    assert m.sample_heads("test").shape == (2,)


def _reference_shift(x):
    """The reference's ShiftAug.forward (tdmpc2/common/layers.py at e9f5932), which checks no training flag."""
    import torch.nn.functional as F

    x = x.float()
    n, _, h, w = x.size()
    x = F.pad(x, (3, 3, 3, 3), "replicate")
    eps = 1.0 / (h + 6)
    arange = torch.linspace(-1.0 + eps, 1.0 - eps, h + 6, device=x.device, dtype=x.dtype)[:h]
    arange = arange.unsqueeze(0).repeat(h, 1).unsqueeze(2)
    base_grid = torch.cat([arange, arange.transpose(1, 0)], dim=2).unsqueeze(0).repeat(n, 1, 1, 1)
    shift = torch.randint(0, 7, size=(n, 1, 1, 2), device=x.device, dtype=x.dtype) * (2.0 / (h + 6))
    return F.grid_sample(x, base_grid + shift, padding_mode="zeros", align_corners=False)


def test_pixel_frames_are_shifted_as_the_reference_shifts_them_in_every_mode():
    """The reference's encoder shifts every frame it encodes, in training and eval mode alike: z_0's, the TD
    targets' and the frames it plans on. Ours draws the same shifts from the same generator state, and the
    update and a plan each shift what the reference's do."""
    from tdmpc.agent import Agent
    from tdmpc.buffer import Batch
    from tdmpc.model.layers import ShiftAug

    frames = torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8)
    for mode in (True, False):
        aug = ShiftAug().train(mode)
        torch.manual_seed(3)
        ours = aug(frames)
        torch.manual_seed(3)
        assert torch.equal(ours, _reference_shift(frames)), mode
        assert not torch.equal(ours, frames.float())

    cfg = Config(model_size=1, obs="rgb", num_channels=8, latent_dim=128, batch_size=4, horizon=2, device="cpu",
                 num_samples=16, num_elites=4, num_pi_trajs=2, iterations=1, precision="fp32")
    agent = Agent(cfg, ModelDims.from_config(cfg, (3, 64, 64), 2, False), 100, torch.device("cpu"))
    seen: list[tuple[int, ...]] = []
    original = ShiftAug.forward
    ShiftAug.forward = lambda self, x: (seen.append(tuple(x.shape)), original(self, x))[1]  # type: ignore
    try:
        batch = Batch(torch.randint(0, 256, (3, 4, 3, 64, 64), dtype=torch.uint8), torch.rand(2, 4, 2) * 2 - 1,
                      torch.randn(2, 4), torch.zeros(2, 4, dtype=torch.bool))
        agent.update(batch)
        assert seen == [(8, 3, 64, 64), (4, 3, 64, 64)]  # the TD targets' H x B frames, then z_0's B
        seen.clear()
        agent.act(frames[:2].numpy(), eval_mode=True)
        assert seen == [(2, 3, 64, 64)]  # the frames a plan starts from, in eval mode too
    finally:
        ShiftAug.forward = original  # type: ignore
