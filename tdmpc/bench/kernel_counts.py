"""What `python -m tdmpc.bench --kernels` measures: the GPU's launch and transfer costs, counted on any machine.

Everything runs on the CPU on the code path CUDA takes (device.cuda_code_path): planning in bf16 and updates in
fp32 (CUDA's defaults), no fused C++ ops, no chunked planning. For each model size: the kernels of one plan()
for 1 and 32 envs and of one update() at batch 256, eager (the ops dispatched) and compiled (the kernels in the
Triton code inductor writes for a GPU: tdmpc.bench.triton_code), and the host-to-device copies and host waits of
one whole training step (act, buffer add, sample, update) of the real loop.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from tdmpc.agent import Agent
from tdmpc.bench import kernel_groups
from tdmpc.bench.kernels import TransferCounter, compiled_kernels, count_kernels, kernels_in_code
from tdmpc.bench.timing import BATCH, OBS_DIM, agent_for, random_batch
from tdmpc.bench.triton_code import triton_for_gpu
from tdmpc.config import Config, validate
from tdmpc.runtime.compile import PLAN_OPTIONS
from tdmpc.runtime.device import cuda_code_path
from tdmpc.runtime.files import json_text, write_text_atomic


def counting_agent(size: int, compile: bool, discrete: bool = False) -> Agent:
    """On the CPU in CUDA's planning dtype, without the run's overrides; discrete: ACTION_DIM discrete actions
    (the categorical planner) instead of ACTION_DIM continuous dims."""
    cfg = validate(Config(model_size=size, device="cpu", precision="bf16", compile=compile))
    return agent_for(cfg, torch.device("cpu"), discrete)


def _plan_args(n: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    return torch.randn(n, OBS_DIM), torch.zeros(n, dtype=torch.bool), False


def plan_kernels(agent: Agent, n: int, compiled: bool) -> Counter[str]:
    """Kernels of one plan() for n envs (the second call: the first may allocate). Compiled: those in the code
    inductor writes, for whichever backend is in force (triton_for_gpu() for a GPU's)."""
    planner = agent.planner(n)
    args = _plan_args(n)
    with torch.no_grad():
        planner.plan_graph(*args)
        if not compiled:
            return count_kernels(lambda: planner.plan_graph(*args)).counts
        plan = torch.compile(planner.plan_graph, fullgraph=True, dynamic=False, options=PLAN_OPTIONS)  # as Actor's
        return compiled_kernels(plan, *args)


def update_kernels(size: int, compiled: bool) -> tuple[Counter[str], Counter[str]]:
    """Kernels of one update() at batch 256: (inside compiled graphs, run eagerly). Eager, all of them are the
    second; compiled, the first are read from inductor's code (both losses, forward and backward, for whichever
    backend is in force) and the second counted around them (the fused Adam steps and the target update; the
    clipping statistics are compiled)."""
    agent = counting_agent(size, compile=False)
    batch = random_batch(agent)
    agent.update(batch)
    if not compiled:
        return Counter(), count_kernels(lambda: agent.update(batch)).counts
    compiled_agent = counting_agent(size, compile=True)
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(lambda: compiled_agent.update(random_batch(compiled_agent)))
    inside: Counter[str] = Counter()
    for source in sources:
        inside.update(kernels_in_code(source))
    # What runs between the compiled graphs: measured on the eager agent once its gradients exist.
    m = agent.model
    m.train()
    total, _, zs, reached = agent.learner._model_loss_eager(*(batch.obs, batch.action, batch.reward, batch.terminated), None)
    total.backward()
    around = _optimizer_step_kernels(agent, agent.optim)
    loss, _ = agent.learner._pi_loss_eager(zs.detach(), None, reached)
    loss.backward()
    around.update(_optimizer_step_kernels(agent, agent.pi_optim))
    around.update(count_kernels(lambda: m.soft_update_targets(agent.cfg.tau)).counts)
    m.eval()
    return inside, around


def _optimizer_step_kernels(agent: Agent, optim: torch.optim.Optimizer) -> Counter[str]:
    """Learner._optimizer_step's kernels but its clipping statistics, which --compile compiles (their kernels are read from
    the compiled update's code); run with the statistics computed beforehand."""
    stats = agent.learner._clip_stats[optim]
    out = stats(torch.stack(torch._foreach_norm(agent.learner.grads(optim))))
    agent.learner._clip_stats[optim] = lambda norms: out
    try:
        return count_kernels(lambda: agent.learner._optimizer_step(optim)).counts
    finally:
        agent.learner._clip_stats[optim] = stats


def step_transfers(size: int) -> tuple[TransferCounter, int]:
    """Host-to-device copies and host waits of one training step of the real loop (Pendulum-v1, one env), a step
    that acts with the planner, stores its transition, samples a batch and updates; and the waits made before its
    first update began (on one CUDA stream a wait after the updates are queued waits for them too)."""
    from tdmpc.training.setup import trainer_for

    cfg = validate(Config(task="Pendulum-v1", model_size=size, device="cpu", precision="bf16", seed_steps=20,
                          steps=10**6, eval_freq=10**9, eval_episodes=0, save_every=10**9, log_every=10**9,
                          progress=False, tensorboard=False, threads=torch.get_num_threads(), batch_size=BATCH,
                          num_samples=64, num_elites=8, num_pi_trajs=4, iterations=1, update_every=1,
                          overlap_updates=True))  # CUDA's default: the updates run between the action and the env step
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(cfg, Path(tmp) / "run", torch.device("cpu"))
        assert cfg.seed_steps is not None
        while trainer.counters.step < 2 * cfg.seed_steps:  # seeding, pretraining, then steps like the one counted
            trainer.step()
        updates, update, before = trainer.counters.updates, trainer.update, []

        def counted_update() -> None:
            before.append(counter.blocking_waits)
            update()

        trainer.update = counted_update  # type: ignore[method-assign]
        with TransferCounter() as counter:
            trainer.step()
        assert trainer.counters.updates == updates + 1, "the counted step must update once"
        trainer.close()
    return counter, before[0]


def measure(sizes: tuple[int, ...] = (5, 1), combo_kernels: bool = False) -> dict[str, Any]:
    """results/kernels.json: size 5 at the top level, other sizes under 'size<N>'; 'detail' has every breakdown.
    combo_kernels: compiled with inductor's combo kernels (triton_for_gpu)."""
    import torch._inductor.config as inductor_config

    out: dict[str, Any] = {"torch": torch.__version__, "triton": version("triton"), "combo_kernels": combo_kernels,
                           "split_reductions": inductor_config.split_reductions,  # TORCHINDUCTOR_SPLIT_REDUCTIONS
                           "path": "CUDA's, counted on the CPU (bf16 planning, fp32 updates); compiled counts read the "
                           "Triton code inductor writes for an H100 (tdmpc/bench/triton_code.py)", "detail": {}}
    with cuda_code_path():
        for size in sizes:
            print(f"counting kernels at model size {size} (compiling takes minutes)...", file=sys.stderr)
            agent = counting_agent(size, compile=False)
            plan_eager, plan_32 = plan_kernels(agent, 1, False), plan_kernels(agent, 32, False)
            update_eager = update_kernels(size, compiled=False)[1]
            with triton_for_gpu(combo_kernels):
                plan_compiled, plan_compiled_32 = plan_kernels(agent, 1, True), plan_kernels(agent, 32, True)
                inside, around = update_kernels(size, compiled=True)
            transfers, _ = step_transfers(size)
            row = {"plan_kernels_eager": sum(plan_eager.values()), "plan_kernels_eager_32env": sum(plan_32.values()),
                   "plan_kernels_compiled": sum(plan_compiled.values()),
                   "plan_kernels_compiled_32env": sum(plan_compiled_32.values()),
                   "update_kernels_eager": sum(update_eager.values()),
                   "update_kernels_compiled": sum(inside.values()) + sum(around.values()),
                   "h2d_copies_per_env_step": transfers.h2d_copies,
                   "blocking_waits_per_env_step": transfers.blocking_waits}
            out["detail"][f"size{size}"] = {
                "plan_eager": dict(plan_eager.most_common()), "plan_compiled": dict(plan_compiled.most_common()),
                "update_eager": dict(update_eager.most_common()),
                "update_compiled_graphs": dict(inside.most_common()), "update_compiled_around": dict(around.most_common()),
                "h2d": dict(transfers.h2d), "waits": dict(transfers.waits)}
            if size == 5:
                out.update(row)
                out["gpu_estimate"] = gpu_estimates(out["detail"]["size5"])
            else:
                out[f"size{size}"] = row
    return out


def gpu_estimates(detail: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What a GPU would launch for these CPU counts (size 5's detail): each plus the last GPU profile's offset per
    group (tdmpc.bench.kernel_groups)."""
    cpu = {"plan_eager": detail["plan_eager"], "update_eager": detail["update_eager"],
           "plan_compiled": detail["plan_compiled"],
           "update_compiled": dict(Counter(detail["update_compiled_graphs"]) + Counter(detail["update_compiled_around"]))}
    return {"profile": str(kernel_groups.PROFILE.relative_to(kernel_groups.PROFILE.parents[2])),
            **{"{}_kernels_{}".format(*call.split("_")): kernel_groups.gpu_estimate(call, counts)
               for call, counts in cpu.items()},
            "offsets_by_group": {call: kernel_groups.offsets(call) for call in kernel_groups.CALLS}}


def write_kernel_counts(out: Path, combo_kernels: bool = False) -> int:
    """--kernels: measure()'s counts, printed and written to `out`."""
    result = measure(combo_kernels=combo_kernels)
    rows = [("size 5", result), *((k.replace("size", "size "), v) for k, v in result.items() if k.startswith("size"))]
    print("kernels per call (CUDA's code path, counted on the CPU; compiled: in inductor's Triton code for an H100)")
    for name, r in rows:
        print(f"{name}: plan() 1 env {r['plan_kernels_eager']} eager / {r['plan_kernels_compiled']} compiled, "
              f"32 envs {r['plan_kernels_eager_32env']} / {r['plan_kernels_compiled_32env']}; update() B=256 "
              f"{r['update_kernels_eager']} / {r['update_kernels_compiled']}; per env step "
              f"{r['h2d_copies_per_env_step']} host-to-device copies, {r['blocking_waits_per_env_step']} host waits")
    g = result["gpu_estimate"]
    print(f"a GPU would launch about (size 5; the CPU counts plus the offsets per group of {g['profile']}): plan() "
          f"{g['plan_kernels_eager']} eager / {g['plan_kernels_compiled']} compiled; update() {g['update_kernels_eager']}"
          f" / {g['update_kernels_compiled']}")
    write_text_atomic(out, json_text(result))
    print(f"wrote {out}")
    return 0
