"""Discrete regression: scalars as two-hot vectors over bins evenly spaced in symlog space.

Rewards and values span orders of magnitude across tasks; a cross-entropy over symlog
bins learns them without per-task reward scaling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def symlog(x: Tensor) -> Tensor:
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: Tensor) -> Tensor:
    return torch.sign(x) * torch.expm1(torch.abs(x))


class TwoHot(nn.Module):
    """Encodes scalars to two-hot targets and decodes logits back to scalars."""

    # buffers (register_buffer)
    bins: Tensor
    _index: Tensor

    def __init__(self, num_bins: int, vmin: float, vmax: float):
        super().__init__()
        self.num_bins, self.vmin, self.vmax = num_bins, vmin, vmax
        self.bin_size = (vmax - vmin) / (num_bins - 1)
        # Made on the host, then moved: on the meta device (the memory estimate) linspace and arange import sympy.
        device = torch.get_default_device()
        self.register_buffer("bins", torch.linspace(vmin, vmax, num_bins, device="cpu").to(device), persistent=False)
        self.register_buffer("_index", torch.arange(num_bins, device="cpu").to(device), persistent=False)

    def encode(self, x: Tensor) -> Tensor:
        """(...,) scalars -> (..., num_bins): weights 1 - frac and frac on the two enclosing bins."""
        pos = ((symlog(x).clamp(self.vmin, self.vmax) - self.vmin) / self.bin_size).unsqueeze(-1)
        low = pos.floor()
        frac = pos - low
        k = self._index.to(pos.dtype)
        return (k == low) * (1 - frac) + (k == low + 1) * frac

    def decode(self, logits: Tensor) -> Tensor:
        """(..., num_bins) logits -> (..., 1) scalars: symexp of the softmax mean, in fp32."""
        probs = torch.softmax(logits.float(), dim=-1)
        return symexp((probs * self.bins).sum(-1, keepdim=True))  # not a matmul: compiled, it fuses with the softmax

    def cross_entropy(self, logits: Tensor, target: Tensor) -> Tensor:
        """(..., num_bins) logits, (...,) scalar targets -> (...,) losses."""
        logp = F.log_softmax(logits.float(), dim=-1)
        return -(self.encode(target.float()) * logp).sum(-1)
