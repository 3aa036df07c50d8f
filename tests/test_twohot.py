import torch
import torch.nn.functional as F

from tdmpc.model.layers import simnorm
from tdmpc.model.twohot import TwoHot, symexp, symlog


def test_symlog_symexp_inverse():
    x = torch.linspace(-1000, 1000, 2001)
    assert torch.allclose(symexp(symlog(x)), x, rtol=1e-5, atol=1e-4)


def test_two_hot_round_trip_and_shape():
    th = TwoHot(101, -10, 10)
    x = torch.tensor([-500.0, -3.3, -1e-3, 0.0, 0.7, 42.0, 9000.0])
    enc = th.encode(x)
    assert enc.shape == (7, 101)
    assert torch.allclose(enc.sum(-1), torch.ones(7))
    assert ((enc > 0).sum(-1) <= 2).all()  # at most two neighbouring bins
    # Decoding the two-hot as logits of a distribution: log of the weights.
    dec = th.decode(torch.log(enc.clamp_min(1e-30)))
    assert torch.allclose(dec.squeeze(-1), x, rtol=1e-4, atol=1e-4)


def test_two_hot_clamps_to_range():
    th = TwoHot(101, -10, 10)
    big = symexp(torch.tensor(30.0))
    assert th.encode(big.view(1))[0, -1] == 1.0


def test_cross_entropy_matches_definition():
    th = TwoHot(11, -2, 2)
    logits, target = torch.randn(5, 11), torch.randn(5)
    expected = -(th.encode(target) * F.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(th.cross_entropy(logits, target), expected)


def test_simnorm_groups_sum_to_one():
    x = torch.randn(3, 4, 32)
    y = simnorm(x, 8)
    assert y.shape == x.shape
    groups = y.view(3, 4, 4, 8)
    assert torch.allclose(groups.sum(-1), torch.ones(3, 4, 4))
    assert torch.allclose(groups, torch.softmax(x.view(3, 4, 4, 8), -1))
