"""Round 4 of a demanding user's probes of stopping and resuming: a step evaluated twice after a crash, signals at
the edges of a run (before its loop, during its shutdown), resume hints a shell can run, the run lock when a
directory is moved away, and what a full disk is said to need. Each is a real run of tdmpc.train where it can be."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import one_line_error, read_csv, run_train, tiny_json

PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


# --- a step evaluated twice after a crash ------------------------------------------------------------

@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_a_kill_right_after_an_evaluation_on_a_checkpoint_step_never_logs_that_step_twice(tmp_path):
    """The evaluation due at a checkpoint step runs before the checkpoint, which records it as done: killed after
    it (before or after the checkpoint), the resumed run's eval.csv has every step once."""
    cfg = tiny_json(tmp_path, steps=200, seed_steps=100, eval_freq=100, save_every=100, eval_episodes=1)
    run = tmp_path / "run"
    r = subprocess.run([PY, "-m", "tdmpc.train", "--cfg", str(cfg), "--run-dir", str(run)], capture_output=True,
                       text=True, timeout=240, env=_env(TDMPC_KILL_AT="evaluated:3"))  # just after step 200's
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert [int(x["env_step"]) for x in read_csv(run / "eval.csv")] == [0, 100, 200]
    r = run_train("--resume", run)
    assert r.returncode == 0, r.stderr
    assert [int(x["env_step"]) for x in read_csv(run / "eval.csv")] == [0, 100, 200]
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["finished"]


# --- signals at the edges ----------------------------------------------------------------------------

@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
@pytest.mark.parametrize("first,second", [("USR1", "TERM"), ("INT", "TERM")])
def test_a_second_stop_signal_during_the_shutdown_still_exits_3_and_the_hint_is_a_shell_command(tmp_path, first,
                                                                                                   second):
    """A scheduler's TERM after its USR1, or a forwarded SIGTERM beside a Ctrl-C, lands while the first stop's
    shutdown runs: the run still exits 3 after its checkpoint (slurm/train.sh requeues it). The resume hint quotes
    a run directory with a space, so the printed command runs as it is."""
    cfg = tiny_json(tmp_path, steps=150, seed_steps=100, eval_episodes=0)
    run = tmp_path / "my run"
    r = subprocess.run([PY, "-m", "tdmpc.train", "--cfg", str(cfg), "--run-dir", str(run)], capture_output=True,
                       text=True, timeout=240, env=_env(TDMPC_KILL_AT=f"seeding:50:{first},shutdown:1:{second}"))
    assert r.returncode == 3 and f"stopped by signal SIG{first} at step 50" in r.stderr, (r.returncode, r.stderr)
    hint = r.stderr.split("Resume with: ", 1)[1].splitlines()[0]
    assert hint == f"python -m tdmpc.train --resume {shlex.quote(str(run))}", hint
    r = subprocess.run([PY, *shlex.split(hint)[1:]], capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 0, r.stderr
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 150


# A stop signal while a command's run does its work before the loop (the first start's build of the CPU kernels,
# ~30 s, or the speed check): sent from inside that work, at a known moment.
SIGNAL_BEFORE_THE_LOOP = textwrap.dedent('''
    import os, signal, sys
    from tdmpc.training import speed

    def signalled(trainer, *args, **kwargs):
        for name in os.environ["SEND"].split(","):
            os.kill(os.getpid(), getattr(signal, name))

    speed.warn_if_slow = signalled
    from tdmpc.cli.train import main
    sys.exit(main(sys.argv[1:]))
''')


@pytest.mark.parametrize("signame", [pytest.param("SIGINT", marks=pytest.mark.slow), "SIGTERM"])  # (CI: both)
def test_a_stop_signal_before_the_loop_is_one_line_that_says_what_there_is_to_go_on_from(tmp_path, signame):
    """Ctrl-C or SIGTERM while a command's run does its work before the loop: stopped at once (nothing was trained),
    exit 130 or 143 as a shell reports the signal (slurm/train.sh then requeues it), in one line that sends the user
    to --resume only where there is a checkpoint to resume: not the false 'interrupted again', nor no word."""
    cfg = tiny_json(tmp_path, steps=100, seed_steps=100, eval_episodes=0)
    run = tmp_path / "run"
    args = [PY, "-c", SIGNAL_BEFORE_THE_LOOP, "--cfg", str(cfg), "--run-dir", str(run)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=_env(SEND=signame))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 128 + getattr(signal, signame) and len(errors) == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "again" not in errors[0], r.stderr
    assert "before training started" in errors[0] and "no checkpoint was written yet" in errors[0], errors[0]
    assert "--resume" not in errors[0] and not (run / "checkpoints").exists(), errors[0]
    if signame == "SIGINT":  # the same command starts the run afresh; a resumed run's line names its checkpoint
        r = run_train("--cfg", cfg, "--run-dir", run)
        assert r.returncode == 0, r.stderr
        latest = (run / "checkpoints" / "latest.pt").read_bytes()
        r = subprocess.run([PY, "-c", SIGNAL_BEFORE_THE_LOOP, "--resume", str(run), "--steps", "200"],
                           capture_output=True, text=True, timeout=240, env=_env(SEND=signame))
        line = one_line_error(r, code=130)
        assert f"the last good checkpoint is {run / 'checkpoints' / 'latest.pt'} (resume with --resume {run})" in line
        assert (run / "checkpoints" / "latest.pt").read_bytes() == latest


# --- the run lock ------------------------------------------------------------------------------------

def test_the_run_lock_is_taken_on_the_directory_there_now_when_the_old_one_was_moved_away(tmp_path, monkeypatch):
    """Another process sets the directory aside (holding its lock) between this one's open() of .lock and its
    flock(): the lock is then taken again on the directory that the path names now, never on the moved one."""
    import fcntl

    from tdmpc.training.run_dir import RunDirLock

    run, aside = tmp_path / "run", tmp_path / "run.stale1"
    run.mkdir()
    flock = fcntl.flock

    def moved_first(f, op):
        if run.exists() and not aside.exists():
            run.rename(aside)
        return flock(f, op)

    monkeypatch.setattr(fcntl, "flock", moved_first)
    lock = RunDirLock(run)
    lock.acquire()
    try:
        assert lock.file is not None and os.path.samestat(os.fstat(lock.file.fileno()), os.stat(run / ".lock"))
        assert RunDirLock.held(run) == f"pid {os.getpid()} on {os.uname().nodename}"
        assert RunDirLock.held(aside) is None
    finally:
        lock.release()
    assert RunDirLock.held(run) is None


# A stop signal while Python tears the process down after the run (torch's teardown takes seconds): sent from a
# module global's __del__, which runs once Python has put Python-function signal handlers back to the default.
SIGNAL_AT_TEARDOWN = textwrap.dedent('''
    import os, signal, sys, time
    from tdmpc.cli.train import main

    class AtTeardown:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # delivered meanwhile

    at_teardown = AtTeardown()
    sys.exit(main(sys.argv[1:]))
''')


@pytest.mark.slow  # a spawned trainer: CI's slow step (.ci/run)
def test_a_stop_signal_while_python_tears_down_after_the_stop_still_exits_3(tmp_path):
    """The run's handler for signals after the run was a Python function, which Python's exit resets to the default
    before it deletes the modules: a SIGTERM then (a scheduler's TERM after its USR1) killed the process (143, not
    requeued) after the stop's checkpoint was written. An ignored signal stays ignored to the end."""
    cfg = tiny_json(tmp_path, steps=150, seed_steps=100, eval_episodes=0)
    r = subprocess.run([PY, "-c", SIGNAL_AT_TEARDOWN, "--cfg", str(cfg), "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=240, env=_env(TDMPC_KILL_AT="seeding:50:USR1"))
    assert r.returncode == 3 and "stopped by signal SIGUSR1 at step 50" in r.stderr, (r.returncode, r.stderr)


def test_a_command_run_in_a_process_leaves_the_processes_it_starts_later_stoppable(tmp_path):
    """The signals a command's ended run keeps are ignored by a Python handler, made SIG_IGN only at exit: an
    ignored signal is inherited, so a process started after the run (the test suite's next train.sh) could not
    be stopped by TERM."""
    from tdmpc.cli.train import main

    cfg = tiny_json(tmp_path, steps=150, seed_steps=100, eval_episodes=0)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        assert main(["--cfg", str(cfg), "--run-dir", str(tmp_path / "run")]) == 0
        code = ("import signal; "
                "print(*(signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGUSR1)))")
        r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.stdout.split() == ["True", "True"], r.stdout + r.stderr  # not SIG_IGN
    finally:
        for s, h in before.items():
            signal.signal(s, h)
