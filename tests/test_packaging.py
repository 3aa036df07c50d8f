"""The wheel works outside the checkout: configs, Slurm scripts, console scripts, no stray top-level names."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, seeing the dependencies (torch, gymnasium, ...) of the environment
    running the tests but not this checkout: a .pth file names that environment's site-packages, whose own .pth
    files (an editable install of this checkout among them) are not run from there. That holds whether the tests
    run in a system install (CI) or in a venv (the README's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist",
                    ROOT], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("tdmpc-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", tmp / "venv"], check=True, timeout=120)
    py = tmp / "venv" / "bin" / "python"
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --ignore-installed: the outer environment's tdmpc (an editable install of this checkout, say) is not replaced
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", wheel], check=True,
                   capture_output=True, timeout=300)
    return tmp


def run(installed: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=installed,
                          env={**env, "OMP_NUM_THREADS": "1", "PATH": f"{installed / 'venv' / 'bin'}:{env['PATH']}"})


def test_the_wheel_holds_the_package_data_and_no_other_top_level_package(installed):
    names = zipfile.ZipFile(next((installed / "dist").glob("tdmpc-*.whl"))).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tdmpc"}, tops
    for needed in ("tdmpc/configs/cpu.json", "tdmpc/configs/a4000.json", "tdmpc/slurm/train.sh",
                   "tdmpc/slurm/sweep.sh", "tdmpc/planners/mppi.py", "tdmpc/py.typed", "tdmpc/model/csrc/fused_cpu.cpp",
                   "tdmpc/data/dmc_published.csv", "tdmpc/data/kernels-h200-2026-11-30.json"):
        assert needed in names, needed


def test_installed_commands_run_from_outside_the_checkout(installed):
    py = installed / "venv" / "bin" / "python"
    where = run(installed, py, "-c", "import tdmpc, tdmpc.planners; print(tdmpc.__file__, tdmpc.__version__)")
    assert where.returncode == 0 and str(installed / "venv") in where.stdout, where.stderr
    r = run(installed, installed / "venv" / "bin" / "tdmpc-train", "--cfg", "cpu.json", "--dry-run", "--task",
            "Pendulum-v1", "--device", "cpu", "--run-dir", installed / "run")
    assert r.returncode == 0, r.stderr
    assert "dry run: Pendulum-v1" in r.stdout and "model size 1" in r.stdout
    r = run(installed, py, "-m", "tdmpc.train", "--cfg", "nope.json")
    assert r.returncode == 2 and "available: a4000.json" in r.stderr and "cpu.json" in r.stderr
    # bench --kernels' GPU offsets (read after minutes of counting): from the installed package, not a checkout
    offsets = run(installed, py, "-c", "from tdmpc.bench import kernel_groups as k; k.profile(); print(k.PROFILE)")
    assert offsets.returncode == 0 and str(installed / "venv") in offsets.stdout, offsets.stderr
    scripts = run(installed, installed / "venv" / "bin" / "tdmpc-slurm")
    assert scripts.returncode == 0 and Path(scripts.stdout.strip(), "train.sh").is_file()
    copied = run(installed, py, "-m", "tdmpc.slurm_scripts", "--copy", installed / "mine")
    assert copied.returncode == 0, copied.stderr
    assert (installed / "mine" / "slurm" / "sweep.sh").is_file() and (installed / "mine" / "slurm" / "logs").is_dir()
