"""The benchmark's FLOP accounting: every matmul counted (planning's under inference_mode too), each dtype's
against that dtype's peak."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tdmpc.bench.timing import count_flops, fraction_of_peak, make_agent, random_batch
from tdmpc.runtime.device import bf16_matmuls_emulated


# bf16 matmuls run in fp32 on a CPU that would emulate them (tdmpc.model.layers.linear): counted as fp32 there
BF16 = "fp32" if bf16_matmuls_emulated(torch.device("cpu")) else "bf16"


@pytest.mark.parametrize("train_precision, kinds", [("fp32", {"fp32"}), ("mixed", {"fp32", BF16}),
                                                     ("bf16", {BF16})])
def test_update_flops_are_split_by_the_dtype_their_matmuls_ran_in(train_precision, kinds):
    agent = make_agent(1, torch.device("cpu"), "fp32", train_precision=train_precision)
    batch = random_batch(agent, B=16)
    flops = count_flops(lambda: agent.update(batch))
    with FlopCounterMode(display=False) as counter:
        agent.update(batch)
    assert {k for k, v in flops.items() if v > 0} == kinds
    assert sum(flops.values()) == counter.get_total_flops()  # the same ops, only grouped


def test_fraction_of_peak_charges_each_dtype_at_its_own_peak():
    peaks = {"fp32": {"peak": 100.0}, "bf16": {"peak": 400.0}}  # GFLOP/s
    # 1 GFLOP at 100 GFLOP/s (10 ms) + 4 GFLOP at 400 (10 ms): 20 ms at the peaks; measured 40 ms
    assert fraction_of_peak({"fp32": 10**9, "bf16": 4 * 10**9}, 0.040, peaks) == pytest.approx(0.5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_plan_flops_under_inference_mode_match_flop_counter_mode(precision):
    """act() plans under torch.inference_mode, where F.linear reaches a dispatch mode as one aten.linear: the
    count must still hold every matmul (it once missed them all: 3.86 of 31.7 GFLOP at size 5)."""
    agent = make_agent(1, torch.device("cpu"), precision)
    obs = np.zeros((2, *agent.dims.obs_shape), np.float32)
    agent.act(obs)  # planners and buffers made once, outside the counts
    flops = count_flops(lambda: agent.act(obs))
    with FlopCounterMode(display=False) as counter:
        agent.act(obs)
    assert sum(flops.values()) == counter.get_total_flops() > 0
    if precision == "fp32" or BF16 == "fp32":
        assert set(flops) == {"fp32"}
    else:  # the networks' matmuls; only the two-hot decode (softmax @ bins) stays in fp32
        assert flops["bf16"] > 0.95 * sum(flops.values())
    mlp_dim, samples, iters, horizon = agent.dims.mlp_dim, agent.cfg.num_samples, agent.cfg.iterations, agent.cfg.horizon
    # at least the dynamics' second layer, (mlp_dim x mlp_dim), for every sampled candidate and step
    assert sum(flops.values()) > 2 * 2 * samples * iters * horizon * mlp_dim * mlp_dim


# --- the command's inputs: each a one-line error before anything is measured --------------------------------------

@pytest.fixture
def nothing_measured(monkeypatch):
    """Any measurement fails the test: bad input must be refused before the first one (minutes of it were lost)."""
    from tdmpc.bench import cli

    def measured(*args, **kw):
        raise AssertionError("a measurement started before the input was checked")

    for name in ("matmul_peak", "bench_model", "write_kernel_counts", "bench_tensor_envs"):
        monkeypatch.setattr(cli, name, measured)


def _bench(capsys, *argv) -> tuple[int, str]:
    from tdmpc.bench.cli import main

    code = main([*map(str, argv)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--out", "--kernels-out", "--tensor-envs-out"])
def test_an_output_that_is_a_directory_is_refused_before_measuring(tmp_path, capsys, nothing_measured, flag):
    mode = {"--kernels-out": ["--kernels"], "--tensor-envs-out": ["--tensor-envs"]}.get(flag, [])
    code, err = _bench(capsys, *mode, flag, tmp_path, "--device", "cpu")
    assert code == 2 and err.strip() == (f"error: {flag} {tmp_path} is a directory; give the file to write the "
                                         f"results to, e.g. {flag} {tmp_path / 'bench.json'}"), err
    (tmp_path / "file").write_text("")
    code, err = _bench(capsys, flag, tmp_path / "file" / "bench.json", "--device", "cpu", *mode)
    assert code == 2 and err.startswith(f"error: {flag} {tmp_path / 'file' / 'bench.json'}: ") and "\n" not in err.strip()


def test_cuda_without_cuda_is_one_line(tmp_path, capsys, monkeypatch, nothing_measured):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _bench(capsys, "--device", "cuda", "--out", tmp_path / "b.json")
    assert code == 2 and err.strip() == "error: device 'cuda' requested but CUDA is not available here; use --device cpu"
    code, err = _bench(capsys, "--device", "gpu", "--out", tmp_path / "b.json")
    assert code == 2 and err.strip() == "error: --device 'gpu': use 'auto', 'cpu', 'cuda' or 'cuda:N'"


def test_a_gpu_mem_of_zero_is_refused_before_measuring(tmp_path, capsys, nothing_measured):
    code, err = _bench(capsys, "--device", "cpu", "--gpu-mem", "0GB", "--out", tmp_path / "b.json")
    assert code == 2 and err.strip().startswith("error: --gpu-mem 0GB: must be more than 0"), err


def test_an_unknown_model_size_is_refused_before_measuring(tmp_path, capsys, nothing_measured):
    code, err = _bench(capsys, "--device", "cpu", "--sizes", "1", "7", "--out", tmp_path / "b.json")
    assert code == 2 and err.strip().startswith("error: --sizes 7: unknown model size; choose from 1, 5"), err


@pytest.mark.parametrize("argv,needle", [
    (["--horizon", "0"], "--horizon must be >= 1, got 0"),  # was read as unset: the default timed under its name
    (["--num-samples", "0"], "--num-samples must be >= 1, got 0"),
    (["--warmup-steps", "0"], "--warmup-steps must be >= 1, got 0"),
    (["--envs", "0"], "--envs must be >= 1, got 0"),  # was an act() error, after the matmul peaks
    (["--sizes"], "--sizes needs one or more values"),  # was an IndexError after the whole run
    (["--task", "cartpole-swingupp"], "cartpole-swingupp"),  # was a silent measurement of Pendulum-v1
])
def test_bad_bench_values_are_refused_before_measuring(tmp_path, capsys, nothing_measured, argv, needle):
    code, err = _bench(capsys, "--device", "cpu", *argv, "--out", tmp_path / "b.json")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow  # spawned interpreters: CI's slow step (.ci/run)
def test_e2e_procs_children_run_with_their_share_of_threads_and_start_from_one_barrier():
    """Read back from the children: the threads each process's torch ran with (set by its own trainer, not the
    parent's), and that the n of them were the n parties of one barrier (each passes it with its own index)."""
    import torch

    from tdmpc.bench.e2e import bench_processes

    out = bench_processes("Pendulum-v1", torch.device("cpu"), (1, 2), agent_steps=5, warmup_steps=5, threads=2,
                          small=True)
    assert sorted(out) == [1, 2]
    for n, p in out.items():
        assert [r["threads"] for r in p["runs"]] == [2 // n] * n
        assert sorted(r["barrier_index"] for r in p["runs"]) == list(range(n))
        assert p["agent_steps_per_s_total"] == pytest.approx(sum(r["agent_steps_per_s"] for r in p["runs"]))


@pytest.mark.slow  # two loops of setup per path: CI's slow step (.ci/run)
def test_bench_tensor_envs_times_both_paths_and_counts_their_transfers(tmp_path):
    """--tensor-envs: the training loop's env steps/s on the tensor path (a JAX env) and the numpy path, seeding and
    acting, and the host-device copies and waits of one vector step on each (none for the tensor path's data)."""
    import torch

    from helpers import import_or_skip

    import_or_skip("jax")
    from tdmpc.bench.e2e import bench_tensor_envs

    out = bench_tensor_envs(torch.device("cpu"), (2,), steps=2, threads=1)
    rows = {r["path"]: r for r in out["rows"]}
    assert sorted(rows) == ["numpy", "tensor"] and all(r["num_envs"] == 2 for r in rows.values())
    for r in rows.values():
        assert r["seeding_env_steps_per_s"] > 0 and r["acting_env_steps_per_s"] > 0
    assert rows["tensor"]["task"] == "phys2d/Pendulum-v0" and out["steps_timed"] == 2
    assert rows["tensor"]["host_waits_per_vector_step"] <= rows["numpy"]["host_waits_per_vector_step"]


def test_a_cpu_that_emulates_bf16_times_no_bf16(monkeypatch, tmp_path, capsys):
    """On an AVX2 CPU (no AVX512-BF16, no AMX) bf16 matmuls are emulated: the bf16 peak's 2048^3 matmul took 60 s
    a call, so bench --quick ran for over 20 minutes in its first step. There it times fp32 alone, and says so."""
    import json

    from tdmpc.bench import cli

    monkeypatch.setattr(cli, "bf16_matmuls_emulated", lambda device: True)
    peaks: list[torch.dtype] = []
    monkeypatch.setattr(cli, "matmul_peak", lambda device, dtype, reps: peaks.append(dtype) or {"peak": 100.0})
    updates: list[tuple[str, ...]] = []

    def bench_model(size, device, envs, reps, peaks, train_precisions):
        updates.append(train_precisions)
        return {"model_size": size, "dtype": "float32", "plan": {},
                "update": {p: {"ms": 1.0, "gflop": 0.1, "fraction_of_peak": 0.5} for p in train_precisions}}

    monkeypatch.setattr(cli, "bench_model", bench_model)
    out = tmp_path / "bench.json"
    code = cli.main(["--quick", "--sizes", "1", "--envs", "1", "--e2e-steps", "0", "--rss-steps", "0",
                     "--offline-updates", "0", "--no-compare-plain", "--threads", "1", "--out", str(out)])
    assert code == 0 and peaks == [torch.float32] and updates == [("fp32",)]
    assert "bf16 not timed: this CPU has no AVX512-BF16 or AMX" in capsys.readouterr().out
    assert "skipped" in json.loads(out.read_text())["peak"]["bf16"]


def test_the_host_loop_is_timed_without_plan_and_update_and_the_agent_is_whole_after(tmp_path, monkeypatch):
    """bench's host share of a step: act and update swapped for stand-ins while timed, the real ones back after."""
    import time

    from tdmpc.bench.e2e import host_loop_ms
    from tdmpc.config import Config, validate
    from tdmpc.training.setup import trainer_for
    from tests.helpers import TINY

    cfg = validate(Config(**{**TINY, "seed_steps": 20, "steps": 10**6, "eval_freq": 10**6, "log_every": 10**6,
                             "save_every": 10**6}))
    trainer = trainer_for(cfg, tmp_path / "run", torch.device("cpu"))
    try:
        while trainer.counters.step < 40:  # past seeding: the agent acts, an update per step
            trainer.step()
        slow_act, updates = type(trainer.agent).act_on_device, []

        def act(self, *args, **kwargs):
            time.sleep(0.05)
            return slow_act(self, *args, **kwargs)

        monkeypatch.setattr(type(trainer.agent), "act_on_device", act)
        monkeypatch.setattr(type(trainer), "update", lambda self: updates.append(1))
        v0 = trainer.counters.vector_steps
        ms = host_loop_ms(trainer, torch.device("cpu"), 10)
        assert 0 < ms < 50 and trainer.counters.vector_steps == v0 + 10 and updates == []  # one real act, before
        assert "act_on_device" not in vars(trainer.agent) and "update" not in vars(trainer)
        trainer.step()
        assert updates  # the class's update again
    finally:
        trainer.close()
