"""End to end: train, stop by signal, resume exactly, evaluate; and bad input at the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tdmpc.config import Config, validate
from tdmpc.runtime.device import resolve_device
from tdmpc.training.setup import trainer_for as Trainer

from helpers import (TINY, cli, finished_run, import_or_skip, one_line_error, read_csv, run_module,  # noqa: E402
                     run_train, tiny_json)


def test_tiny_run_writes_csvs_and_checkpoint(capsys, tmp_path):
    run = tmp_path / "run"
    r = cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path, eval_episodes=2), "--run-dir", run)  # played again
    assert r.returncode == 0, r.stderr
    rows = read_csv(run / "train.csv")
    assert [int(r["env_step"]) for r in rows] == list(range(100, 601, 100))
    assert b"\r" not in (run / "train.csv").read_bytes() + (run / "eval.csv").read_bytes()
    assert "consistency_loss" in rows[-1] and rows[-1]["consistency_loss"] != ""
    evals = read_csv(run / "eval.csv")
    assert [int(r["env_step"]) for r in evals] == [0, 400, 600]  # the first at step 0, as the reference
    assert (run / "checkpoints" / "latest.pt").is_file()
    assert len(list((run / "checkpoints").glob("buffer_*.h5"))) == 2  # latest.pt's and previous.pt's
    at_400 = torch.load(run / "checkpoints" / "previous.pt", weights_only=True)["train"]
    assert at_400["step"] == 400 and at_400["next_save"] == 800  # a resume from it saves next at 800, not at once
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["episodic"] is False and cfg["action_repeat"] == 1 and cfg["seed_steps"] == 200

    # evaluate works on that checkpoint and writes a JSON report
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "tdmpc.evaluate", "--checkpoint", run / "checkpoints" / "latest.pt",
                        "--episodes", "2", "--report", report], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    assert rep["episodes"] == 2 and rep["task"] == "Pendulum-v1" and rep["imported_reference"] is False
    assert rep["checkpoint_step"] == 600 and rep["trained_on"] == "Pendulum-v1" and "(step 600)" in r.stdout
    assert rep["checkpoint"] == str((run / "checkpoints" / "latest.pt").resolve())
    assert len(rep["returns"]) == 2 and rep["episode_length"] == 200
    assert "return" in r.stdout
    # by default it plays the run's own evaluation episodes: eval.csv's last row (the checkpoint's step) again
    assert rep["episode_return"] == pytest.approx(float(evals[-1]["episode_return"]), rel=1e-4), (rep, evals[-1])

    # another task of the same dims is allowed, and said
    ck = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    ck["config"]["task"] = "Other-v0"
    torch.save(ck, tmp_path / "other.pt")
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", tmp_path / "other.pt", "--task", "Pendulum-v1", "--episodes", 1,
            "--report", report)
    assert r.returncode == 0 and "note: evaluating on Pendulum-v1 (--task) a model trained on Other-v0" in r.stderr, \
        r.stderr
    assert json.loads(report.read_text())["trained_on"] == "Other-v0" and "over 1 episode (" in r.stdout


def test_sigterm_then_resume_continues_from_the_same_step(tmp_path):
    run = tmp_path / "run"
    cfg = tiny_json(tmp_path, steps=3000, eval_freq=10_000, save_every=10_000)
    proc = subprocess.Popen([sys.executable, "-m", "tdmpc.train", "--cfg", str(cfg), "--run-dir", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until learning has started (the pretraining burst is over)
        if (run / "train.csv").exists() and len(read_csv(run / "train.csv")) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "stopped by signal SIGTERM" in err
    ck = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    stopped_at = ck["train"]["step"]
    assert 300 <= stopped_at < 3000

    r = run_train("--resume", run, "--steps", stopped_at + 150)
    assert r.returncode == 0, r.stderr
    steps = [int(x["env_step"]) for x in read_csv(run / "train.csv")]
    assert steps == sorted(set(steps)), "a step was logged twice"
    last = [stopped_at + 150] if (stopped_at + 150) % 100 else []  # the run's last row, off the 100s
    assert steps == list(range(100, stopped_at + 151, 100)) + last, "a step was lost"
    assert "steps changed" in r.stderr or "steps changed from" in r.stderr


def _stop_after_seeding(tmp_path, *signals: signal.Signals, gap: float = 0.0) -> tuple[subprocess.CompletedProcess, Path]:
    """Start a tiny run, send `signals` (`gap` seconds apart) once its pretraining updates run, wait for it."""
    cfg = tiny_json(tmp_path, steps=100_000, save_every=100_000, eval_freq=100_000, seed_steps=400)
    run, log = tmp_path / "run", tmp_path / "err.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tdmpc.train", "--cfg", str(cfg), "--run-dir", str(run)],
                                stderr=err, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.time() + 120
        while "pretraining updates" not in log.read_text():
            assert time.time() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(gap)
            proc.send_signal(sig)
        proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", log.read_text()), run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGUSR1])
def test_ctrl_c_or_sigusr1_outside_slurm_checkpoint_and_exit_3(tmp_path, sig):
    r, run = _stop_after_seeding(tmp_path, sig)
    assert r.returncode == 3 and f"stopped by signal {sig.name}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] >= 400


def test_a_second_ctrl_c_stops_at_once_with_one_line_and_the_run_resumes(capsys, tmp_path):
    r, run = _stop_after_seeding(tmp_path, signal.SIGINT, signal.SIGINT, gap=0.01)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 130 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "interrupted" in errors[0]
    if (run / "checkpoints" / "latest.pt").is_file():  # the first Ctrl-C's checkpoint may have been cut short
        r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 450)
        assert r.returncode == 0, r.stderr
        assert "removed" in r.stderr or not list((run / "checkpoints").glob(".*.tmp"))


def test_a_stop_signal_before_the_loop_that_python_drops_in_a_finalizer_still_stops_the_command(tmp_path, capsys):
    """Before its loop a command stops at once on a signal, by an exception from the handler; raised inside a
    __del__, Python printed it ('Exception ignored ... Traceback') and dropped it, and the run trained on."""
    from tdmpc.errors import run_cli
    from tdmpc.training.stopping import StopSignals

    class Run(StopSignals):
        run_dir, stop_reason, stop_signal, interrupts, aborted_by = tmp_path, None, None, 0, None
        looping = run_ended = False
        old_handlers = None

    class SignalledWhileCollected:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs inside this finalizer

    run, dropped = Run(), []

    def command() -> int:
        run.install_stop_handlers()
        try:
            SignalledWhileCollected()
            run.check_aborted()  # what Trainer.run() does before its loop
            return 0
        finally:
            run.restore_stop_handlers()

    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, "unraisablehook", dropped.append)
        assert run_cli(command) == 128 + signal.SIGTERM
    assert not dropped and "stopped by SIGTERM before training started" in capsys.readouterr().err


def _stopped_and_resumed(run: Path, steps: int, stop_at: int, edit_checkpoint=None, **over):
    """A run stopped (as by a signal) past `stop_at`, its checkpoint edited if asked, and the resumed trainer."""
    cfg = validate(Config(**{**TINY, "steps": steps, "eval_freq": 10_000, "save_every": 10_000, **over}))
    first = Trainer(cfg, run, resolve_device("cpu"))
    _stop_after(first, stop_at)
    assert first.run() == 3
    if edit_checkpoint is not None:
        path = run / "checkpoints" / "latest.pt"
        ck = torch.load(path, weights_only=True)
        edit_checkpoint(ck)
        torch.save(ck, path)
    second = Trainer(validate(Config(**json.loads((run / "config.json").read_text()))), run,
                     resolve_device("cpu"), resume=True)
    return first, second


def test_resume_restores_buffer_optimizer_scale_and_counters_exactly(tmp_path):
    first, second = _stopped_and_resumed(tmp_path / "run", 700, 450, log_every=300)
    assert second.counters.step == first.counters.step and second.counters.updates == first.counters.updates
    # what the next log row averages: the updates since the row at 300, the episode that ended at 400
    assert second.metric_count == first.metric_count > 0 and second.metric_sum is not None
    for k, v in first.metric_sum.items():
        assert torch.equal(second.metric_sum[k], v), k
    assert torch.equal(second.ended, first.ended) and first.ended[0].sum() == 1
    F = first.buffer.filled
    assert second.buffer.transitions == first.buffer.transitions
    assert second.buffer.filled == F + 1  # + the reset observation the resumed run begins with
    for name in ("obs", "action", "reward", "terminated", "valid"):
        assert torch.equal(getattr(first.buffer, name)[:, :F], getattr(second.buffer, name)[:, :F]), name
    # the in-flight episode is discarded: the next row of every env starts a new episode
    assert np.array_equal(second.buffer.ptr, (first.buffer.ptr + 1) % first.buffer.C)
    assert torch.equal(first.agent.scale, second.agent.scale)
    s1, s2 = first.agent.optim.state_dict(), second.agent.optim.state_dict()
    for k in s1["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1["state"][k][name], s2["state"][k][name])
    for p1, p2 in zip(first.agent.model.parameters(), second.agent.model.parameters()):
        assert torch.equal(p1, p2)
    assert second.run() == 0
    assert second.counters.step == 700


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_checkpoint_naming_its_step_env_step_resumes_at_that_step(tmp_path):
    """Checkpoints written before Counters.step was renamed hold 'env_step' (offline it counted updates)."""
    run = tmp_path / "run"
    first, second = _stopped_and_resumed(run, 500, 300, lambda ck: ck["train"].update(env_step=ck["train"].pop("step")))
    assert second.counters.step == first.counters.step >= 300
    assert second.run() == 0
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 500


def _stop_after(trainer, at_step):
    """Raise the stop flag as the SIGTERM handler would, once the run passes `at_step`."""
    original = trainer.step

    def step():
        original()
        if trainer.counters.step >= at_step:
            trainer.stop_reason = "signal SIGTERM"

    trainer.step = step


@pytest.mark.parametrize("args,needle", [
    (["--task", "walkr-walk"], "unknown task 'walkr-walk'"),
    (["--batch-size", "0"], "'batch_size'"),
    (["--cfg", "missing.json"], "not found"),
    (["--resume", "/nonexistent/run"], "no such directory"),
    (["--init-from", "/nonexistent/x.pt", "--task", "Pendulum-v1", "--steps", "10"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, needle):
    r = cli(capsys, "tdmpc.train", *args, "--run-dir", tmp_path / "r")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def test_unknown_json_key_suggests(tmp_path):  # the command's own process: its exit code, and nothing else said
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"batchsize": 3}))
    assert "did you mean 'batch_size'" in one_line_error(run_train("--cfg", bad))


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    return finished_run(tmp_path_factory) / "checkpoints" / "latest.pt"


def test_evaluate_bad_checkpoints(capsys, tmp_path, trained_checkpoint):
    truncated = tmp_path / "truncated.pt"
    data = trained_checkpoint.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(1000))
    cases = [
        (tmp_path / "missing.pt", "does not exist"),
        (truncated, "truncated or corrupt"),
        (garbage, "cannot load"),
    ]
    for path, needle in cases:
        r = cli(capsys, "tdmpc.evaluate", "--checkpoint", path, "--episodes", "1")
        assert r.returncode == 2, (path, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], r.stderr


def test_checkpoint_from_a_different_model_size_is_rejected(capsys, tmp_path, trained_checkpoint):
    r = cli(capsys, "tdmpc.train", "--init-from", trained_checkpoint, "--task", "Pendulum-v1", "--model-size", "1",
            "--run-dir", tmp_path / "r", "--steps", "10", "--device", "cpu")
    assert r.returncode == 2
    assert "architecture differs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli(capsys, "tdmpc.train", "--init-from", trained_checkpoint, "--task", "Pendulum-v1", "--model-size", "1",
            "--dry-run")
    assert "architecture differs" in one_line_error(r)  # the dry run says what the run would refuse


def test_evaluate_on_a_task_with_other_dims_is_rejected(capsys, trained_checkpoint):
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", trained_checkpoint, "--task", "MountainCarContinuous-v0",
            "--episodes", "1")
    assert r.returncode == 2 and "continuous actions of dim" in r.stderr


def test_fresh_start_sets_aside_a_session_without_checkpoint(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.csv").write_text("env_step,episodes\n100,0\n200,1\n")
    r = cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path, steps=300, seed_steps=400, eval_episodes=0),
            "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert [int(x["env_step"]) for x in read_csv(run / "train.csv")] == [100, 200, 300]
    aside = list(run.glob("no-checkpoint-*"))
    assert len(aside) == 1 and (aside[0] / "train.csv").read_text().startswith("env_step,episodes\n100,0")


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_evaluate_records_a_video_through_mujoco_offscreen_rendering(tmp_path):
    import_or_skip("dm_control")
    imageio = import_or_skip("imageio.v3")
    run = tmp_path / "run"
    cfg = tiny_json(tmp_path, task="cartpole-swingup", steps=100, seed_steps=1000, eval_episodes=0)
    r = run_train("--cfg", cfg, "--run-dir", run)
    assert r.returncode == 0, r.stderr
    video = tmp_path / "episode.mp4"
    r = run_module("tdmpc.evaluate", "--checkpoint", run / "checkpoints" / "latest.pt", "--episodes", "1", "--no-mpc",
                   "--video", video, "--report", tmp_path / "report.json")
    assert r.returncode == 0, r.stderr
    frames = imageio.imread(video)
    assert frames.shape[0] == 501 and frames.shape[1:] == (240, 320, 3)  # reset frame + 500 agent steps
    assert frames.std() > 5  # a rendered scene, not a blank image


def test_resume_of_a_run_older_than_a_config_field_says_which_default_applies(tmp_path, capsys):
    """A config.json written before a field existed (train_precision, say) resumes with the field's default,
    and a line says so: nothing changes silently."""
    from tdmpc.training.run_dir import saved_config

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.pt").write_bytes(b"")
    old = {k: v for k, v in Config(precision="bf16").to_dict().items() if k != "train_precision"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    cfg = saved_config(tmp_path)
    assert cfg.train_precision == "fp32" and cfg.precision == "bf16"
    err = capsys.readouterr().err
    assert "has no 'train_precision'" in err and "'fp32'" in err


def test_resume_of_a_run_older_than_a_changed_default_keeps_what_it_ran_with(tmp_path, capsys):
    """uniform_prior_coef came in at 0 and its default is now 1e-3: a run whose config predates it ran with 0."""
    from tdmpc.config import AS_BEFORE_ADDED
    from tdmpc.training.run_dir import saved_config

    assert Config().uniform_prior_coef != AS_BEFORE_ADDED["uniform_prior_coef"] == 0.0
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.pt").write_bytes(b"")
    old = {k: v for k, v in Config(task="CartPole-v1").to_dict().items() if k != "uniform_prior_coef"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert saved_config(tmp_path).uniform_prior_coef == 0.0
    assert "has no 'uniform_prior_coef'" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps(Config(task="CartPole-v1").to_dict()))
    assert saved_config(tmp_path).uniform_prior_coef == Config().uniform_prior_coef  # recorded: kept


def test_resume_of_a_run_saved_without_a_plan_horizon_plans_over_its_horizon(tmp_path, capsys):
    """A run's config records its plan_horizon (1 for a discrete task); one saved before, without the field or
    with None, planned over `horizon`, and a resume keeps that even for a discrete task."""
    from tdmpc.training.run_dir import saved_config

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.pt").write_bytes(b"")
    saved = Config(task="CartPole-v1", horizon=4).to_dict()
    assert saved["plan_horizon"] is None
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert saved_config(tmp_path).plan_horizon == 4
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "plan_horizon"}))
    assert saved_config(tmp_path).plan_horizon == 4
    assert "has no 'plan_horizon'" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({**saved, "plan_horizon": 2}))
    assert saved_config(tmp_path).plan_horizon == 2  # recorded: kept


def test_explicit_bf16_on_a_cpu_that_emulates_it_warns_once(monkeypatch, capsys):
    """On AVX2-only CPUs bf16 buys no speed (its matmuls run in fp32 on bf16 values, tdmpc.model.layers.linear):
    an explicit bf16 says so, 'auto' picks fp32."""
    from tdmpc.runtime import device
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    device._warn_emulated_bf16.cache_clear()
    cpu = torch.device("cpu")
    assert device.resolve_dtype("bf16", cpu) is torch.bfloat16
    assert device.resolve_dtype("mixed", cpu) is torch.bfloat16
    assert device.resolve_dtype("auto", cpu) is torch.float32
    assert capsys.readouterr().err.count("bf16 is not faster than fp32 here") == 1
    device._warn_emulated_bf16.cache_clear()


def _trace(trainer, events: list[str]) -> None:
    """Record the order of acting, updates and env steps."""
    agent, envs = trainer.agent, trainer.envs
    for obj, name, tag in ((agent, "act_on_device", "act"), (agent, "update", "update"), (envs, "step", "step")):
        original = getattr(obj, name)
        setattr(obj, name, lambda *a, _f=original, _t=tag, **k: (events.append(_t), _f(*a, **k))[1])


@pytest.mark.parametrize("overlap", [pytest.param(False, marks=pytest.mark.slow), True])  # (CI: both)
def test_overlap_updates_run_after_the_next_action_and_a_resume_keeps_them(tmp_path, overlap):
    """With overlap_updates a step's round of updates waits for the next step's action and runs before its env
    step (on a GPU: while the host steps the envs); evaluations and the end see every update due, and the
    round queued at a stop runs first after the resume."""
    cfg = validate(Config(**{**TINY, "steps": 600, "eval_freq": 500, "eval_episodes": 1, "save_every": 10_000,
                             "overlap_updates": overlap}))
    first = Trainer(cfg, tmp_path / "run", resolve_device("cpu"))
    events: list[str] = []
    _trace(first, events)
    _stop_after(first, 450)
    assert first.run() == 3
    c = first.counters
    steady = events[-3 * 5:]  # five steps after the pretraining burst, one update each (one env)
    assert steady == (["act", "update", "step"] if overlap else ["act", "step", "update"]) * 5
    assert c.updates_queued == (1 if overlap else 0)
    assert c.updates == 200 + (250 - c.updates_queued)  # the burst, then one per step
    run = tmp_path / "run"
    saved = json.loads((run / "config.json").read_text())
    assert saved["overlap_updates"] is overlap
    second = Trainer(validate(Config(**saved)), run, resolve_device("cpu"), resume=True)
    assert second.counters.updates_queued == c.updates_queued
    events.clear()
    _trace(second, events)
    second.run()
    assert events[:3] == (["act", "update", "step"] if overlap else ["act", "step", "update"])
    assert second.counters.updates == 200 + 400 and second.counters.updates_queued == 0  # none lost at the end


def test_overlap_updates_default_on_for_cuda_with_host_envs_only(tmp_path):
    """None resolves to where it gains (a CUDA device, host envs, online), and config.json records it."""
    from tdmpc.training.setup import overlap_default

    t = Trainer(validate(Config(**{**TINY, "steps": 10})), tmp_path / "run", resolve_device("cpu"))
    assert t.cfg.overlap_updates is False
    t.close()
    cfg = Config(**TINY)
    cuda = torch.device("cuda")
    assert overlap_default(cuda, False, cfg)
    assert not overlap_default(cuda, True, cfg) and not overlap_default(torch.device("cpu"), False, cfg)
    assert not overlap_default(cuda, False, Config(**{**TINY, "dataset": ("d.h5",)}))
