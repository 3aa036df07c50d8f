"""Host data to the device in one copy: a training step's rows, indices and flags travel together.

Each host-to-device copy from pageable memory makes the host wait for the GPU stream. to_device packs every
host array of a call into one byte buffer (8-byte aligned fields), pinned when the device is a GPU, sends it
with one non_blocking copy and returns device views of its fields. On the CPU nothing is copied (inside
device.cuda_code_path() the staging path runs, so that its one copy can be counted).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tdmpc.runtime.device import cpu_fast_paths

STAGED = "_tdmpc_staged"  # marks a staging buffer: pinned on a GPU, sent non_blocking (tdmpc.bench.kernels)


def to_device(device: torch.device, *arrays: np.ndarray | Tensor) -> list[Tensor]:
    """Host arrays or CPU tensors on `device`, through one staging copy; each keeps its dtype and shape."""
    hosts = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
    if cpu_fast_paths(device):
        return [torch.from_numpy(np.ascontiguousarray(h)) for h in hosts]
    offsets, size = [], 0
    for h in hosts:
        offsets.append(size)
        size += -(-h.nbytes // 8) * 8  # the next field starts 8-byte aligned, so every dtype can view it
    raw = np.empty(size, dtype=np.uint8)
    for h, off in zip(hosts, offsets):
        raw[off:off + h.nbytes].view(h.dtype)[:] = h.ravel()
    staging = torch.from_numpy(raw)
    if device.type == "cuda":
        staging = staging.pin_memory()  # torch's caching host allocator keeps it until the copy is done
    setattr(staging, STAGED, True)
    sent = staging.to(device, non_blocking=True)
    return [sent[off:off + h.nbytes].view(_torch_dtype(h.dtype)).view(h.shape) for h, off in zip(hosts, offsets)]


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype
