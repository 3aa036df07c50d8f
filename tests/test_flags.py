"""Flags that no other test names: each does what `--help` says, or this fails."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.model.world_model import ModelDims

from helpers import cli, one_line_error, read_csv, run_module, run_train, tiny_json, trained_once

SMALL = dict(model_size=None, enc_dim=32, mlp_dim=32, latent_dim=16, num_enc_layers=2, num_q=2, num_samples=32,
             num_elites=4, num_pi_trajs=4, iterations=2, horizon=3, batch_size=8, precision="fp32", device="cpu")
CPU = torch.device("cpu")


def agent(obs: int = 5, act: int = 2, discrete: bool = False, tasks: tuple[str, ...] = (), **over) -> Agent:
    cfg = Config(**{**SMALL, **over}, **({"task_set": tasks} if tasks else {}))
    dims = ModelDims.from_config(cfg, (obs,), act, False, tasks=tasks, action_dims=(act,) * len(tasks),
                                 discrete=discrete)
    return Agent(cfg, dims, [100] * len(tasks) if tasks else 100, CPU)


def batch(a: Agent, B: int = 8, task: torch.Tensor | None = None) -> Batch:
    H, obs, act = a.cfg.horizon, a.dims.obs_shape[0], a.dims.action_dim
    g = torch.Generator().manual_seed(0)
    action = (torch.randint(act, (H, B), generator=g) if a.dims.discrete else
              torch.rand(H, B, act, generator=g) * 2 - 1)
    return Batch(torch.randn(H + 1, B, obs, generator=g), action, torch.randn(H, B, generator=g),
                 torch.zeros(H, B, dtype=torch.bool), task)


def test_plan_chunk_envs_plans_a_chunk_of_envs_per_model_call_and_the_same_plans():
    obs, first = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32), np.ones(3, bool)
    whole, chunked = agent(), agent(plan_chunk_envs=1)
    chunked.load_state_dict(whole.state_dict())
    actions = []
    for a in (whole, chunked):
        torch.manual_seed(1)
        actions.append(a.act(obs, first))
    assert chunked.planner(3).chunk_envs == 1 and whole.planner(3).chunk_envs >= 3
    np.testing.assert_allclose(actions[0], actions[1], atol=1e-5)


def test_uniform_prior_coef_adds_the_mean_log_probability_to_a_discrete_prior_objective():
    a = agent(act=3, discrete=True)
    zs = torch.randn(a.cfg.horizon + 1, 8, a.dims.latent_dim).softmax(-1)
    losses = {}
    for coef in (0.0, 0.5):
        a.cfg.uniform_prior_coef = coef
        torch.manual_seed(2)
        a.scale.fill_(1.0)
        losses[coef] = a.learner._pi_loss(zs, None, None)[0]
    log_probs = a.model.pi(zs).log_std  # the categorical's log-probabilities
    expected = -(a.learner.losses.rho * (0.5 * log_probs.mean(-1, keepdim=True)).mean((1, 2))).mean()
    assert torch.allclose(losses[0.5] - losses[0.0], expected, atol=1e-6)


def test_task_scales_keeps_one_running_scale_per_task():
    tasks = ("cartpole-swingup", "cheetah-run")
    shared, per_task = agent(tasks=tasks), agent(tasks=tasks, task_scales=True)
    assert shared.scale.shape == () and per_task.scale.shape == (2,)
    with torch.no_grad():
        for a in (shared, per_task):  # Q values of task 1 spread over 40, task 0's over 0.1
            q = torch.cat([torch.linspace(0, 0.1, 4), torch.linspace(0, 40, 4)]).view(8, 1)
            a.learner._update_scale(q, torch.tensor([0] * 4 + [1] * 4))
    assert per_task.scale[0] == 1.0 and per_task.scale[1] > 1.0  # task 0's range is under 1: its scale stays
    assert shared.scale > 1.0


@pytest.mark.parametrize("precision", ["fp32", "bf16", "mixed"])
def test_train_precision_sets_the_dtype_updates_compute_in(precision):
    """fp32: every layer in fp32; bf16: autocast; mixed: autocast but the Q heads read fp32 latents in fp32."""
    a = agent(train_precision=precision)
    seen: dict[str, torch.dtype] = {}

    def record(name: str):
        def hook(module, inputs, output) -> None:
            seen.setdefault(name, output.dtype)
        return hook

    hooks = [a.model._dynamics[0].register_forward_hook(record("dynamics")),
             a.model._Qs[0].register_forward_hook(record("q"))]
    metrics = a.update(batch(a))
    for h in hooks:
        h.remove()
    assert torch.isfinite(metrics["total_loss"])
    half = torch.bfloat16
    assert seen == {"fp32": {"dynamics": torch.float32, "q": torch.float32},
                    "bf16": {"dynamics": half, "q": half},
                    "mixed": {"dynamics": half, "q": torch.float32}}[precision]


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_matmul_precision_sets_torchs_float32_matmul_precision(precision):
    before = torch.get_float32_matmul_precision()
    try:
        agent(matmul_precision=precision)
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)


def test_cuda_graphs_apply_only_on_cuda():
    """--cuda-graphs: plan() and update() replay as CUDA graphs on CUDA, eager everywhere else (tests/test_cuda.py
    checks the capture on a GPU)."""
    a = agent(cuda_graphs=True)
    assert not a.graphs and a.learner._update_fn == a.learner._update_tensors


# --- through the command line -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny training run (300 env steps, a checkpoint at 200 and at 300) that the command-line tests below read."""
    return trained_once(tmp_path_factory, "flags", steps=300, save_every=200)


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_no_save_buffer_writes_checkpoints_without_the_replay_buffer(tmp_path, tiny_run):
    assert list((tiny_run / "checkpoints").glob("buffer_*.h5"))  # the default stores it
    r = run_train("--cfg", str(tiny_json(tmp_path)), "--run-dir", str(tmp_path / "run"), "--no-save-buffer")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").is_file()
    assert not list((tmp_path / "run" / "checkpoints").glob("buffer_*.h5"))


def test_config_from_checkpoint_resumes_a_run_whose_config_json_is_gone(capsys, tmp_path, tiny_run):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "config.json").unlink()
    r = cli(capsys, "tdmpc.train", "--resume", str(run), "--no-config-from-checkpoint", "--steps", "400")
    assert r.returncode == 2 and "config.json" in r.stderr, r.stderr
    r = cli(capsys, "tdmpc.train", "--resume", str(run), "--config-from-checkpoint", "--steps", "400")
    assert r.returncode == 0, r.stderr
    assert float(read_csv(run / "eval.csv")[-1]["env_step"]) == 400


def test_resume_takes_the_runs_latest_checkpoint_file_for_its_directory(capsys, tmp_path, tiny_run):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns(".lock"))
    r = cli(capsys, "tdmpc.train", "--resume", str(run / "checkpoints" / "previous.pt"), "--steps", "400")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--init-from" in r.stderr, r.stderr
    r = cli(capsys, "tdmpc.train", "--resume", str(run / "checkpoints" / "latest.pt"), "--steps", "400")
    assert r.returncode == 0, r.stderr
    assert f"continuing the run in {run}" in r.stderr and f"resume: continuing {run} from step 300 (latest.pt)" in r.stderr
    assert float(read_csv(run / "eval.csv")[-1]["env_step"]) == 400


@pytest.mark.parametrize("flag", ["--no-buffer", "--config-from-checkpoint"])
def test_resume_flags_without_a_resume_are_one_line(capsys, tmp_path, flag):
    r = cli(capsys, "tdmpc.train", flag, "--dry-run", "--threads", "1")
    assert f"{flag} applies to a resume" in one_line_error(r)


def test_a_resume_cannot_turn_an_online_run_offline(capsys, tiny_run):
    r = cli(capsys, "tdmpc.train", "--resume", str(tiny_run), "--dataset", "data.h5", "--steps", "900")
    assert "--dataset cannot turn an online run offline on --resume" in one_line_error(r)


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_updates_per_round_sets_the_updates_each_round_runs(tmp_path):
    counts = {}
    for per_round in (1, 3):
        run = tmp_path / f"run{per_round}"
        r = run_train("--cfg", str(tiny_json(tmp_path, steps=220, eval_freq=220, save_every=220, eval_episodes=0, log_every=20)),
                      "--run-dir", str(run), "--updates-per-round", str(per_round))
        assert r.returncode == 0, r.stderr
        counts[per_round] = int(float(read_csv(run / "train.csv")[-1]["updates"]))
    # 200 seeding steps (a round of pretraining updates each), then 20 agent steps with a round each
    assert counts == {1: 220, 3: 660}, counts


def test_evaluate_no_mpc_acts_with_the_policy_prior(capsys, tmp_path, tiny_run):
    out = {}
    for flag in ("--mpc", "--no-mpc"):
        report = tmp_path / f"{flag}.json"
        r = cli(capsys, "tdmpc.evaluate", "--checkpoint", str(tiny_run / "checkpoints" / "latest.pt"), "--episodes",
                "1", "--device", "cpu", "--threads", "1", flag, "--report", str(report))
        assert r.returncode == 0, r.stderr
        out[flag] = json.loads(report.read_text())
    assert out["--mpc"]["mpc"] is True and out["--no-mpc"]["mpc"] is False


def test_plot_title_and_group(tmp_path, tiny_run, monkeypatch):
    import shutil

    import tdmpc.cli.plot

    for seed in (1, 2):
        shutil.copytree(tiny_run, tmp_path / f"seed{seed}")
    drawn = []
    monkeypatch.setattr(tdmpc.cli.plot, "draw",
                        lambda curves, out, title, remedy="": drawn.append((len(curves), title)) or out)
    runs = [str(tmp_path / "seed1"), str(tmp_path / "seed2")]
    assert tdmpc.cli.plot.main([*runs, "--title", "My title"]) == 0
    assert tdmpc.cli.plot.main([*runs, "--no-group"]) == 0
    assert drawn == [(1, "My title"), (2, None)]  # the two seeds as one curve, or one curve each


def test_dataset_convert_records_the_action_repeat_and_obs_type_it_is_given(capsys, tmp_path, tiny_run):
    import h5py

    buffer = sorted((tiny_run / "checkpoints").glob("buffer_*.h5"))[-1]
    for name, flags, repeat in (("default.h5", [], 1), ("given.h5", ["--action-repeat", "3", "--obs-type", "state"], 3)):
        r = cli(capsys, "tdmpc.dataset", "convert", str(buffer), "--task", "Pendulum-v1", "--out", str(tmp_path / name),
                *flags)
        assert r.returncode == 0, r.stderr
        with h5py.File(tmp_path / name) as f:
            assert (int(f.attrs["action_repeat"]), f.attrs["obs_type"]) == (repeat, "state")
    r = cli(capsys, "tdmpc.dataset", "convert", str(buffer), "--task", "Pendulum-v1", "--out", str(tmp_path / "x.h5"),
            "--obs-type", "rgb")
    assert r.returncode == 2 and "obs='rgb' is supported for DMC tasks only" in r.stderr


def test_to_minari_writes_the_id_author_and_code_permalink_it_is_given(capsys, tmp_path, tiny_run, monkeypatch):
    from helpers import import_or_skip

    minari = import_or_skip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    buffer = sorted((tiny_run / "checkpoints").glob("buffer_*.h5"))[-1]
    data = tmp_path / "d.h5"
    assert cli(capsys, "tdmpc.dataset", "convert", buffer, "--task", "Pendulum-v1", "--out", data).returncode == 0
    r = run_module("tdmpc.dataset", "to-minari", str(data), "--dataset-id", "tdmpc/flags-v0", "--author", "Ada",
                   "--author-email", "ada@example.org", "--code-permalink", "https://example.org/code",
                   env={**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari")})
    assert r.returncode == 0, r.stderr
    meta = minari.load_dataset("tdmpc/flags-v0").storage.metadata
    assert (meta["dataset_id"], meta["author"], meta["author_email"], meta["code_permalink"]) == \
        ("tdmpc/flags-v0", {"Ada"}, {"ada@example.org"}, "https://example.org/code")


def test_collect_no_mpc_plays_the_policy_priors_mean(capsys, tmp_path, tiny_run):
    """collect --no-mpc: every stored action is the prior's mean at the stored observation (no planning, no noise);
    with --mpc (the default) the planner's actions are not."""
    import h5py

    import tdmpc

    checkpoint = tiny_run / "checkpoints" / "latest.pt"
    prior = tdmpc.Agent.from_checkpoint(checkpoint, device="cpu", mpc=False)
    for flag in ("--no-mpc", "--mpc"):
        out = tmp_path / f"{flag}.h5"
        r = cli(capsys, "tdmpc.collect", "--checkpoint", checkpoint, "--out", out, "--episodes", 1, "--device", "cpu",
                "--threads", 1, flag)
        assert r.returncode == 0, r.stderr
        with h5py.File(out) as f:
            obs, action = f["obs"][:50], f["action"][:50]
            assert ("--no-mpc" in f.attrs["source"]) == (flag == "--no-mpc")
        means = prior.act(obs, eval_mode=True)  # a row's action is the one that led to its observation
        assert np.allclose(action[1:], means[:-1], atol=1e-5) == (flag == "--no-mpc")
