"""Multi-task runs end to end: one model over several tasks (per-task eval rows, resume), the reference's
mt30 model evaluated and fine-tuned (a task of its set, and a new task), one-line errors, and all 30
mt30 tasks acted on in one batched call."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tdmpc.agent import Agent
from tdmpc.tasks.sets import TASK_SETS

from helpers import cli, import_or_skip

import_or_skip("dm_control")

ROOT = Path(__file__).resolve().parent.parent
MT30 = ROOT / "tests" / "fixtures" / "reference-mt30-ms1" / "reference_checkpoint.pt"
SMALL = ["--num-samples", "32", "--num-elites", "4", "--num-pi-trajs", "2", "--iterations", "2", "--batch-size", "16",
         "--buffer-size", "10000", "--no-tensorboard", "--no-progress", "--device", "cpu", "--threads", "1"]
TINY_MODEL = ["--model-size", "None", "--enc-dim", "32", "--mlp-dim", "32", "--latent-dim", "16", "--num-q", "2",
              "--num-enc-layers", "2"]


def run(module: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_one_model_trains_on_two_tasks_with_a_row_per_task_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    r = run("tdmpc.train", "--tasks", "cartpole-swingup,pendulum-swingup", *TINY_MODEL, *SMALL, "--steps", "480",
            "--seed-steps", "400", "--eval-freq", "480", "--eval-episodes", "1", "--log-every", "240",
            "--save-every", "480", "--run-dir", run_dir)
    assert r.returncode == 0, r.stderr
    evals = rows(run_dir / "eval.csv")
    assert [(int(e["env_step"]), e["task"]) for e in evals] == [
        (0, "cartpole-swingup"), (0, "pendulum-swingup"), (0, "mean"),
        (480, "cartpole-swingup"), (480, "pendulum-swingup"), (480, "mean")]
    assert {"episode_return_cartpole-swingup", "episode_return_pendulum-swingup"} <= set(rows(run_dir / "train.csv")[0])
    last = evals[-3:]
    assert float(last[2]["episode_return"]) == pytest.approx(np.mean([float(e["episode_return"]) for e in last[:2]]),
                                                            abs=1e-3)  # 6 significant digits in the csv
    ck = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["dims"]["tasks"] == ["cartpole-swingup", "pendulum-swingup"] and ck["dims"]["task_dim"] == 64
    assert ck["dims"]["obs_shape"] == [5] and ck["dims"]["action_dims"] == [1, 1]
    # 2 envs x 2 repeat per step: 100 seed steps, then 20 more; one update per env step (2 per step) by default
    assert ck["train"]["step"] == 480 and ck["train"]["updates"] == 2 * 120
    assert json.loads((run_dir / "config.json").read_text())["updates_per_round"] == 2
    r = run("tdmpc.train", "--resume", run_dir, "--steps", "560")
    assert r.returncode == 0, r.stderr
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 560


def test_the_reference_mt30_model_evaluates_on_a_task_of_its_set(capsys, tmp_path):
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", MT30, "--task", "pendulum-spin", "--episodes", "1", "--no-mpc",
            "--device", "cpu", "--report", tmp_path / "report.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task"] == "pendulum-spin" and report["imported_reference"] and report["lengths"] == [500]


@pytest.mark.parametrize("task,needle", [
    (None, "is a multi-task model: choose the one task to evaluate with --task, one of mt30: walker-stand"),
    ("walker-walk,cheetah-run", "is a multi-task model, and --task walker-walk,cheetah-run names 2 tasks: choose the "
                                "one task to evaluate with --task, one of mt30"),
    ("walker-fly", "task 'walker-fly' is not in this model's task set (mt30: walker-stand"),
    ("cartpole-swingp", "task 'cartpole-swingp' is not in this model's task set (mt30: walker-stand, walker-walk, "),
])
def test_evaluating_a_multitask_model_without_a_task_of_its_set_is_one_line(capsys, tmp_path, task, needle):
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", MT30, *(["--task", task] if task else []), "--episodes", "1",
            "--device", "cpu", "--report", tmp_path / "report.json")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    assert lines[0].endswith("did you mean 'cartpole-swingup'?") == (task == "cartpole-swingp"), lines[0]


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_reference_multitask_model_of_another_size_than_mt30_or_mt80_takes_its_tasks_from_task_set(tmp_path):
    """Its file names no tasks: --task-set does, in evaluate and in --init-from (docs/multitask.md)."""
    model = torch.load(MT30, weights_only=True)["model"]
    for key in ("_task_emb.weight", "_action_masks"):  # mt30's rows 1 and 2: walker-walk, walker-run
        model[key] = model[key][1:3].clone()
    two = tmp_path / "mt2.pt"
    torch.save({"model": model}, two)
    evaluate = ["tdmpc.evaluate", "--checkpoint", two, "--task", "walker-run", "--episodes", "1", "--no-mpc",
                "--device", "cpu", "--threads", "1", "--report", tmp_path / "report.json"]
    r = run(*evaluate)
    assert r.returncode == 2 and "neither mt30 nor mt80: name its tasks in id order (--task-set" in r.stderr, r.stderr
    r = run(*evaluate, "--task-set", "walker-walk,walker-run")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "report.json").read_text())["task"] == "walker-run"
    r = run("tdmpc.collect", "--checkpoint", two, "--task", "walker-run", "--task-set", "walker-walk", "walker-run",
            "--episodes", "1", "--no-mpc", "--out", tmp_path / "c.h5", "--device", "cpu", "--threads", "1")
    assert r.returncode == 0 and "walker-run: 1 episodes" in r.stdout, r.stderr
    fine_tune = ["tdmpc.train", "--init-from", two, "--task", "walker-walk", "--dry-run", "--threads", "1"]
    assert run(*fine_tune).returncode == 2
    r = run(*fine_tune, "--task-set", "walker-walk", "walker-run")
    assert r.returncode == 0 and "task_dim 96" in r.stderr, r.stderr
    # the set's first names are the file's tasks, the rest new rows; mt30's count needs no names, as before
    new = ["tdmpc.train", "--task", "Pendulum-v1", "--dry-run", "--threads", "1", "--init-from"]
    assert run(*new, two, "--task-set", "walker-walk,walker-run,Pendulum-v1").returncode == 0
    r = run(*new, MT30, "--task-set", "mt30", "Pendulum-v1")
    assert r.returncode == 0, r.stderr


def test_a_task_that_can_terminate_in_a_multitask_run_is_named(capsys):
    r = cli(capsys, "tdmpc.train", "--task", "Pendulum-v1,MountainCarContinuous-v0", "--dry-run", "--threads", "1")
    assert r.returncode == 0 and ("note: MountainCarContinuous-v0 can terminate, but a multi-task model has no "
                                  "termination head") in r.stderr and "Pendulum-v1 can" not in r.stderr, r.stderr


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_fine_tuning_mt30_keeps_its_task_set_and_a_new_task_gets_a_new_row(tmp_path):
    original = torch.load(MT30, weights_only=True)["model"]
    for task, rows_after in (("cartpole-swingup", 30), ("Pendulum-v1", 31)):
        run_dir = tmp_path / task
        r = run("tdmpc.train", "--init-from", MT30, "--task", task, *SMALL, "--steps", "40", "--seed-steps", "100",
                "--eval-episodes", "0", "--no-save-buffer", "--run-dir", run_dir)
        assert r.returncode == 0, r.stderr
        assert "init-from: architecture from the checkpoint (model size 1)" in r.stderr
        ck = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
        emb = ck["model"]["_task_emb.weight"]
        assert emb.shape == (rows_after, 96) and ck["dims"]["tasks"][:30] == list(TASK_SETS["mt30"])
        even = torch.arange(0, 30, 2)  # rows within max_norm: never rescaled, and no update happened
        assert torch.equal(emb[even], original["_task_emb.weight"][even])
    assert "new embedding rows for Pendulum-v1" in r.stderr
    assert ck["dims"]["tasks"][30] == "Pendulum-v1" and ck["dims"]["action_dims"][30] == 1
    assert emb[30].abs().max() <= 0.02  # initialised U(-0.02, 0.02), as the reference initialises embeddings
    assert torch.equal(ck["model"]["_action_masks"][30], torch.tensor([1.0, 0, 0, 0, 0, 0]))


def test_task_ids_are_checked_in_one_line():
    agent = Agent.from_checkpoint(MT30, device="cpu", mpc=False)
    assert agent.cfg.task == "mt30"
    obs = np.zeros(24, np.float32)
    assert agent.act(obs, task="walker-walk").shape == (6,)
    assert np.count_nonzero(agent.act(obs, task=7)) == 1  # pendulum-swingup acts on one dim
    for task, needle in ((None, "needs the task of each observation"), (30, "task id 30 is out of range"),
                         ("walker-fly", "not in this model's task set"),
                         (["walker-walk", 3], "mixes names and ids"), ([1, 2], "2 tasks for 1 observation:"),
                         ([[1], [2, 3]], "is not a task name, an id")):
        with pytest.raises(ValueError, match=needle):
            agent.act(obs, task=task)
    with pytest.raises(ValueError, match="3 tasks for 2 observations"):
        agent.act(np.zeros((2, 24), np.float32), task=[1, 2, 3])
    with pytest.raises(ValueError, match=r"got shape \(3,\): a multi-task model's observations are each task's "
                                         r"own zero-padded to 24 \(np.pad"):
        agent.act(np.zeros(3, np.float32), task="pendulum-swingup")  # its own obs, unpadded


def test_all_thirty_mt30_tasks_act_in_one_batched_call():
    from tdmpc.envs import make_task_envs

    tasks = TASK_SETS["mt30"]
    agent = Agent.from_checkpoint(MT30, device="cpu", num_samples=32, num_elites=4, num_pi_trajs=2, iterations=1)
    envs, specs = make_task_envs(tasks, 1, seed=0, obs_dim=24, action_dim=6)
    obs, _ = envs.reset(seed=0)
    ids = np.arange(30)
    for t in range(3):
        action = agent.act(obs, first_step=t == 0, task=ids)
        masks = agent.model._action_masks.numpy()
        assert action.shape == (30, 6) and np.all(action[masks == 0] == 0)
        obs, reward, *_ = envs.step(action)
        assert np.all((reward >= 0) & (reward <= 2))
    assert [s.action_dim for s in specs] == list(agent.dims.action_dims)
    envs.close()


def test_the_memory_estimate_counts_the_embedding_and_every_tasks_envs(capsys, tmp_path):
    from tdmpc import memory
    from tdmpc.config import Config
    from tdmpc.multitask import task_setup

    cfg = Config(task="mt30", model_size=1, num_envs=2, device="cpu")
    tasks = task_setup(cfg)
    assert tasks is not None and (tasks.obs_dim, tasks.action_dim) == (24, 6)
    target = memory.detect_target(cfg, torch.device("cpu"))
    est = memory.estimate(cfg, (24,), 6, False, target, tasks=tasks)
    assert est.learnable == 1_426_427  # the reference's mt30 model of size 1
    import dataclasses

    sixty = memory.estimate(dataclasses.replace(cfg, task="walker-walk", num_envs=60), (24,), 6, False, target)
    assert est.planner_buffers == sixty.planner_buffers  # 2 envs of each of 30 tasks plan in one call
    # the out-of-memory report's estimate is the run's (it left the tasks out: one task's envs, no embedding)
    said, _ = memory.out_of_memory_report(cfg, (24,), 6, False, target, True, torch.device("cpu"), tasks=tasks)
    assert f"estimate {memory.fmt_bytes(est.total)} in all" in said
    r = cli(capsys, "tdmpc.train", "--task", "mt30", "--cfg", "a4000.json", "--dry-run", "--gpu-mem", "16GB",
            "--run-dir", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    assert "dry run: mt30 (obs (24,) state, action dim 6)" in r.stdout and "train 30 env(s)" in r.stdout


def test_a_task_lists_default_run_dir_has_no_commas():
    from tdmpc.config import Config
    from tdmpc.training.run_dir import default_run_dir

    path = default_run_dir(Config(task="cheetah-run,finger-spin", seed=3))
    assert path.parts[:3] == ("runs", "cheetah-run+finger-spin", "seed3")


def test_an_episodic_multitask_run_is_one_line_before_anything_is_built(capsys, tmp_path):
    """It passed validation and died building the model: a traceback, exit 1 (a user's audit, 2026-11-29)."""
    r = cli(capsys, "tdmpc.train", "--task", "walker-walk,cheetah-run", "--episodic", "--steps", "200", "--run-dir",
            tmp_path / "run", *SMALL, *TINY_MODEL)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["error: config field 'episodic': multi-task models are for tasks without "
                                             "terminations (as the reference's); train episodic tasks one at a time"]
    assert not (tmp_path / "run").exists()


def test_tasks_of_different_default_action_repeats_name_the_field_and_the_repeats():
    from tdmpc.config import Config
    from tdmpc.errors import ConfigError
    from tdmpc.multitask import task_setup

    with pytest.raises(ConfigError) as e:
        task_setup(Config(task="walker-walk,Pendulum-v1", device="cpu"))
    assert str(e.value) == ("config field 'action_repeat' = None: the tasks walker-walk, Pendulum-v1 have different "
                            "default action repeats (1, 2); set one for all")
    tasks = task_setup(Config(task="walker-walk,Pendulum-v1", action_repeat=2, device="cpu"))
    assert tasks is not None and tasks.action_repeat == 2
