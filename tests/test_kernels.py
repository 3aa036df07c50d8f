"""The counters behind `python -m tdmpc.bench --kernels`: kernels per call and transfers per training step."""

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tdmpc.runtime.device import cpu_fast_paths, cuda_code_path
from tdmpc.bench.kernels import TransferCounter, compiled_kernels, count_kernels, kernels_in_code

RESULTS = Path(__file__).parents[1] / "results"


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Mish(), nn.Linear(16, 3))


def test_eager_count_of_a_module_whose_kernels_are_known():
    """Linear (one addmm; its transpose is a view), LayerNorm, Mish, Linear: 4 kernels, with or without autograd,
    and views and allocations add none."""
    net, x = small_mlp(), torch.randn(5, 8)
    for mode in (torch.inference_mode, torch.no_grad, torch.enable_grad):
        with mode():
            c = count_kernels(lambda: net(x))
        assert c.total == 4, (mode, c.counts)
        assert c.counts == {"addmm": 2, "native_layer_norm": 1, "mish": 1}
    c = count_kernels(lambda: (x.view(40).unsqueeze(0).t(), torch.empty(3), x.transpose(0, 1)))
    assert c.total == 0, c.counts
    c = count_kernels(lambda: x.transpose(0, 1).contiguous() + 1)  # a real copy, then an add
    assert c.counts == {"clone": 1, "add": 1}, c.counts


def test_item_is_a_wait_not_a_kernel():
    x = torch.randn(4)
    c = count_kernels(lambda: float(x.sum()))
    assert c.counts == {"sum": 1} and sum(c.waits.values()) == 1


def test_sites_name_the_package_line_that_launched_each_op():
    from tdmpc.buffer import ReplayBuffer
    buf = ReplayBuffer(64, 2, (3,), 1, 3)
    buf.start(torch.zeros(2, 3))
    with cuda_code_path():
        counter = count_kernels(lambda: buf.add(torch.ones(2, 3), torch.zeros(2, 1), torch.ones(2),
                                                torch.zeros(2, dtype=torch.bool)), sites=True)
    assert counter.sites is not None and sum(counter.sites.values()) == counter.total > 0
    writes = [site for (op, site), n in counter.sites.items() if op == "index_put_"]
    assert writes and all(site.startswith("buffer.py:") and "field[envs, rows]" in site for site in writes)
    assert count_kernels(lambda: torch.ones(2) + 1).sites is None  # off unless asked: a stack walk per op


def test_the_triton_count_reads_a_gpus_kernels_and_leaves_nothing_behind():
    """A dynamics output's LayerNorm then SimNorm: the H200 ran it as two Triton kernels each time (a
    `native_layer_norm` and a `_softmax_native_layer_norm`, 15 of each per compiled plan()), where inductor's C++ code
    fuses one. Counted in the Triton code written for a GPU: two with gradients (the update's forward), one without
    (planning: fused._ln_simnorm_pointwise, the softmax as pointwise sums). After it, compiling is the CPU's again."""
    from tdmpc.bench.triton_code import triton_for_gpu
    from tdmpc.model.fused import ln_act

    gamma, beta = torch.ones(512), torch.zeros(512)
    trained = torch.ones(512, requires_grad=True)
    def fn(x):
        return ln_act(x, gamma, beta, "simnorm", group=8)
    def fn_grad(x):
        return ln_act(x, trained, beta, "simnorm", group=8)
    x = torch.randn(512, 512)
    with triton_for_gpu():
        assert compiled_kernels(torch.compile(fn, fullgraph=True), x) == {"fused": 1}
        torch._dynamo.reset()
        assert compiled_kernels(torch.compile(fn_grad, fullgraph=True), x) == {"fused": 2}
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    assert compiled_kernels(compiled, x) == {"fused": 1}
    torch.testing.assert_close(compiled(x), fn(x))  # real kernels: no stand-in survived


def test_combo_kernels_are_counted_as_a_gpu_would_launch_them():
    """Two independent pointwise results: two Triton kernels, or one with inductor's combo kernels (which it
    forms on a GPU only: the count groups the CPU's nodes as it would a GPU's)."""
    from tdmpc.bench.triton_code import triton_for_gpu

    def fn(x, y):
        return x.sin() * 2, y.cos() + 1
    x, y = torch.randn(64, 32), torch.randn(128)
    with triton_for_gpu():
        assert compiled_kernels(torch.compile(fn, fullgraph=True), x, y) == {"fused": 2}
    with triton_for_gpu(combo_kernels=True):
        assert compiled_kernels(torch.compile(fn, fullgraph=True), x, y) == {"fused": 1}
    import torch._inductor.config as inductor_config
    from torch._inductor.scheduler import ForeachKernelSchedulerNode
    assert not inductor_config.combo_kernels  # the setting went with it
    assert ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels.__module__ == "torch._inductor.scheduler"


@pytest.mark.compile  # CI's compile steps: with torch 2.13 and 2.11, whose lowerings the patch must both find
def test_a_cat_is_counted_as_cuda_lowers_it():
    """The planner's stack of each step's LayerNorm + Mish outputs (both heads, heads first), read once after the
    rollout: on the CPU inductor copies a cat input by input (here the LayerNorm kernels write straight into it),
    on CUDA it computes this one in a kernel of its own (the H200's 5 per plan()). The count takes CUDA's lowering:
    three LayerNorms and the stack; after it the CPU's lowering is back."""
    import torch._inductor.lowering as lowering

    from tdmpc.bench.triton_code import triton_for_gpu
    from tdmpc.model.fused import ln_act

    w, w2, gamma, beta = torch.randn(2, 32, 32), torch.randn(32, 8), torch.ones(2, 32), torch.zeros(2, 32)

    def rollout(x):
        features = []
        for _ in range(3):
            h = ln_act(torch.bmm(x, w), gamma, beta, "mish", heads_first=True)
            features.append(h)
            x = (h[0] @ w[0]).expand(2, -1, -1)
        return torch.stack(features, dim=1)[1].reshape(-1, 32) @ w2

    cpu_lowering = lowering.cat.__wrapped__.__code__
    with torch.no_grad(), triton_for_gpu():
        assert compiled_kernels(torch.compile(rollout, fullgraph=True), torch.randn(2, 16, 32)) == {
            "fused": 4, "extern.bmm": 3, "extern.mm": 3}
    assert lowering.cat.__wrapped__.__code__ is cpu_lowering


def test_the_one_kernel_simnorm_is_the_softmax():
    """fused._ln_simnorm_pointwise (compiled, no gradients) against LayerNorm then softmax over groups of 8, in fp32
    (to about 1e-6) and bf16 (CUDA's planning dtype: the same rounding as the fp32 result's, or one step of it)."""
    from tdmpc.model.fused import ln_act

    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 512, generator=g) * 3
    gamma, beta = 1 + torch.randn(512, generator=g) / 5, torch.randn(512, generator=g) / 5
    exact = torch.softmax(nn.functional.layer_norm(x.double(), (512,), gamma.double(), beta.double())
                          .unflatten(-1, (-1, 8)), -1).flatten(-2)
    torch._dynamo.reset()
    with torch.no_grad():
        fp32 = torch.compile(lambda x: ln_act(x, gamma, beta, "simnorm"), fullgraph=True)(x)
        torch._dynamo.reset()
        bf16 = torch.compile(lambda x: ln_act(x, gamma, beta, "simnorm"), fullgraph=True)(x.bfloat16())
    torch.testing.assert_close(fp32.double(), exact, rtol=2e-6, atol=1e-7)
    exact_bf16 = torch.softmax(nn.functional.layer_norm(x.bfloat16().double(), (512,), gamma.double(), beta.double())
                               .unflatten(-1, (-1, 8)), -1).flatten(-2)
    assert bf16.dtype == torch.bfloat16
    assert (bf16.double() - exact_bf16).abs().max() <= 2 ** -8  # within one bf16 step of values <= 1
    assert (bf16 != exact_bf16.bfloat16()).float().mean() < 1e-3


def test_without_triton_the_gpu_count_asks_for_it(monkeypatch):
    import importlib.util

    from tdmpc.bench.triton_code import triton_for_gpu
    from tdmpc.errors import BadInput

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    with pytest.raises(BadInput, match=r"pip install 'tdmpc\[kernels\]'"):
        with triton_for_gpu():
            pass


def test_compiled_count_reads_the_generated_code():
    """relu(x @ w) * 2 + 1: one extern matmul and one fused pointwise kernel."""
    torch._dynamo.reset()
    w = torch.randn(8, 8)
    fn = torch.compile(lambda x: torch.relu(x @ w) * 2 + 1, fullgraph=True)
    kinds = compiled_kernels(fn, torch.randn(4, 8))
    assert sum(kinds.values()) == 2 and kinds["fused"] == 1 and sum(v for k, v in kinds.items() if k.startswith("extern")) == 1, kinds


def test_code_parser_counts_launches_not_allocations():
    source = """
def call(args):
    buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
    extern_kernels.mm(arg0_1, arg1_1, out=buf0)
    buf1 = reinterpret_tensor(buf0, (32,), (1,), 0)
    cpp_fused_add_mul_relu_0(buf1, arg2_1)
    triton_poi_fused_1.run(buf1, 32, stream=stream0)
    buf2 = torch.ops.aten.sort.stable(buf1, dim=0)
    return (buf1,)
"""
    assert kernels_in_code(source) == {"extern.mm": 1, "fused": 2, "aten.sort": 1}


def test_cuda_code_path_switches_off_the_cpu_paths():
    cpu = torch.device("cpu")
    assert cpu_fast_paths(cpu)
    with cuda_code_path():
        assert not cpu_fast_paths(cpu)
    assert cpu_fast_paths(cpu) and not cpu_fast_paths(torch.device("meta"))


def test_transfer_counter_sees_copies_and_waits():
    """Host data made into device tensors, copies of host tensors, and reads back; pinned non_blocking copies
    do not wait; ops on host tensors stay on the host, and a host tensor mixed into a device op is a copy."""
    dev = torch.zeros(4)
    with TransferCounter() as c:
        host = torch.from_numpy(np.ones(4, np.float32))
        host2 = host * 2  # still on the host
        on_dev = host2.to(dev.device)
        torch.as_tensor(np.arange(3), device=dev.device)
        pinned = host.pin_memory() if torch.cuda.is_available() else None
        dev.add_(on_dev)
        dev.cpu().numpy()
    assert c.h2d == {"Tensor.to": 1, "as_tensor": 1}, c.h2d
    assert c.waits == {"blocking Tensor.to": 1, "as_tensor from pageable memory": 1, "cpu": 1}, c.waits
    del pinned
    with TransferCounter() as c:
        host = torch.from_numpy(np.ones(4, np.float32))
        dev[torch.as_tensor(np.array([0, 1]))] = 1.0  # a host index into a device tensor: CUDA copies it
        float(dev.sum())
    assert c.h2d_copies == 1 and c.waits == {"implicit h2d in index_put_": 1, "__float__": 1}, (c.h2d, c.waits)
    assert not hasattr(host, TransferCounter.HOST)  # no mark outlives the count


def test_to_device_sends_every_field_in_one_copy():
    """Fields of several dtypes and shapes come back as they were, from one staged, non_blocking copy."""
    from tdmpc.runtime.transfer import to_device

    fields = [np.arange(6, dtype=np.int64).reshape(2, 3), np.array([True, False, True]),
              np.linspace(0, 1, 5, dtype=np.float32), np.arange(7, dtype=np.uint8)]
    with cuda_code_path(), TransferCounter() as c:
        out = to_device(torch.device("cpu"), *fields)
    assert c.h2d_copies == 1 and c.blocking_waits == 0, (c.h2d, c.waits)
    for f, t in zip(fields, out):
        assert t.shape == f.shape and np.array_equal(t.numpy(), f) and t.numpy().dtype == f.dtype


def test_a_training_step_copies_to_the_device_once_and_waits_once():
    """One step of the real loop that acts, stores and updates: the buffer's rows, indices and validity in one
    copy; the agent acts on the buffer's newest rows, already there; the only wait is the action coming back,
    before the updates are queued (overlap_updates, CUDA's default), so nothing holds the host while they run."""
    from tdmpc.bench.kernel_counts import step_transfers

    with cuda_code_path():
        c, waits_before_updates = step_transfers(1)
    assert c.h2d == {"Tensor.to": 1} and c.waits == {"cpu": 1}, (c.h2d, c.waits)
    assert waits_before_updates == 1


def test_the_categorical_planner_launches_about_as_many_kernels_as_mppi():
    """One eager plan() on CUDA's code path, one env, 6 actions or 6 action dims: the inverse-CDF draw costs a few
    kernels per iteration more than the Gaussian's, the exact bootstrap over the n actions a few less than a sampled
    prior action (742 against 777 when this was written, 737 against 761 on 2026-11-28; docs/discrete.md). Model
    size 1: its layers are narrower, not fewer, so it launches what size 5 does (737 and 761 both, 2026-11-29), in
    two thirds of the time where bf16 is emulated."""
    from tdmpc.bench.kernel_counts import counting_agent, plan_kernels
    from tdmpc.runtime.device import cuda_code_path

    with cuda_code_path():
        continuous = sum(plan_kernels(counting_agent(1, False), 1, False).values())
        discrete = sum(plan_kernels(counting_agent(1, False, discrete=True), 1, False).values())
    assert abs(discrete - continuous) <= 40, (continuous, discrete)


def test_gpu_kernels_are_set_beside_the_op_that_launched_them_and_the_cpu_count():
    """bench --profile on CUDA: the profiler's kernels per launching op, and where they differ from the CPU count.
    Here with the profiler's own event objects on the CPU (no kernels) and stand-ins for CUDA's."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from tdmpc.bench.gpu_profile import count_differences, kernels_by_op, kernels_by_site

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(4, 4) @ torch.ones(4, 4)
    assert any(e.name == "aten::mm" for e in prof.events()) and kernels_by_op(prof.events()) == Counter()
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    def frames(*names):  # the profiler's Python frames above an op, innermost first (cpu_parent)
        parent = None
        for name in reversed(names):
            parent = NS(name=name, cpu_parent=parent)
        return parent

    generated = frames("<built-in method mm>", "torchinductor_root/ab/cabc.py(71): call", "tdmpc/actor.py(9): act")
    events = [NS(device_type=cpu, name="aten::native_layer_norm_backward", kernels=[NS(name="grad_input"),
                                                                                    NS(name="gamma_beta")],
                 cpu_parent=None),
              NS(device_type=cpu, name="aten::mm", kernels=[NS(name="sm90_gemm"), NS(name="Memset (Device)")],
                 cpu_parent=frames("torch/_ops.py(840): __call__", "x.py(3): f")),
              NS(device_type=cpu, name="aten::copy_", kernels=[NS(name="direct_copy_kernel")], cpu_parent=generated,
                 input_shapes=[[512, 24], [512, 24], []]),
              NS(device_type=cpu, name="aten::linear", kernels=[], cpu_parent=None),  # composite: its addmm launched it
              NS(device_type=cuda, name="sm90_gemm", kernels=[], cpu_parent=None)]
    by_op = kernels_by_op(events)
    assert by_op == Counter({"native_layer_norm_backward": 2, "mm": 1, "copy_": 1})
    assert kernels_by_site(events) == {"native_layer_norm_backward [] <- ?": 2, "mm [] <- x.py(3): f": 1,
                                       "copy_ [[512, 24], [512, 24]] <- cabc.py(71): call": 1}
    assert count_differences(by_op, Counter({"native_layer_norm_backward": 1, "mm": 1, "topk": 1})) == {
        "copy_": 1, "native_layer_norm_backward": 1, "topk": -1}


def test_the_committed_kernel_counts_are_the_codes_eager_counts():
    """results/kernels.json (what BENCHMARKS.md quotes) is rewritten by `bench --kernels`: its eager counts at model
    size 5 must be what the code launches now, so a change that adds or removes kernels cannot leave it stale."""
    from tdmpc.bench.kernel_counts import counting_agent, plan_kernels, update_kernels

    committed = json.loads((RESULTS / "kernels.json").read_text())
    with cuda_code_path():
        plan = sum(plan_kernels(counting_agent(5, False), 1, False).values())
        update = sum(update_kernels(5, False)[1].values())
    assert (plan, update) == (committed["plan_kernels_eager"], committed["update_kernels_eager"]), \
        "rerun python -m tdmpc.bench --kernels and commit results/kernels.json"


def _torch_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# Inductor's fusion differs between torch releases (2.11 fused 45 fewer of plan()'s kernels than 2.13 before
# PLAN_OPTIONS), so each count file holds one torch's counts: CI's (2.13) and the GPU machines' (2.11, .ci/run).
COUNT_FILES = [(name, combo, split) for name, combo, split in [
    ("kernels.json", False, True), ("kernels-combo.json", True, True), ("kernels-combo-no-split.json", True, False),
    ("kernels-torch2.11.json", False, True)]
    if _torch_minor(json.loads((RESULTS / name).read_text())["torch"]) == _torch_minor(torch.__version__)]


@pytest.mark.compile
def test_a_committed_kernel_count_is_for_this_torch():
    minor = _torch_minor(torch.__version__)
    assert COUNT_FILES, (f"no results/kernels*.json counts torch {minor}'s kernels: "
                         f"python -m tdmpc.bench --kernels --kernels-out results/kernels-torch{minor}.json")


@pytest.mark.compile
@pytest.mark.parametrize("name,combo,split", COUNT_FILES)
def test_the_committed_kernel_counts_are_the_codes_compiled_counts(name, combo, split):
    """The same for the compiled counts, read from the Triton code written for a GPU (half a minute of compiling
    each): as compiled today, with combo kernels (--combo-kernels), and with them and no split reductions; each
    file with the torch it was counted with."""
    import torch._inductor.config as inductor_config

    from tdmpc.bench.kernel_counts import counting_agent, plan_kernels, update_kernels
    from tdmpc.bench.triton_code import triton_for_gpu
    from tdmpc.runtime.device import cuda_code_path

    committed = json.loads((RESULTS / name).read_text())
    assert (committed["combo_kernels"], committed["split_reductions"]) == (combo, split)
    with cuda_code_path(), inductor_config.patch(split_reductions=split), triton_for_gpu(combo):
        plan = sum(plan_kernels(counting_agent(5, False), 1, True).values())
        update = sum(sum(part.values()) for part in update_kernels(5, True))
    assert (plan, update) == (committed["plan_kernels_compiled"], committed["update_kernels_compiled"]), \
        f"rerun python -m tdmpc.bench --kernels and commit results/{name}"


def test_the_cpu_count_predicts_the_last_gpu_profile_by_group():
    """The last GPU profile (an H200, 2026-11-30) beside the CPU count of its commit: grouped alike, the offsets per
    group rebuild the GPU's totals, and where the two must agree they do: the GPU ran exactly the GEMMs the CPU
    counter counts for plan() today (108 eager: a matmul added or removed fails here until a new profile is taken;
    102 compiled), the compiled plan() no copy but the one of its 24-row staging (36 before plan() used bmm for
    baddbmm), and the Triton code written on the CPU has within 10 of the fused kernels the GPU ran."""
    from tdmpc.bench.kernel_counts import counting_agent, plan_kernels
    from tdmpc.bench.kernel_groups import CALLS, by_group, counted, gpu_estimate, gpu_groups, offsets, profile
    from tdmpc.runtime.device import cuda_code_path

    p = profile()
    assert {c: sum(p["gpu"][c].values()) for c in CALLS} == {
        "plan_eager": 771, "update_eager": 626, "plan_compiled": 255, "update_compiled": 292}
    for call in CALLS:
        assert gpu_estimate(call, counted(call)) == sum(p["gpu"][call].values()), call
    for call in ("plan_compiled", "update_compiled"):
        assert abs(offsets(call).get("fused (inductor)", 0)) <= 10, offsets(call)
    assert "GEMM" not in offsets("plan_eager") and "GEMM" not in offsets("plan_compiled")
    assert offsets("update_compiled")["split-K reduce"] == 22  # cuBLAS's, which no CPU count can see
    with cuda_code_path():
        plan = plan_kernels(counting_agent(5, False), 1, False)
    assert by_group(plan)["GEMM"] == by_group(p["gpu"]["plan_eager"], gpu_groups)["GEMM"] == 108
    # the compiled count is the committed one (the compile tests check it against the code's)
    assert by_group(counted("plan_compiled"))["GEMM"] == by_group(p["gpu"]["plan_compiled"], gpu_groups)["GEMM"] == 102
    assert offsets("plan_compiled")["copy"] == by_group(p["gpu"]["plan_compiled"], gpu_groups)["copy"] == 1


@pytest.mark.compile
def test_a_compiled_calls_ops_are_traced_to_the_generated_codes_line():
    """bench --profile's by_site on a real profile: an op a compiled function calls is traced to inductor's
    generated code (here on the CPU: the profiler's frames are the same on CUDA), or on torch 2.11 to its
    compiled graph."""
    from torch.profiler import ProfilerActivity, profile

    from tdmpc.bench.gpu_profile import call_site

    fn = torch.compile(lambda x: torch.mm(x, x).sin() @ x, dynamic=False)
    fn(torch.ones(8, 8))
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        fn(torch.ones(8, 8))
    sites = [call_site(e) for e in prof.events() if e.name == "aten::mm"]
    # torch 2.13 records the generated code's frames; 2.11 (the H200's) only the compiled graph's call
    assert len(sites) == 2 and all(re.fullmatch(r"c\w+\.py\(\d+\): call|CompiledFxGraph \w+", s) for s in sites), sites
