"""What a planner needs from a world model, and nothing more.

Any object with these members can be planned with; `tdmpc.model.world_model.WorldModel`
is one. A new planner depends only on this protocol. `task` is None for a single-task
model, else task ids broadcast against the rows of the input (one per env and candidate).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Protocol, Sequence, Union

import torch
from torch import Tensor

from tdmpc.model.policy import PolicyOutput
from tdmpc.model.random import RandomSource

Task = Union[Tensor, int, None]


class LatentModel(Protocol):
    @property
    def num_q(self) -> int: ...
    @property
    def episodic(self) -> bool: ...
    @property
    def latent_dim(self) -> int: ...
    @property
    def discrete(self) -> bool: ...  # actions are one-hot rows (CategoricalMPPI plans it), else in [-1, 1]
    @property
    def latent_dtype(self) -> torch.dtype: ...  # what encode() and next() return

    def encode(self, obs: Tensor, task: Task = None) -> Tensor: ...
    def next(self, z: Tensor, a: Tensor, task: Task = None) -> Tensor: ...
    def latent_part(self, z: Tensor, task: Task = None) -> Tensor: ...  # z's share of step()'s first layers
    # (next latent, reward features); with z_part (latent_part() of the starting latents) z is not read
    def step(self, z: Optional[Tensor], a: Tensor, task: Task = None,
             z_part: Optional[Tensor] = None) -> tuple[Tensor, Tensor]: ...
    def reward_logits(self, features: list[Tensor]) -> Tensor: ...  # several steps' features -> (steps, ...) logits
    def termination(self, z: Tensor) -> Tensor: ...  # probability (single-task models)
    def pi(self, z: Tensor, task: Task = None) -> PolicyOutput: ...
    # pi().action; eps: N(0, 1) draws, (..., A), whatever the prior (a categorical one makes Gumbel noise of them)
    def pi_action(self, z: Tensor, task: Task = None, eps: Optional[Tensor] = None) -> Tensor: ...
    # (..., 1): the value of z under the prior, from the given Q heads (one of q_heads()' draws); eps: the prior's
    # N(0, 1) draw for its sample
    def prior_q(self, z: Tensor, task: Task, reduce: Literal["min", "avg"], heads: Any = None,
                eps: Optional[Tensor] = None) -> Tensor: ...
    # head pairs (draws, 2) -> one opaque choice per draw for prior_q (a model may select all draws' weights at once)
    def q_heads(self, pairs: Tensor) -> Sequence[Any]: ...
    def action_mask(self, task: Task) -> Optional[Tensor]: ...  # (..., A) ones on each task's action dims
    def decode(self, logits: Tensor) -> Tensor: ...  # logits -> (..., 1) scalars


class Planner(Protocol):
    """What the agent needs of a planner: plan() for N envs at once, static shapes and no host syncs (CUDA graphs
    capture plan_graph, torch.compile traces it), and a random source it draws every number from."""

    random: "RandomSource"

    def plan(self, obs: Tensor, first_step: Tensor, eval_mode: bool = False,
             task: Optional[Tensor] = None) -> Tensor: ...  # actions (N, A), or one-hot rows for a discrete model

    def plan_graph(self, obs: Tensor, first_step: Tensor, eval_mode: bool = False,
                   task: Optional[Tensor] = None) -> Tensor: ...  # plan() without its inference mode

    def buffer_bytes(self) -> int: ...  # what it keeps between calls (the memory estimate builds it on "meta")
