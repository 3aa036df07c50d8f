"""What several test files share: a model and plan small enough to train in seconds, and running the CLIs."""

from __future__ import annotations

import csv
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

# One evaluation episode: the suite checks when evaluations run and what they write, not their returns (a test
# that compares returns sets its own count); a second episode made every tiny run's evaluations twice as long.
TINY = dict(task="Pendulum-v1", model_size=None, enc_dim=32, mlp_dim=32, latent_dim=16, num_enc_layers=2, num_q=2,
            num_samples=32, num_elites=4, num_pi_trajs=2, iterations=2, horizon=3, batch_size=16,
            buffer_size=5000, seed_steps=200, eval_freq=400, eval_episodes=1, log_every=100, save_every=400,
            steps=600, precision="fp32", progress=False, tensorboard=False, device="cpu", threads=1)


def tiny_json(tmp_path: Path, **over) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**TINY, **over}))
    return path


def run_module(module: str, *args, timeout: int = 240, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **popen)


def run_train(*args, timeout: int = 240, **popen) -> subprocess.CompletedProcess:
    return run_module("tdmpc.train", *args, timeout=timeout, **popen)


def cli(capsys: pytest.CaptureFixture[str], module: str, *args) -> subprocess.CompletedProcess:
    """A command's main() run in this process, reported as run_module reports a subprocess: for what a command
    refuses before its work starts, with no interpreter and torch to start (3 s each on a 2-core AVX2 EPYC; a
    hundred refusals in the suite). What a command set for itself (torch's threads, signal handlers, the working
    folder) is put back. Where the process itself is what is tested (signals, exit codes of the interpreter,
    warnings printed at import), run_module."""
    main = importlib.import_module(module).main
    threads, cwd = torch_threads(), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # tyro's parse errors
        code = e.code
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        os.chdir(cwd)
        torch_threads(threads)
    out = capsys.readouterr()
    return subprocess.CompletedProcess([module, *map(str, args)], code, out.out, out.err)


def torch_threads(n: int | None = None) -> int:
    """torch's CPU threads, set to n when given (imported here, not at the top: helpers serve tests that need no
    torch)."""
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def trained_once(tmp_path_factory: pytest.TempPathFactory, name: str, *args, **over) -> Path:
    """A tiny run (tiny_json's config with `over`, then the train flags `args`) made once per session and copied
    into the asking worker's own folder. A module's fixture runs once in every pytest-xdist worker that runs one
    of its tests, and each of these runs cost 12-30 s on a 2-core AVX2 EPYC; the first worker to ask trains it
    while the others wait on a file lock. Each gets its own copy, so that no two workers' resumes meet in one run
    directory (its lock would refuse one). "{dir}" in `args` is the shared folder the run is trained in, for a file
    it writes beside itself (--save-data): the run's config names it there, where it stays."""
    import fcntl
    import shutil

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    made = shared / f"{name}-trained"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / "done").is_file():  # whole, or trained again by the next worker to ask
            shutil.rmtree(made, ignore_errors=True)
            made.mkdir()
            r = run_train("--cfg", tiny_json(made, **over), "--run-dir", made / "run",
                          *(str(a).format(dir=made) for a in args))
            assert r.returncode == 0, r.stderr
            (made / "done").touch()
    return copy_run(made / "run", tmp_path_factory.mktemp(name) / "run")


def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short finished run (300 steps; its checkpoint and buffer at the end; no evaluation), trained once per
    session for every module that damages, resumes or evaluates one."""
    return trained_once(tmp_path_factory, "finished", steps=300, save_every=300, eval_episodes=0)


def copy_run(run: Path, to: Path) -> Path:
    """A run's directory copied to `to`, without its lock file (the copy is another run directory)."""
    import shutil

    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".lock"))
    return to


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def one_line_error(r: subprocess.CompletedProcess, code: int = 2) -> str:
    """The error line of a CLI that failed as documented: exit `code`, one line starting 'error: '."""
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error: ")]
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def skip_unless_ci(reason: str) -> NoReturn:
    """Skip a test whose setup is not available here; in CI (CI=true), which installs what every group needs on
    purpose (.ci/run), fail instead, so that a group that stops running cannot leave CI green."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI installs what this test needs, so it must run", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_skip(name: str, reason: str | None = None) -> ModuleType:
    """pytest.importorskip, except in CI, where a missing package .ci/run installs is a failure."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_unless_ci(reason or f"{name} is not installed ({e})")
