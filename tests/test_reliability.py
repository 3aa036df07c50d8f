"""Crashes, killed processes, damaged files, full and read-only disks, a second process, bad env data:
what a run survives, tested with real processes and real files (issue: nothing hangs, loses a run or
ends in a traceback)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tdmpc
from tdmpc.errors import RunDirError
import helpers
from helpers import (TINY as TINY_RUN, cli, copy_run, one_line_error, read_csv, run_module, run_train, skip_unless_ci,
                     tiny_json)

PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def start_train(*args, log: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "tdmpc.train", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), env=_env())


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


# --- 1. the fused kernels' build lock ----------------------------------------------------------------

@pytest.mark.slow  # builds the fused kernels from scratch (a C++ compile): CI's slow step (.ci/run)
@pytest.mark.skipif(sys.platform != "linux", reason="the fused kernels are built on Linux only")
def test_a_build_lock_held_by_a_killed_process_never_blocks_the_next(tmp_path):
    """A process killed (SIGKILL) while it holds the kernel build lock leaves nothing that makes the
    next process wait: the next one builds the kernels and runs."""
    from tdmpc.model import fused

    name = f"tdmpc_fused_{fused._build_tag()}"
    holder = subprocess.Popen([PY, "-c", (
        "import sys, time; from pathlib import Path; from tdmpc.model.fused import build_lock\n"
        f"with build_lock(Path({str(tmp_path)!r}) / '.{name}.lock'):\n"
        "    print('locked', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True, env=_env())
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    (tmp_path / f".build-{name}-dead").mkdir()  # a half-done build directory of the killed process
    t0 = time.time()
    out = subprocess.run([PY, "-c", "from tdmpc.model.fused import extension_available as ok; print(ok())"],
                         capture_output=True, text=True, timeout=300, env=_env(TDMPC_BUILD_DIR=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stderr
    assert "waiting for another process" not in out.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert f"{name}.so" in left and not [n for n in left if n.startswith(".build-")], (left, out.stderr)
    # Built once: a second start loads the library without the lock or a rebuild.
    again = subprocess.run([PY, "-c", "from tdmpc.model.fused import extension_available as ok; print(ok())"],
                           capture_output=True, text=True, timeout=120, env=_env(TDMPC_BUILD_DIR=str(tmp_path)))
    assert again.stdout.strip() == "True" and "building" not in again.stderr, again.stderr
    assert time.time() - t0 < 290


# --- 2. one writer per run directory -----------------------------------------------------------------

@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_two_trainers_or_two_resumes_of_one_run_never_both_run(tmp_path):
    cfg = tiny_json(tmp_path, steps=1_000_000, save_every=100, eval_episodes=0)
    run = tmp_path / "run"
    a = start_train("--cfg", cfg, "--run-dir", run, log=tmp_path / "a.log")
    b = start_train("--cfg", cfg, "--run-dir", run, log=tmp_path / "b.log")  # at the same instant
    wait_for(lambda: a.poll() is not None or b.poll() is not None)
    loser, winner = (a, b) if a.poll() is not None else (b, a)
    err = (tmp_path / ("a.log" if loser is a else "b.log")).read_text()
    assert loser.returncode == 2 and f"in use by pid {winner.pid} on {socket.gethostname()}" in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error: ")]) == 1 and "Traceback" not in err
    wait_for(lambda: (run / "checkpoints" / "latest.pt").is_file())
    r = run_train("--resume", run)  # a resume while the run is going
    assert "is in use by pid" in one_line_error(r)
    os.kill(winner.pid, signal.SIGKILL)  # its lock dies with it: stale locks never block
    winner.wait()
    latest = run / "checkpoints" / "latest.pt"
    written = latest.stat().st_mtime_ns
    c = start_train("--resume", run, log=tmp_path / "c.log")
    d = start_train("--resume", run, log=tmp_path / "d.log")
    wait_for(lambda: c.poll() is not None or d.poll() is not None)
    refused, going = (c, d) if c.poll() is not None else (d, c)
    assert refused.returncode == 2
    # Stopped once it trains: a signal in its start-up, before the loop's handlers, ends it as a signal does (a
    # Slurm job then requeues it, slurm/train.sh), with nothing to lose since its last checkpoint.
    wait_for(lambda: latest.stat().st_mtime_ns != written)
    going.send_signal(signal.SIGTERM)
    assert going.wait(timeout=120) == 3
    steps = [int(r["env_step"]) for r in read_csv(run / "train.csv")]
    assert steps == sorted(set(steps))  # no step logged twice


def test_a_refused_resume_says_only_why(capsys, tmp_path, finished_run):
    """A resume refused once the run's directory is locked (a live run) or its task rebuilt printed "resume:
    continuing ... from step N" first; and a finished run named the flags it did not apply but not --cfg."""
    from tdmpc.training.run_dir import RunDirLock

    run = copy_run(finished_run, tmp_path / "run")
    lock = RunDirLock(run)
    lock.acquire()
    try:
        r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 400, "--eval-episodes", 1)
        with pytest.raises(RunDirError, match=r"or choose another run_dir\)$"):  # fit()'s words, not the flag's
            tdmpc.fit(run_dir=run, resume=True, steps=400)
    finally:
        lock.release()
    assert f"is in use by pid {os.getpid()}" in one_line_error(r) and "resume:" not in r.stderr, r.stderr
    assert "or choose another --run-dir)" in r.stderr
    r = cli(capsys, "tdmpc.train", "--resume", run, "--cfg", "a4000.json")
    assert r.returncode == 0 and "resume: --cfg a4000.json ignored" in r.stderr and "already finished" in r.stderr
    assert "no such directory" in one_line_error(cli(capsys, "tdmpc.train", "--resume", tmp_path / "nothing"))
    (run / "checkpoints" / "latest.pt").rename(run / "checkpoints" / "previous.pt")  # latest.pt gone, previous.pt kept
    line = one_line_error(cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path), "--run-dir", run))
    assert "already holds a run" in line and (run / "checkpoints" / "previous.pt").is_file(), line  # not set aside


def test_a_resume_of_a_live_run_before_its_first_checkpoint_names_the_holder(capsys, tmp_path):
    """Not 'no run to continue there': the run is going, it has only not written a checkpoint yet."""
    from tdmpc.training.run_dir import RunDirLock

    run = tmp_path / "run"
    lock = RunDirLock(run)
    lock.acquire()
    try:
        (run / "config.json").write_text("{}")
        line = one_line_error(cli(capsys, "tdmpc.train", "--resume", run))
    finally:
        lock.release()
    assert f"is in use by pid {os.getpid()}" in line and "no checkpoint yet" in line, line


# --- 3. damaged files --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A short run with a checkpoint and its buffer at step 300."""
    return helpers.finished_run(tmp_path_factory)


def damage(path: Path, kind: str) -> None:
    if kind == "missing":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "list":
        path.write_text("[1, 2, 3]\n")
    else:
        raise ValueError(kind)


@pytest.mark.slow  # a run and two resumes (CI runs it in its slow step)
@pytest.mark.parametrize("kind", ["truncated", "random"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, kind):
    """Each checkpoint write keeps the one before as previous.pt, with its buffer: a damaged latest.pt is kept
    aside and the run resumes from previous.pt, saying which steps run again; with neither usable, one line."""
    run, ck = tmp_path / "run", tmp_path / "run" / "checkpoints"
    r = run_train("--cfg", tiny_json(tmp_path, steps=500, save_every=300, eval_freq=300), "--run-dir", run)
    assert r.returncode == 0, r.stderr
    assert (ck / "previous.pt").is_file() and len(list(ck.glob("buffer_*.h5"))) == 2
    saved = run.parent / "saved"
    shutil.copytree(run, saved, ignore=shutil.ignore_patterns(".lock"))
    damage(ck / "latest.pt", kind)
    r = run_train("--resume", run, "--steps", 600, "--dry-run")  # touches nothing: latest.pt stays where it is
    assert r.returncode == 0 and "Resuming from previous.pt" in r.stderr, r.stderr
    assert (ck / "latest.pt").is_file() and not (ck / "latest.pt.damaged").exists()
    r = run_train("--resume", run, "--steps", 600)
    assert r.returncode == 0, r.stderr
    assert "Resuming from previous.pt" in r.stderr and "(step 300)" in r.stderr and "run again" in r.stderr
    assert (ck / "latest.pt.damaged").is_file()
    steps = [int(x["env_step"]) for x in read_csv(run / "train.csv")]
    assert steps == list(range(100, 601, 100)), steps
    assert torch.load(ck / "latest.pt", weights_only=True)["train"]["step"] == 600
    both = run.parent / "both"  # config.json damaged too: its way out, the checkpoint's config, is previous.pt's
    shutil.copytree(saved, both)
    damage(both / "checkpoints" / "latest.pt", kind)
    (both / "config.json").write_text("{")
    assert "--config-from-checkpoint" in one_line_error(run_train("--resume", both, "--steps", 600))
    r = run_train("--resume", both, "--config-from-checkpoint", "--steps", 600, "--dry-run")
    assert r.returncode == 0 and "the config comes from" in r.stderr and "previous.pt" in r.stderr, r.stderr
    gone = run.parent / "gone"  # latest.pt missing (deleted): previous.pt is still a run to continue
    shutil.copytree(saved, gone)
    (gone / "checkpoints" / "latest.pt").unlink()
    r = run_train("--resume", gone, "--steps", 600, "--dry-run")
    assert r.returncode == 0 and "does not exist. Resuming from previous.pt" in r.stderr, r.stderr
    damage(saved / "checkpoints" / "latest.pt", kind)  # and with no previous.pt to fall back to
    (saved / "checkpoints" / "previous.pt").unlink()
    line = one_line_error(run_train("--resume", saved, "--steps", 600))
    assert "no older checkpoint to fall back to" in line and "--init-from" in line, line


@pytest.mark.parametrize("kind", ["truncated", pytest.param("random", marks=pytest.mark.slow),
                                  pytest.param("missing", marks=pytest.mark.slow), "nan"])  # (CI: all)
def test_a_damaged_buffer_is_one_line_kept_aside_and_no_buffer_resumes(capsys, tmp_path, finished_run, kind):
    run = copy_run(finished_run, tmp_path / "run")
    (buffer,) = (run / "checkpoints").glob("buffer_*.h5")
    latest = (run / "checkpoints" / "latest.pt").read_bytes()
    if kind == "nan":
        import h5py

        with h5py.File(buffer, "r+") as f:
            f["reward"][0, 5] = np.nan
    else:
        damage(buffer, kind)
    r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 400)
    line = one_line_error(r)
    assert str(buffer) in line and f"--resume {run} --no-buffer" in line
    assert ("non-finite values in 'reward' (env 0, row 5)" in line) if kind == "nan" else True
    assert ((run / "checkpoints" / (buffer.name + ".damaged")).is_file()) == (kind != "missing")
    assert (run / "checkpoints" / "latest.pt").read_bytes() == latest  # nothing the user had is changed
    r = run_train("--resume", run, "--steps", 400, "--no-buffer")
    assert r.returncode == 0, r.stderr
    assert "--no-buffer: acting without updates until step 500 to refill the replay buffer" in r.stderr
    ck = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["train"]["step"] == 400 and ck["train"]["refill_until"] == 500
    assert (run / "checkpoints" / (buffer.name + ".damaged")).is_file() == (kind != "missing")  # still kept


@pytest.mark.parametrize("kind", [pytest.param("empty", marks=pytest.mark.slow), "truncated",
                                  pytest.param("random", marks=pytest.mark.slow),
                                  pytest.param("list", marks=pytest.mark.slow),
                                  pytest.param("missing", marks=pytest.mark.slow), "healthy"])  # (CI: all)
def test_a_damaged_config_is_one_line_and_the_checkpoints_config_resumes(capsys, tmp_path, finished_run, kind):
    run = copy_run(finished_run, tmp_path / "run")
    if kind != "healthy":
        damage(run / "config.json", kind)
        r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 400)
        line = one_line_error(r)
        assert "config.json" in line and f"--resume {run} --config-from-checkpoint" in line
    if kind == "truncated":  # a resume with nothing to do (the run is finished) leaves the damaged file where it is
        before = (run / "config.json").read_bytes()
        r = cli(capsys, "tdmpc.train", "--resume", run, "--config-from-checkpoint")
        assert r.returncode == 0 and "already finished" in r.stderr, r.stderr
        assert (run / "config.json").read_bytes() == before and not (run / "config.json.damaged").exists()
    r = run_train("--resume", run, "--steps", 400, "--config-from-checkpoint")
    assert r.returncode == 0, r.stderr
    assert (run / "config.json.damaged").exists() == (kind not in ("missing", "healthy"))
    assert ("the damaged config.json" in r.stderr) == (kind not in ("missing", "healthy"))  # a readable config.json is not 'damaged'
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 400


def test_temp_files_of_killed_writes_are_removed_at_the_next_start(capsys, tmp_path, finished_run):
    run = copy_run(finished_run, tmp_path / "run")
    stale = [run / "checkpoints" / ".latest.pt.x1y2.tmp", run / "checkpoints" / ".buffer_0000000300.h5.z3.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * 1000)
    r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 400)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in stale) and all(f"removed {p}" in r.stderr for p in stale)


# --- 4. full and read-only disks ------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of 64 MB (tmpfs), for full- and read-only-disk tests (needs root, as CI has)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if r.returncode != 0:
        skip_unless_ci(f"cannot mount a tmpfs here (root needed): {r.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """A file taking all of `disk`'s free space but `leave` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(disk).free - leave))
    return filler


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_full_disk_stops_with_one_line_and_the_last_checkpoint_intact(tmp_path, small_disk, finished_run):
    """The tiny run's checkpoint (~0.4 MB) fits in 3 MB (no hidden margin refuses it); with 0.5 MB free it does not:
    said up front, then refused in one line with the real need and margin, the last checkpoint kept intact."""
    spare = copy_run(finished_run, small_disk / "spare")
    filler = _fill(small_disk, 3_000_000)
    r = run_train("--resume", spare, "--steps", 400)
    assert r.returncode == 0 and "warning:" not in r.stderr, r.stderr
    shutil.rmtree(spare)
    filler.unlink()
    run = copy_run(finished_run, small_disk / "run")
    filler = _fill(small_disk, 500_000)
    before = (run / "checkpoints" / "latest.pt").read_bytes()
    r = run_train("--resume", run, "--steps", 400)
    warning = next(ln for ln in r.stderr.splitlines() if ln.startswith("warning: "))  # said before the run
    assert "KB are free on" in warning and "1.0 MB more kept free as a margin" in warning, r.stderr
    line = one_line_error(r, code=1)
    assert f"not enough space to write the checkpoint of step 400 to {run / 'checkpoints' / 'latest.pt'}" in line
    estimate = float(line.split("(latest.pt ")[1].split(" KB")[0]) * 1000
    assert len(before) < estimate < 1.2 * len(before), line  # the checkpoint's real size, not 4x its weights
    assert "1.0 MB more kept free as a margin; " in line and "KB are free on" in line, line
    assert f"the last good checkpoint is {run / 'checkpoints' / 'latest.pt'}" in line
    assert (run / "checkpoints" / "latest.pt").read_bytes() == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["buffer_0000000300.h5", "latest.pt"]
    filler.unlink()  # space again: the run goes on from its last good checkpoint
    r = run_train("--resume", run, "--steps", 400)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow  # a run of its own (CI's slow step, .ci/run): the default suite stays under 8 minutes
def test_a_run_ending_on_a_periodic_save_keeps_the_checkpoint_before_it_as_previous(tmp_path, finished_run):
    """The last step's checkpoint is written twice (periodic, then finished): previous.pt stays the one before,
    with its buffer, rather than becoming latest.pt again."""
    run = copy_run(finished_run, tmp_path / "run")
    assert not (run / "checkpoints" / "previous.pt").exists()  # one checkpoint (step 300): nothing before it
    r = run_train("--resume", run, "--steps", 600)
    assert r.returncode == 0, r.stderr
    ck = {name: torch.load(run / "checkpoints" / name, weights_only=True) for name in ("latest.pt", "previous.pt")}
    assert (ck["latest.pt"]["train"]["step"], ck["latest.pt"]["train"]["finished"]) == (600, True)
    assert ck["previous.pt"]["train"]["step"] == 300 and ck["previous.pt"]["buffer_file"] == "buffer_0000000300.h5"
    assert sorted(p.name for p in (run / "checkpoints").glob("buffer_*")) == ["buffer_0000000300.h5",
                                                                             "buffer_0000000600.h5"]


def test_a_csv_rewrite_on_a_full_disk_keeps_the_rows_it_held(small_disk):
    from tdmpc.training.logger import CSVLog

    log = CSVLog(small_disk / "train.csv")
    log.write({"env_step": 100, "loss": 1.5})
    before = (small_disk / "train.csv").read_bytes()
    filler = _fill(small_disk, 0)
    with pytest.raises(OSError, match="No space left"):
        log.write({"env_step": 200, "loss": 1.0, "new_metric": 2.0})  # a new column: the file is rewritten
    assert (small_disk / "train.csv").read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "train.csv"]  # no temp file left
    filler.unlink()


def test_a_write_refused_for_space_names_the_file_and_exits_1(tmp_path, capsys):
    """h5py reports a full disk naming its temp file in a message of many lines: the one line names the file asked
    for, with exit 1 (a failed write), not 2 (bad input)."""
    import errno

    from tdmpc.errors import run_cli
    from tdmpc.runtime.files import atomic_write

    def h5py_like(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, f"Unable to synchronously create file (file write failed: time = ...\n"
                                    f", filename = '{tmp}', errno = 28, error message = 'No space left on device')")

    def command() -> int:
        atomic_write(tmp_path / "new" / "folders" / "d.h5", h5py_like)
        return 0

    assert run_cli(command) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'new' / 'folders' / 'd.h5'}: No space left on device\n"
    assert not list(tmp_path.iterdir())  # no temp file, and not the folders it made for the file either


def test_a_disk_that_fills_during_a_run_is_one_line_saying_where_to_go_on_from(tmp_path, monkeypatch):
    """A log row refused for want of space (the checkpoint's own check comes only at a save): one DiskError line
    naming the last good checkpoint, as the train command prints it (exit 1)."""
    import errno

    import tdmpc
    from tdmpc.errors import DiskError
    from tdmpc.training.logger import RunLogger

    rows = []

    def train_row(self, row):
        if rows:
            raise OSError(errno.ENOSPC, "No space left on device")
        rows.append(row)

    monkeypatch.setattr(RunLogger, "train", train_row)
    options = {k: v for k, v in TINY_RUN.items() if k != "task"} | {"eval_episodes": 0, "save_every": 100}
    with pytest.raises(DiskError) as e:
        tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", **options)
    message = str(e.value)
    assert message.startswith("a write of the run failed: No space left on device (") and "free in" in message
    assert f"the last good checkpoint is {tmp_path / 'run' / 'checkpoints' / 'latest.pt'}" in message, message


def test_a_short_disk_is_said_before_the_run(tmp_path, small_disk):
    cfg = tiny_json(tmp_path, steps=50, buffer_size=3_000_000, eval_episodes=0)  # a 3M-row buffer: ~75 MB
    r = run_train("--cfg", cfg, "--run-dir", small_disk / "run")
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "checkpoints with the full replay buffer need about" in r.stderr


def test_a_read_only_disk_is_one_line_and_evaluate_says_it_before_its_episodes(capsys, tmp_path, small_disk,
                                                                                finished_run):
    run = copy_run(finished_run, small_disk / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    r = cli(capsys, "tdmpc.train", "--resume", run, "--steps", 400)
    assert "Read-only file system" in one_line_error(r)
    r = cli(capsys, "tdmpc.evaluate", "--checkpoint", run / "checkpoints" / "latest.pt", "--episodes", 1, "--no-mpc",
            "--device", "cpu")
    line = one_line_error(r)  # the default report's place, beside the checkpoint, checked before any episode
    assert f"{run / 'checkpoints'} is read-only: pass --report PATH" in line and "return" not in r.stdout


def test_evaluate_leaves_a_folder_nobody_may_write_alone_even_as_root(capsys, tmp_path, finished_run):
    """Shared checkpoints in a read-only folder (the reference's fixtures): the default report does not go there,
    and an explicit --report there is refused too, both before any episode."""
    folder = tmp_path / "shared"
    folder.mkdir()
    shutil.copy(finished_run / "checkpoints" / "latest.pt", folder / "model.pt")
    folder.chmod(0o555)
    try:
        r = cli(capsys, "tdmpc.evaluate", "--checkpoint", folder / "model.pt", "--episodes", 1, "--no-mpc",
                "--threads", 1, "--device", "cpu")
        assert f"{folder} is read-only: pass --report PATH" in one_line_error(r)
        r = cli(capsys, "tdmpc.evaluate", "--checkpoint", folder / "model.pt", "--episodes", 1, "--no-mpc",
                "--threads", 1, "--device", "cpu", "--report", folder / "sub" / "r.json")
        assert f"--report {folder / 'sub' / 'r.json'}: {folder} is read-only" in one_line_error(r)
        assert sorted(p.name for p in folder.iterdir()) == ["model.pt"]
    finally:
        folder.chmod(0o755)


# --- 5. kill -9 at any moment ----------------------------------------------------------------------

@pytest.mark.slow  # a minute of random kills: CI's slow step (.ci/run), with the kills at each phase (below)
def test_kill_9_at_random_moments_then_resume_twenty_times(tmp_path):
    """Killed in start-up, seeding, updates, evaluation or a checkpoint write, each time the run resumes
    from its last complete checkpoint; at the end it finishes with every step logged once."""
    cfg = tiny_json(tmp_path, steps=2400, save_every=40, log_every=40, eval_freq=600, eval_episodes=1)
    run = tmp_path / "run"
    rng = random.Random(0)
    for i in range(20):
        resume = (run / "checkpoints" / "latest.pt").is_file()
        args = ["--resume", run] if resume else ["--cfg", cfg, "--run-dir", run]
        p = start_train(*args, log=tmp_path / f"kill{i}.log")
        time.sleep(rng.uniform(0.2, 3.5))
        p.kill()
        p.wait()
        log = (tmp_path / f"kill{i}.log").read_text()
        assert "Traceback" not in log and "error" not in log, log
    r = run_train("--resume", run, timeout=600) if (run / "checkpoints" / "latest.pt").is_file() \
        else run_train("--cfg", cfg, "--run-dir", run, timeout=600)
    assert r.returncode == 0, r.stderr
    steps = [int(x["env_step"]) for x in read_csv(run / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 2400
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["finished"]


# The phases of a run, in the order one run meets them: TDMPC_KILL_AT=<point>:<n> (tdmpc.runtime.faults) kills
# the trainer at the n-th pass through that point. The writes are checkpoints' (a complete temp file, not yet
# renamed): a checkpoint writes its replay buffer first, then latest.pt; write-text is config.json's write.
KILL_PHASES = ["startup:1", "write-text:1", "seeding:60", "write:2", "update:40", "evaluation:30", "update:300",
               "write:1"]


@pytest.mark.slow  # nine starts of a run (40 s): CI's slow step (.ci/run), with the random kills above
def test_kill_9_in_each_phase_then_auto_resume(tmp_path):
    """Killed (SIGKILL, by the process itself) in start-up, seeding, an update, an evaluation and both halves of
    a checkpoint write, each at a point it is shown to have reached; each time --auto-resume starts or continues
    the run from its last complete checkpoint, and at the end every step is logged once."""
    cfg = tiny_json(tmp_path, steps=800, save_every=200, log_every=100, eval_freq=400, eval_episodes=1)
    run = tmp_path / "run"
    args = ["--cfg", cfg, "--auto-resume", run]
    for phase in KILL_PHASES:
        r = subprocess.run([PY, "-m", "tdmpc.train", *map(str, args)], capture_output=True, text=True, timeout=300,
                           env=_env(TDMPC_KILL_AT=phase))
        assert r.returncode == -signal.SIGKILL, f"{phase} was not reached: exit {r.returncode}\n{r.stderr}"
        assert "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
        left = list(run.glob(".config.json.*.tmp"))
        assert bool(left) == (phase == "write-text:1"), (phase, left)  # the next start removes it
    assert list((run / "checkpoints").glob(".*.tmp")), "the last kill, mid-write, leaves a temp file"
    r = run_train(*args, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stderr  # the killed write's temp file
    steps = [int(x["env_step"]) for x in read_csv(run / "train.csv")]
    assert steps == list(range(100, 801, 100)), steps
    assert [int(x["env_step"]) for x in read_csv(run / "eval.csv")] == [0, 400, 800]
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["finished"]


# --- 6. NaN or inf from an env ---------------------------------------------------------------------

NAN_ENV = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Spiky(gym.Env):
        """A point that moves with the action; at its 150th step the observation (or reward) is NaN."""
        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        field = "obs"

        def __init__(self):
            self.steps, self.x = 0, 0.0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x = 0.0
            return np.array([self.x, 1.0], np.float32), {}

        def step(self, action):
            self.steps += 1
            self.x = float(np.clip(self.x + 0.1 * action[0], -1, 1))
            obs, reward = np.array([self.x, 1.0], np.float32), -abs(self.x)
            if self.steps == 150:
                obs, reward = (obs * np.nan, reward) if self.field == "obs" else (obs, np.inf)
            return obs, reward, False, False, {}

    class SpikyReward(Spiky):
        field = "reward"

    gym.register("Spiky-v0", entry_point=Spiky, max_episode_steps=100)
    gym.register("SpikyReward-v0", entry_point=SpikyReward, max_episode_steps=100)
''')


@pytest.mark.slow  # three runs each: CI's slow step (.ci/run); the default suite keeps under 8 minutes
@pytest.mark.parametrize("env,field", [("Spiky-v0", "observation"), ("SpikyReward-v0", "reward")])
def test_nonfinite_data_from_an_env_is_named_at_its_source_or_dropped(tmp_path, env, field):
    (tmp_path / "spiky.py").write_text(NAN_ENV)
    env_vars = _env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    cfg = tiny_json(tmp_path, task=f"spiky:{env}", steps=300, seed_steps=100, eval_episodes=0)
    run = tmp_path / "run"
    r = run_train("--cfg", cfg, "--run-dir", run, env=env_vars)
    line = one_line_error(r, code=1)
    assert f"env 0 (spiky:{env}) returned a non-finite {field} at env step 149" in line
    assert "--nonfinite-data drop" in line and "checkpoint written at step 149" in r.stderr
    r = run_train("--resume", run, "--nonfinite-data", "drop", env=env_vars)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = run_train("--cfg", cfg, "--run-dir", tmp_path / "dropped", "--nonfinite-data", "drop", env=env_vars)
    assert r.returncode == 0, r.stderr
    assert f"returned a non-finite {field} at env step 149; dropped" in r.stderr


# --- 7. threads and seeds --------------------------------------------------------------------------

def test_a_runs_files_get_the_mode_a_plain_write_would_give(finished_run, tmp_path):
    """Atomic writes go through a temp file (mkstemp makes it 0600); what a run leaves must still follow the umask,
    so that a lab's group can read checkpoints and CSVs on a shared cluster, and a file's own mode survives."""
    mask = os.umask(0o022)
    os.umask(mask)
    files = [f for f in finished_run.rglob("*") if f.is_file() and f.name != ".lock"]
    assert any(f.suffix == ".pt" for f in files) and any(f.suffix == ".csv" for f in files)
    assert {f.relative_to(finished_run).as_posix(): oct(f.stat().st_mode & 0o777) for f in files} == \
        {f.relative_to(finished_run).as_posix(): oct(0o666 & ~mask) for f in files}
    from tdmpc.runtime.files import write_text_atomic
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    kept.chmod(0o640)
    write_text_atomic(kept, "{\"a\": 1}")
    assert kept.read_text() == "{\"a\": 1}" and kept.stat().st_mode & 0o777 == 0o640


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_evaluate_with_a_seed_repeats_exactly(finished_run, tmp_path):
    """The second evaluation names the run's directory, which stands for its latest checkpoint."""
    import json

    ckpt = finished_run / "checkpoints" / "latest.pt"
    reports = []
    for seed, given in ((3, ckpt), (3, finished_run), (4, ckpt)):
        r = run_module("tdmpc.evaluate", "--checkpoint", given, "--episodes", 2, "--seed", seed, "--threads", 1,
                       "--device", "cpu", "--report", tmp_path / f"r{len(reports)}.json")
        assert r.returncode == 0, r.stderr
        reports.append(json.loads((tmp_path / f"r{len(reports)}.json").read_text()))
    returns = [rep["returns"] for rep in reports]
    assert returns[0] == returns[1] and returns[0] != returns[2]
    assert reports[1]["checkpoint"] == str(ckpt)
    assert "without a run's checkpoints/latest.pt" in one_line_error(
        run_module("tdmpc.evaluate", "--checkpoint", tmp_path, "--threads", 1, "--device", "cpu"))


# --- 8. the small ones -------------------------------------------------------------------------------

def test_seed_steps_0_and_a_resume_that_changes_num_envs_are_one_line(capsys, tmp_path, finished_run):
    assert "'seed_steps'" in one_line_error(cli(capsys, "tdmpc.train", "--cfg", tiny_json(tmp_path), "--seed-steps", 0,
                                                "--run-dir", tmp_path / "r"))
    run = copy_run(finished_run, tmp_path / "run")
    line = one_line_error(cli(capsys, "tdmpc.train", "--resume", run, "--num-envs", 2))
    assert "--num-envs cannot change on --resume" in line, line


def test_the_progress_bar_redraws_during_pretraining_and_a_resumed_eta_counts_this_session(tmp_path):
    from tdmpc.config import Config
    from tdmpc.training.logger import RunLogger

    log = RunLogger(tmp_path, Config(tensorboard=False), total_steps=1000, start_step=500)
    redraws = []
    log.bar.refresh = lambda *a, **k: redraws.append(1)  # type: ignore[method-assign]
    log.progress(500, 0.0, 10.0)  # pretraining updates: no env step since the last call
    assert redraws == [1]
    time.sleep(0.2)
    log.progress(510, 50.0, 5.0)
    d = log.bar.format_dict
    rate = (d["n"] - d["initial"]) / d["elapsed"]
    assert 20 < rate < 100  # this session's 10 steps over its ~0.2 s, not 510 steps
    log.close()


def test_a_resume_keeps_the_tensorboard_events_of_its_checkpoint_step(tmp_path):
    """TensorBoard's purge_step drops events at and after it: a resume from step 200 lost the row at 200 (written
    before the checkpoint, kept in train.csv) along with the rows after it that the resume writes again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tdmpc.config import Config
    from tdmpc.training.logger import RunLogger

    first = RunLogger(tmp_path, Config(tensorboard=True), total_steps=400)
    for step in (100, 200, 300):  # 300: after the checkpoint at 200, then a crash
        first.train({"env_step": step, "loss": float(step)})
    first.close()
    resumed = RunLogger(tmp_path, Config(tensorboard=True), total_steps=400, start_step=200)
    for step in (300, 400):
        resumed.train({"env_step": step, "loss": float(step) + 1})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(100, 100), (200, 200), (300, 301), (400, 401)]


def test_the_step_0_evaluation_is_not_in_the_step_rate(tmp_path):
    """An evaluation before the bar's first step took a whole evaluation for no step: counted, the first ETA
    read hours (one step per evaluation). Later evaluations stay in the rate: they are part of the run's time."""
    from tdmpc.config import Config
    from tdmpc.training.logger import RunLogger

    log = RunLogger(tmp_path, Config(tensorboard=False), total_steps=1000, start_step=0)
    row = {"env_step": 0, "episode_return": 1.0, "episode_return_std": 0.0, "episodes": 1}
    log.evaluating(10)  # the bar says so while it plays (at the reference settings on a CPU: minutes)
    assert "eval=playing 10 episodes" in str(log.bar)
    time.sleep(0.5)  # the evaluation
    log.eval([row])
    time.sleep(0.1)
    log.progress(100, 1000.0, 0.0)
    d = log.bar.format_dict
    assert d["n"] == 100 and d["elapsed"] < 0.5  # ~0.1 s since the evaluation, not its 0.5 s too
    time.sleep(0.3)
    log.eval([{**row, "env_step": 100}])
    assert log.bar.format_dict["elapsed"] > 0.35  # a later evaluation is run time
    log.close()


def test_a_custom_env_without_render_modes_starts_without_warnings(tmp_path):
    (tmp_path / "spiky.py").write_text(NAN_ENV.replace("if self.steps == 150", "if False"))
    cfg = tiny_json(tmp_path, task="spiky:Spiky-v0", steps=100, seed_steps=100, eval_episodes=1)
    r = run_train("--cfg", cfg, "--run-dir", tmp_path / "run",
                  env=_env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"))
    assert r.returncode == 0, r.stderr
    assert "render_mode" not in r.stderr and "WARN" not in r.stderr, r.stderr


@pytest.mark.slow  # runs of their own: CI's slow step keeps the default suite under 8 minutes
def test_a_run_that_ends_within_its_seed_steps_says_it_will_not_update(tmp_path):
    """--steps at or below the seed steps acted at random, made no update and said nothing (a user's audit,
    2026-11-29). It may be meant (random data for --save-data), so a note, not an error."""
    r = run_train("--cfg", tiny_json(tmp_path, steps=300, seed_steps=400, eval_episodes=1, eval_freq=300),
                  "--run-dir", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert ("note: the run ends at step 300, within its 400 seed steps: it acts at random and makes no update "
            "(raise --steps or lower --seed-steps)") in r.stderr
    r = run_train("--cfg", tiny_json(tmp_path, steps=500, seed_steps=400, eval_episodes=1, eval_freq=500),
                  "--run-dir", tmp_path / "run2")
    assert r.returncode == 0 and "seed steps: it acts at random" not in r.stderr, r.stderr


@pytest.mark.slow  # runs of their own: CI's slow step keeps the default suite under 8 minutes
def test_a_resume_compares_sizes_as_the_model_size_preset_makes_them(tmp_path):
    """--mlp-dim 384 on a model-size-1 run (whose mlp_dim field is None: the preset's 384) was refused with 'this run
    has None' (a user's audit, 2026-11-29): the run's own size is accepted, another names the real one."""
    sizes = {k: None for k in ("enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q")}
    cfg = tiny_json(tmp_path, model_size=1, steps=300, seed_steps=200, eval_episodes=1, eval_freq=300, **sizes)
    run = tmp_path / "run"
    assert run_train("--cfg", cfg, "--run-dir", run).returncode == 0
    r = run_train("--resume", run, "--steps", 400, "--mlp-dim", 384)
    assert r.returncode == 0 and "mlp_dim changed" not in r.stderr, r.stderr
    line = one_line_error(run_train("--resume", run, "--steps", 500, "--mlp-dim", 512))
    assert "--mlp-dim cannot change on --resume: this run has 384" in line, line
