import os

# Every process the tests start runs one thread: two processes spinning OpenMP threads on the same cores run
# several times slower (a training subprocess beside the test process, on a 2-core machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402

from tdmpc.envs.gl import load_triton_first  # noqa: E402

# Before any test module imports dm_control: Triton loaded after Mesa's EGL segfaults (tdmpc.envs.gl), and
# `pytest tests/test_custom_tasks.py` alone imported dm_control first.
load_triton_first()


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
