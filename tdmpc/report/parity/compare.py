"""One compared quantity (its largest absolute and relative difference against its tolerance), and a report of them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

@dataclass
class Check:
    """One quantity: the largest absolute and relative difference, against its tolerance."""

    name: str
    max_abs: float
    max_rel: float
    tol: str
    ok: bool
    note: str = ""

    def line(self) -> str:
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.name:<44} abs {self.max_abs:9.3g}  rel {self.max_rel:9.3g}  "
                f"(tolerance: {self.tol}){'  ' + self.note if self.note else ''}")


def close(name: str, ours: Tensor | float, ref: Tensor | float, rtol: float, atol: float = 0.0) -> Check:
    """|ours - ref| <= atol + rtol |ref| elementwise; rel is the largest |ours - ref| / |ref| (0/0 counted 0)."""
    a, b = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(ref, dtype=torch.float64)
    if a.shape != b.shape:
        return Check(name, math.inf, math.inf, f"shape {tuple(b.shape)}", False, f"ours has shape {tuple(a.shape)}")
    diff = (a - b).abs()
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / b.abs())
    ok = bool((diff <= atol + rtol * b.abs()).all()) and bool(torch.isfinite(a).all())
    tol = f"rel {rtol:g}" + (f" + abs {atol:g}" if atol else "")
    return Check(name, float(diff.max()) if diff.numel() else 0.0, float(rel.max()) if rel.numel() else 0.0, tol, ok)


def moved(name: str, ours: Tensor, ref_after: Tensor, ref_before: Tensor, frac: float) -> Check:
    """A tensor after updates: its difference from the reference's, as a fraction of the most any element of the
    reference's moved (the updates' own scale: a rounding difference that Adam's first steps amplify where a
    second moment is near zero stays a small part of a step)."""
    diff = (ours.double() - ref_after.double()).abs().max()
    scale = (ref_after.double() - ref_before.double()).abs().max()
    ratio = float(diff / scale) if scale > 0 else (0.0 if diff == 0 else math.inf)
    return Check(name, float(diff), ratio, f"{frac:g} of the largest move {float(scale):.3g}", ratio <= frac,
                 "rel: of the largest move")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]
