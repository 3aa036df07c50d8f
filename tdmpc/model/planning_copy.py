"""Planning copies of a world model: frozen, in the planning dtype, with the layers planning runs together fused
into one tensor each; sync_copy() refreshes one from the trained model after updates."""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch import Tensor, nn

from tdmpc.model.layers import EnsembleLinear, NormedLinear, StackedLayerNormAffine, concat
from tdmpc.model.world_model import WorldModel
from tdmpc.runtime.device import cpu_fast_paths


def planning_copy(model: WorldModel, dtype: torch.dtype) -> WorldModel:
    """A frozen copy for planning: matmul weights in `dtype`; LayerNorm parameters in fp32 where the fused CPU
    kernels read them, else in `dtype` too (on CUDA an fp32 affine would cost two casts per LayerNorm).

    The first layers of dynamics and reward become views into one fused tensor, so
    step() needs no concatenation, and their second layers views into a (2, ...) stack it runs as
    one batched matmul; sync_copy() keeps them current in place.
    """
    copy_ = copy.deepcopy(model).requires_grad_(False).eval()
    for m in copy_.modules():
        if isinstance(m, (nn.Linear, EnsembleLinear, nn.Conv2d)):  # not LayerNorm affine parameters
            m.weight = nn.Parameter(m.weight.to(dtype), requires_grad=False)
            assert m.bias is not None  # every layer here has one
            m.bias = nn.Parameter(m.bias.to(dtype), requires_grad=False)
    if not cpu_fast_paths(model.log_std_min.device):
        for m in copy_.modules():
            if isinstance(m, (nn.LayerNorm, StackedLayerNormAffine)):
                m.weight = nn.Parameter(m.weight.to(dtype), requires_grad=False)
                m.bias = nn.Parameter(m.bias.to(dtype), requires_grad=False)

    def fuse(mod_d: nn.Module, mod_r: nn.Module, name: str) -> Tensor:
        both = concat([getattr(mod_d, name).unsqueeze(0), getattr(mod_r, name).unsqueeze(0)], 0)
        setattr(mod_d, name, nn.Parameter(both[0], requires_grad=False))
        setattr(mod_r, name, nn.Parameter(both[1], requires_grad=False))
        return both

    d, r = cast(NormedLinear, copy_._dynamics[0]), cast(NormedLinear, copy_._reward[0])
    copy_._fused_first_layers = (fuse(d, r, "weight").flatten(0, 1), fuse(d, r, "bias").flatten(0, 1),
                                 fuse(d.ln, r.ln, "weight"), fuse(d.ln, r.ln, "bias"))
    copy_._Qs.flatten_heads()
    d, r = cast(NormedLinear, copy_._dynamics[1]), cast(NormedLinear, copy_._reward[1])
    copy_._fused_second_layers = (fuse(d, r, "weight"), fuse(d, r, "bias"), fuse(d.ln, r.ln, "weight"),
                                  fuse(d.ln, r.ln, "bias"))
    return copy_


@torch.no_grad()
def sync_copy(copy_: WorldModel, model: WorldModel) -> None:
    """Refresh a planning copy from the trained model (one fused copy kernel per dtype group)."""
    torch._foreach_copy_(list(copy_.parameters()) + list(copy_.buffers()), list(model.parameters()) + list(model.buffers()))
