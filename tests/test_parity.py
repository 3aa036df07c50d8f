"""Our networks compute what the reference implementation computed from its own checkpoint."""

from pathlib import Path

import pytest
import torch

from tdmpc.checkpoint import load_reference

FIXTURE = Path(__file__).parent / "fixtures" / "reference-ms1"


@pytest.fixture(scope="module")
def ref():
    model = load_reference(FIXTURE / "reference_checkpoint.pt")
    io = torch.load(FIXTURE / "reference_io.pt", weights_only=True)
    return model, io


def test_architecture_inferred_from_shapes(ref):
    model, _ = ref
    d = model.dims
    assert (d.obs_shape, d.action_dim, d.latent_dim, d.mlp_dim, d.enc_dim, d.num_q, d.episodic) == \
        ((24,), 6, 128, 384, 256, 2, False)
    assert model.num_learnable_params == 1_214_651


@torch.no_grad()
def test_every_output_matches_reference(ref):
    m, io = ref
    z = m.encode(io["obs"])
    a = io["action"]
    checks = {
        "z": z,
        "z_next": m.next(z, a),
        "reward_logits": m.reward(z, a),
        "reward": m.decode(m.reward(z, a)),
        "pi_mean": m.pi(z).mean,
        "pi_log_std": m.pi(z).log_std,
        "q_logits": m.Q(z, a),
        "q_target_logits": m.Q(z, a, target=True),
        "q_values": m.decode(m.Q(z, a)),
    }
    for name, ours in checks.items():
        assert ours.shape == io[name].shape, name
        err = (ours - io[name]).abs().max().item()
        assert err < 1e-5, f"{name}: max abs error {err}"
