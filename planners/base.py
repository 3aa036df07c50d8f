"""What a planner needs from a world model, and nothing more.

Any object with these members can be planned with; `tdmpc.world_model.WorldModel`
is one. A new planner depends only on this protocol.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from torch import Tensor


class PolicyOutput(NamedTuple):
    action: Tensor  # sampled action in [-1, 1]
    mean: Tensor  # deterministic action in [-1, 1]
    log_std: Tensor
    entropy: Tensor  # -log-prob of `action`, squash correction included: (..., 1)
    scaled_entropy: Tensor  # the reference's entropy bonus: -(active action dims) x Gaussian log-prob, (..., 1)


class LatentModel(Protocol):
    num_q: int
    episodic: bool

    def encode(self, obs: Tensor) -> Tensor: ...
    def next(self, z: Tensor, a: Tensor) -> Tensor: ...
    def reward(self, z: Tensor, a: Tensor) -> Tensor: ...  # logits
    def next_and_reward(self, z: Tensor, a: Tensor) -> tuple[Tensor, Tensor]: ...  # both, sharing their input
    def termination(self, z: Tensor) -> Tensor: ...  # probability
    def Q(self, z: Tensor, a: Tensor, heads: Tensor | None = None) -> Tensor: ...  # (heads, ..., bins) logits
    def pi(self, z: Tensor) -> PolicyOutput: ...
    def decode(self, logits: Tensor) -> Tensor: ...  # logits -> (..., 1) scalars
    def sample_heads(self) -> Tensor: ...  # indices of 2 random Q heads
