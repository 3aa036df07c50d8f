import os

# Every process the tests start runs one thread: two processes spinning OpenMP threads on the same cores run
# several times slower (a training subprocess beside the test process, on a 2-core machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
