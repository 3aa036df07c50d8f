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


def test_a_failed_sweep_element_says_how_to_go_on_with_its_own_arguments(tmp_path):
    """The trainer refuses a flag before any checkpoint: the command train.sh prints must start the same run
    (its task, seed and flags) in that directory, not a default run there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").chmod(0o755)
    cfg = tiny_json(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NAME": "tdmpc", "SLURM_JOB_ID": "501",
           "SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "1", "TDMPC_SWEEP_TASKS": "Pendulum-v1",
           "TDMPC_SWEEP_SEEDS": "3 4", "TDMPC_PYTHON": sys.executable, "TDMPC_RUNS": str(tmp_path / "runs")}
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
