import os

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
