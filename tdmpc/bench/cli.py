"""python -m tdmpc.bench: measure plan() and update() against this machine's own matmul peak.

Everything is measured in one run on one device: the matmul peak (fp32 and bf16) at the
shapes the model uses, planning latency and throughput for 1, 8 and 32 envs at model
sizes 1 and 5 with the reference planning settings, update time at batch 256, the
end-to-end agent steps/s of the training loop on a real task, and host RSS growth over
a longer run. FLOPs of each call are counted with torch.utils.flop_counter, so every
time comes with the fraction of the peak it achieves. It prints a table and writes JSON.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import torch

from tdmpc.bench.e2e import bench_processes, bench_tensor_envs, bench_training
from tdmpc.bench.gpu_profile import profile_kernels
from tdmpc.bench.kernel_counts import write_kernel_counts
from tdmpc.bench.triton_code import require_triton
from tdmpc.bench.offline import bench_offline
from tdmpc.bench.timing import BF16_SKIPPED, OVERRIDES, bench_model, bench_plain, machine_info, \
    matmul_peak
from tdmpc.config import MODEL_SIZES, Config
from tdmpc.errors import BadInput, run_cli
from tdmpc.runtime.args import parse_args
from tdmpc.memory.peak import gpu_mem_bytes
from tdmpc.model import fused
from tdmpc.runtime.device import bf16_matmuls_emulated, resolve_device, resolve_dtype, set_matmul_precision, set_threads
from tdmpc.runtime.files import json_text, write_text_atomic


@dataclass
class BenchArgs:
    """The command's flags (tyro makes --help from these docstrings)."""

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
    training step, on the code path CUDA takes, eager and compiled (no GPU needed, but Triton's code generator:
    pip install 'tdmpc[kernels]'; minutes on 2 cores, most of it compiling). Writes --kernels-out."""
    kernels_out: Path = Path("results/kernels.json")
    """Where --kernels writes its counts (JSON)."""
    tensor_envs: bool = False
    """Instead of the rest: env steps/s through the training loop of a tensor-native env (gymnasium's JAX
    phys2d/Pendulum-v0, needs tdmpc[jax]) against the same task on the numpy path (Pendulum-v1), while seeding
    (envs and buffer alone) and while acting (one plan() for all envs per step, no updates), and the host copies
    and waits of an acting step on CUDA's code path. Writes --tensor-envs-out."""
    tensor_envs_out: Path = Path("results/tensor-envs.json")
    """Where --tensor-envs writes its measurements (JSON)."""
    compile: Optional[bool] = None
    """Time every agent with plan() and update() through torch.compile (--compile) or eager (--no-compile). None:
    as a run decides (Config.compile: compiled with CUDA, eager on the CPU)."""
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
    update_stream: bool = False
    """End to end, with overlap_updates on CUDA: each round of updates on a stream of its own, beside the next plan
    (Config.update_stream); compare without it for what it gains."""
    combo_kernels: bool = False
    """Compile with inductor's combo kernels (independent kernels launched as one; experimental in torch), for every
    compile of this command; with --kernels, counted as a GPU would launch them. Not a training setting: a GPU has
    yet to time it (its count: results/kernels-combo.json against results/kernels.json)."""
    profile: bool = False
    """On CUDA: count the kernels of one plan() and one update() with torch.profiler (graphs off, and as run),
    and the GPU's busy fraction over end-to-end steps."""


def print_table(r: dict) -> None:
    """The results for people: one line per call timed, then the ratios, the end-to-end rates and memory."""
    print(f"\n{r['machine']['cpu']} ({r['machine']['cores']} cores) | {r['machine'].get('gpu', 'no GPU')} | "
          f"torch {r['machine']['torch']} | device {r['machine']['device']}")
    bf16 = r["peak"]["bf16"]
    print(f"matmul peak: fp32 ({r.get('fp32_matmul_precision', 'highest')}) {r['peak']['fp32']['peak']:.0f} GFLOP/s, "
          + (f"bf16 {bf16['peak']:.0f} GFLOP/s" if "peak" in bf16 else f"bf16 not timed: {bf16['skipped']}"))
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
        one_env = fast["plan"].get(1)  # bench_plain plans for 1 env
        vs = f" ({p['plan_ms'] / one_env['ms']:.1f}x slower)" if one_env else ""
        print(f"plain fp32 eager, size {size}: plan {p['plan_ms']:.1f} ms{vs}, update {p['update_ms']:.1f} ms "
              f"({p['update_ms'] / update:.1f}x slower than the default {Config.train_precision} update)")
    for n in r["models"][0]["plan"] if any(1 in m["plan"] for m in r["models"]) else ():  # ratios to N=1
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
        size = f"model size {e['config']['model_size']}, " if "config" in e else ""
        host = (f"; {e['ms_per_vector_step']:.2f} ms per vector step, the loop without plan() and update() "
                f"{e['host_loop_ms_per_vector_step']:.2f}" if "host_loop_ms_per_vector_step" in e else "")
        print(f"end to end ({e['task']}, {size}{n} env(s), 1 update per env step{overlap}): "
              f"{e['agent_steps_per_s']:.1f} agent steps/s over {e['agent_steps']} steps{host}{mem}{busy}")
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
    --gpu-mem, the model sizes. Returns the device."""
    if args.kernels:
        check_output(args.kernels_out, "--kernels-out")
        require_triton()
    elif args.tensor_envs:
        check_output(args.tensor_envs_out, "--tensor-envs-out")
    else:
        check_output(args.out, "--out")
    if args.device not in ("auto", "cpu", "cuda") and not (args.device.startswith("cuda:") and args.device[5:].isdigit()):
        raise BadInput(f"--device {args.device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if args.gpu_mem is not None:
        gpu_mem_bytes(args.gpu_mem)
    if args.combo_kernels and args.e2e_procs:
        raise BadInput("--combo-kernels applies to this process's compiles; --e2e-procs starts others: run them apart")
    unknown = [s for s in args.sizes if s not in MODEL_SIZES]
    if unknown:
        raise BadInput(f"--sizes {unknown[0]}: unknown model size; choose from {', '.join(map(str, MODEL_SIZES))} "
                       f"(millions of parameters)")
    for flag, values in (("--sizes", args.sizes), ("--envs", args.envs)):
        if not values:
            raise BadInput(f"{flag} needs one or more values")
    for flag, value in (("--envs", min(args.envs)), ("--e2e-envs", min(args.e2e_envs, default=1)),
                        ("--horizon", args.horizon), ("--num-samples", args.num_samples),
                        ("--warmup-steps", args.warmup_steps)):
        if value is not None and value < 1:  # not read as "unset": the default would be timed under this name
            raise BadInput(f"{flag} must be >= 1, got {value}")
    if not (args.kernels or args.tensor_envs) and args.e2e_steps != 0:
        from tdmpc.envs.names import resolve_task
        resolve_task(args.task)  # a typo is one line now, not a silent measurement of another task
    return resolve_device(args.device)


def main(argv: list[str] | None = None) -> int:
    """The command (python -m tdmpc.bench, tdmpc-bench): its exit code, an error as one line."""
    args = parse_args(BenchArgs, argv, "python -m tdmpc.bench", __doc__.splitlines()[0])
    return run_cli(lambda: _main(args))


def _main(args: BenchArgs) -> int:
    device = check_args(args)
    set_threads(args.threads)
    if args.kernels:
        return write_kernel_counts(args.kernels_out, args.combo_kernels)
    if args.combo_kernels:
        import torch._inductor.config as inductor_config
        inductor_config.combo_kernels = True
    if args.tensor_envs:
        out = bench_tensor_envs(device, (64, 256), 10 if args.quick else 40, torch.get_num_threads())
        write_text_atomic(args.tensor_envs_out, json_text(out))
        print(f"wrote {args.tensor_envs_out}")
        return 0
    reps = 5 if args.quick else 20
    OVERRIDES.update({k: v for k, v in (("matmul_precision", args.matmul_precision), ("horizon", args.horizon),
                                        ("num_samples", args.num_samples)) if v is not None})
    OVERRIDES.update({k: v for k, v in (("compile", args.compile), ("overlap_updates", args.overlap_updates))
                      if v is not None})
    if args.update_stream:
        OVERRIDES["update_stream"] = True
    if args.gpu_mem and device.type == "cuda":
        from tdmpc.runtime.device import cap_cuda_memory
        print(cap_cuda_memory(device, gpu_mem_bytes(args.gpu_mem)), file=sys.stderr)
    fused.extension_available()
    # The fp32 peak in the matmul precision the agents will set (TF32 on CUDA by default), not torch's default.
    fp32_matmuls = set_matmul_precision(args.matmul_precision, device)
    emulated = bf16_matmuls_emulated(device)  # bf16 timed only where torch does not emulate it (hours there)
    peaks = {"fp32": matmul_peak(device, torch.float32, reps),
             "bf16": {"skipped": BF16_SKIPPED} if emulated else matmul_peak(device, torch.bfloat16, reps)}
    result: dict = {"machine": machine_info(device), "quick": args.quick, "peak": peaks, "overrides": OVERRIDES,
                    "combo_kernels": args.combo_kernels,
                    "fp32_matmul_precision": fp32_matmuls,
                    "planning_dtype": str(resolve_dtype("auto", device)).replace("torch.", ""), "models": []}
    for size in args.sizes:
        print(f"benchmarking model size {size}...", file=sys.stderr)
        result["models"].append(bench_model(size, device, args.envs, reps, peaks,
                                            train_precisions=("fp32",) if emulated else ("fp32", "mixed", "bf16")))
        if args.profile and device.type == "cuda":
            result["models"][-1]["gpu_kernels"] = profile_kernels(size, device)
    if args.compare_plain:
        result["plain_fp32"] = {str(s): bench_plain(s, device, max(3, reps // 4)) for s in args.sizes}
    task = args.task
    try:
        from tdmpc.envs import make_vector_env
        make_vector_env(task, 1, seed=0)[0].close()
    except ImportError:  # dm_control missing (checked above: the task's name is known)
        print(f"{task} needs dm_control (pip install 'tdmpc[dmc]'): timing the training loop on Pendulum-v1",
              file=sys.stderr)
        task = "Pendulum-v1"
    print(f"benchmarking the training loop ({task}, model size {Config.model_size})...",
          file=sys.stderr)
    e2e = args.e2e_steps if args.e2e_steps is not None else (60 if args.quick else 300)
    warmup = args.warmup_steps if args.warmup_steps is not None else (200 if args.quick else 1000)
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
    write_text_atomic(args.out, json_text(result))  # first: the measurements outlast any fault in the table
    print_table(result)
    print(f"\nwrote {args.out}")
    return 0

