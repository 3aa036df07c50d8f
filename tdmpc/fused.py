"""LayerNorm followed by Mish, the activation of every hidden layer.

Kept in one function so a faster fused kernel can replace the plain formula in one place.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def ln_mish(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """mish(layer_norm(x) * weight + bias); weight/bias are (D,) or broadcast per ensemble head."""
    if weight.dim() == 1:
        y = F.layer_norm(x, x.shape[-1:], weight.to(x.dtype), bias.to(x.dtype), eps)
    else:
        y = F.layer_norm(x, x.shape[-1:], eps=eps) * weight + bias
    return F.mish(y)
