"""Building blocks: Linear -> LayerNorm -> Mish, SimNorm, a stacked ensemble, the pixel encoder.

Parameter names mirror the reference implementation's NormedLinear (`weight`, `bias`,
`ln.weight`, `ln.bias`) so its checkpoints map onto ours key by key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tdmpc.model.fused import ln_act
from tdmpc.model.random import TORCH, RandomSource
from tdmpc.runtime.device import bf16_matmuls_emulated, cpu_fast_paths


def simnorm(x: Tensor, group: int) -> Tensor:
    """Softmax over groups of `group` features: keeps latents on a product of simplices."""
    shape = x.shape
    return torch.softmax(x.unflatten(-1, (-1, group)), dim=-1).view(shape)


def _bf16_emulated(x: Tensor) -> bool:
    """This matmul is bf16 (its input, or CPU autocast's dtype) on a CPU whose bf16 matmuls torch emulates, eager."""
    if x.dtype != torch.bfloat16 and not (x.dtype == torch.float32 and torch.is_autocast_enabled("cpu")):
        return False  # first: fp32 is every call's case on most machines, and this costs it the least
    if x.device.type != "cpu" or torch.compiler.is_compiling() or not bf16_matmuls_emulated(x.device):
        return False
    return x.dtype == torch.bfloat16 or torch.get_autocast_dtype("cpu") == torch.bfloat16


def _in_fp32(op: Callable[..., Tensor], *args: Tensor | None) -> Tensor:
    """A bf16 matmul in fp32 on the bf16-rounded operands, its result rounded to bf16: what a bf16 GEMM that
    accumulates in fp32 computes (CUDA's, oneDNN's), up to the order of its sums, at fp32's speed rather than the
    emulation's. Autograd through the casts rounds the gradients as a bf16 backward does."""
    with torch.autocast("cpu", enabled=False):
        return op(*(None if t is None else t.to(torch.bfloat16).float() for t in args)).to(torch.bfloat16)


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear; bf16 where the CPU emulates it, in fp32 (_in_fp32)."""
    return _in_fp32(F.linear, x, w, b) if _bf16_emulated(x) else F.linear(x, w, b)


def batched_linear(x: Tensor, w_t: Tensor, b: Tensor) -> Tensor:
    """b + x @ w_t, batched. Eager: one baddbmm. Compiled: bmm, with the bias added in the kernel inductor fuses
    after it (the LayerNorm that follows), since CUDA's baddbmm first copies the broadcast bias into its output: a
    kernel per call, 36 per compiled plan() (results/baddbmm-copies/). Eager keeps baddbmm: bmm then the bias ran
    4% slower end to end on the CPU and rounds bf16 twice."""
    if torch.compiler.is_compiling():
        return torch.bmm(x, w_t) + b
    if _bf16_emulated(x):
        return _in_fp32(lambda x_, w_, b_: torch.baddbmm(b_, x_, w_), x, w_t, b)
    return torch.baddbmm(b, x, w_t)


def concat(parts: list[Tensor], dim: int) -> Tensor:
    """torch.cat by copies into one new tensor. Frozen copies are built this way because the memory estimate
    builds them on the meta device, where cat and stack import torch._dynamo (about 1 s of every start)."""
    assert len({(p.dtype, p.device) for p in parts}) == 1, "concat copies into the first part's dtype and device"
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    out, start = parts[0].new_empty(shape), 0
    for p in parts:
        out.narrow(dim, start, p.shape[dim]).copy_(p)
        start += p.shape[dim]
    return out


class Linear(nn.Linear):
    """nn.Linear through linear(): bf16 in fp32 where the CPU emulates it."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class NormedLinear(nn.Linear):
    """Linear -> (dropout) -> LayerNorm -> Mish, or -> LayerNorm -> SimNorm for latent outputs."""

    def __init__(self, in_features: int, out_features: int, act: str = "mish",
                 dropout: float = 0.0, simnorm_dim: int = 8):
        super().__init__(in_features, out_features)
        self.ln = nn.LayerNorm(out_features)
        self.act, self.dropout, self.simnorm_dim = act, dropout, simnorm_dim
        self.random: RandomSource = TORCH  # WorldModel.use_random() sets the agent's

    def forward(self, x: Tensor) -> Tensor:
        x = linear(x, self.weight, self.bias)
        if self.dropout and self.training:
            x = self.random.dropout("dropout", x, self.dropout, cpu_fast_paths(x.device))
        return ln_act(x, self.ln.weight, self.ln.bias, self.act, group=self.simnorm_dim)


class MLP(nn.Sequential):
    """Layers applied to (rows, features): every Linear is one addmm (3-D inputs would add a bias pass)."""

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        return super().forward(x.reshape(-1, x.shape[-1])).view(*lead, -1)


def mlp(in_dim: int, hidden: list[int], out_dim: int, last: str = "linear",
        dropout: float = 0.0, simnorm_dim: int = 8) -> MLP:
    """Hidden NormedLinear layers (dropout only on the first), then a plain or SimNorm output."""
    dims = [in_dim, *hidden]
    layers: list[nn.Module] = [NormedLinear(dims[i], dims[i + 1], dropout=dropout if i == 0 else 0.0)
                               for i in range(len(hidden))]
    if last == "simnorm":
        layers.append(NormedLinear(dims[-1], out_dim, act="simnorm", simnorm_dim=simnorm_dim))
    else:
        layers.append(Linear(dims[-1], out_dim))
    return MLP(*layers)


class StackedLayerNormAffine(nn.Module):
    def __init__(self, num: int, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num, features))
        self.bias = nn.Parameter(torch.zeros(num, features))


class EnsembleLinear(nn.Module):
    """`num` Linear layers with stacked weights (num, out, in): every head in one batched matmul."""

    def __init__(self, num: int, in_features: int, out_features: int, normed: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(num, out_features))
        self.ln = StackedLayerNormAffine(num, out_features) if normed else None
        self.dropout = dropout
        self.random: RandomSource = TORCH  # WorldModel.use_random() sets the agent's

    def params(self) -> list[Tensor]:
        """weight, bias and (normed layers) the LayerNorm affine, each (num, ...)."""
        return [getattr(owner, name) for owner, name in _param_owners(self)]

    def forward(self, x: Tensor, heads: Tensor | None = None, detach: bool = False,
                chosen: list[Tensor] | None = None, every_action: int = 0) -> Tensor:
        """x: (M, in) shared by all heads, or (heads, M, in). Returns (heads, M, out).

        `heads` selects a subset (only those heads are computed), or `chosen` gives their parameters already
        selected; `detach` blocks gradients into the weights while letting them flow into x. every_action=n: the
        last n inputs are a one-hot action, left out of x (M, in - n), and each row is taken with each of the n
        actions: (heads, M * n, out), rows (m, action) in that order. A one-hot action adds its weight column to
        the rest's product, so that product is computed once per row, not once per action.
        """
        params = chosen if chosen is not None else self.params()
        if heads is not None and chosen is None:
            params = [p.index_select(0, heads) for p in params]
        if detach:
            params = [p.detach() for p in params]
        w, b = params[0], params[1]
        if every_action:
            w, w_action = w[..., :-every_action], w[..., -every_action:]
        if x.dim() == 2 and chosen is not None:  # views into flat heads (planning): one batched matmul, no copies
            y = batched_linear(x.expand(w.shape[0], -1, -1), w.transpose(1, 2), b.unsqueeze(1))
        elif x.dim() == 2:  # one input for every head: a single GEMM over the stacked (heads*out, in) weight,
            # whose backward sums the heads' input gradients inside the GEMM too
            n_heads, out = w.shape[0], w.shape[1]
            y = linear(x, w.reshape(n_heads * out, -1), b.reshape(-1))
            y = y.view(x.shape[0], n_heads, out).transpose(0, 1).contiguous()
        else:
            y = batched_linear(x, w.transpose(1, 2), b.unsqueeze(1))
        if every_action:
            y = (y.unsqueeze(2) + w_action.transpose(1, 2).contiguous().unsqueeze(1)).flatten(1, 2)  # a row-major sum
        if self.ln is None:
            return y
        if self.dropout and self.training:
            y = self.random.dropout("dropout", y, self.dropout, cpu_fast_paths(y.device))
        return ln_act(y, params[2], params[3], "mish", heads_first=True)


@dataclass(frozen=True)
class ChosenHeads:
    """Some heads' parameters already selected from a flattened ensemble (Ensemble.choose): per layer, views into
    one selection made for several draws at once, so a planner's iterations share a single index_select."""
    params: list[list[Tensor]]


Heads = Tensor | ChosenHeads  # head indices (2,), or their parameters already chosen


class Ensemble(nn.Sequential):
    """An MLP ensemble (the Q-functions) as a stack of EnsembleLinear layers."""

    def __init__(self, num: int, in_dim: int, hidden: list[int], out_dim: int, dropout: float = 0.0):
        dims = [in_dim, *hidden]
        layers = [EnsembleLinear(num, dims[i], dims[i + 1], dropout=dropout if i == 0 else 0.0)
                  for i in range(len(hidden))]
        super().__init__(*layers, EnsembleLinear(num, dims[-1], out_dim, normed=False))
        self.num = num
        self._flat: list[Tensor] = []  # flatten_heads(): one (num, P) tensor per dtype

    def forward(self, x: Tensor, heads: Heads | None = None, detach: bool = False, every_action: int = 0) -> Tensor:
        """x: (..., in) -> (heads, ..., out). every_action=n: x holds the inputs without the one-hot action that
        ends them, (..., in - n), and the result is each row's with each of the n actions, (heads, ..., n, out)."""
        lead = (*x.shape[:-1], every_action) if every_action else x.shape[:-1]
        y = x.reshape(-1, x.shape[-1])
        chosen: list[list[Tensor]] | None = None
        if isinstance(heads, ChosenHeads):
            assert not detach, "chosen heads are a frozen copy's"
            chosen, heads = heads.params, None
        elif heads is not None and self.flattened and not detach:
            chosen = self.choose(heads.unsqueeze(0))[0].params
        for i, layer in enumerate(self):
            y = layer(y, heads, detach, None if chosen is None else chosen[i], every_action if i == 0 else 0)
        return y.view(y.shape[0], *lead, y.shape[-1])

    @property
    def flattened(self) -> bool:
        """flatten_heads() was called: choose() can select heads' parameters."""
        return len(self._flat) > 0  # not bool(list): dynamo before torch 2.13 cannot trace it

    def flatten_heads(self) -> None:
        """For frozen copies (planning): each head's parameters become a row of one (num, P) tensor per dtype, and
        every layer's parameters views into it, so choosing heads is one index_select per dtype, not one per
        parameter. A foreach copy into the parameters (sync_copy) writes through the views."""
        params = [p for layer in self for p in cast(EnsembleLinear, layer).params()]
        dtypes = list(dict.fromkeys(p.dtype for p in params))
        self._flat = [concat([p.detach().reshape(self.num, -1) for p in params if p.dtype == d], 1) for d in dtypes]
        offsets = [0] * len(dtypes)
        self._layout: list[list[tuple[int, int, int, tuple[int, ...]]]] = []  # (flat, start, size, shape) per param
        for layer in self:
            places = []
            for owner, name in _param_owners(cast(EnsembleLinear, layer)):
                p = getattr(owner, name)
                k, n = dtypes.index(p.dtype), p[0].numel()
                view = self._flat[k][:, offsets[k]:offsets[k] + n].view(p.shape)
                setattr(owner, name, nn.Parameter(view, requires_grad=False))
                places.append((k, offsets[k], n, tuple(p.shape[1:])))
                offsets[k] += n
            self._layout.append(places)

    def choose(self, heads: Tensor) -> list[ChosenHeads]:
        """Every layer's parameters of the chosen heads, for each of several draws (draws, k), from one
        index_select per flat tensor (flatten_heads) over all the draws."""
        picked = [flat.index_select(0, heads.flatten()).view(*heads.shape, -1) for flat in self._flat]
        return [ChosenHeads([[picked[k][d, :, start:start + n].view(-1, *shape) for k, start, n, shape in places]
                             for places in self._layout]) for d in range(heads.shape[0])]


def _param_owners(layer: EnsembleLinear) -> list[tuple[nn.Module, str]]:
    """Where each of a layer's parameters lives, in params()' order (flatten_heads re-points them)."""
    return [(layer, "weight"), (layer, "bias")] + ([(layer.ln, "weight"), (layer.ln, "bias")] if layer.ln else [])


class ShiftAug(nn.Module):
    """Random shift of up to `pad` pixels (DrQ-v2) on fp32 frames, in every mode: the reference's ShiftAug checks no
    training flag, so it shifts the frames it plans on and the TD targets' too."""

    def __init__(self, pad: int = 3):
        super().__init__()
        self.pad = pad
        self.random: RandomSource = TORCH  # WorldModel.use_random() sets the agent's

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        n, _, h, w = x.shape
        x = F.pad(x, (self.pad,) * 4, mode="replicate")
        eps = 1.0 / (h + 2 * self.pad)
        arange = torch.linspace(-1.0 + eps, 1.0 - eps, h + 2 * self.pad, device=x.device, dtype=x.dtype)[:h]
        arange = arange.unsqueeze(0).repeat(h, 1).unsqueeze(2)
        base_grid = torch.cat([arange, arange.transpose(1, 0)], dim=2).unsqueeze(0).repeat(n, 1, 1, 1)
        shift = self.random.integers("shift_aug", 2 * self.pad + 1, (n, 1, 1, 2), x.device, x.dtype)
        return F.grid_sample(x, base_grid + shift * (2.0 / (h + 2 * self.pad)), padding_mode="zeros",
                             align_corners=False)


class PixelEncoder(nn.Sequential):
    """4 conv layers (stride 2, 2, 2, 1) on 64x64 frames, then SimNorm; indices match the reference."""

    def __init__(self, in_channels: int, num_channels: int, simnorm_dim: int):
        super().__init__(
            ShiftAug(), _PixelScale(),
            nn.Conv2d(in_channels, num_channels, 7, stride=2), nn.ReLU(),
            nn.Conv2d(num_channels, num_channels, 5, stride=2), nn.ReLU(),
            nn.Conv2d(num_channels, num_channels, 3, stride=2), nn.ReLU(),
            nn.Conv2d(num_channels, num_channels, 3, stride=1), nn.Flatten())
        self.simnorm_dim = simnorm_dim

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-3]
        x = self[0](x.reshape(-1, *x.shape[-3:])).to(cast(nn.Conv2d, self[2]).weight.dtype)  # shifted in fp32
        for layer in list(self)[1:]:
            x = layer(x)
        return simnorm(x, self.simnorm_dim).view(*lead, -1)


class _PixelScale(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x / 255.0 - 0.5


def init_weights(module: nn.Module) -> None:
    """As the reference initialises: truncated normal (std 0.02) weights and zero biases, task embeddings
    U(-0.02, 0.02) (convs keep torch's default)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, EnsembleLinear)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.uniform_(m.weight, -0.02, 0.02)
