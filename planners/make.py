"""The planners by name (Config.planner), and make_planner. A new planner is a module of its own with a class that
satisfies base.Planner and takes PlannerFactory's arguments, plus its line in PLANNERS."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from tdmpc.config.planner import MPPIConfig
from tdmpc.errors import ConfigError
from tdmpc.model.random import TORCH, RandomSource

from .base import LatentModel, Planner
from .categorical import CategoricalMPPI
from .mppi import GaussianMPPI

__all__ = ["PLANNERS", "PlannerFactory", "make_planner", "planner_factory"]

# (model, settings, num_envs, action_dim, discount, device, chunk_rows, random) -> a planner
PlannerFactory = Callable[[LatentModel, MPPIConfig, int, int, "float | Tensor", torch.device, "int | None",
                           RandomSource], Planner]


def mppi(model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int, discount: float | Tensor,
         device: torch.device, chunk_rows: int | None, random: RandomSource) -> Planner:
    """MPPI for the model's actions: over a Gaussian (continuous) or categorical probabilities (discrete). Both
    plan() the same way, so callers never branch on the action type."""
    kind = CategoricalMPPI if model.discrete else GaussianMPPI
    return kind(model, cfg, num_envs, action_dim, discount, device, chunk_rows, random)


PLANNERS: dict[str, PlannerFactory] = {"mppi": mppi}


def planner_factory(name: str) -> PlannerFactory:
    """The factory Config.planner names; an unknown name is a one-line ConfigError. The config layer, below this
    registry, does not check the name: the setup pipeline asks here before anything is built."""
    if name not in PLANNERS:
        raise ConfigError(f"config field 'planner' = {name!r}: not a planner: one of {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name]


def make_planner(name: str, model: LatentModel, cfg: MPPIConfig, num_envs: int, action_dim: int,
                 discount: float | Tensor, device: torch.device, chunk_rows: int | None = None,
                 random: RandomSource = TORCH) -> Planner:
    """The planner Config.planner names, built."""
    return planner_factory(name)(model, cfg, num_envs, action_dim, discount, device, chunk_rows, random)
