"""slurm/train.sh and slurm/sweep.sh on a real single-node Slurm (slurm/local_cluster.sh).

Run with `python -m pytest -m slurm`. The session fixture starts the local cluster (root and
apt needed; otherwise every test skips with the reason) with two fake GPUs, so the script's own
`--gres=gpu:1` is accepted as it is; the tests override CPUs and memory for a 2-core test
machine (and the time limit where that is the point), and train tiny CPU configs.
"""

import csv
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import TINY as TINY_RUN, skip_unless_ci

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "slurm" / "local_cluster.sh"
LOGS = REPO / "slurm" / "logs"
SMALL_JOB = ["--cpus-per-task=1", "--mem=1G"]  # instead of 8 CPUs and 32 GB
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}

# About 100 env steps/s on one core: seeding (200 steps) + 200 updates, then a step and an update each.
# Smaller than the other tests' model and plan: several of these runs share the two cores under Slurm.
TINY = {**{k: v for k, v in TINY_RUN.items() if k != "threads"}, "enc_dim": 16, "mlp_dim": 16, "num_samples": 16,
        "iterations": 1, "horizon": 1, "batch_size": 8, "eval_freq": 100_000, "eval_episodes": 1, "save_every": 200}


@pytest.fixture(scope="session")
def cluster():
    was_up = subprocess.run([CLUSTER, "status"], capture_output=True).returncode == 0
    try:
        r = subprocess.run([CLUSTER, "start", "--fake-gpus", "2"], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        skip_unless_ci("slurm/local_cluster.sh start took over 10 minutes")
    if r.returncode != 0:
        reason = (r.stderr.strip() or r.stdout.strip() or f"exit code {r.returncode}").splitlines()[-1]
        skip_unless_ci(f"cannot start a local Slurm: {reason}")
    yield
    if not was_up:
        subprocess.run([CLUSTER, "stop"], capture_output=True, timeout=120)


@pytest.fixture
def job_names(request):
    """A unique job name per test; the test's Slurm logs are deleted afterwards."""
    names = []

    def make(tag):
        names.append(f"tdmpc-test-{tag}-{os.getpid()}")
        return names[-1]

    yield make
    for name in names:
        for log in LOGS.glob(f"{name}-*.out"):
            log.unlink()


def tiny_cfg(tmp_path, **over):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**TINY, **over}))
    return str(path)


def sbatch(tmp_path, name, *args, sbatch_opts=(), env=()):
    """Submit slurm/train.sh from the repository root, as the README says; returns the job id."""
    env = {**os.environ, "TDMPC_RUNS": str(tmp_path / "runs"), **dict(env)}
    r = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", *SMALL_JOB, *sbatch_opts, "slurm/train.sh",
                        *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def jobs(job_id):
    """{job id: fields} from `scontrol show job` (one entry per array element for an array job)."""
    r = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return {f["JobId"]: f for f in (dict(re.findall(r"(\w+)=(\S*)", line)) for line in r.stdout.splitlines())}


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def wait_until_done(job_id, timeout=300):
    """The job's final fields; an array job is done when every element is."""
    def done():
        found = jobs(job_id)
        return found if all(f["JobState"] in TERMINAL for f in found.values()) else None
    return wait_for(f"job {job_id} to end", done, timeout)


def env_steps(run_dir):
    with open(run_dir / "train.csv", newline="") as f:
        return [int(row["env_step"]) for row in csv.DictReader(f)]


def slurm_log(name, job_id):
    path = LOGS / f"{name}-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_sbatch_tiny_run_completes(cluster, tmp_path, job_names):
    name = job_names("a")
    # TDMPC_SETUP is how a site's module loads and activations get in; this one only leaves a mark.
    setup = tmp_path / "setup.sh"
    setup.write_text('echo "setup ran, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\n')
    job = sbatch(tmp_path, name, "--cfg", tiny_cfg(tmp_path), env={"TDMPC_SETUP": str(setup)})
    fields = wait_until_done(job)[job]
    log = slurm_log(name, job)
    assert fields["JobState"] == "COMPLETED", log
    assert fields["Restarts"] == "0"

    run = tmp_path / "runs" / "slurm" / name / job
    assert env_steps(run) == list(range(100, 601, 100))
    assert (run / "checkpoints" / "latest.pt").is_file() and (run / "eval.csv").is_file()
    assert (run / f"slurm-{job}.out").resolve() == (LOGS / f"{name}-{job}.out").resolve()
    assert "setup ran, CUDA_VISIBLE_DEVICES=0" in log  # the fake GPU was granted
    assert "the run is finished" in log


def run_then_interrupt(tmp_path, name, interrupt, sbatch_opts=()):
    """Start a run long enough to interrupt, wait for its first checkpoint, call interrupt(job)."""
    job = sbatch(tmp_path, name, "--cfg", tiny_cfg(tmp_path, steps=1500), sbatch_opts=sbatch_opts)
    run = tmp_path / "runs" / "slurm" / name / job
    wait_for("the first checkpoint", lambda: (run / "checkpoints" / "latest.pt").is_file(), 180)
    interrupt(job)
    return job, run


@pytest.mark.parametrize("how", ["scontrol-requeue", "usr1"])
def test_requeued_job_resumes_without_lost_or_repeated_steps(cluster, tmp_path, job_names, how):
    name = job_names(how)
    if how == "scontrol-requeue":  # Slurm requeues the job itself: TERM, checkpoint, pend, resume
        interrupt = lambda job: subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    else:  # what --signal=B:USR1@180 sends before the time limit: the script checkpoints and requeues
        interrupt = lambda job: subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
    job, run = run_then_interrupt(tmp_path, name, interrupt)
    fields = wait_until_done(job)[job]
    log = slurm_log(name, job)
    assert fields["JobState"] == "COMPLETED", log
    assert fields["Restarts"] == "1", log
    assert "checkpoint written" in log and "restart 1; resuming" in log
    assert env_steps(run) == list(range(100, 1501, 100)), log


def test_scancel_stops_for_good(cluster, tmp_path, job_names):
    name = job_names("scancel")
    job, run = run_then_interrupt(tmp_path, name, lambda job: subprocess.run(["scancel", job], check=True))
    fields = wait_until_done(job)[job]  # a requeued job would pend, then run to completion
    log = slurm_log(name, job)
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0", log
    assert "checkpoint written" in log and "not requeueing" in log
    steps = env_steps(run)
    assert steps == list(range(100, steps[-1] + 1, 100))


def test_time_limit_checkpoints_requeues_and_resumes(cluster, tmp_path, job_names):
    """The fallback when the USR1 warning did not help: TERM at the time limit, then requeue.

    --signal=B:URG@10 replaces the USR1 warning by a signal that nobody handles, so the job
    runs into its 1-minute limit; it requeues itself, resumes, and is then cancelled.
    """
    name = job_names("timelimit")
    job = sbatch(tmp_path, name, "--cfg", tiny_cfg(tmp_path, steps=100_000),
                 sbatch_opts=["--time=1", "--signal=B:URG@10"])
    run = tmp_path / "runs" / "slurm" / name / job
    wait_for("the requeued job to resume", lambda: "restart 1; resuming" in slurm_log(name, job), 240)
    subprocess.run(["scancel", job], check=True)
    wait_until_done(job)
    log = slurm_log(name, job)
    assert "DUE TO TIME LIMIT" in log and "Slurm ended the job (time limit)" in log
    assert jobs(job)[job]["Restarts"] == "1", log
    steps = env_steps(run)
    assert steps == list(range(100, steps[-1] + 1, 100)), log


def test_sweep_array_runs_every_element_with_distinct_seeds(cluster, tmp_path, job_names):
    name = job_names("sweep")
    env = {**os.environ, "TDMPC_RUNS": str(tmp_path / "runs")}
    r = subprocess.run(["slurm/sweep.sh", "--tasks", "Pendulum-v1", "--seeds", "1-3", "--name", name, *SMALL_JOB,
                        "--", "--cfg", tiny_cfg(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    array_job = re.search(r"submitted array job (\d+): 3 runs", r.stdout).group(1)
    elements = wait_until_done(array_job)
    assert len(elements) == 3 and all(f["JobState"] == "COMPLETED" for f in elements.values()), r.stdout
    seeds = []
    for seed in (1, 2, 3):
        run = tmp_path / "runs" / "slurm" / name / array_job / "Pendulum-v1" / f"seed{seed}"
        assert str(run) in r.stdout  # where the results are, printed at submission
        assert env_steps(run) == list(range(100, 601, 100))
        seeds.append(json.loads((run / "config.json").read_text())["seed"])
    assert seeds == [1, 2, 3]


def test_sweep_dry_run_submits_nothing(cluster, tmp_path):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    r = subprocess.run(["slurm/sweep.sh", "--tasks", "walker-walk,cheetah-run", "--seeds", "1-3", "--dry-run",
                        "--", "--cfg", "a4000.json"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "--array=0-5" in r.stdout and "train.sh --cfg a4000.json" in r.stdout
    assert "cheetah-run          seed 3" in r.stdout
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before


def tiny_dataset(path: Path) -> Path:
    """A dataset of 10 random-action Pendulum-v1 episodes of 200 steps."""
    import numpy as np

    from tdmpc.offline.writer import DatasetWriter

    rng = np.random.default_rng(0)
    with DatasetWriter(path, (3,), 1, ["Pendulum-v1"], "state", 1, "tests/test_slurm.py") as w:
        for _ in range(10):
            w.add_episode(rng.standard_normal((201, 3)).astype(np.float32), rng.uniform(-1, 1, (200, 1)),
                          rng.uniform(-16, 0, 200), False, True)
    return path


def test_train_multi_runs_two_ranks_checkpoints_requeues_and_resumes(cluster, tmp_path, job_names):
    """slurm/train_multi.sh: 2 tasks (gloo on this CPU), rank 0 writes the run; USR1 stops both ranks at one
    checkpoint and the job requeues and resumes them."""
    name = job_names("multi")
    data = tiny_dataset(tmp_path / "data.h5")
    env = {**os.environ, "TDMPC_RUNS": str(tmp_path / "runs")}
    cfg = tiny_cfg(tmp_path, steps=3000, eval_episodes=0, save_every=100, log_every=100)
    r = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--nodes=1", "--ntasks-per-node=2",
                        "--cpus-per-task=1", "--mem=2G", "slurm/train_multi.sh", "--cfg", cfg, "--dataset", str(data),
                        "--task", "Pendulum-v1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    run = tmp_path / "runs" / "slurm" / name / job
    wait_for("the first checkpoint", lambda: (run / "checkpoints" / "latest.pt").is_file(), 240)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
    fields = wait_until_done(job, timeout=600)[job]
    log = slurm_log(name, job)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log
    assert "2 ranks on" in log and "rendezvous at" in log and "restart 1; resuming" in log
    assert env_steps(run) == list(range(100, 3001, 100)), log  # updates, each logged once, by rank 0 alone
