"""The planner's settings (MPPIConfig), declared once: Config inherits these fields (its JSON keys, CLI flags and
docs), and the planners (tdmpc.planners) take them. Declared in the config layer, below the planners, so that a
config is read without them (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class MPPIConfig:
    """The planning settings; the defaults are the reference TD-MPC2's."""

    iterations: int = 6
    """MPPI iterations per plan (2 more for action spaces of 20 dims or more, as the reference)."""
    num_samples: int = 512
    """Candidate action sequences per iteration, policy trajectories included."""
    num_elites: int = 64
    """Best candidates that set the next mean and std."""
    num_pi_trajs: int = 24
    """Candidates rolled out with the policy prior instead of sampled."""
    horizon: int = 3
    """Planning horizon, and the length of training sub-trajectories (tdmpc's Config.plan_horizon, when set, is the
    planner's instead: a discrete run's is 1 unless told otherwise)."""
    min_std: float = 0.05
    """Lower bound of the sampling std."""
    max_std: float = 2.0
    """Upper bound of the sampling std, and its value at the first iteration."""
    temperature: float = 0.5
    """Sharpness of the elites' softmax weights: exp(temperature x (value - max))."""
    min_prob: float = 0.05
    """Discrete actions: each refit mixes every step's probabilities with uniform at this weight, so that no
    action's falls below min_prob / n (the analogue of min_std)."""

    @classmethod
    def from_config(cls, cfg: Any, action_dim: int) -> "MPPIConfig":
        """This planner's settings read off any config that has them (tdmpc's Config does); the reference adds
        2 iterations for large action spaces (A >= 20); a config's plan_horizon, when set, is the horizon."""
        values = {f.name: getattr(cfg, f.name) for f in fields(MPPIConfig)}
        return cls(**{**values, "iterations": values["iterations"] + 2 * int(action_dim >= 20),
                      "horizon": getattr(cfg, "plan_horizon", None) or values["horizon"]})
