"""make_planner: the planner for a model's actions, MPPI (continuous) or CategoricalMPPI (discrete). Both take the
same arguments and plan() the same way, so callers never branch on the action type."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import LatentModel
from .categorical import CategoricalMPPI
from .mppi import MPPILoop, GaussianMPPI
from tdmpc.model.random import TORCH, RandomSource
from .settings import MPPIConfig

__all__ = ["make_planner"]


def make_planner(model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int, discount: float | Tensor,
                 device: torch.device, chunk_rows: int | None = None, random: RandomSource = TORCH) -> MPPILoop:
    kind = CategoricalMPPI if model.discrete else GaussianMPPI
    return kind(model, cfg, num_envs, action_dim, discount, device, chunk_rows, random)
