"""What a policy prior returns, and the one-hot argmax that priors and planners share: the model's side of the
planner interface (planners/base.py), so that the model imports no planner."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor


class PolicyOutput(NamedTuple):
    """A Gaussian prior's (continuous actions) or a categorical one's (discrete: actions are one-hot rows)."""

    action: Tensor  # sampled action in [-1, 1]; categorical: one-hot
    mean: Tensor  # deterministic action in [-1, 1]; categorical: the most probable, one-hot
    log_std: Tensor  # categorical: the log-probabilities
    entropy: Tensor  # -log-prob of `action`, squash correction included: (..., 1)
    scaled_entropy: Tensor  # the reference's entropy bonus: -(active action dims) x Gaussian log-prob, (..., 1)
    squash_correction: Tensor  # sum of log(1 - action^2), <= 0, very negative when saturated: (..., 1); categorical: 0
    probs: Optional[Tensor] = None  # categorical: the probabilities (..., n); None for a Gaussian


def one_hot_argmax(x: Tensor) -> Tensor:
    """One-hot rows of x's argmax (a scatter: no host sync, unlike F.one_hot's range check)."""
    return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
