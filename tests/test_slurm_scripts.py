"""slurm/sweep.sh's refusals and slurm/train.sh's advice, without a cluster: train.sh runs as a job would, with
Slurm's variables set and a stand-in `scontrol` (the tests of them under a real Slurm are in test_slurm.py)."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import tiny_json

SLURM = Path(__file__).resolve().parents[1] / "slurm"
# sweep.sh checks the train arguments with this Python, and train.sh runs it (not whatever python3 is on PATH)
CHECKING = {**os.environ, "TDMPC_PYTHON": sys.executable}


def stand_ins(tmp_path, **scripts):
    """A folder of stand-in commands (name=shell body) to put first on PATH; sbatch's records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.parametrize("args,needle", [
    (["--tasks", "walker-walk", "--seeds", "1,1"], "--seeds names 1 twice"),
    (["--tasks", "walker-walk", "--seeds", "1-3,2"], "--seeds names 2 twice"),
    (["--tasks", "walker-walk", "--seeds", "1,01"], "--seeds names 1 twice"),  # tdmpc.train reads 01 as 1
    # a train flag before -- went to sbatch: refused by it (exit 255), or --threads taken as --threads-per-core
    (["--tasks", "walker-walk", "--seeds", "1", "--cfg", "a4000.json"], "--cfg before --: it is a tdmpc.train flag"),
    (["--tasks", "walker-walk", "--seeds", "1", "--threads", "1", "--dry-run", "--", "--cfg", "a4000.json"],
     "--threads before --: it is a tdmpc.train flag"),
    (["--tasks", "walker-walk", "--seeds", "1", "--no-compile=x", "--dry-run"], "--no-compile before --"),
    (["--tasks", "walker-walk,walker-walk", "--seeds", "1"], "--tasks names walker-walk twice"),
    (["--tasks", "walker-walk", "--seeds", ""], "--seeds needs a value"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--seed", "4"], "--seed after --"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--task=cup-catch"], "--task after --"),
    # a flag naming the run directory: every element would share it, and a requeue would not look there
    (["--tasks", "walker-walk", "--seeds", "1-2", "--dry-run", "--", "--run-dir", "x"], "--run-dir after --"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--resume=x"], "--resume after --"),
    (["--tasks", "walker-walk", "--seeds", "1", "--dry-run", "--", "--auto_resume", "x"], "--auto-resume after --"),
])
def test_sweep_refuses_what_would_put_two_elements_in_one_run_or_override_theirs_in_one_line(args, needle):
    r = subprocess.run([SLURM / "sweep.sh", *args], capture_output=True, text=True, env=CHECKING, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and not r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--tasks", "walker-wlak", "--seeds", "1-2", "--", "--cfg", "a4000.json"], "unknown task 'walker-wlak'"),
    (["--tasks", "walker-walk,cup-catch", "--seeds", "1", "--", "--cfg", "nonexist.json"], "'nonexist.json' not found"),
    (["--tasks", "walker-walk", "--seeds", "1", "--", "--bogus"], "Unrecognized option: --bogus"),
    (["--tasks", "walker-walk", "--seeds", "1", "--", "--horizon", "0"], "horizon"),
])
def test_sweep_checks_the_tasks_and_train_arguments_before_it_submits(tmp_path, args, needle):
    """As tdmpc.reproduce --slurm does: a typo is one line here, not a failure of every element once queued."""
    path = stand_ins(tmp_path, sbatch=f'echo "$@" >> {tmp_path}/submitted; echo 77')
    r = subprocess.run([SLURM / "sweep.sh", *args], capture_output=True, text=True, env={**CHECKING, "PATH": path},
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr and not r.stdout
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "slurm").exists()


def test_sweep_submits_input_that_checks_out(tmp_path):
    path = stand_ins(tmp_path, sbatch=f'echo "$@" >> {tmp_path}/submitted; echo 77')
    r = subprocess.run([SLURM / "sweep.sh", "--tasks", "walker-walk,cup-catch", "--seeds", "1-2", "--", "--cfg",
                        "a4000.json", "--horizon", "2"], capture_output=True, text=True, env={**CHECKING, "PATH": path},
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "submitted array job 77: 4 runs" in r.stdout, r.stderr
    assert (tmp_path / "submitted").read_text().rstrip().endswith("train.sh --cfg a4000.json --horizon 2")


def test_sweep_without_a_python_that_has_tdmpc_says_so_in_one_line(tmp_path):
    r = subprocess.run([SLURM / "sweep.sh", "--tasks", "walker-walk", "--seeds", "1", "--dry-run"], capture_output=True,
                       text=True, env={**os.environ, "TDMPC_PYTHON": "false"}, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not r.stdout, r.stderr
    assert r.stderr.startswith("error: could not check the train arguments") and "TDMPC_PYTHON" in r.stderr


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
                       capture_output=True, text=True, env=CHECKING, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"--output={tmp_path}/slurm/logs/%x-%A_%a.out" in r.stdout and f"logs: {tmp_path}/slurm/logs/" in r.stdout


@pytest.mark.parametrize("argv", [["--copy", "x", "--check-job"], ["--check-job", "--check-sweep", "cup-catch"],
                                  ["--", "--steps", "5"]])
def test_the_scripts_checks_are_asked_for_one_at_a_time(argv, tmp_path, capsys, monkeypatch):
    from tdmpc.cli.slurm_scripts import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "x").exists(), err


@pytest.mark.slow  # a trainer started and stopped per case: CI's slow step (.ci/run)
@pytest.mark.parametrize("reason,said", [("DUE TO TIME LIMIT", "Slurm ended the job (time limit)"),
                                         ("", "the job ended (cancelled by a user); not requeueing it")])
def test_train_sh_reads_slurms_reason_for_term_after_the_progress_bar(tmp_path, reason, said):
    """slurmstepd's '*** JOB ... CANCELLED AT ... DUE TO TIME LIMIT ***' lands right after the progress bar's
    last frame, which ends in no newline: train.sh looked for it at the start of a line, found nothing, and its
    `set -e` ended the script with exit 1, neither requeueing a timed-out job nor telling a cancelled one how to
    go on."""
    log = tmp_path / "job.out"
    log.write_text("")
    scontrol = f'case "$1" in show) echo "   StdErr={log}" ;; requeue) echo "$@" >> {tmp_path}/requeued ;; esac'
    env = {**CHECKING, "PATH": stand_ins(tmp_path, scontrol=scontrol), "SLURM_JOB_NAME": "tdmpc",
           "SLURM_JOB_ID": "10", "TDMPC_RUNS": str(tmp_path / "runs")}
    cfg = tiny_json(tmp_path, steps=100_000, eval_episodes=0)
    p = subprocess.Popen(["bash", SLURM / "train.sh", "--cfg", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    config = tmp_path / "runs" / "slurm" / "tdmpc" / "10" / "config.json"
    deadline = time.monotonic() + 120
    while not config.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the trainer is under way, and train.sh's traps set long before
    with open(log, "a") as f:
        f.write(f"Pendulum-v1:   0%|          | 0/100000 [00:01<?, env/s=13]slurmstepd-vm: error: *** JOB 10 ON vm "
                f"CANCELLED AT 2026-11-29T07:53:19{' ' + reason if reason else ''} ***\n")
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=240)
    assert said in text, text
    if reason:
        assert p.returncode == 0 and "requeueing job 10" in text, (p.returncode, text)
        assert (tmp_path / "requeued").read_text() == "requeue 10\n"
    else:
        assert p.returncode == 3 and "Resume by hand: TDMPC_RUN_DIR=" in text and not (tmp_path / "requeued").exists()


def test_train_sh_refuses_a_run_directory_that_is_a_file_in_one_line(tmp_path):
    """TDMPC_RUN_DIR naming the run's checkpoint (as --resume may): mkdir's 'File exists' and exit 1 in the log."""
    ckpt = tmp_path / "run" / "checkpoints" / "latest.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"mine")
    r = subprocess.run(["bash", SLURM / "train.sh", "--cfg", "cpu.json"], capture_output=True, text=True,
                       env=job_env(tmp_path, SLURM_JOB_ID="11", TDMPC_RUN_DIR=str(ckpt)), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert f"error: the run directory {ckpt} is a file (TDMPC_RUN_DIR names the run's folder" in r.stderr
    assert ckpt.read_bytes() == b"mine"
