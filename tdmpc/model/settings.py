"""The network settings that are not sizes, declared once: tdmpc's Config (its JSON keys, CLI flags and docs)
and the model's ModelDims both inherit these fields. No torch here, so that reading a config stays light."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NetworkSettings:
    """Encoder, latent, regression and policy-prior settings besides the sizes."""

    num_channels: int = 32
    """Channels of the pixel encoder's conv layers (latent_dim must be 16 x num_channels for rgb)."""
    simnorm_dim: int = 8
    """Group size of the SimNorm softmax on latents."""
    dropout: float = 0.01
    """Dropout after the first layer of each Q head."""
    num_bins: int = 101
    """Bins of the two-hot discrete regression of rewards and values."""
    vmin: float = -10.0
    """Lowest bin, in symlog space."""
    vmax: float = 10.0
    """Highest bin, in symlog space."""
    log_std_min: float = -10.0
    """Lower bound of the policy prior's log std."""
    log_std_max: float = 2.0
    """Upper bound of the policy prior's log std."""
