"""The one source of every random draw that update() and plan() make.

The agent owns a RandomSource and hands it to its world model (policy noise, Q-head pairs, dropout, the pixel
shift) and to its planners (MPPI's noise, the elite choice). The default draws from torch's generator on the
tensors' device, exactly the calls the hot path made before this seam existed, so CUDA graphs, torch.compile
and the kernel counts are unchanged. A subclass can return other values instead: `tdmpc.parity` replays the
draws the reference implementation recorded, to check one update and one plan against its numbers.

Every draw is named; the names, their shapes and where they go:

| name | method | shape | use |
|---|---|---|---|
| `td_target.pi_eps` | normal | (H, B, A) | the prior's action at next_z in the TD target |
| `td_target.q_pair` | head_pairs | (1, 2) | the target Q heads the TD target takes the min of |
| `pi.pi_eps` | normal | (H+1, B, A) | the prior's action in the policy loss |
| `pi.q_pair` | head_pairs | (1, 2) | the Q heads the policy loss averages |
| `pi.eps` | normal | (..., A) | any other call of the prior without given noise (acting without planning) |
| `dropout` | dropout | as its input | the Q heads' dropout after the first layer (training mode) |
| `shift_aug` | integers | (n, 1, 1, 2) | the pixel encoder's random shift (every encode of pixel frames, as the reference's) |
| `plan.normal` | normal_ | GaussianMPPI.draw_views | all of one plan's N(0, 1) draws, in one flat buffer |
| `plan.uniform` | uniform_ | CategoricalMPPI | a discrete plan's U(0, 1) draws |
| `plan.q_pairs` | head_pairs | (iterations, 2) | each MPPI iteration's Q heads for the value estimate |
| `plan.exponential` | exponential_ | (N, elites) | Exp(1) draws: Gumbel noise -log(E) for the elite each env acts on |

A source is shared, never copied: deepcopy (planning copies of the model) keeps the same object.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["RandomSource", "TORCH"]


class RandomSource:
    """Draws from torch's default generator of the device the tensors live on."""

    def normal(self, name: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """A new (shape) tensor of N(0, 1) draws, float32."""
        return torch.randn(shape, device=device)

    def normal_(self, name: str, out: Tensor) -> Tensor:
        """Fill a preallocated buffer with N(0, 1) draws (one kernel)."""
        return torch.randn(out.shape, out=out)

    def uniform_(self, name: str, out: Tensor) -> Tensor:
        return torch.rand(out.shape, out=out)

    def exponential_(self, name: str, out: Tensor) -> Tensor:
        return out.exponential_()

    def integers(self, name: str, high: int, shape: tuple[int, ...], device: torch.device,
                 dtype: torch.dtype = torch.int64) -> Tensor:
        """Uniform integers in [0, high)."""
        return torch.randint(0, high, shape, device=device, dtype=dtype)

    def head_pairs(self, name: str, num_q: int, draws: int, device: torch.device) -> Tensor:
        """(draws, 2) pairs of distinct Q heads, uniform over ordered pairs as the first two of a random permutation
        are, chosen on the device without a sort or a host sync: the second is the first plus 1..num_q-1 mod num_q."""
        first = torch.randint(num_q, (draws, 1), device=device)
        return torch.cat([first, (first + torch.randint(1, num_q, (draws, 1), device=device)) % num_q], 1)

    def dropout(self, name: str, x: Tensor, p: float, cheap_bits: bool) -> Tensor:
        """Training-mode dropout of x. cheap_bits (the CPU's fast path), where ATen would draw one random number per
        element (~6 ns each): one 64-bit draw serves four elements (16 bits each), p rounded to a multiple of
        1/65536 (0.01 -> 0.0099945)."""
        if not cheap_bits:
            return F.dropout(x, p, training=True)
        n = x.numel()
        bits = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64).view(torch.int16)[:n]
        drop_below = round(p * 65536) - 32768  # int16 values are uniform on [-32768, 32767]
        scale = 1.0 / (1.0 - (drop_below + 32768) / 65536)
        return x * ((bits >= drop_below).view(x.shape).to(x.dtype) * scale)

    def __deepcopy__(self, memo: dict) -> "RandomSource":
        return self


TORCH = RandomSource()  # the default source: torch's generators
