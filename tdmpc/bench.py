"""python -m tdmpc.bench: measure plan() and update() against this machine's own matmul peak.

Everything is measured in one run on one device: the matmul peak (fp32 and bf16) at the
shapes the model uses, planning latency and throughput for 1, 8 and 32 envs at model
sizes 1 and 5 with the reference planning settings, update time at batch 256, the
end-to-end agent steps/s of the training loop on a real task, and host RSS growth over
a longer run. FLOPs of each call are counted with torch.utils.flop_counter, so every
time comes with the fraction of the peak it achieves. It prints a table and writes JSON.
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from tdmpc.errors import BadInput, parse_args, run_cli
from tdmpc.model import fused
from tdmpc.runtime import cuda_graphs
from tdmpc.runtime.files import json_text, write_text_atomic
from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config, validate
from tdmpc.memory.fit import gpu_mem_bytes
from tdmpc.runtime.device import resolve_device, resolve_dtype, set_matmul_precision, set_threads
from tdmpc.model.world_model import ModelDims

OBS_DIM, ACTION_DIM = 24, 6  # walker-walk, the anchors' dims


@dataclass
class BenchArgs:
    quick: bool = False
    """Fewer repetitions and shorter runs (about 3 minutes on 2 CPU cores)."""
    device: str = "auto"
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    out: Path = Path("bench.json")
    """Where the full results go (JSON); the table is printed."""
    sizes: tuple[int, ...] = (1, 5)
    """Model sizes to time plan() and update() at."""
    envs: tuple[int, ...] = (1, 8, 32)
    """Numbers of envs planned for in one plan() call."""
    task: str = "cartpole-swingup"
    """Task of the end-to-end measurement (Pendulum-v1 if dm_control is missing)."""
    e2e_steps: Optional[int] = None
    """Agent steps timed end to end (default 300, quick 60)."""
    rss_steps: Optional[int] = None
    """Agent steps of the RSS run after warm-up (default 20000, quick 2000), with a small model."""
    warmup_steps: Optional[int] = None
    """Seeding steps before the end-to-end and RSS runs, and as many pretraining updates (default 1000, quick
    200)."""
    compare_plain: bool = True
    """Also time the plain fp32 eager variant (no fused kernels) for same-run ratios."""
    threads: Optional[int] = None
    """CPU threads for torch. None: the cores other processes leave idle (time on an idle machine)."""
    offline_rows: int = 1_000_000
    """Rows of the synthetic dataset for the offline measurement (update time, data in memory vs streamed)."""
    offline_updates: Optional[int] = None
    """Updates timed per offline sampler (default 200, quick 40); 0 skips the measurement."""
    kernels: bool = False
    """Instead of timing: count the kernels of plan() and update() and the host-device copies and waits of a
    training step, on the code path CUDA takes, eager and compiled (no GPU needed; about 15 minutes on 2 cores,
    most of it compiling). Writes --kernels-out."""
    kernels_out: Path = Path("results/kernels.json")
    """Where --kernels writes its counts (JSON)."""
    tensor_envs: bool = False
    """Instead of the rest: env steps/s through the training loop of a tensor-native env (gymnasium's JAX
    phys2d/Pendulum-v0, needs tdmpc[jax]) against the same task on the numpy path (Pendulum-v1), while seeding
    (envs and buffer alone) and while acting (one plan() for all envs per step, no updates), and the host copies
    and waits of an acting step on CUDA's code path. Writes --tensor-envs-out."""
    tensor_envs_out: Path = Path("results/tensor-envs.json")
    """Where --tensor-envs writes its measurements (JSON)."""
    compile: bool = False
    """Time every agent with Config.compile (plan() and update() through torch.compile)."""
    matmul_precision: Optional[Literal["highest", "high"]] = None
    """fp32 matmuls ('high': TF32 on GPUs that have it). None: Config's default ('high' on CUDA)."""
    horizon: Optional[int] = None
    """Planning and update horizon for every agent (None: Config's, 3)."""
    num_samples: Optional[int] = None
    """Planning samples for every agent (None: Config's, 512)."""
    e2e_envs: tuple[int, ...] = (1,)
    """Env counts of the end-to-end measurement (one update per env step); none given: none (--e2e-procs
    alone)."""
    e2e_procs: tuple[int, ...] = ()
    """For each N given: the end-to-end measurement (1 env) in N processes at once, each with its share of the
    CPU threads, timed from one barrier. How many training runs one machine (or one GPU) holds before their
    total agent steps/s stops growing: the --jobs to give tdmpc.reproduce."""
    gpu_mem: Optional[str] = None
    """On CUDA: cap the allocator at this size (16GiB: the A4000's card), as tdmpc.train --gpu-mem does; the
    end-to-end rows report their peak memory beside the memory estimate."""
    overlap_updates: Optional[bool] = None
    """End to end: run each step's updates while the envs step (None: Config's default, on with CUDA); compare
    --no-overlap-updates for what it gains."""
    profile: bool = False
    """On CUDA: count the kernels of one plan() and one update() with torch.profiler (graphs off, and as run),
    and the GPU's busy fraction over end-to-end steps."""


def sync(device: torch.device) -> None:
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


OVERRIDES: dict[str, Any] = {}  # Config fields every agent of this run takes (--compile, --horizon, ...)


def make_agent(size: int, device: torch.device, precision: Literal["auto", "fp32", "bf16"], **over) -> Agent:
    cfg = validate(Config(model_size=size, device=str(device), precision=precision, **{**OVERRIDES, **over}))
    return Agent(cfg, ModelDims.from_config(cfg, (OBS_DIM,), ACTION_DIM, False), 500, device)


def random_batch(agent: Agent, B: int = 256) -> Batch:
    H, d = agent.cfg.horizon, agent.device
    return Batch(torch.randn(H + 1, B, OBS_DIM, device=d), torch.rand(H, B, ACTION_DIM, device=d) * 2 - 1,
                 torch.randn(H, B, device=d), torch.zeros(H, B, dtype=torch.bool, device=d))


def bench_model(size: int, device: torch.device, envs: tuple[int, ...], reps: int, peaks: dict,
                precision: Literal["auto", "fp32", "bf16"] = "auto") -> dict:
    """plan() in the planning dtype; update() in both training precisions (fp32 is the default)."""
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
    for train_precision in ("fp32", "mixed", "bf16"):
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


def _cuda_kernels(prof: Any) -> list:
    """The kernel launches a torch.profiler run recorded on the GPU (copies and memsets left out)."""
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset", "[memory]"))]


def kernels_by_op(events: Any) -> Counter[str]:
    """GPU kernels per ATen op that launched them (the innermost op, named as KernelCounter names it), from a
    torch.profiler run with CPU and CUDA activities: the profiler links each kernel to the op that launched it."""
    by_op: Counter[str] = Counter()
    for e in events:
        launched = [k for k in e.kernels if not k.name.startswith(("Memcpy", "Memset"))]
        if e.device_type == DeviceType.CPU and launched:
            by_op[e.name.removeprefix("aten::")] += len(launched)
    return by_op


def count_differences(gpu: Counter[str], cpu: Counter[str]) -> dict[str, int]:
    """Per op, the GPU's kernels less the CPU count's, where they differ: where the CPU count must learn."""
    return {op: gpu[op] - cpu[op] for op in sorted(gpu.keys() | cpu.keys()) if gpu[op] != cpu[op]}


def profile_kernels(size: int, device: torch.device) -> dict:
    """Kernels of one plan() (1 env) and one update() (batch 256) as the GPU ran them (torch.profiler, CUPTI),
    with CUDA graphs off and on. Graphs off, each kernel is set beside the op that launched it, and the ops'
    counts beside tdmpc.bench --kernels's, counted here on the CPU along CUDA's code path: `differences` (for
    plan() they include act()'s own few ops around the planner, which the CPU count leaves out; without
    --compile, --horizon and --num-samples, whose agents the CPU count does not build)."""
    from torch.profiler import ProfilerActivity, profile

    from tdmpc.report.kernel_counts import counting_agent, plan_kernels, update_kernels
    from tdmpc.runtime.device import cuda_code_path

    cpu: dict[str, Counter[str]] = {}
    if not {"compile", "horizon", "num_samples"} & OVERRIDES.keys():  # else not the agent the CPU count builds
        with cuda_code_path():
            cpu = {"plan": plan_kernels(counting_agent(size, compile=False), 1, False),
                   "update": update_kernels(size, compiled=False)[1]}
    out: dict = {}
    for graphs in (False, True):
        agent = make_agent(size, device, "auto", cuda_graphs=graphs)
        obs, first = np.random.randn(1, OBS_DIM).astype(np.float32), np.zeros(1, dtype=bool)
        batch = random_batch(agent)
        for name, fn in (("plan", lambda: agent.act(obs, first)), ("update", lambda: agent.update(batch))):
            for _ in range(cuda_graphs.WARMUP + 2):
                fn()
            sync(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                sync(device)
            kernels = _cuda_kernels(prof)
            row = out[f"{name}_graphs_{'on' if graphs else 'off'}"] = {
                "kernels": len(kernels), "kernel_us": sum(e.device_time for e in kernels),
                "by_name": dict(Counter(e.name[:120] for e in kernels).most_common())}
            if not graphs and cpu:  # a graph's replay launches its kernels from no op
                by_op = kernels_by_op(prof.events())
                row.update(by_op=dict(by_op.most_common()), unattributed=len(kernels) - sum(by_op.values()),
                           cpu_count=sum(cpu[name].values()), differences=count_differences(by_op, cpu[name]))
    return out


def gpu_busy(run: Callable[[], object], device: torch.device) -> dict:
    """The fraction of wall-clock time the GPU ran a kernel while `run` ran (the union of kernel intervals)."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync(device)
    wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in _cuda_kernels(prof))
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return {"wall_ms": wall * 1e3, "kernel_ms": busy / 1e3, "busy_fraction": busy / 1e6 / wall,
            "kernels": len(spans)}


def bench_plain(size: int, device: torch.device, reps: int) -> dict:
    """The same calls in plain fp32 eager mode without the fused kernels: the same-run baseline."""
    with fused.disabled():
        agent = make_agent(size, device, "fp32")
        obs, first = np.random.randn(1, OBS_DIM).astype(np.float32), np.zeros(1, dtype=bool)
        batch = random_batch(agent)
        return {"plan_ms": timeit(lambda: agent.act(obs, first), device, reps) * 1e3,
                "update_ms": timeit(lambda: agent.update(batch), device, reps) * 1e3}


def bench_offline(size: int, device: torch.device, rows: int, updates: int) -> dict:
    """Offline training's update time with the data in memory vs streamed from disk in prefetched windows
    (a synthetic walker-sized dataset of `rows` rows, written to a temp file), at model size `size`."""
    from tdmpc.offline.format import Episode, open_dataset
    from tdmpc.offline.sampler import InMemoryDataset, StreamingDataset
    from tdmpc.offline.writer import DatasetWriter

    length, rng = 500, np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.h5"
        t0 = time.perf_counter()
        with DatasetWriter(path, (OBS_DIM,), ACTION_DIM, ["walker-walk"], "state", 2, "tdmpc.bench") as w:
            w.commit(Episode(np.cumsum(rng.standard_normal((length + 1, OBS_DIM)), 0).astype(np.float32) * 0.1,
                             rng.uniform(-1, 1, (length, ACTION_DIM)).astype(np.float32),
                             rng.uniform(0, 1, length).astype(np.float32), False, True)
                     for _ in range(rows // (length + 1)))
        write_s = time.perf_counter() - t0
        info = open_dataset(path, check_rows=False)
        agent = make_agent(size, device, "auto")
        # Windows 1/16 of the data, replaced 4 times while timed (training swaps every ~window/batch updates,
        # far less often): each swap's read and copy compete with the updates, as they would on a long run.
        window, swap_every = max(1, info.rows // 16), max(1, updates // 4)
        out: dict = {"rows": info.rows, "file_mb": path.stat().st_size / 1e6, "write_s": write_s, "model_size": size}
        for name, make in (("memory", lambda: InMemoryDataset(info, agent.cfg.horizon, device)),
                           ("stream", lambda: StreamingDataset(info, agent.cfg.horizon, window_rows=window,
                                                               swap_every=swap_every, device=device))):
            sampler = make()
            try:
                for _ in range(5):
                    agent.update(sampler.sample(256))
                sync(device)
                t0 = time.perf_counter()
                for _ in range(updates):
                    agent.update(sampler.sample(256))
                sync(device)
                out[name] = {"update_ms": (time.perf_counter() - t0) / updates * 1e3,
                             "late_samples": getattr(sampler, "late_samples", 0),
                             "windows": getattr(sampler, "windows", 1), "window_rows": window}
            finally:
                sampler.close()
        out["stream_over_memory"] = out["stream"]["update_ms"] / out["memory"]["update_ms"]
        return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_training(task: str, device: torch.device, agent_steps: int, warmup_steps: int, small: bool,
                   threads: int, num_envs: int = 1, gpu_mem: str | None = None, profile: bool = False,
                   start: Any = None) -> dict:
    """Agent steps/s of the real training loop (num_envs envs, 1 update per env step) and RSS over the run; on
    CUDA the peak memory beside the estimate, and with `profile` the GPU's busy fraction over 20 more steps.
    `start`: a barrier of several processes, waited on before the timed steps (bench_processes)."""
    from tdmpc.envs import make_env
    from tdmpc.training.setup import trainer_for

    env, spec = make_env(task, seed=0)
    env.close()
    R = spec.action_repeat
    over: dict[str, Any] = dict(model_size=1, num_samples=128, num_elites=16, num_pi_trajs=8, iterations=3,
                                batch_size=64) if small else {}
    settle = min(20, agent_steps)  # agent steps after the pretraining burst, before timing starts
    cfg = validate(Config(task=task, device=str(device), seed_steps=warmup_steps * R,
                          steps=(warmup_steps + settle + agent_steps) * R, eval_freq=10**9, eval_episodes=0,
                          save_every=10**9, log_every=10**9, progress=False, tensorboard=False, threads=threads,
                          buffer_size=max(10_000, (warmup_steps + settle + agent_steps) * 2), num_envs=num_envs,
                          **{**OVERRIDES, **over}))
    with tempfile.TemporaryDirectory() as tmp:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        trainer = trainer_for(cfg, Path(tmp) / "run", device, gpu_mem=gpu_mem)
        c = trainer.counters
        assert cfg.seed_steps is not None
        while c.env_step < cfg.seed_steps + settle * R:  # seeding, pretraining updates, settling
            trainer.step()
        gc.collect()
        barrier_index = None  # which of the barrier's parties this process was (each gets its own)
        if start is not None:
            sync(device)
            barrier_index = start.wait(timeout=1800)
        rss0, t0, s0 = rss_mb(), time.perf_counter(), c.env_step
        samples = []
        while c.env_step < cfg.steps:
            trainer.step()
            if c.vector_steps % 500 == 0:
                samples.append(rss_mb())
        sync(device)
        dt = time.perf_counter() - t0
        steps = (c.env_step - s0) // R
        out = {"task": task, "small_model": small, "num_envs": num_envs, "agent_steps": steps,
               "threads": torch.get_num_threads(), "barrier_index": barrier_index,
               "agent_steps_per_s": steps / dt, "rss_start_mb": rss0, "rss_end_mb": rss_mb(),
               "rss_growth_mb": rss_mb() - rss0, "rss_samples_mb": samples[:: max(1, len(samples) // 20)],
               "config": {k: getattr(trainer.cfg, k) for k in ("model_size", "horizon", "num_samples", "iterations",
                                                               "batch_size", "compile", "cuda_graphs",
                                                               "overlap_updates")}}
        if device.type == "cuda":
            from tdmpc.memory import assess_run
            est = assess_run(trainer.cfg, trainer.spec.obs_shape, trainer.spec.action_dim, trainer.spec.episodic,
                             device, gpu_mem).estimate
            out.update(peak_allocated_gib=torch.cuda.max_memory_allocated(device) / 2**30,
                       peak_reserved_gib=torch.cuda.max_memory_reserved(device) / 2**30,
                       estimate_gib=est.total / 2**30, estimate_peak_allocated_gib=est.peak_allocated / 2**30)
            if profile:
                def more_steps() -> None:
                    for _ in range(max(1, 20 // num_envs)):
                        trainer.step()
                out["gpu_busy"] = gpu_busy(more_steps, device)
        trainer.close()
    return out


def _e2e_process(task: str, device: str, agent_steps: int, warmup_steps: int, small: bool, threads: int,
                 overrides: dict, gpu_mem: str | None, start: Any, results: Any) -> None:
    """One process of bench_processes (spawned: a fresh interpreter, as a separate run would be); the trainer
    sets its `threads`."""
    OVERRIDES.update(overrides)
    results.put(bench_training(task, torch.device(device), agent_steps, warmup_steps, small, threads,
                               gpu_mem=gpu_mem, start=start))


def bench_processes(task: str, device: torch.device, counts: tuple[int, ...], agent_steps: int, warmup_steps: int,
                    threads: int, gpu_mem: str | None = None, small: bool = False) -> dict:
    """--e2e-procs: for each N, N training loops (1 env each) in N processes, with threads // N CPU threads
    each, timed from one barrier after their warm-up. Each does the same steps, so they end close together and
    the sum of their rates is the machine's total over the shared window."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    out: dict[int, dict] = {}
    for n in counts:
        share = max(1, threads // n)
        start, results = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_e2e_process, daemon=True,
                             args=(task, str(device), agent_steps, warmup_steps, small, share, dict(OVERRIDES),
                                   gpu_mem, start, results)) for _ in range(n)]
        for p in procs:
            p.start()
        each: list[dict] = []
        while len(each) < n:
            try:
                each.append(results.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    for p in procs:
                        p.terminate()
                    raise RuntimeError(f"--e2e-procs {n}: a measuring process failed (exit codes "
                                       f"{[p.exitcode for p in procs]})") from None
        for p in procs:
            p.join()
        rates = sorted(e["agent_steps_per_s"] for e in each)
        out[n] = {"threads_each": share, "agent_steps_per_s_each": rates, "agent_steps_per_s_total": sum(rates),
                  "runs": each}
    return out


def bench_tensor_envs(device: torch.device, counts: tuple[int, ...], steps: int, threads: int) -> dict:
    """Env steps/s of the training loop on the tensor path and the numpy path (module BenchArgs.tensor_envs)."""
    from tdmpc.runtime.device import cuda_code_path
    from tdmpc.runtime.kernels import TransferCounter
    from tdmpc.training.setup import trainer_for

    rows = []
    for n in counts:
        for path, task in (("tensor", "phys2d/Pendulum-v0"), ("numpy", "Pendulum-v1")):
            seed_steps = (steps + 2) * n  # the warm-up and timed seeding steps all draw random actions
            cfg = validate(Config(task=task, device=str(device), num_envs=n, seed_steps=seed_steps,
                                  steps=10**9, update_every=10**9, eval_freq=10**9, eval_episodes=0, save_every=10**9,
                                  log_every=10**9, progress=False, tensorboard=False, threads=threads,
                                  buffer_size=4 * seed_steps, model_size=1, num_samples=128, num_elites=16,
                                  num_pi_trajs=8, iterations=3, horizon=3))
            row: dict[str, Any] = {"path": path, "task": task, "num_envs": n}
            for phase in ("seeding", "acting"):
                with tempfile.TemporaryDirectory() as tmp:
                    trainer = trainer_for(cfg, Path(tmp) / "run", device)
                    c = trainer.counters
                    if phase == "acting":
                        c.env_step = seed_steps  # act from the start: untrained weights plan as fast
                    trainer.step()  # warm-up (first plan, buffer pages)
                    sync(device)
                    t0, s0 = time.perf_counter(), c.env_step
                    for _ in range(steps):
                        trainer.step()
                    sync(device)
                    row[f"{phase}_env_steps_per_s"] = (c.env_step - s0) / (time.perf_counter() - t0)
                    trainer.close()
            with tempfile.TemporaryDirectory() as tmp, cuda_code_path():
                trainer = trainer_for(cfg, Path(tmp) / "run", device)
                trainer.counters.env_step = seed_steps
                trainer.step()
                with TransferCounter() as counter:
                    trainer.step()
                row["h2d_copies_per_vector_step"] = counter.h2d_copies
                row["host_waits_per_vector_step"] = counter.blocking_waits
                trainer.close()
            rows.append(row)
            print(f"  {path:6s} {n:4d} envs: seeding {row['seeding_env_steps_per_s']:9.0f} env steps/s, acting "
                  f"{row['acting_env_steps_per_s']:7.0f}, h2d copies {row['h2d_copies_per_vector_step']}, waits "
                  f"{row['host_waits_per_vector_step']} per vector step", file=sys.stderr)
    return {"machine": machine_info(device), "steps_timed": steps, "rows": rows}


def machine_info(device: torch.device) -> dict:
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


def print_table(r: dict) -> None:
    print(f"\n{r['machine']['cpu']} ({r['machine']['cores']} cores) | {r['machine'].get('gpu', 'no GPU')} | "
          f"torch {r['machine']['torch']} | device {r['machine']['device']}")
    print(f"matmul peak: fp32 ({r.get('fp32_matmul_precision', 'highest')}) {r['peak']['fp32']['peak']:.0f} GFLOP/s, "
          f"bf16 {r['peak']['bf16']['peak']:.0f} GFLOP/s")
    print(f"{'call':<38}{'ms':>10}{'actions/s':>12}{'GFLOP':>9}{'% peak':>9}")
    for m in r["models"]:
        tag = f"size {m['model_size']} ({m['dtype']})"
        for n, p in m["plan"].items():
            print(f"{'plan N=' + str(n) + ', ' + tag:<38}{p['ms']:>10.1f}{p['actions_per_s']:>12.1f}"
                  f"{p['gflop']:>9.2f}{100 * p['fraction_of_peak']:>8.0f}%")
        for tp, u in m["update"].items():
            tag = f"size {m['model_size']} ({tp}{', default' if tp == Config.train_precision else ''})"
            print(f"{'update B=256, ' + tag:<38}{u['ms']:>10.1f}{'':>12}{u['gflop']:>9.2f}"
                  f"{100 * u['fraction_of_peak']:>8.0f}%")
    for size, p in r.get("plain_fp32", {}).items():
        fast = next(m for m in r["models"] if m["model_size"] == int(size))
        update = fast["update"][Config.train_precision]["ms"]
        print(f"plain fp32 eager, size {size}: plan {p['plan_ms']:.1f} ms ({p['plan_ms'] / fast['plan'][1]['ms']:.1f}x"
              f" slower), update {p['update_ms']:.1f} ms ({p['update_ms'] / update:.1f}x slower than the"
              f" default {Config.train_precision} update)")
    for n in r["models"][0]["plan"]:
        if n != 1:
            ratios = ", ".join(f"size {m['model_size']}: {m['plan'][n]['actions_per_s'] / m['plan'][1]['actions_per_s']:.2f}x"
                               for m in r["models"])
            print(f"batched planning N={n} vs N=1 (actions/s): {ratios}")
    for m in r["models"]:
        for name, k in m.get("gpu_kernels", {}).items():
            beside = (f"; the CPU count {k['cpu_count']}, differing in "
                      f"{', '.join(f'{op} {d:+d}' for op, d in k['differences'].items()) or 'no op'}"
                      if "cpu_count" in k else "")
            print(f"size {m['model_size']} {name}: {k['kernels']} kernels on the GPU, {k['kernel_us'] / 1e3:.2f} ms of "
                  f"kernels{beside}")
    for n, e in r.get("end_to_end_by_envs", {}).items():
        mem = (f"; peak {e['peak_allocated_gib']:.2f} GiB allocated, {e['peak_reserved_gib']:.2f} reserved, estimate "
               f"{e['estimate_gib']:.2f}" if "peak_allocated_gib" in e else "")
        busy = f"; GPU busy {e['gpu_busy']['busy_fraction']:.0%}" if "gpu_busy" in e else ""
        overlap = ", updates beside the env step" if e.get("config", {}).get("overlap_updates") else ""
        print(f"end to end ({e['task']}, {n} env(s), 1 update per env step{overlap}): {e['agent_steps_per_s']:.1f} "
              f"agent steps/s over {e['agent_steps']} steps{mem}{busy}")
    procs = r.get("end_to_end_by_procs", {})
    one = procs.get(1, {}).get("agent_steps_per_s_total")
    for n, p in procs.items():
        than_one = f" ({p['agent_steps_per_s_total'] / one:.2f}x one process)" if one and int(n) != 1 else ""
        print(f"end to end, {n} process(es) at once ({p['threads_each']} thread(s) each, 1 env, 1 update per env "
              f"step): {p['agent_steps_per_s_total']:.1f} agent steps/s in all{than_one}; each "
              f"{', '.join(f'{x:.1f}' for x in p['agent_steps_per_s_each'])}")
    o = r.get("offline")
    if o:
        print(f"offline, size {o['model_size']}, {o['rows']:,} rows ({o['file_mb']:.0f} MB on disk): update B=256 "
              f"{o['memory']['update_ms']:.1f} ms with the data in memory, {o['stream']['update_ms']:.1f} ms streamed "
              f"({o['stream_over_memory']:.2f}x; {o['stream']['windows']} windows of "
              f"{o['stream']['window_rows']:,} rows loaded, {o['stream']['late_samples']} samples past due)")
    s = r.get("rss")
    if s:
        print(f"host RSS over {s['agent_steps']} agent steps after warm-up (small model): {s['rss_start_mb']:.0f} -> "
              f"{s['rss_end_mb']:.0f} MB ({s['rss_growth_mb']:+.1f} MB)")


def count_kernels(out: Path) -> int:
    """--kernels: the counts of tdmpc.report.kernel_counts, printed and written to `out`."""
    from tdmpc.report.kernel_counts import measure

    result = measure()
    rows = [("size 5", result), *((k.replace("size", "size "), v) for k, v in result.items() if k.startswith("size"))]
    print("kernels per call (CUDA's code path, counted on the CPU)")
    for name, r in rows:
        print(f"{name}: plan() 1 env {r['plan_kernels_eager']} eager / {r['plan_kernels_compiled']} compiled, "
              f"32 envs {r['plan_kernels_eager_32env']} / {r['plan_kernels_compiled_32env']}; update() B=256 "
              f"{r['update_kernels_eager']} / {r['update_kernels_compiled']}; per env step "
              f"{r['h2d_copies_per_env_step']} host-to-device copies, {r['blocking_waits_per_env_step']} host waits")
    write_text_atomic(out, json_text(result))
    print(f"wrote {out}")
    return 0


def check_output(path: Path, flag: str) -> None:
    """Before anything is measured: `path` can take the results (a file, in a folder that is there or can be made,
    and writable), else a one-line BadInput; a measurement of minutes is not lost at the end."""
    if path.is_dir():
        raise BadInput(f"{flag} {path} is a directory; give the file to write the results to, e.g. "
                       f"{flag} {path / 'bench.json'}")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise BadInput(f"{flag} {path}: {folder} is a file, so no folder can be made there")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {path}: {folder} is not writable")


def check_args(args: BenchArgs) -> torch.device:
    """Every input checked before the first measurement, each a one-line error: the output file, the device,
    --gpu-mem. Returns the device."""
    if args.kernels:
        check_output(args.kernels_out, "--kernels-out")
    elif args.tensor_envs:
        check_output(args.tensor_envs_out, "--tensor-envs-out")
    else:
        check_output(args.out, "--out")
    if args.device not in ("auto", "cpu", "cuda") and not (args.device.startswith("cuda:") and args.device[5:].isdigit()):
        raise BadInput(f"--device {args.device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if args.gpu_mem is not None:
        gpu_mem_bytes(args.gpu_mem)
    return resolve_device(args.device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(BenchArgs, argv, "python -m tdmpc.bench", __doc__.splitlines()[0])
    return run_cli(lambda: _main(args))


def _main(args: BenchArgs) -> int:
    device = check_args(args)
    set_threads(args.threads)
    if args.kernels:
        return count_kernels(args.kernels_out)
    if args.tensor_envs:
        out = bench_tensor_envs(device, (64, 256), 10 if args.quick else 40, torch.get_num_threads())
        write_text_atomic(args.tensor_envs_out, json_text(out))
        print(f"wrote {args.tensor_envs_out}")
        return 0
    reps = 5 if args.quick else 20
    OVERRIDES.update({k: v for k, v in (("compile", args.compile), ("matmul_precision", args.matmul_precision),
                                        ("horizon", args.horizon), ("num_samples", args.num_samples)) if v})
    if args.overlap_updates is not None:
        OVERRIDES["overlap_updates"] = args.overlap_updates
    if args.gpu_mem and device.type == "cuda":
        from tdmpc.memory import parse_size
        from tdmpc.runtime.device import cap_cuda_memory
        print(cap_cuda_memory(device, parse_size(args.gpu_mem)), file=sys.stderr)
    fused.extension_available()
    # The fp32 peak in the matmul precision the agents will set (TF32 on CUDA by default), not torch's default.
    fp32_matmuls = set_matmul_precision(args.matmul_precision, device)
    peaks = {"fp32": matmul_peak(device, torch.float32, reps), "bf16": matmul_peak(device, torch.bfloat16, reps)}
    result: dict = {"machine": machine_info(device), "quick": args.quick, "peak": peaks, "overrides": OVERRIDES,
                    "fp32_matmul_precision": fp32_matmuls,
                    "planning_dtype": str(resolve_dtype("auto", device)).replace("torch.", ""), "models": []}
    for size in args.sizes:
        print(f"benchmarking model size {size}...", file=sys.stderr)
        result["models"].append(bench_model(size, device, args.envs, reps, peaks))
        if args.profile and device.type == "cuda":
            result["models"][-1]["gpu_kernels"] = profile_kernels(size, device)
    if args.compare_plain:
        result["plain_fp32"] = {str(s): bench_plain(s, device, max(3, reps // 4)) for s in args.sizes}
    task = args.task
    try:
        from tdmpc.envs import make_vector_env
        make_vector_env(task, 1, seed=0)[0].close()
    except Exception:
        task = "Pendulum-v1"
    print("benchmarking the training loop...", file=sys.stderr)
    e2e = args.e2e_steps if args.e2e_steps is not None else (60 if args.quick else 300)
    warmup = args.warmup_steps or (200 if args.quick else 1000)
    threads = torch.get_num_threads()  # the training loop's too (its own default would re-read the load)
    if e2e and args.e2e_envs:
        result["end_to_end_by_envs"] = {
            n: bench_training(task, device, max(e2e, 20 * n), warmup_steps=max(warmup, 2 * n), small=False,
                              threads=threads, num_envs=n, gpu_mem=args.gpu_mem, profile=args.profile)
            for n in args.e2e_envs}
        result["end_to_end"] = next(iter(result["end_to_end_by_envs"].values()))
    if e2e and args.e2e_procs:
        print("benchmarking training processes side by side...", file=sys.stderr)
        result["end_to_end_by_procs"] = bench_processes(task, device, args.e2e_procs, e2e, warmup, threads,
                                                        args.gpu_mem)
    rss = args.rss_steps if args.rss_steps is not None else (2000 if args.quick else 20_000)
    if rss:
        result["rss"] = bench_training(task, device, rss, warmup_steps=warmup, small=True, threads=threads)
    offline = args.offline_updates if args.offline_updates is not None else (40 if args.quick else 200)
    if offline:
        print("benchmarking offline sampling...", file=sys.stderr)
        result["offline"] = bench_offline(min(args.sizes), device, args.offline_rows, offline)
    print_table(result)
    write_text_atomic(args.out, json_text(result))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
