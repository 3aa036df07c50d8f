"""slurm/sweep.sh's refusals and slurm/train.sh's advice, without a cluster: train.sh runs as a job would, with
Slurm's variables set and a stand-in `scontrol` (the tests of them under a real Slurm are in test_slurm.py)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import tiny_json

SLURM = Path(__file__).resolve().parents[1] / "slurm"
# train.sh runs this Python (not whatever python3 is on PATH)
CHECKING = {**os.environ, "TDMPC_PYTHON": sys.executable}


def stand_ins(tmp_path, **scripts):
    """A folder of stand-in commands (name=shell body) to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.parametrize("args,needle", [
    (["--tasks", "walker-walk", "--seeds", "1,1"], "--seeds names 1 twice"),
    (["--tasks", "walker-walk", "--seeds", "1-3,2"], "--seeds names 2 twice"),
    (["--tasks", "walker-walk,walker-walk", "--seeds", "1"], "--tasks names walker-walk twice"),
    (["--tasks", "walker-walk", "--seeds", ""], "--seeds needs a value"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--seed", "4"], "--seed after --"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--task=cup-catch"], "--task after --"),
])
def test_sweep_refuses_what_would_put_two_elements_in_one_run_or_override_theirs_in_one_line(args, needle):
    r = subprocess.run([SLURM / "sweep.sh", *args], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert not r.stdout


def job_env(tmp_path, **over):
    """train.sh's environment in a job: Slurm's variables, a stand-in scontrol, this Python."""
    return {**CHECKING, "PATH": stand_ins(tmp_path, scontrol="exit 0"), "SLURM_JOB_NAME": "tdmpc",
            "TDMPC_RUNS": str(tmp_path / "runs"), **over}


@pytest.mark.parametrize("flag", [["--run-dir", "mine"], ["--resume=mine"], ["--auto_resume", "mine"]])
def test_train_sh_refuses_a_flag_naming_the_run_directory(tmp_path, flag):
    """The trainer's last --run-dir would win over the job's: a requeue would find no checkpoint in the job's
    directory, start afresh, and fail on the run the first session left."""
    r = subprocess.run(["bash", SLURM / "train.sh", "--cfg", "nonexist.json", *flag], capture_output=True, text=True,
                       env=job_env(tmp_path, SLURM_JOB_ID="4242"), timeout=120)
    name = flag[0].split("=")[0].replace("_", "-")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert r.stderr.startswith(f"error: {name} in train.sh's arguments") and "TDMPC_RUN_DIR" in r.stderr, r.stderr
    assert "running:" not in r.stdout and not (tmp_path / "runs").exists()


def test_a_failed_sweep_element_says_how_to_go_on_with_its_own_arguments(tmp_path):
    """The trainer refuses a flag before any checkpoint: the command train.sh prints must start the same run
    (its task, seed and flags) in that directory, not a default run there."""
    cfg = tiny_json(tmp_path)
    env = job_env(tmp_path, SLURM_JOB_ID="501", SLURM_ARRAY_JOB_ID="500", SLURM_ARRAY_TASK_ID="1",
                  TDMPC_SWEEP_TASKS="Pendulum-v1", TDMPC_SWEEP_SEEDS="3 4")
    r = subprocess.run(["bash", SLURM / "train.sh", "--cfg", cfg, "--horizon", "0"], capture_output=True, text=True,
                       env=env, timeout=240)
    assert r.returncode == 2, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "slurm" / "tdmpc" / "500" / "Pendulum-v1" / "seed4"
    expected = (f"TDMPC_RUN_DIR={shlex.quote(str(run_dir))} sbatch slurm/train.sh --cfg {shlex.quote(str(cfg))} "
                f"--horizon 0 --task Pendulum-v1 --seed 4")
    assert f"not requeueing. Fix the cause, then go on: {expected}\n" in r.stdout, r.stdout


def test_sweep_logs_go_under_the_submit_directory_not_beside_the_script(tmp_path):
    """As train.sh's own #SBATCH --output: a packaged sweep.sh (in site-packages, say) writes no logs there."""
    r = subprocess.run([SLURM / "sweep.sh", "--tasks", "walker-walk", "--seeds", "1", "--dry-run"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"--output={tmp_path}/slurm/logs/%x-%A_%a.out" in r.stdout and f"logs: {tmp_path}/slurm/logs/" in r.stdout
