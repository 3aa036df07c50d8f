"""Our networks compute what the reference implementation computed from its own checkpoint."""

import copy
from pathlib import Path

import pytest
import torch

from tdmpc.model.checkpoint import load_reference
from tdmpc.model.world_model import squash_correction

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


# --- the multi-task fixture (mt30, model size 1) ---------------------------------------------------
MT30 = Path(__file__).parent / "fixtures" / "reference-mt30-ms1"


@pytest.fixture(scope="module")
def mt30():
    import json

    model = load_reference(MT30 / "reference_checkpoint.pt")
    io = torch.load(MT30 / "reference_io.pt", weights_only=True)
    return model, io, json.loads((MT30 / "reference_meta.json").read_text())


def test_multitask_dims_are_inferred_and_the_task_set_is_mt30(mt30):
    model, _, meta = mt30
    d = model.dims
    assert d.tasks == tuple(meta["tasks"]) and d.task_dim == meta["task_dim"] == 96
    assert (d.obs_shape, d.action_dim, d.latent_dim, d.num_q) == ((24,), 6, 128, 2)
    assert d.action_dims == tuple(meta["action_dims"])
    assert model.num_learnable_params == 1_426_427


@torch.no_grad()
def test_every_multitask_output_matches_reference(mt30):
    """Row i of every output with task[i]: the embedding after its max_norm rescale, the latents, heads,
    and the masked policy with its entropy terms, from the reference's own eps draw."""
    m, io, _ = mt30
    task, obs, action = io["task"], io["obs"], io["action"]
    z = m.encode(obs, task)
    policy = m.pi(z, task, eps=io["pi_eps"])
    ours = {"task_emb": m.task_vector(task, (16,)), "z": z, "z_next": m.next(z, action, task),
            "reward_logits": m.reward(z, action, task), "reward": m.decode(m.reward(z, action, task)),
            "pi_mean": policy.mean, "pi_log_std": policy.log_std, "pi_action": policy.action,
            "pi_entropy": policy.entropy, "pi_scaled_entropy": policy.scaled_entropy,
            "q_logits": m.Q(z, action, task), "q_target_logits": m.Q(z, action, task, target=True),
            "q_values": m.decode(m.Q(z, action, task))}
    assert set(ours) | {"task", "obs", "action", "pi_eps"} == set(io)
    scaled, entropy = ours.pop("pi_scaled_entropy"), ours.pop("pi_entropy")
    for key, value in ours.items():
        torch.testing.assert_close(value, io[key], rtol=0, atol=1e-5, msg=key)
    # The entropy is -(Gaussian log-prob) + squash_correction(action), and the squash term is ill-conditioned at
    # saturation: 11 of these 16 rows have an action within 1.4e-5 of +-1, where one float32 ulp of tanh moves
    # log(1 - a^2 + 1e-6) by up to 0.1 (the reference's own fp32 entropy is 0.044 from float64 on its weights). So the
    # tolerance is 1e-5, plus the float32 rounding of its ~13 terms (1e-6 relative: the reference's own), plus what a
    # 2-ulp difference in each action moves the squash term by. That last part is 0 where |a| < 0.95 (4 rows here,
    # checked within 1e-5 + 1e-6 relative) and up to 0.25 per entry at a = +-1. The Gaussian part has no such
    # sensitivity: checked against the reference's entropy with its own actions' squash term added back.
    a = io["pi_action"]
    sensitivity = (2 * a.abs() / (1 - a.pow(2) + 1e-6) * (a.abs() >= 0.95)).sum(-1, keepdim=True)
    allowed = 1e-5 + 1e-6 * io["pi_entropy"].abs() + sensitivity * 2 * torch.finfo(torch.float32).eps
    assert ((entropy - io["pi_entropy"]).abs() <= allowed).all(), (entropy - io["pi_entropy"]).abs().max()
    assert (sensitivity == 0).sum() >= 4  # rows checked within 1e-5 (+ rounding)
    reference_gaussian = io["pi_entropy"] + squash_correction(a)
    torch.testing.assert_close(entropy + policy.squash_correction, reference_gaussian, rtol=1e-6, atol=1e-5,
                               msg="pi_entropy, Gaussian part")
    # The scaled entropy (values up to ~51) sums 6 log-stds (each down to -10) and multiplies by up to 6 (action dims
    # over active dims), so float32 rounding moves it by several ulps, by how many depends on the CPU's vector math
    # (2.3e-5 on an AMD EPYC, more on an Intel Xeon with torch 2.11). The formula is checked in float64 on the same
    # weights against the reference's float32 value, which is itself 2.1e-5 from float64; our float32 value then
    # has to match our float64 one to float32 rounding (1e-5 relative, ~80 ulps; measured 6.4e-7).
    m64 = copy.deepcopy(m).double()
    scaled64 = m64.pi(m64.encode(obs.double(), task), task, eps=io["pi_eps"].double()).scaled_entropy
    torch.testing.assert_close(scaled64, io["pi_scaled_entropy"].double(), rtol=0, atol=2.5e-5,
                               msg="pi_scaled_entropy (float64)")
    torch.testing.assert_close(scaled.double(), scaled64, rtol=1e-5, atol=0, msg="pi_scaled_entropy (float32)")
    # the fused planning path and a bf16-free planning copy agree with the separate heads
    nxt, hidden = m.step(z, action, task)
    rew = m.reward_logits([hidden])[0]
    torch.testing.assert_close(nxt, io["z_next"], rtol=0, atol=1e-5)
    torch.testing.assert_close(rew, io["reward_logits"], rtol=0, atol=1e-5)


def test_embedding_rows_above_max_norm_are_rescaled_in_place(mt30):
    m, io, meta = mt30
    fresh = load_reference(MT30 / "reference_checkpoint.pt")
    odd = torch.tensor([1, 3])
    assert (fresh._task_emb.weight[odd].norm(dim=-1) > 1.4).all()  # as written: rows of norm 1.5 to 3
    with torch.no_grad():
        fresh.task_vector(odd, (2,))
    norms = fresh._task_emb.weight[odd].norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones(2), rtol=0, atol=1e-5)
