"""Crashes, killed processes, damaged files: what a run survives, tested with real processes and files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.skipif(sys.platform != "linux", reason="the fused kernels are built on Linux only")
def test_a_build_lock_held_by_a_killed_process_never_blocks_the_next(tmp_path):
    """A process killed (SIGKILL) while it holds the kernel build lock leaves nothing that makes the
    next process wait: the next one builds the kernels and runs."""
    from tdmpc import fused

    name = f"tdmpc_fused_{fused._build_tag()}"
    holder = subprocess.Popen([PY, "-c", (
        "import sys, time; from pathlib import Path; from tdmpc.fused import build_lock\n"
        f"with build_lock(Path({str(tmp_path)!r}) / '.{name}.lock'):\n"
        "    print('locked', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, text=True, env=_env())
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    (tmp_path / f".build-{name}-dead").mkdir()  # a half-done build directory of the killed process
    t0 = time.time()
    out = subprocess.run([PY, "-c", "from tdmpc.fused import extension_available as ok; print(ok())"],
                         capture_output=True, text=True, timeout=300, env=_env(TDMPC_BUILD_DIR=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stderr
    assert "waiting for another process" not in out.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert f"{name}.so" in left and not [n for n in left if n.startswith(".build-")], (left, out.stderr)
    # Built once: a second start loads the library without the lock or a rebuild.
    again = subprocess.run([PY, "-c", "from tdmpc.fused import extension_available as ok; print(ok())"],
                           capture_output=True, text=True, timeout=120, env=_env(TDMPC_BUILD_DIR=str(tmp_path)))
    assert again.stdout.strip() == "True" and "building" not in again.stderr, again.stderr
    assert time.time() - t0 < 290
