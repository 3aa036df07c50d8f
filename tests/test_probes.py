"""Faults found by probing the package as a demanding user would (bad values, odd envs, resumes that cannot be
honoured): each is a one-line error with exit code 2, or handled, and nothing the user had is lost. Kept and run
again, with others like them."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import numpy as np
import torch
import pytest

from helpers import TINY, cli, one_line_error, read_csv, run_module, run_train, tiny_json, trained_once

# Envs with faults, as a user's module (their names: probe_envs:<Name>-v0).
PROBE_ENVS = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Point(gym.Env):
        """A point that moves with the action's first dim; 50 steps an episode."""
        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x, self.t = 0.0, 0
            return self.obs(), {}

        def step(self, action):
            assert np.isfinite(action).all(), f"the env got a non-finite action {action}"
            self.x, self.t = float(np.clip(self.x + 0.1 * action[0], -1, 1)), self.t + 1
            return self.obs(), self.x, False, False, {}

        def obs(self):
            return np.array([self.x, self.t / 50], np.float32)

    class WrongShape(Point):
        """Declares 2 observation dims, returns 3."""
        def obs(self):
            return np.array([self.x, self.t / 50, 0.0], np.float32)

    class NanAtReset(Point):
        """Every reset's observation holds a NaN."""
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed)
            return np.array([np.nan, 0.0], np.float32), info

    class SometimesNanAtReset(Point):
        """Every 3rd reset's observation holds a NaN (its episodes end after 10 steps)."""
        resets = 0

        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed)
            SometimesNanAtReset.resets += 1
            return (obs * np.nan if SometimesNanAtReset.resets % 3 == 0 else obs), info

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, self.t >= 10, info

    class ConstantDim(Point):
        """Its second action dim has low == high: the env must get 0.5 there, never NaN."""
        action_space = gym.spaces.Box(np.array([-1.0, 0.5], np.float32), np.array([1.0, 0.5], np.float32))

        def step(self, action):
            assert action[1] == 0.5, f"the constant dim got {action[1]}"
            return super().step(action)

    class NanAfter5(Point):
        """From its 6th step on, the observations hold a NaN."""
        def obs(self):
            return np.array([self.x if self.t <= 5 else np.nan, 0.0], np.float32)

    for name in ("Point", "WrongShape", "NanAtReset", "SometimesNanAtReset", "ConstantDim", "NanAfter5"):
        gym.register(f"{name}-v0", entry_point=globals()[name], max_episode_steps=50)
''')


@pytest.fixture
def probe_envs(tmp_path, monkeypatch):
    """The module above importable by the CLIs these tests start (PYTHONPATH)."""
    (tmp_path / "probe_envs.py").write_text(PROBE_ENVS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def small(tmp_path, **over):
    return tiny_json(tmp_path, **{"steps": 300, "seed_steps": 100, "eval_freq": 300, "save_every": 300, **over})


@pytest.mark.parametrize("flags, field", [(["--seed", "-1"], "'seed'"), (["--seed", str(10**14)], "'seed'"),
                                          (["--lr", "inf"], "'lr'"),
                                          (["--temperature", "nan"], "'temperature'"),
                                          (["--num-samples", "8", "--num-elites", "32"], "'num_elites'")])
def test_bad_values_are_one_line_naming_the_field(capsys, tmp_path, flags, field):
    r = cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path), "--run-dir", tmp_path / "run", *flags)
    assert field in one_line_error(r)
    assert not (tmp_path / "run").exists()


def test_a_config_file_names_the_field_it_set(capsys, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY, "num_samples": 8, "num_elites": 32}))
    assert "'num_elites'" in one_line_error(cli(capsys, "tdmpc.train", "--cfg", cfg, "--run-dir", tmp_path / "run"))


def test_an_observation_of_another_shape_than_declared_is_one_line(tmp_path, probe_envs):
    r = run_train("--cfg", small(tmp_path), "--task", "probe_envs:WrongShape-v0", "--run-dir", tmp_path / "run")
    line = one_line_error(r)
    assert "shape (3,)" in line and "declares (2,)" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_nonfinite_reset_observation_is_named_or_reset_again(tmp_path, probe_envs):
    r = run_train("--cfg", small(tmp_path), "--task", "probe_envs:NanAtReset-v0", "--run-dir", tmp_path / "a")
    assert "non-finite observation from reset()" in one_line_error(r)
    assert not (tmp_path / "a").exists()
    # an env whose every 3rd reset is NaN trains with --nonfinite-data drop; the buffer holds no NaN
    run = tmp_path / "b"
    r = run_train("--cfg", small(tmp_path), "--task", "probe_envs:SometimesNanAtReset-v0", "--nonfinite-data",
                  "drop", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert "non-finite observation from reset()" in r.stderr and "reset again" in r.stderr
    import h5py

    with h5py.File(next((run / "checkpoints").glob("buffer_*.h5"))) as f:
        assert np.isfinite(f["obs"][...]).all()
    # and the run resumes with the buffer it wrote
    assert run_train("--resume", run, "--steps", 400).returncode == 0


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_constant_action_dimension_is_held_at_its_value(tmp_path, probe_envs):
    run = tmp_path / "run"
    r = run_train("--cfg", small(tmp_path), "--task", "probe_envs:ConstantDim-v0", "--run-dir", run)
    assert r.returncode == 0, r.stderr  # the env asserts the value it gets
    r = run_module("tdmpc.evaluate", "--checkpoint", run / "checkpoints" / "latest.pt", "--episodes", 2,
                   "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny finished run (Pendulum-v1, 300 env steps, replay buffer saved)."""
    return trained_once(tmp_path_factory, "probes", steps=300, seed_steps=100, eval_freq=300, save_every=300)


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_resume_follows_its_new_eval_log_and_save_schedule(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    r = run_train("--resume", run, "--steps", 800, "--eval-freq", 200, "--log-every", 150, "--save-every", 200)
    assert r.returncode == 0, r.stderr
    assert "eval_freq changed from 300 to 200" in r.stderr, r.stderr
    # from step 300, each at the next multiple of its new interval (the old schedule: evals at 600, logs at 400)
    assert [int(x["env_step"]) for x in read_csv(run / "eval.csv")] == [0, 300, 400, 600, 800]
    rows = read_csv(run / "train.csv")[3:]
    assert [int(x["env_step"]) for x in rows] == [450, 600, 750, 800]  # and a last row for the steps after 750
    # ... just after the evaluation at 800, which took no step: no rate, not 0
    assert rows[-1]["env_steps_per_s"] == "" and float(rows[-2]["env_steps_per_s"]) > 0, rows[-2:]
    assert torch.load(run / "checkpoints" / "previous.pt", weights_only=True)["train"]["step"] == 600


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("flag, value, old", [("--horizon", 5, "3"), ("--num-envs", 2, "1"),
                                               ("--mlp-dim", 64, "32"), ("--buffer-size", 4000, "5000"),
                                               ("--task", "MountainCarContinuous-v0", "'Pendulum-v1'"),
                                               ("--obs", "rgb", "'state'")])  # not first a pixel setting's error
def test_a_resume_that_cannot_keep_a_flag_refuses_it_and_touches_nothing(capsys, finished, tmp_path, flag, value, old):
    before = _files(finished)
    line = one_line_error(cli(capsys, "tdmpc.train", "--resume", finished, "--steps", 400, flag, value))
    assert f"{flag} cannot change on --resume: this run has {old}" in line, line
    assert _files(finished) == before  # no buffer set aside as damaged, no config.json rewritten
    assert not list(finished.rglob("*.damaged*"))


def test_resume_and_auto_resume_together_are_refused_and_auto_resume_is_named_in_its_refusals(capsys, finished,
                                                                                                tmp_path):
    """Both flags once went through, one of them dropped without a word (the other when the auto-resume folder held
    no checkpoint); a refusal of an --auto-resume once named --resume."""
    before = _files(finished)
    for other in (finished, tmp_path / "elsewhere"):
        line = one_line_error(cli(capsys, "tdmpc.train", "--resume", finished, "--auto-resume", other, "--steps", 400))
        assert "both name the run to continue: give one" in line, line
    line = one_line_error(cli(capsys, "tdmpc.train", "--auto-resume", finished, "--steps", 400, "--horizon", 5))
    assert "--horizon cannot change on --auto-resume: this run has 3" in line, line
    assert _files(finished) == before and not (tmp_path / "elsewhere").exists()


def test_a_resume_with_nothing_to_do_changes_nothing(capsys, finished):
    before = _files(finished)
    r = cli(capsys, "tdmpc.train", "--resume", finished)
    assert r.returncode == 0 and "already finished at step 300" in r.stderr, r.stderr
    r = cli(capsys, "tdmpc.train", "--resume", finished, "--eval-freq", 50)  # said as not applied, not as changed
    assert r.returncode == 0 and "(--eval-freq not applied: nothing was changed)" in r.stderr, r.stderr
    ckpt = finished / "checkpoints" / "latest.pt"
    r = cli(capsys, "tdmpc.train", "--auto-resume", finished, "--init-from", ckpt)
    assert r.returncode == 0 and f"(--init-from {ckpt} not applied: nothing was changed)" in r.stderr, r.stderr
    assert "changed from" not in r.stderr, r.stderr
    assert _files(finished) == before
    assert json.loads((finished / "config.json").read_text())["steps"] == 300
    assert [int(x["env_step"]) for x in read_csv(finished / "eval.csv")] == [0, 300]


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_evaluate_stops_on_nan_observations_or_drops_them_and_writes_valid_json(tmp_path, probe_envs):
    run = tmp_path / "run"
    assert run_train("--cfg", small(tmp_path), "--task", "probe_envs:Point-v0", "--run-dir", run).returncode == 0
    ckpt, report = run / "checkpoints" / "latest.pt", tmp_path / "report.json"
    args = ["--checkpoint", ckpt, "--task", "probe_envs:NanAfter5-v0", "--episodes", 2, "--report", report]
    line = one_line_error(run_module("tdmpc.evaluate", *args))
    assert "non-finite observation at step 6" in line and "--nonfinite-data drop" in line, line
    assert not report.exists()
    r = run_module("tdmpc.evaluate", *args, "--nonfinite-data", "drop")
    assert r.returncode == 0 and "2 episode(s) left out" in r.stdout, r.stderr

    def no_nan(token):
        raise AssertionError(f"{token} in the JSON report")

    rep = json.loads(report.read_text(), parse_constant=no_nan)
    assert rep["episodes"] == 0 and rep["dropped_episodes"] == 2 and rep["episode_return"] is None


def test_act_on_wrong_input_is_one_clear_error_and_converts_what_training_converts():
    import torch

    from tdmpc.bench.timing import make_agent
    from tdmpc.errors import BadInput

    agent = make_agent(1, torch.device("cpu"), "fp32", num_samples=16, num_elites=2, num_pi_trajs=2, iterations=1)
    D = agent.dims.obs_shape[0]
    for obs, first, says in [(np.zeros(D - 1), None, f"got shape ({D - 1},)"), (np.float32(1), None, "got shape ()"),
                             (np.zeros((0, D)), None, f"got shape (0, {D})"), ("abc", None, "not str"),
                             (np.zeros(D), "yes", "first_step takes a bool"),
                             (np.zeros((3, D)), [True, False], "2 flags for 3 observations"),
                             (np.full((2, D), np.nan), None, "NaN or inf in observation 0"),
                             (np.stack([np.zeros(D), np.full(D, np.inf)]), None, "NaN or inf in observation 1")]:
        with pytest.raises(BadInput, match=".*") as e:
            agent.act(obs, first)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert f"({D},)" in str(e.value) or "first_step" in str(e.value) or "NaN" in str(e.value)
    for obs in (np.zeros(D, np.int64), np.zeros(D, bool), np.zeros((2, D), np.float64)):  # as training converts
        assert np.isfinite(agent.act(obs)).all()
    with pytest.warns(UserWarning, match="values up to 1e"):
        assert np.isfinite(agent.act(np.full(D, 1e30, np.float32))).all()


def test_datasets_with_actions_outside_the_unit_range_are_named_by_info_and_refused_by_training(tmp_path):
    import h5py

    from tdmpc.offline.writer import DatasetWriter

    path = tmp_path / "d.h5"
    obs, reward = np.zeros((51, 3), np.float32), np.zeros(50, np.float32)
    with DatasetWriter(path, (3,), 1, ["Pendulum-v1"], "state", 1, "test") as writer:
        for _ in range(4):
            writer.add_episode(obs, np.zeros((50, 1), np.float32), reward, False, True)
    assert run_module("tdmpc.dataset", "info", path).returncode == 0
    with h5py.File(path, "r+") as f:  # the env's own action range (Pendulum's is [-2, 2]), not rescaled
        f["action"][2] = -1.5
    r = run_module("tdmpc.dataset", "info", path)  # described, with one line saying training refuses it
    assert r.returncode == 0 and "4 episodes" in r.stdout, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {path}: 'action' is outside [-1, 1] at row 2 (episode 0, step 2); actions are stored in [-1, 1], "
        f"the agent's range: map the env's action bounds onto it; training refuses this file"]
    r = run_train("--dataset", path, "--task", "Pendulum-v1", "--cfg", tiny_json(tmp_path), "--steps", 10,
                  "--run-dir", tmp_path / "run")
    assert "'action' is outside [-1, 1]" in one_line_error(r)


def test_update_every_runs_one_round_every_k_agent_steps(capsys, tmp_path):
    """--update-every 2: seeding's 200 steps give 100 pretraining updates, the 200 steps after them 100."""
    import torch

    run = tmp_path / "run"
    r = cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path, steps=400, seed_steps=200, eval_episodes=0),
            "--update-every", 2, "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["updates"] == 200
    assert "100 pretraining updates" in r.stderr


@pytest.mark.slow  # a run in subprocess envs (CI runs it in its slow step)
def test_async_vectorization_trains(tmp_path):
    """--vectorization async: each env in its own process (forkserver), stopped with the run."""
    import torch

    run = tmp_path / "run"
    cfg = tiny_json(tmp_path, steps=400, seed_steps=200, eval_freq=400, eval_episodes=1)
    r = run_train("--cfg", cfg, "--num-envs", 2, "--vectorization", "async", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 400


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_debug_stops_at_the_first_nonfinite_metric_with_one_line(tmp_path):
    assert run_train("--cfg", small(tmp_path), "--debug", "--run-dir", tmp_path / "a").returncode == 0
    r = run_train("--cfg", small(tmp_path), "--debug", "--lr", "1e30", "--run-dir", tmp_path / "b")
    line = one_line_error(r, code=1)
    assert "--debug: non-finite metrics at update" in line, line


def test_dataset_stream_auto_streams_what_would_not_fit_in_half_the_free_memory(tmp_path, monkeypatch):
    import torch

    from tdmpc.config import Config
    from tdmpc.offline import data
    from tdmpc.offline.format import open_dataset
    from tdmpc.offline.sampler import InMemoryDataset, StreamingDataset
    from tdmpc.offline.writer import DatasetWriter

    path = tmp_path / "d.h5"
    with DatasetWriter(path, (3,), 1, ["Pendulum-v1"], "state", 1, "test") as writer:
        for _ in range(4):
            writer.add_episode(np.zeros((51, 3), np.float32), np.zeros((50, 1), np.float32), np.zeros(50), False, True)
    info, cfg = open_dataset(path), Config(dataset=(str(path),), dataset_stream="auto", batch_size=8)
    size = info.rows * info.schema.row_bytes()
    for free, kind in ((100 * size, InMemoryDataset), (size, StreamingDataset)):
        monkeypatch.setattr(data, "available_host_memory", lambda: free)
        sampler = data._sampler(cfg, info, torch.device("cpu"), 0, (0, 1))
        try:
            assert type(sampler) is kind and sampler.sample(8).obs.shape == (4, 8, 3)
        finally:
            sampler.close()


@pytest.mark.slow  # a minute of benchmarking: CI's own step (.ci/run)
def test_bench_quick_writes_its_json_and_table(tmp_path):
    """python -m tdmpc.bench --quick, shrunk to one size, one env count and a short warm-up."""
    out = tmp_path / "bench.json"
    r = run_module("tdmpc.bench", "--quick", "--sizes", 1, "--envs", 1, "--task", "Pendulum-v1", "--e2e-steps", 3,
                   "--rss-steps", 3, "--warmup-steps", 10, "--offline-updates", 0, "--no-compare-plain",
                   "--threads", 1, "--out", out, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    (model,) = result["models"]
    assert model["model_size"] == 1 and result["end_to_end"]["agent_steps"] >= 3 and result["peak"]["fp32"]["peak"] > 0
    assert "plan" in r.stdout and f"wrote {out}" in r.stdout


@pytest.mark.slow  # three spawned interpreters: CI's slow step (.ci/run), with bench --quick
def test_bench_processes_time_n_training_loops_from_one_barrier_with_their_share_of_threads():
    """--e2e-procs: N spawned processes, each with threads // N threads, each timed over the same window."""
    from tdmpc.bench.e2e import bench_processes

    out = bench_processes("Pendulum-v1", torch.device("cpu"), (1, 2), agent_steps=5, warmup_steps=5, threads=2,
                          small=True)
    assert sorted(out) == [1, 2]
    for n, p in out.items():
        assert p["threads_each"] == 2 // n and len(p["runs"]) == len(p["agent_steps_per_s_each"]) == n
        assert all(r["agent_steps"] >= 5 and r["small_model"] for r in p["runs"])
        assert p["agent_steps_per_s_total"] == pytest.approx(sum(r["agent_steps_per_s"] for r in p["runs"]))


# --- found by the probe of 2026-11-26: user paths and values checked before any work ---------------------

def test_settings_a_run_never_reads_and_steps_past_its_end_are_said(capsys):
    r = cli(capsys, "tdmpc.train", "--task", "CartPole-v1", "--entropy-bonus", "squashed", "--min-std", 0.3,
            "--dry-run", "--threads", 1)
    assert r.returncode == 0 and "note: --entropy-bonus, --min-std do nothing with discrete actions (CartPole-v1)" \
        in r.stderr, r.stderr
    r = cli(capsys, "tdmpc.train", "--task", "Pendulum-v1", "--min-prob", 0.1, "--eval-episodes", 0, "--save-video",
            "--num-envs", 3, "--steps", 301, "--seed-steps", 150, "--dry-run", "--threads", 1)
    for line in ("note: --min-prob does nothing with continuous actions (Pendulum-v1)",
                 "note: --save-video records evaluation episodes, and --eval-episodes 0 plays none",
                 "note: the run ends at step 303, the first whole step of its 3 envs x action repeat 1 at or after "
                 "--steps 301"):
        assert line in r.stderr, r.stderr
    line = one_line_error(cli(capsys, "tdmpc.train", "--task", "Pendulum-v1", "--num-envs", 300, "--buffer-size", 1000,
                              "--dry-run"))
    assert "for each of 300 env(s) (--num-envs, per task): at least 1,500" in line


def test_evaluate_video_and_seed_are_checked_first_and_a_file_already_there_is_kept(finished, tmp_path, capsys):
    ckpt = finished / "checkpoints" / "latest.pt"
    kept = tmp_path / "notes"
    kept.write_text("mine")
    for flags, needle in ((["--video", kept], "the name must end in .mp4"), (["--video", tmp_path], "is a folder"),
                          (["--seed", -1], "--seed must be >= 0"), (["--seed", 10**20], "< 2**62"),
                          (["--report", tmp_path], "is a folder")):
        line = one_line_error(cli(capsys, "tdmpc.evaluate", "--checkpoint", ckpt, "--episodes", 1, "--threads", 1,
                                  *flags))
        assert needle in line, line
    assert kept.read_text() == "mine"
    r = run_module("tdmpc.evaluate", "--checkpoint", ckpt, "--episodes", 1, "--threads", 1, "--no-mpc",
                   "--video", tmp_path / "v.gif", "--report", tmp_path / "r.json")
    assert r.returncode == 0 and (tmp_path / "v.gif").stat().st_size > 1000, r.stderr
    assert "error" not in r.stderr, r.stderr  # SDL's "error: XDG_RUNTIME_DIR is invalid" on a video that worked
    line = one_line_error(cli(capsys, "tdmpc.collect", "--checkpoint", ckpt, "--out", tmp_path / "d.h5", "--seed",
                              -1))
    assert "--seed must be >= 0 and < 2**62 (gymnasium and torch seed with it), got -1" in line, line
    assert not (tmp_path / "d.h5").exists()
    line = one_line_error(cli(capsys, "tdmpc.collect", "--checkpoint", ckpt, "--out", tmp_path / "d.h5", "--seed",
                              10**20))  # a traceback from torch.manual_seed before (a user's audit, 2026-11-29)
    assert "< 2**62 (gymnasium and torch seed with it), got 100000000000000000000" in line, line
    assert not (tmp_path / "d.h5").exists()


def test_a_video_write_that_fails_leaves_the_file_that_was_there(tmp_path, monkeypatch):
    import imageio.v2 as imageio

    from tdmpc.episodes import write_video

    video = tmp_path / "episode.mp4"
    video.write_bytes(b"an earlier video")

    def broken(path, frames, **kw):
        open(path, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(imageio, "mimsave", broken)
    with pytest.raises(OSError):
        write_video(video, [np.zeros((8, 8, 3), np.uint8)], 10)
    assert video.read_bytes() == b"an earlier video" and list(tmp_path.iterdir()) == [video]


def test_a_video_writer_that_stops_still_prints_the_result_and_its_report_then_one_line(finished, tmp_path, capsys,
                                                                                         monkeypatch):
    """ffmpeg stopping on a full disk reaches imageio as an OSError with no errno ("[Errno 32] Broken pipe" and
    ffmpeg's command line): the episodes were played, so the result and the report come first."""
    import imageio.v2 as imageio

    def stopped(path, frames, **kw):
        raise OSError("[Errno 32] Broken pipe\n\nFFMPEG COMMAND:\nffmpeg -y -f rawvideo ...")

    monkeypatch.setattr(imageio, "mimsave", stopped)
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", finished, "--episodes", 1, "--threads", 1, "--no-mpc",
            "--video", tmp_path / "v.mp4", "--report", tmp_path / "r.json")
    line = one_line_error(r, code=1)
    assert "Pendulum-v1 (step 300): return" in r.stdout and "video:" not in r.stdout, r.stdout
    assert f"the video could not be written: {tmp_path / 'v.mp4'}: the video writer stopped ([Errno 32] Broken pipe;" \
        in line, line
    assert "video" not in json.loads((tmp_path / "r.json").read_text()) and not (tmp_path / "v.mp4").exists()


def test_evaluations_of_other_settings_or_checkpoints_keep_their_own_reports(finished, tmp_path, capsys):
    import shutil

    from tdmpc.episodes import eval_seed

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.copy(run / "checkpoints" / "latest.pt", run / "checkpoints" / "step300.pt")
    for checkpoint, extra in ((run, []), (run, ["--precision", "fp32"]), (run / "checkpoints" / "step300.pt", []),
                              (run, ["--plan-horizon", 2])):  # a planning flag does nothing without planning
        r = cli(capsys, "tdmpc.evaluate", "--checkpoint", checkpoint, "--episodes", 1, "--threads", 1, "--no-mpc",
                *extra)
        assert r.returncode == 0, r.stderr
    assert "note: --plan-horizon does nothing with --no-mpc" in r.stderr and "(replaces the report" in r.stdout
    seed = eval_seed(json.loads((run / "config.json").read_text())["seed"])
    names = sorted(p.name for p in (run / "checkpoints").glob("eval_*.json"))
    assert names == [f"eval_Pendulum-v1_seed{seed}_{what}.json" for what in ("no-mpc", "no-mpc_precisionfp32",
                                                                            "step300_no-mpc")], names


def test_output_paths_that_cannot_be_used_are_one_line(finished, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for module, args, needle in (("tdmpc.reproduce", ["--gather", finished, "--out", afile], "afile"),
                                 ("tdmpc.slurm_scripts", ["--copy", afile], "Not a directory"),
                                 ("tdmpc.plot", [finished, "--out", tmp_path / "p.txt"], "the name must end in"),
                                 ("tdmpc.plot", [], "give one or more run directories"),
                                 ("tdmpc.reproduce", ["--tasks", "Pendulum-v1", "--seeds", "1-100000000", "--dry-run"],
                                  "more than 1,000 seeds"),
                                 ("tdmpc.dataset", ["from-minari", tmp_path, "--out", tmp_path / "m.h5"],
                                  "no such local Minari dataset"),
                                 # a file where a folder goes is said so (mkdir's word was 'File exists')
                                 ("tdmpc.plot", [finished, "--out", afile / "p.png"],
                                  f"{afile}: a file where a folder goes"),
                                 ("tdmpc.evaluate", ["--checkpoint", finished, "--video", afile / "v.mp4"],
                                  f"--video {afile / 'v.mp4'}: {afile} is a file where a folder goes"),
                                 # before any episode, as --video is (it was an exit 1 after the result)
                                 ("tdmpc.evaluate", ["--checkpoint", finished, "--report", afile / "r.json"],
                                  f"--report {afile / 'r.json'}: {afile} is a file where a folder goes")):
        line = one_line_error(cli(capsys, module, *args))
        assert needle in line, (module, line)
    assert afile.read_text() == "mine"


def test_plot_counts_a_run_named_twice_once_and_an_unevaluated_run_is_one_line(finished, tmp_path, capsys):
    import shutil

    from tdmpc.report.curves import group_runs

    (curve,) = group_runs([finished, finished / "." / ""])
    assert curve.label.endswith(", 1 seed"), curve.label  # not "2 runs of 1 seed"
    never = tmp_path / "never"  # eval_episodes 0: no eval.csv at all
    shutil.copytree(finished, never)
    (never / "eval.csv").unlink()
    assert f"{never}: no evaluation yet (no eval.csv" in one_line_error(cli(capsys, "tdmpc.plot", never, "--out",
                                                                            tmp_path / "p.png"))
    missing = tmp_path / "missing"
    assert f"{missing} does not exist" in one_line_error(cli(capsys, "tdmpc.plot", missing, "--out",
                                                             tmp_path / "p.png"))
    header = tmp_path / "header"  # stopped before its first evaluation's row
    shutil.copytree(finished, header)
    (header / "eval.csv").write_text((finished / "eval.csv").read_text().splitlines()[0] + "\n")
    line = one_line_error(cli(capsys, "tdmpc.plot", header, "--out", tmp_path / "p.png"))
    assert "no evaluation yet" in line and not (tmp_path / "p.png").exists()
    r = cli(capsys, "tdmpc.plot", header, finished, "--out", tmp_path / "p.png")  # the other run is drawn
    assert r.returncode == 0 and f"skipping {header}: no evaluation yet" in r.stderr


def test_a_damaged_config_json_is_one_line_for_plot(finished, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "config.json").write_text("{ not json")
    assert "config.json is damaged" in one_line_error(cli(capsys, "tdmpc.plot", run, "--out", tmp_path / "p.png"))


@pytest.mark.parametrize("content,needle", [(b"garbage,stuff\n1,2\n", "no env_step, episode_return column"),
                                            (b"env_step,episode_return\n0,abc\n", "line 2: not a number"),
                                            (b"\x00\x01\xff\n", "not a text file")])
def test_an_eval_csv_that_is_not_ours_is_one_line_for_plot(finished, tmp_path, capsys, content, needle):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "eval.csv").write_bytes(content)
    assert needle in one_line_error(cli(capsys, "tdmpc.plot", run, "--out", tmp_path / "p.png"))
    assert not (tmp_path / "p.png").exists()


def test_parse_errors_of_every_cli_are_one_line_pointing_to_help(tmp_path, capsys):
    for module, args, needle in (("tdmpc.train", ["--steps", "abc"], "--steps takes an integer, not 'abc'"),
                                 ("tdmpc.train", ["--lr", "fast"], "--lr takes a number, not 'fast'"),
                                 ("tdmpc.evaluate", ["--checkpoint", "x", "--episodes", "abc"],
                                  "error: --episodes takes an integer, not 'abc'"),  # no "Value error:" before it
                                 ("tdmpc.train", ["--precision", "fp9"],
                                  "error: --precision takes one of ('auto', 'fp32', 'bf16'), not 'fp9'"),
                                 ("tdmpc.evaluate", ["--bogus"], "Unrecognized option: --bogus"),
                                 # the unknown flag's value is not a second unknown option
                                 ("tdmpc.train", ["--stepz", "10"], "Unrecognized option: --stepz; Perhaps you meant"),
                                 ("tdmpc.train", ["--stepz", "10", "--bogus=3", "x"],
                                  "Unrecognized options: --stepz, --bogus=3, x;"),
                                 ("tdmpc.dataset", [], "Expected one of {convert, info, to-minari, from-minari}")):
        line = one_line_error(cli(capsys, module, *args))
        assert needle in line and f"(see python -m {module} --help)" in line, line


def test_a_replay_buffer_larger_than_host_memory_is_refused_before_the_run(tmp_path, capsys):
    r = cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--run-dir", tmp_path / "run", "--buffer-size", 10**12)
    line = one_line_error(r)
    assert "of host memory" in line and "lower --buffer-size" in line and not (tmp_path / "run").exists()
    r = cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--buffer-size", 10**12, "--dry-run")
    assert r.returncode == 0 and "host memory: DOES NOT FIT this machine" in r.stdout


def test_min_prob_outside_0_1_is_one_line(tmp_path, capsys):
    r = cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--task", "CartPole-v1", "--min-prob", 2, "--run-dir",
            tmp_path / "run")
    assert "'min_prob'" in one_line_error(r)


def test_fit_refuses_conflicting_or_wrong_arguments_before_it_starts(tmp_path, finished):
    import tdmpc
    from tdmpc.errors import BadInput, CheckpointError

    for kw, needle in ((dict(env="Pendulum-v1", task="CartPole-v1"), "two tasks"),
                       (dict(env="Pendulum-v1", on_eval=5), "takes a function"),
                       (dict(env="Pendulum-v1", cfg={"steps": 3}), "takes a tdmpc Config")):
        with pytest.raises(BadInput, match=needle):
            tdmpc.fit(run_dir=tmp_path / "run", **kw)
    assert not (tmp_path / "run").exists()
    with pytest.raises(CheckpointError, match="2 discrete actions"):
        tdmpc.Agent.from_checkpoint(finished / "checkpoints" / "latest.pt", task="CartPole-v1", device="cpu")


def test_a_second_run_directory_an_empty_info_and_a_dataset_named_twice_are_one_line(finished, tmp_path, capsys):
    for flag in ("--resume", "--auto-resume"):
        line = one_line_error(cli(capsys, "tdmpc.train", flag, finished, "--run-dir", tmp_path / "other"))
        assert f"{flag} {finished} names the run directory; --run-dir {tmp_path / 'other'} names another" in line
    r = cli(capsys, "tdmpc.train", "--auto-resume", finished, "--run-dir", finished)  # one dir twice (docs/slurm.md)
    assert r.returncode == 0 and "already finished" in r.stderr, r.stderr
    assert "give one or more dataset files" in one_line_error(cli(capsys, "tdmpc.dataset", "info"))
    d = tmp_path / "d.h5"
    line = one_line_error(cli(capsys, "tdmpc.train", "--dataset", d, d, "--task", "Pendulum-v1", "--steps", 10))
    assert "'dataset'" in line
    assert not list(tmp_path.iterdir())


def test_a_mistyped_flag_is_one_line_naming_the_flags_meant_without_their_help(capsys):
    line = one_line_error(cli(capsys, "tdmpc.train", "--no-no-buffer"))
    assert "Perhaps you meant: --no-buffer or --save-buffer, --no-save-buffer (see" in line, line


def test_help_reads_a_field_docstring_of_several_lines_as_one_paragraph_and_no_buffer_as_one_flag(capsys,
                                                                                                   monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping: a row break is a break tyro kept
    r = cli(capsys, "tdmpc.train", "--help")
    assert r.returncode == 0
    rows = [row.strip("│ ") for row in r.stdout.splitlines()]
    assert any("several, separated by commas (--tasks is the same flag), or mt30" in row for row in rows), r.stdout
    assert any(row.startswith("--no-buffer ") for row in rows) and "--no-no-buffer" not in r.stdout


def test_reproduce_checks_the_train_flags_after_the_double_dash_before_any_run(tmp_path, capsys):
    for extra, needle in ((["--bogus"], "Unrecognized option: --bogus"), (["--lr", "-1"], "'lr'")):
        line = one_line_error(cli(capsys, "tdmpc.reproduce", "--tasks", "Pendulum-v1", "--seeds", 1, "--runs-root",
                                  tmp_path / "runs", "--", *extra))
        assert needle in line, line
    assert not (tmp_path / "runs").exists()


def test_output_piped_into_a_reader_that_leaves_ends_quietly(tmp_path):
    """train --dry-run | head -1, when head leaves before the output is written: the BrokenPipeError a write then
    raises ends the command quietly with 141 (128 + SIGPIPE), in a command's body and in tyro's --help alike."""
    import subprocess
    import sys

    code = textwrap.dedent("""
        import sys
        from tdmpc.errors import run_cli
        from tdmpc.runtime.args import one_line_parse_errors

        def closed():
            raise BrokenPipeError(32, "Broken pipe")

        if sys.argv[1] == "body":
            sys.exit(run_cli(closed))
        with one_line_parse_errors("prog"):
            closed()
    """)
    for where in ("body", "parse"):
        r = subprocess.run([sys.executable, "-c", code, where], capture_output=True, text=True, timeout=60)
        assert r.returncode == 141 and r.stderr == "", (where, r.stderr)


def test_config_files_that_repeat_a_key_hold_null_or_name_a_folder_and_numpy_numbers(tmp_path, capsys):
    import numpy as np

    from tdmpc.config import from_dict

    (tmp_path / "dup.json").write_text('{"steps": 10, "steps": 20}')
    (tmp_path / "null.json").write_text("null")
    for cfg, needle in ((tmp_path / "dup.json", "sets 'steps' twice"), (tmp_path / "null.json", "not null"),
                        (tmp_path, "give a config file"), ("", "give a config file")):
        assert needle in one_line_error(cli(capsys, "tdmpc.train", "--cfg", cfg, "--dry-run")), cfg
    cfg = from_dict({"seed": np.int64(3), "lr": np.float32(0.5)})
    assert cfg.seed == 3 and type(cfg.seed) is int and cfg.lr == 0.5


def test_wandb_without_its_package_is_one_line_before_the_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    line = one_line_error(cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--run-dir", tmp_path / "run",
                              "--wandb"))
    assert "needs the wandb package" in line and not (tmp_path / "run").exists()


def test_more_threads_than_the_cpus_this_process_may_use_are_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """--threads 999 on 2 cores had not finished a run's first step in 5 minutes (OpenMP's threads spin, waiting on
    threads that are not running): refused in one line naming the CPUs, before a run directory exists; a dry run
    (planning for another machine) says it; OMP_NUM_THREADS above them is capped with a line; the CPUs are the
    process's share (a Slurm job's), not the machine's."""
    from tdmpc.runtime.device import set_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    line = one_line_error(cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--run-dir", tmp_path / "run",
                              "--threads", 3))
    assert "--threads 3: this process may use 2 CPUs" in line and "give at most 2" in line
    assert not (tmp_path / "run").exists()
    r = cli(capsys, "tdmpc.train", "--cfg", small(tmp_path), "--threads", 3, "--dry-run")
    assert r.returncode == 0 and "threads: TOO MANY for this machine: --threads 3" in r.stdout
    for module, args in (("tdmpc.evaluate", ["--checkpoint", tmp_path / "none.pt"]),
                         ("tdmpc.collect", ["--checkpoint", tmp_path / "none.pt", "--out", tmp_path / "d.h5"]),
                         ("tdmpc.reproduce", ["--tasks", "Pendulum-v1", "--seeds", 1, "--runs-root", tmp_path / "rr"])):
        assert "this process may use 2 CPUs" in one_line_error(cli(capsys, module, *args, "--threads", 3))
    before = torch.get_num_threads()
    try:
        assert set_threads(2) == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "7")
        assert set_threads(None) == 2 and "not OMP_NUM_THREADS=7" in capsys.readouterr().err
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert set_threads(None) == 1  # a share of the machine: its own CPU, whatever the machine's load
    finally:
        torch.set_num_threads(before)
