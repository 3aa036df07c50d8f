"""Each fast path computes what the plain formula computes."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tdmpc.planners.mppi import GaussianMPPI, MPPIConfig
from tdmpc.model import fused
from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.model.planning_copy import planning_copy, sync_copy
from tdmpc.model.world_model import ModelDims, WorldModel

from helpers import skip_unless_ci

@pytest.fixture
def fused_extension():
    if not fused.extension_available():
        skip_unless_ci("the fused CPU kernels could not be built here (no C++ compiler?)")


needs_ext = pytest.mark.usefixtures("fused_extension")

LAYOUTS = [((64, 96), 1, False), ((64, 2, 96), 2, False), ((3, 64, 96), 3, True)]


@needs_ext
@pytest.mark.parametrize("shape,G,heads_first", LAYOUTS)
@pytest.mark.parametrize("act", ["mish", "simnorm"])
def test_fused_forward_matches_plain(shape, G, heads_first, act):
    x = torch.randn(*shape) * 3
    gamma, beta = torch.randn(G, 96), torch.randn(G, 96)
    ref = fused._plain(x, gamma, beta, act, heads_first)
    assert (fused.ln_act(x, gamma, beta, act, heads_first) - ref).abs().max() < 1e-5
    out16 = fused.ln_act(x.bfloat16(), gamma, beta, act, heads_first)
    assert out16.dtype == torch.bfloat16
    ref16 = fused._plain(x.bfloat16().float(), gamma, beta, act, heads_first)
    assert ((out16.float() - ref16).abs() <= 1e-2 * (1 + ref16.abs())).all()  # bf16 output rounding


@needs_ext
def test_fused_simnorm_survives_large_gains():
    x, gamma, beta = torch.randn(32, 64), torch.full((1, 64), 40.0), torch.zeros(1, 64)
    out = fused.ln_act(x, gamma, beta, "simnorm")
    assert torch.isfinite(out).all()
    assert (out - fused._plain(x, gamma, beta, "simnorm", False)).abs().max() < 1e-5


@needs_ext
@pytest.mark.parametrize("shape,G,heads_first", LAYOUTS)
def test_fused_backward_matches_autograd_of_plain(shape, G, heads_first):
    x = torch.randn(*shape, requires_grad=True)
    gamma = torch.randn(G, 96, requires_grad=True)
    beta = torch.randn(G, 96, requires_grad=True)
    go = torch.randn(shape)
    fast = torch.autograd.grad(fused.ln_act(x, gamma, beta, "mish", heads_first), (x, gamma, beta), go)
    plain = torch.autograd.grad(fused._plain(x, gamma, beta, "mish", heads_first), (x, gamma, beta), go)
    for a, b in zip(fast, plain):
        assert (a - b).abs().max() < 1e-4 * (1 + b.abs().max())


@needs_ext
@pytest.mark.parametrize("shape,G,heads_first", LAYOUTS)
def test_fused_bf16_backward_matches_fp32_autograd_of_plain(shape, G, heads_first):
    """bf16 training goes through this path: its gradients must be fp32's up to bf16 rounding."""
    x16 = (torch.randn(*shape) * 3 + 1).bfloat16().requires_grad_()
    x32 = x16.detach().float().requires_grad_()
    gamma, beta = 1 + 0.3 * torch.randn(G, 96), 0.2 * torch.randn(G, 96)
    go = torch.randn(shape).bfloat16()
    g16, g32 = (gamma.clone().requires_grad_(), gamma.clone().requires_grad_())
    b16, b32 = (beta.clone().requires_grad_(), beta.clone().requires_grad_())
    fast = torch.autograd.grad(fused.ln_act(x16, g16, b16, "mish", heads_first), (x16, g16, b16), go)
    plain = torch.autograd.grad(fused._plain(x32, g32, b32, "mish", heads_first), (x32, g32, b32), go.float())
    assert fast[0].dtype == torch.bfloat16 and fast[1].dtype == torch.float32
    assert ((fast[0].float() - plain[0]).abs() <= 1e-2 * (plain[0].abs() + plain[0].abs().mean())).all()
    for a, b in zip(fast[1:], plain[1:]):  # accumulated in fp32 from bf16 inputs
        assert (a - b).norm() < 1e-4 * b.norm()


class DtypesSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes |= {t.dtype for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)}
        return out


@pytest.mark.parametrize("train_precision", ["fp32", "bf16", "mixed"])
def test_train_precision_is_separate_from_planning_precision(train_precision):
    cfg = Config(model_size=1, precision="bf16", train_precision=train_precision, num_samples=32, num_elites=4,
                 num_pi_trajs=2, iterations=1, batch_size=8)
    agent = Agent(cfg, ModelDims.from_config(cfg, (24,), 6, False), 500, torch.device("cpu"))
    assert next(agent.plan_model.parameters()).dtype == torch.bfloat16
    H, B = cfg.horizon, cfg.batch_size
    batch = Batch(torch.randn(H + 1, B, 24), torch.rand(H, B, 6), torch.randn(H, B), torch.zeros(H, B, dtype=bool))
    outputs: dict[str, set] = {"_Qs": set(), "_target_Qs": set(), "_dynamics": set(), "_pi": set()}
    for name, dtypes in outputs.items():
        getattr(agent.model, name).register_forward_hook(lambda mod, inp, out, d=dtypes: d.add(out.dtype))
    with DtypesSeen() as seen:
        agent.update(batch)
    assert (torch.bfloat16 in seen.dtypes) == (train_precision != "fp32"), seen.dtypes
    # mixed: the Q heads (online and target) compute in fp32, the world model's other parts in bf16
    q_dtype = torch.bfloat16 if train_precision == "bf16" else torch.float32
    rest = torch.float32 if train_precision == "fp32" else torch.bfloat16
    assert outputs["_Qs"] == outputs["_target_Qs"] == {q_dtype}, outputs
    assert outputs["_dynamics"] == outputs["_pi"] == {rest}, outputs


def test_fused_step_matches_separate_heads():
    m = WorldModel(ModelDims.from_config(Config(model_size=1), (24,), 6, False)).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.1)
    z, a = m.encode(torch.randn(9, 24)), torch.rand(9, 6)
    copy32 = planning_copy(m, torch.float32)
    with torch.no_grad():
        for model in (m, copy32):
            nxt, hidden = model.step(z, a)
            rew = model.reward_logits([hidden])[0]
            assert (nxt - m.next(z, a)).abs().max() < 1e-6 and (rew - m.reward(z, a)).abs().max() < 1e-6
        # planning's first step: the latent's share of the first layers computed once for all its candidates
        z0 = z[:3].unsqueeze(1)
        a0 = torch.rand(3, 5, 6)
        for model in (m, copy32):
            nxt, hidden = model.step(None, a0, z_part=model.latent_part(z0))
            rew = model.reward_logits([hidden])[0]
            z0s = z0.expand(-1, 5, -1)
            assert (nxt - m.next(z0s, a0)).abs().max() < 1e-6 and (rew - m.reward(z0s, a0)).abs().max() < 1e-5
        for p in m.parameters():  # the copy follows the model after a sync
            p.add_(0.01)
        sync_copy(copy32, m)
        assert (copy32.reward_logits([copy32.step(z, a)[1]])[0] - m.reward(z, a)).abs().max() < 1e-6


def trained_like_model():
    """A model with non-trivial heads: random weights, so planning has something to optimise."""
    torch.manual_seed(0)
    cfg = Config(model_size=1)
    m = WorldModel(ModelDims.from_config(cfg, (24,), 6, False)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return cfg, m


def test_bf16_planning_picks_actions_close_to_fp32():
    """Four envs (24 planned actions): on a CPU without AVX512-BF16 (AVX2) bf16 matmuls are emulated, and 16 envs
    took 81 s of the default suite there."""
    cfg, m = trained_like_model()
    obs = torch.randn(4, 24)
    first = torch.ones(4, dtype=torch.bool)
    actions = {}
    for dtype in (torch.float32, torch.bfloat16):
        planner = GaussianMPPI(planning_copy(m, dtype), MPPIConfig.from_config(Config(iterations=8), 6), 4, 6,
                               discount=0.99, device=torch.device("cpu"))
        torch.manual_seed(1)
        planner.plan(obs, first, eval_mode=True)
        actions[dtype] = planner.prev_mean[0].clone()  # the planned mean: no elite sampling noise
    diff = (actions[torch.float32] - actions[torch.bfloat16]).abs()
    assert diff.mean() < 0.1 and diff.max() < 0.5, diff


class CountSyncs(TorchDispatchMode):
    """Counts ops that read a tensor value back to the host."""

    SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(str(func.name()).startswith(n) for n in self.SYNC_OPS):
            self.calls.append(str(func.name()))
        return func(*args, **(kwargs or {}))


def test_no_host_sync_in_act_and_update():
    cfg = Config(model_size=1, num_samples=64, num_elites=8, num_pi_trajs=4, iterations=2, batch_size=32)
    agent = Agent(cfg, ModelDims.from_config(cfg, (24,), 6, True), 500, torch.device("cpu"))
    H, B = cfg.horizon, cfg.batch_size
    batch = Batch(torch.randn(H + 1, B, 24), torch.rand(H, B, 6), torch.randn(H, B), torch.zeros(H, B, dtype=bool))
    obs, first = np.random.randn(2, 24).astype(np.float32), np.ones(2, dtype=bool)
    agent.act(obs, first)  # allocate planners etc. outside the count
    agent.update(batch)
    with CountSyncs() as counter:
        agent.act(obs, first)
        agent.update(batch)
        agent.act(obs, ~first)
    assert counter.calls == [], counter.calls


def test_cpu_dropout_rate_is_p_in_every_16_bit_lane():
    from tdmpc.model.random import TORCH

    x = torch.ones(4 * 250_000)
    y = TORCH.dropout("dropout", x, 0.01, cheap_bits=True)
    dropped = (y == 0).float().view(-1, 4)  # the four lanes of each 64-bit draw
    assert torch.allclose(dropped.mean(0), torch.full((4,), 0.01), atol=1.5e-3)
    assert abs(y.mean().item() - 1.0) < 0.01  # kept values are rescaled


class _GemmDtypes(TorchDispatchMode):
    """The dtypes of every matmul run inside it."""

    GEMMS = {"mm", "addmm", "bmm", "baddbmm"}

    def __init__(self):
        super().__init__()
        self.seen: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket.__name__ in self.GEMMS:
            self.seen.append(args[1].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("how", ["bf16 tensors", "autocast"])
def test_bf16_matmuls_the_cpu_emulates_run_in_fp32_on_bf16_values(monkeypatch, how):
    """Without AVX512-BF16 or AMX torch emulates bf16 matmuls, 90-450x slower than fp32 (results/bf16-emulated); the
    layers run them in fp32 on the bf16-rounded operands and round the result, which is what a bf16 GEMM that sums
    in fp32 computes: within one bf16 rounding of torch's own bf16 result, gradients too. On CUDA's code path (the
    kernel count) they stay bf16 matmuls."""
    from tdmpc.model import layers
    from tdmpc.runtime import device
    from tdmpc.runtime.device import cuda_code_path

    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    x, w, b = torch.randn(64, 96), torch.randn(48, 96) / 10, torch.randn(48)
    xb, wb, bb = torch.randn(4, 64, 96), torch.randn(4, 96, 48) / 10, torch.randn(4, 1, 48)

    def run(x, w, b, xb, wb, bb):
        if how == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return layers.linear(x, w, b), layers.batched_linear(xb, wb, bb)
        return layers.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()), layers.batched_linear(
            xb.bfloat16(), wb.bfloat16(), bb.bfloat16())

    leaves = [t.requires_grad_() for t in (x, w, b, xb, wb, bb)]
    with _GemmDtypes() as emulated:
        outs = run(*leaves)
    assert emulated.seen == [torch.float32, torch.float32] and all(o.dtype == torch.bfloat16 for o in outs)
    grads = torch.autograd.grad(sum(o.float().square().sum() for o in outs), leaves)
    with cuda_code_path(), _GemmDtypes() as native:
        native_outs = run(*leaves)
    assert native.seen == [torch.bfloat16, torch.bfloat16]
    native_grads = torch.autograd.grad(sum(o.float().square().sum() for o in native_outs), leaves)
    for got, want in zip([*outs, *grads], [*native_outs, *native_grads]):
        assert got.dtype == want.dtype
        assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-3).all()
