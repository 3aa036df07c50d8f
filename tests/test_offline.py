"""Offline data end to end: an online run keeps every episode (--save-data), a trained agent collects
episodes (tdmpc.collect), training from datasets (in memory and streamed, resume), bad data, and
data-parallel training over 2 processes (gloo) computing what one process computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import cli, one_line_error, read_csv, run_module, run_train, tiny_json, trained_once
from tdmpc.offline.format import open_dataset, read_episodes

OFFLINE = ["--eval-episodes", "1", "--log-every", "50", "--save-every", "100", "--eval-freq", "100"]


@pytest.fixture(scope="module")
def online(tmp_path_factory) -> tuple[Path, Path]:
    """A finished tiny online run on Pendulum-v1 (200-step episodes) that kept its episodes: (run, data). The data
    file is the one the run wrote, shared by the session's workers: read it, or copy it to write."""
    run = trained_once(tmp_path_factory, "online", "--save-data", "{dir}/data.h5", steps=600, save_every=300,
                       eval_episodes=0)
    return run, Path(json.loads((run / "config.json").read_text())["save_data"])


def test_save_data_keeps_every_finished_episode_as_the_buffer_holds_it(online, tmp_path):
    run, data = online
    info = open_dataset(data)
    assert info.schema.tasks == ("Pendulum-v1",) and info.episodes == 3 and info.rows == 3 * 201
    r = run_module("tdmpc.dataset", "convert", run / "checkpoints" / "buffer_0000000600.h5", "--task", "Pendulum-v1",
                   "--out", tmp_path / "converted.h5")
    assert r.returncode == 0, r.stderr
    kept, converted = list(read_episodes(data)), list(read_episodes(tmp_path / "converted.h5"))
    assert len(converted) == 3  # the run ended at an episode's end: the next holds only its reset observation
    for a, b in zip(kept, converted[:3]):
        for name in ("obs", "action", "reward"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_save_data_says_when_no_episode_finished(tmp_path):
    cfg = tiny_json(tmp_path, steps=300, seed_steps=400, eval_episodes=0)  # random actions alone: no update
    r = run_train("--cfg", cfg, "--task", "MountainCarContinuous-v0", "--run-dir", tmp_path / "run", "--save-data",
                  tmp_path / "d.h5")  # 999-step episodes
    assert r.returncode == 0, r.stderr
    assert f"no episode finished, so --save-data wrote nothing to {tmp_path / 'd.h5'}" in r.stderr
    assert not (tmp_path / "d.h5").exists()


@pytest.mark.slow  # subprocess runs of tens of seconds: CI's slow step keeps the default suite under 8 min
def test_a_resume_never_drops_episodes_another_writer_appended(online, tmp_path):
    """tdmpc.collect appends to the file a run saves its episodes to; the run, resumed (here onto a copy of the
    file, named by --save-data), keeps them and appends its own after them."""
    import shutil

    run, data = online
    shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    shutil.copy(data, tmp_path / "data.h5")
    r = run_module("tdmpc.collect", "--checkpoint", tmp_path / "run", "--episodes", 2, "--out", tmp_path / "data.h5",
                   "--threads", 1)
    assert r.returncode == 0, r.stderr
    collected = [ep.reward for ep in read_episodes(tmp_path / "data.h5")][3:]
    r = run_train("--resume", tmp_path / "run", "--steps", 800, "--save-data", tmp_path / "data.h5")
    assert r.returncode == 0, r.stderr
    rewards = [ep.reward for ep in read_episodes(tmp_path / "data.h5")]
    assert len(rewards) == 6  # the run's 3, collect's 2, the resumed run's next one
    for a, b in zip(rewards[3:5], collected):
        np.testing.assert_array_equal(a, b)


def test_offline_init_from_evaluates_the_loaded_weights_at_step_0(online, tmp_path):
    """Step 0's evaluation plays the --init-from weights (it played the fresh ones): what evaluate plays on them."""
    import json

    run, data = online
    r = run_train("--dataset", data, "--init-from", run, "--cfg", tiny_json(tmp_path), "--steps", 50,
                  "--eval-freq", 50, "--eval-episodes", 2, "--run-dir", tmp_path / "off")
    assert r.returncode == 0, r.stderr
    seed = json.loads((tmp_path / "off" / "config.json").read_text())["seed"]
    r = run_module("tdmpc.evaluate", "--checkpoint", run, "--episodes", 2, "--seed", 1_000_003 * (seed + 1),
                   "--report", tmp_path / "report.json")
    assert r.returncode == 0, r.stderr
    played = json.loads((tmp_path / "report.json").read_text())["episode_return"]
    assert float(read_csv(tmp_path / "off" / "eval.csv")[0]["episode_return"]) == pytest.approx(played, rel=1e-4)


@pytest.mark.parametrize("stream", ["memory", pytest.param("stream", marks=pytest.mark.slow)])  # (CI: both)
def test_offline_training_updates_evaluates_and_resumes(online, tmp_path, stream):
    """Started with the dataset's path relative to its folder, resumed from another: the run keeps it absolute."""
    _, data = online
    run = tmp_path / "run"
    args = ["--dataset", data.name, "--task", "Pendulum-v1", "--cfg", tiny_json(tmp_path), "--dataset-stream", stream]
    r = run_train(*args, "--steps", 200, *OFFLINE, "--run-dir", run, cwd=data.parent)
    assert r.returncode == 0, r.stderr
    assert "finished 200 updates" in r.stderr
    assert [int(e["env_step"]) for e in read_csv(run / "eval.csv")] == [0, 100, 200]
    rows = read_csv(run / "train.csv")
    assert [int(x["updates"]) for x in rows] == [50, 100, 150, 200] and int(rows[-1]["episodes"]) == 0
    assert json.loads((run / "config.json").read_text())["dataset"] == [str(data)]
    r = run_train("--resume", run.name, "--steps", 300, cwd=tmp_path)  # the run's own path stays as it was
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "config.json").read_text())["run_dir"] == str(run)
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["updates"] == 300


def test_a_resume_cannot_turn_an_online_run_that_kept_its_episodes_offline(capsys, online):
    """Said as the resume's refusal, not as a clash of --dataset with the run's own --save-data."""
    run, data = online
    r = cli(capsys, "tdmpc.train", "--resume", run, "--dataset", data, "--steps", 900)
    assert "--dataset cannot turn an online run offline on --resume" in one_line_error(r)


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_collect_appends_a_trained_agents_episodes(online, tmp_path):
    run, _ = online
    out = tmp_path / "collected.h5"
    for _ in range(2):
        r = run_module("tdmpc.collect", "--checkpoint", run / "checkpoints" / "latest.pt", "--out", out,
                       "--episodes", 2, "--noise", 0.2, "--no-mpc", "--device", "cpu")
        assert r.returncode == 0, r.stderr
    info = open_dataset(out)
    assert info.episodes == 4 and info.schema.tasks == ("Pendulum-v1",)
    episodes = list(read_episodes(out))
    assert all(len(ep.reward) == 200 and ep.truncated for ep in episodes)
    assert np.abs(episodes[0].action).max() <= 1
    r = run_module("tdmpc.collect", "--checkpoint", run / "checkpoints" / "latest.pt", "--out", out,
                   "--task", "MountainCarContinuous-v0", "--episodes", 1, "--device", "cpu")
    assert "model is for obs (3,)" in one_line_error(r)  # another task's dims: refused, the file left as it was
    assert open_dataset(out).episodes == 4


@pytest.mark.parametrize("kind,needle", [
    ("task", "the data are of task 'Pendulum-v1'; pass --task Pendulum-v1"),
    ("nan", "'reward'"),
    ("range", "'action' is outside [-1, 1]"),
    ("truncated", "truncated"),
    ("missing", "'terminated'"),
])
def test_bad_data_is_one_line_naming_the_file_and_field(capsys, online, tmp_path, kind, needle):
    import h5py

    _, data = online
    bad = tmp_path / "bad.h5"
    bad.write_bytes(data.read_bytes())
    task = "Pendulum-v1"
    if kind == "task":
        task = "cartpole-swingup"
    elif kind == "nan":
        with h5py.File(bad, "r+") as f:
            f["reward"][10] = np.nan
    elif kind == "range":  # actions as an env with bounds [-2, 2] gives them, not rescaled
        with h5py.File(bad, "r+") as f:
            f["action"][10] = 1.7
    elif kind == "truncated":
        bad.write_bytes(data.read_bytes()[: bad.stat().st_size // 2])
    elif kind == "missing":
        with h5py.File(bad, "r+") as f:
            del f["terminated"]
    before = bad.read_bytes()
    r = cli(capsys, "tdmpc.train", "--dataset", bad, "--task", task, "--cfg", tiny_json(tmp_path), "--steps", 10,
            "--run-dir", tmp_path / "run")
    line = one_line_error(r)
    assert needle in line and str(bad) in line, line
    assert bad.read_bytes() == before and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow  # subprocess runs of tens of seconds: CI's slow step keeps the default suite under 8 min
def test_collect_again_plays_new_episodes_and_a_stop_keeps_the_finished_batches(online, tmp_path):
    """The default seed is the count the file holds, so a second collect into it adds new episodes; SIGTERM stops
    it at the next step, with the batches written kept and the one in play left out, exit 3 and a line."""
    import signal
    import time

    run, _ = online
    out = tmp_path / "c.h5"
    for _ in range(2):
        r = run_module("tdmpc.collect", "--checkpoint", run, "--episodes", 2, "--out", out, "--threads", 1)
        assert r.returncode == 0, r.stderr
    first = [ep.obs[0] for ep in read_episodes(out)]
    assert len(first) == 4 and not any(np.array_equal(first[i], first[i + 2]) for i in range(2))

    proc = subprocess.Popen([sys.executable, "-m", "tdmpc.collect", "--checkpoint", str(run), "--episodes", "200",
                             "--out", str(tmp_path / "k.h5"), "--threads", "1", "--seed", "7"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 200
    while not (tmp_path / "k.h5").exists():  # the first batch of 16 is written
        assert time.time() < deadline and proc.poll() is None, "no batch written"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    # a stop asked for is no error; the rest is collected from the next seed, not by playing seeds 7.. again
    assert err.splitlines()[-1] == (f"stopped by SIGTERM after 16 of 200 episodes: {tmp_path / 'k.h5'} holds 16 "
                                    "episodes, the batch in play left out. Collect the rest with the same command "
                                    "and --episodes 184 --seed 23"), err
    assert len(list(read_episodes(tmp_path / "k.h5"))) == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5", "k.h5"]  # no lock file either


def test_a_collect_stopped_before_its_first_batch_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    import signal

    from tdmpc.cli import collect

    def stopped_at_once(*args):  # a SIGTERM in the first batch, seen at its next step
        os.kill(os.getpid(), signal.SIGTERM)
        assert args[-1]()
        raise collect.CollectStopped

    monkeypatch.setattr(collect, "_play", stopped_at_once)
    reference = Path(__file__).parent / "fixtures" / "reference-ms1" / "reference_checkpoint.pt"
    out = tmp_path / "new.h5"
    assert collect.main(["--checkpoint", str(reference), "--task", "walker-walk", "--episodes", "3", "--no-mpc",
                         "--out", str(out), "--threads", "1"]) == 3
    err = capsys.readouterr().err
    assert f"after 0 of 3 episodes: nothing was written ({out} not made)" in err and "holds" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_refused_collect_leaves_nothing(capsys, tmp_path):
    """An --out that is not a dataset is refused in one line, and left as it was with nothing beside it (a
    .notjson.json.lock stayed)."""
    reference = Path(__file__).parent / "fixtures" / "reference-ms1" / "reference_checkpoint.pt"
    out = tmp_path / "notjson.json"
    out.write_text('{"mine": 1}')
    r = cli(capsys, "tdmpc.collect", "--checkpoint", reference, "--task", "walker-walk", "--episodes", 1,
            "--no-mpc", "--out", out, "--threads", 1)
    assert f"{out}: not an HDF5 file" in one_line_error(r)
    assert [p.name for p in tmp_path.iterdir()] == ["notjson.json"] and out.read_text() == '{"mine": 1}'


@pytest.mark.slow  # a run of its own (CI's slow step, .ci/run): the default suite stays under 8 minutes
def test_episodes_collected_from_a_multi_task_model_train_a_model_of_their_task(tmp_path):
    """collect keeps a multi-task model's padded rows (several tasks' files can then train one multi-task model)
    and records the task's own dims; a single-task run on the file reads those columns only."""
    mt30 = Path(__file__).parent / "fixtures" / "reference-mt30-ms1" / "reference_checkpoint.pt"
    data = tmp_path / "pendulum.h5"
    r = run_module("tdmpc.collect", "--checkpoint", mt30, "--task", "pendulum-swingup", "--episodes", 1, "--no-mpc",
                   "--out", data, "--threads", 1)
    assert r.returncode == 0, r.stderr
    info = run_module("tdmpc.dataset", "info", data)
    assert "obs state (24,)" in info.stdout and "obs/action dims 3/1" in info.stdout, info.stdout
    r = run_train("--dataset", data, "--task", "pendulum-swingup", "--cfg", tiny_json(tmp_path), "--steps", 20,
                  "--eval-episodes", 0, "--run-dir", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    weights = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)["model"]
    assert weights["_encoder.0.weight"].shape[1] == 3  # the task's own obs, not the 24 padded columns
    # another task of the model joins the file's list (its episodes get its id); the first task's again does not
    for task in ("cartpole-swingup", "pendulum-swingup"):
        r = run_module("tdmpc.collect", "--checkpoint", mt30, "--task", task, "--episodes", 1, "--no-mpc",
                       "--out", data, "--threads", 1)
        assert r.returncode == 0, r.stderr
    info = run_module("tdmpc.dataset", "info", data)
    assert "3 episodes" in info.stdout and "2 task(s)" in info.stdout, info.stdout
    assert "task pendulum-swingup: 2 episodes" in info.stdout and "task cartpole-swingup: 1 episodes" in info.stdout


@pytest.mark.parametrize("command,needle", [
    (["tdmpc.collect", "--checkpoint", "{run}", "--episodes", "1", "--out", "{tmp}/c.h5", "--threads", "0"],
     "--threads must be >= 1, got 0"),
    (["tdmpc.collect", "--checkpoint", "{run}", "--episodes", "1", "--out", "{tmp}/c.h5", "--noise", "-0.5"],
     "--noise must be >= 0, got -0.5"),
    (["tdmpc.dataset", "convert", "{buffer}", "--task", "Pendulum-v1", "--out", "{tmp}/c.h5", "--obs-type", "pixels"],
     "'pixels'"),
    (["tdmpc.dataset", "to-minari", "{data}", "--dataset-id", "pend"], "an id ends in its version, -vN"),
    (["tdmpc.dataset", "convert", "{buffer}", "--task", "Pendulum-v1", "--out", "{tmp}/c.h5", "--action-repeat", "-3"],
     "--action-repeat must be >= 1, got -3"),
    (["tdmpc.dataset", "info", "{buffer}"], "a saved replay buffer, not a dataset file: python -m tdmpc.dataset convert"),
    (["tdmpc.parity", "{tmp}", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["tdmpc.train", "--dataset", "--run-dir", "{tmp}/run"], "--dataset names no file"),
    (["tdmpc.train", "--dataset", "{data}", "--task", "Pendulum-v1", "--num-envs", "4", "--run-dir", "{tmp}/run"],
     "an offline run (--dataset) steps none"),
    (["tdmpc.collect", "--checkpoint", "{mt30}", "--episodes", "1", "--out", "{tmp}/c.h5"],
     "is a multi-task model: choose the one task to collect with --task, one of mt30"),
])
def test_bad_input_to_the_data_commands_is_one_line(capsys, online, tmp_path, command, needle):
    run, data = online
    paths = {"run": run, "data": data, "tmp": tmp_path, "buffer": run / "checkpoints" / "buffer_0000000600.h5",
             "mt30": Path(__file__).parent / "fixtures" / "reference-mt30-ms1" / "reference_checkpoint.pt"}
    r = cli(capsys, *(part.format(**paths) for part in command))
    assert needle in one_line_error(r)
    assert not (tmp_path / "c.h5").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_two_ranks_at_half_the_batch_compute_what_one_process_does(online, tmp_path):
    """torchrun, 2 processes on gloo at batch 8 each, against 1 process at batch 16: after 20 updates every
    parameter agrees (dropout off: its masks are drawn per rank)."""
    _, data = online
    common = ["--dataset", data, "--task", "Pendulum-v1", "--cfg", tiny_json(tmp_path), "--steps", 20,
              "--eval-episodes", 0, "--save-every", 20, "--log-every", 10, "--dropout", 0, "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "tdmpc.train", *map(str, common), "--batch-size", "8", "--run-dir",
                          str(tmp_path / "two")], capture_output=True, text=True, timeout=300, env=env)
    assert two.returncode == 0, two.stderr
    assert two.stderr.count("data-parallel: 2 processes, global batch 16 (--batch-size 8 per process)") == 1
    one = run_train(*common, "--batch-size", 16, "--run-dir", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    a = torch.load(tmp_path / "two" / "checkpoints" / "latest.pt", weights_only=True)
    b = torch.load(tmp_path / "one" / "checkpoints" / "latest.pt", weights_only=True)
    assert a["train"]["updates"] == b["train"]["updates"] == 20
    for key in b["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    differ = run_train(*common, "--batch-size", 8, "--run-dir", tmp_path / "half")  # the check can fail:
    c = torch.load(tmp_path / "half" / "checkpoints" / "latest.pt", weights_only=True)  # batch 8 alone differs
    assert differ.returncode == 0 and not torch.allclose(c["model"]["_pi.0.weight"], b["model"]["_pi.0.weight"])
    # the process count is the run's: resumed on one process, the global batch it changes is said (once)
    assert a["ranks"] == 2 and b["ranks"] == 1
    r = run_train("--resume", tmp_path / "two", "--steps", 30)
    assert r.returncode == 0, r.stderr
    assert ("resume: this run trained on 2 data-parallel processes (global batch 16); it continues on 1 (global "
            "batch 8): --batch-size is per process") in r.stderr
    again = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "tdmpc.train", "--resume", str(tmp_path / "one"), "--steps", "30"],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("resume: continuing") == 1 and "trained on 1 data-parallel process (global batch 16)" \
        in again.stderr, again.stderr  # rank 0 speaks for the ranks


def test_a_data_parallel_run_names_its_launch_in_the_resume_command(monkeypatch):
    from tdmpc.runtime.distributed import command

    assert command("--resume r", 1) == "python -m tdmpc.train --resume r"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert command("--resume r", 4) == "torchrun --nproc-per-node 4 -m tdmpc.train --resume r"
    assert command("--resume r", 8) == "the same launch of 8 data-parallel processes with tdmpc.train --resume r"


def test_ranks_pick_their_backend_by_device_and_a_rank_without_a_gpu_is_one_line(monkeypatch):
    """On a GPU machine, --device cpu ranks start gloo and leave the GPUs alone (this ran on an H100 and broke
    there: rank 1 asked for a second GPU); GPU ranks beyond the node's GPUs stop with a DeviceError."""
    from tdmpc.runtime import distributed
    from tdmpc.runtime.device import DeviceError

    started, pinned = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", started.append)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.from_environment("cpu") == distributed.Shard(1, 2, 1)
    assert started == ["gloo"] and pinned == []
    with pytest.raises(DeviceError, match="local rank 1 has no GPU of its own: this node has 1"):
        distributed.from_environment("auto")
    assert started == ["gloo"] and pinned == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert distributed.from_environment("cuda") == distributed.Shard(0, 2, 0)
    assert started == ["gloo", "nccl"] and pinned == [0]


def test_bench_offline_streams_through_several_windows_while_timed():
    """The benchmark's streamed measurement must replace windows during the timed updates, or it
    compares two in-memory samplers (no timing is asserted)."""
    from tdmpc.bench.offline import bench_offline

    out = bench_offline(1, torch.device("cpu"), rows=20_000, updates=8)
    assert out["rows"] >= 19_000 and out["stream"]["window_rows"] <= out["rows"] // 16 + 1
    assert out["stream"]["windows"] >= 4  # the first, then one every updates // 4 samples
    assert out["memory"]["update_ms"] > 0 and out["stream"]["update_ms"] > 0
