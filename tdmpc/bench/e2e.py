"""The training loop end to end: agent steps/s and host RSS of the real loop (--e2e-envs, the RSS run), several
loops side by side in processes of their own (--e2e-procs), and env steps/s of tensor-native envs against the
numpy path (--tensor-envs)."""

from __future__ import annotations

import gc
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tdmpc.bench.gpu_profile import gpu_busy
from tdmpc.bench.kernels import TransferCounter
from tdmpc.bench.timing import OVERRIDES, machine_info, sync
from tdmpc.config import Config, validate
from tdmpc.runtime.device import cuda_code_path


def rss_mb() -> float:
    """This process's resident memory now (its peak where /proc is missing), in MB."""
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
        while c.step < cfg.seed_steps + settle * R:  # seeding, pretraining updates, settling
            trainer.step()
        gc.collect()
        barrier_index = None  # which of the barrier's parties this process was (each gets its own)
        if start is not None:
            sync(device)
            barrier_index = start.wait(timeout=1800)
        rss0, t0, s0, v0 = rss_mb(), time.perf_counter(), c.step, c.vector_steps
        samples = []
        while c.step < cfg.steps:
            trainer.step()
            if c.vector_steps % 500 == 0:
                samples.append(rss_mb())
        sync(device)
        dt = time.perf_counter() - t0
        steps = (c.step - s0) // R
        host_ms = host_loop_ms(trainer, device, max(1, min(200, agent_steps // num_envs)))
        out = {"task": task, "small_model": small, "num_envs": num_envs, "agent_steps": steps,
               "threads": torch.get_num_threads(), "barrier_index": barrier_index,
               "agent_steps_per_s": steps / dt, "ms_per_vector_step": 1e3 * dt / max(1, c.vector_steps - v0),
               "host_loop_ms_per_vector_step": host_ms, "rss_start_mb": rss0, "rss_end_mb": rss_mb(),
               "rss_growth_mb": rss_mb() - rss0, "rss_samples_mb": samples[:: max(1, len(samples) // 20)],
               "config": {k: getattr(trainer.cfg, k) for k in ("model_size", "horizon", "num_samples", "iterations",
                                                               "batch_size", "compile", "cuda_graphs",
                                                               "overlap_updates", "update_stream")}}
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


def host_loop_ms(trainer: Any, device: torch.device, vector_steps: int) -> float:
    """ms per vector step of the training loop with plan() and update() taken out (each act returns the last
    action, each update does nothing): the host's own share of a step (env step, buffer writes, bookkeeping),
    which on a GPU runs one after the other with plan() and is hidden only behind the update."""
    agent = trainer.agent
    action = agent.act_on_device(*trainer.buffer.newest(), task=trainer.env_task_ids)
    agent.act_on_device = lambda *args, **kwargs: action
    trainer.update = lambda: None
    try:
        sync(device)
        t0, v0 = time.perf_counter(), trainer.counters.vector_steps
        while trainer.counters.vector_steps - v0 < vector_steps:
            trainer.step()
        sync(device)
        return 1e3 * (time.perf_counter() - t0) / vector_steps
    finally:
        del agent.act_on_device, trainer.update  # the instance's stand-ins: the class's methods again


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
    """Env steps/s of the training loop on the tensor path and the numpy path (cli.BenchArgs.tensor_envs)."""
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
                        c.step = seed_steps  # act from the start: untrained weights plan as fast
                    trainer.step()  # warm-up (first plan, buffer pages)
                    sync(device)
                    t0, s0 = time.perf_counter(), c.step
                    for _ in range(steps):
                        trainer.step()
                    sync(device)
                    row[f"{phase}_env_steps_per_s"] = (c.step - s0) / (time.perf_counter() - t0)
                    trainer.close()
            with tempfile.TemporaryDirectory() as tmp, cuda_code_path():
                trainer = trainer_for(cfg, Path(tmp) / "run", device)
                trainer.counters.step = seed_steps
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
