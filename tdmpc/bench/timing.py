"""plan() and update() timed on this device, each with its FLOPs and the fraction of the matmul peak it reaches;
the agents, batches and machine description every measurement of the benchmark shares."""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from typing import Any, Callable, Literal

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config, validate
from tdmpc.model import fused
from tdmpc.model.world_model import ModelDims
from tdmpc.runtime import cuda_graphs

OBS_DIM, ACTION_DIM = 24, 6  # walker-walk, the anchors' dims
BATCH = 256  # the reference batch of an update

OVERRIDES: dict[str, Any] = {}  # Config fields every agent of this run takes (--compile, --horizon, ...)


def sync(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = cuda_graphs.WARMUP + 2) -> float:
    """Median seconds per call, after the warm-up calls: with CUDA graphs those include the eager calls and
    the capture, so every timed call is a replay."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


class _FlopsByDtype(TorchDispatchMode):
    """What FlopCounterMode counts (its registry of matmuls and convolutions), summed by the dtype each op ran
    in: a mixed-precision update runs matmuls in both fp32 and bf16, each against its own peak.

    An op outside the registry is decomposed first, as FlopCounterMode does: under inference_mode (planning)
    F.linear reaches the mode as one aten.linear, which only its decomposition (addmm, mm) tells the cost of."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket not in flop_registry:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            dtype = next(a.dtype for a in tree_leaves(args) if isinstance(a, torch.Tensor))
            self.flops[_PEAK_OF.get(dtype, "fp32")] += count(*args, **kwargs, out_val=out)
        return out


_PEAK_OF = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def count_flops(fn: Callable[[], object]) -> dict[str, int]:
    """FLOPs of one call, by the peak they run against ('fp32', 'bf16')."""
    with _FlopsByDtype() as counter:
        fn()
    return dict(counter.flops)


def fraction_of_peak(flops: dict[str, int], seconds: float, peaks: dict) -> float:
    """The time the matmul peaks allow (each dtype's FLOPs at its own peak) over the time measured."""
    return sum(n / (peaks[kind]["peak"] * 1e9) for kind, n in flops.items()) / seconds


BF16_SKIPPED = ("this CPU has no AVX512-BF16 or AMX, so torch emulates bf16 matmuls (90-450 times slower than fp32 "
                "on an AVX2 EPYC, results/bf16-emulated), the package runs them in fp32 on bf16 values and "
                "--precision auto plans in fp32; its peak and the mixed and bf16 updates are left out")


def matmul_peak(device: torch.device, dtype: torch.dtype, reps: int) -> dict:
    """GFLOP/s of (M x K) @ (K x N) at the shapes planning and updates use; peak = the best."""
    shapes = [(512, 518, 1024), (512, 512, 512), (16384, 512, 512), (768, 518, 512), (2048, 2048, 2048)]
    out = {}
    for M, K, N in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        t = timeit(lambda: a @ b, device, reps)
        out[f"{M}x{K}x{N}"] = 2 * M * K * N / t / 1e9
    out["peak"] = max(out.values())
    return out


def agent_for(cfg: Config, device: torch.device, discrete: bool = False) -> Agent:
    """An agent of cfg for walker-walk's dims (discrete: ACTION_DIM discrete actions instead)."""
    return Agent(cfg, ModelDims.from_config(cfg, (OBS_DIM,), ACTION_DIM, False, discrete=discrete), 500, device)


def make_agent(size: int, device: torch.device, precision: Literal["auto", "fp32", "bf16"], **over) -> Agent:
    """The agent this run measures: the command line's OVERRIDES, then `over`."""
    return agent_for(validate(Config(model_size=size, device=str(device), precision=precision,
                                     **{**OVERRIDES, **over})), device)


def random_batch(agent: Agent, B: int = BATCH) -> Batch:
    """A batch of B random sequences of the agent's horizon: update() times the same whatever the data."""
    H, d = agent.cfg.horizon, agent.device
    return Batch(torch.randn(H + 1, B, OBS_DIM, device=d), torch.rand(H, B, ACTION_DIM, device=d) * 2 - 1,
                 torch.randn(H, B, device=d), torch.zeros(H, B, dtype=torch.bool, device=d))


def bench_model(size: int, device: torch.device, envs: tuple[int, ...], reps: int, peaks: dict,
                precision: Literal["auto", "fp32", "bf16"] = "auto",
                train_precisions: tuple[str, ...] = ("fp32", "mixed", "bf16")) -> dict:
    """plan() in the planning dtype; update() in each of train_precisions (fp32 is the default)."""
    agent = make_agent(size, device, precision)
    # FLOPs are counted on an eager twin: a graph replay dispatches no ops, and a compiled function first called
    # under the counting mode would not compile (dynamo leaves frames under a dispatch mode to eager).
    eager = make_agent(size, device, precision, compile=False, cuda_graphs=False)
    res: dict = {"model_size": size, "dtype": str(agent.plan_dtype).replace("torch.", ""), "plan": {}, "update": {}}
    for n in envs:
        obs = np.random.randn(n, OBS_DIM).astype(np.float32)
        first = np.zeros(n, dtype=bool)
        fn = lambda: agent.act(obs, first)  # noqa: E731
        flops = count_flops(lambda: eager.act(obs, first))
        t = timeit(fn, device, max(2, reps // max(1, n // 8)))
        res["plan"][n] = {"ms": t * 1e3, "actions_per_s": n / t, "gflop": sum(flops.values()) / 1e9,
                          "fraction_of_peak": fraction_of_peak(flops, t, peaks)}
    for train_precision in train_precisions:
        if train_precision != agent.cfg.train_precision:
            agent = make_agent(size, device, precision, train_precision=train_precision)
            eager = make_agent(size, device, precision, train_precision=train_precision, compile=False,
                               cuda_graphs=False)
        batch = random_batch(agent)
        flops = count_flops(lambda: eager.update(batch))
        t = timeit(lambda: agent.update(batch), device, reps)
        res["update"][train_precision] = {"ms": t * 1e3, "gflop": sum(flops.values()) / 1e9, "gflop_by_dtype":
                                          {k: v / 1e9 for k, v in flops.items()},
                                          "fraction_of_peak": fraction_of_peak(flops, t, peaks)}
    return res


def bench_plain(size: int, device: torch.device, reps: int) -> dict:
    """The same calls in plain fp32 eager mode without the fused kernels: the same-run baseline."""
    with fused.disabled():
        agent = make_agent(size, device, "fp32")
        obs, first = np.random.randn(1, OBS_DIM).astype(np.float32), np.zeros(1, dtype=bool)
        batch = random_batch(agent)
        return {"plan_ms": timeit(lambda: agent.act(obs, first), device, reps) * 1e3,
                "update_ms": timeit(lambda: agent.update(batch), device, reps) * 1e3}


def machine_info(device: torch.device) -> dict:
    """The CPU (model, cores, vector ISA), torch and the device the results were measured on."""
    flags = set()
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    info = {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "isa": isa,
            "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
            "fused_cpu_kernels": fused.extension_available()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
