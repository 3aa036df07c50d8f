"""A reference fixture read, the agent built to match it, and the random source that replays its recorded draws."""

from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tdmpc.agent import Agent
from tdmpc.config import Config, NetworkSettings
from tdmpc.errors import BadInput
from tdmpc.model.random import RandomSource
from tdmpc.model.reference import reference_to_ours

FILES = ("meta.json", "checkpoint_before.pt", "checkpoint_after.pt", "optim_after.pt", "batch.pt", "update_io.pt",
         "plan_io.pt")


class Recorded(RandomSource):
    """Gives recorded draws instead of drawing: values[name] holds one call's draws of that name, in call order.

    set() copies a new call's values into the tensors already held (same shapes), so a compiled function that
    read them keeps reading them without recompiling."""

    def __init__(self) -> None:
        self.values: dict[str, list[Tensor]] = {}
        self.taken: dict[str, int] = {}

    def set(self, values: dict[str, list[Tensor]]) -> None:
        for name, draws in values.items():
            held = self.values.get(name)
            if held is not None and [t.shape for t in held] == [t.shape for t in draws]:
                for t, v in zip(held, draws):
                    t.copy_(v)
            else:
                self.values[name] = [v.clone() for v in draws]
        for name in [n for n in self.values if n not in values]:
            del self.values[name]
        self.taken = {}

    def untaken(self) -> list[str]:
        """Draws given but never asked for: a sign that the two implementations draw differently."""
        return [f"{name} ({len(v) - self.taken.get(name, 0)} of {len(v)})" for name, v in self.values.items()
                if self.taken.get(name, 0) < len(v)]

    def _take(self, name: str, shape: tuple[int, ...]) -> Tensor:
        i = self.taken.get(name, 0)
        draws = self.values.get(name, [])
        if i >= len(draws):
            raise ParityError(f"the agent drew '{name}' {i + 1} time(s) in one call; the fixture recorded {len(draws)}")
        self.taken[name] = i + 1
        value = draws[i]
        if tuple(value.shape) != tuple(shape):
            raise ParityError(f"draw '{name}' #{i}: the agent asks for shape {tuple(shape)}, the fixture gives "
                              f"{tuple(value.shape)}")
        return value

    def normal(self, name: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
        return self._take(name, shape)

    def normal_(self, name: str, out: Tensor) -> Tensor:
        return out.copy_(self._take(name, tuple(out.shape)))

    def uniform_(self, name: str, out: Tensor) -> Tensor:
        return out.copy_(self._take(name, tuple(out.shape)))

    def exponential_(self, name: str, out: Tensor) -> Tensor:
        return out.copy_(self._take(name, tuple(out.shape)))

    def integers(self, name: str, high: int, shape: tuple[int, ...], device: torch.device,
                 dtype: torch.dtype = torch.int64) -> Tensor:
        return self._take(name, shape).to(dtype)

    def head_pairs(self, name: str, num_q: int, draws: int, device: torch.device) -> Tensor:
        return self._take(name, (draws, 2))

    def dropout(self, name: str, x: Tensor, p: float, cheap_bits: bool) -> Tensor:
        return x * self._take(name, tuple(x.shape)).to(x.dtype)  # the recorded mask, 0 or 1 / (1 - p)


class ParityError(ValueError):
    """The fixture and the agent cannot be matched (a draw missing or of another shape); one line."""


@dataclass
class Fixture:
    path: Path
    meta: dict
    cfg: Config
    episode_length: int | list[int]
    tasks: tuple[str, ...]
    compact: bool

    def load(self, name: str) -> Any:
        """A fixture file; one torch cannot read (cut short by a copy, a git-LFS pointer) is a one-line BadInput."""
        try:
            return torch.load(self.path / name, weights_only=True, map_location="cpu")
        except (RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
            raise BadInput(f"{self.path / name}: not a readable fixture file ({type(e).__name__}, as a copy cut "
                           f"short or a git-LFS pointer reads); copy the fixture again") from None

    def calls(self, name: str) -> tuple[dict, list[dict]]:
        """A recorded-calls file (update_io.pt, plan_io.pt) and its calls, or a one-line BadInput."""
        io = self.load(name)
        if not isinstance(io, dict) or not isinstance(io.get("calls"), list):
            raise BadInput(f"{self.path / name}: not a fixture's recorded calls (no list of calls); copy the fixture "
                           f"again")
        return io, io["calls"]


def read_fixture(path: str | Path, **overrides: Any) -> Fixture:
    """The fixture at `path` and the Config that matches the reference's settings (overrides: Config fields, e.g.
    precision='bf16'). A directory that is not such a fixture is a one-line BadInput."""
    path = Path(path)
    if not path.is_dir():
        raise BadInput(f"{path}: not a directory (give a fixture directory, as ../shared/fixtures/reference-update-ms1)")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise BadInput(f"{path}: not an update/plan fixture: missing {', '.join(missing)}")
    try:
        meta = json.loads((path / "meta.json").read_text())
        ref, fixture = meta["cfg"], meta["fixture"]
        multitask = bool(ref.get("multitask"))
        tasks = tuple(ref["tasks"]) if multitask else ()
        length = [int(n) for n in ref["episode_lengths"]] if multitask else int(ref["episode_length"])
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{path / 'meta.json'}: not a fixture's meta.json ({type(e).__name__}: {e})") from None
    fields = _reference_fields() | {"batch_size", "mpc"}
    values = {k: ref[k] for k in fields if k in ref and ref[k] != "???"}
    values.update(task=ref.get("task", "walker-walk") if not multitask else ",".join(tasks),
                  episodic=bool(fixture.get("episodic", ref.get("episodic", False))),
                  device="cpu", precision="fp32", train_precision="fp32", compile=False, cuda_graphs=False,
                  plan_horizon=None, entropy_bonus="gaussian", task_scales=False, uniform_prior_coef=0.0,
                  task_set=tasks, task_dim=ref.get("task_dim") or None)
    cfg = Config(**{**values, **overrides})
    return Fixture(path, meta, cfg, length, tasks, bool(meta.get("args", {}).get("compact", False)))


def _reference_fields() -> set[str]:
    """Config fields that the reference's config.yaml names alike (losses, planning, network settings, sizes)."""
    from tdmpc.config.fields import _Losses, _Sizes  # noqa: PLC0415 (the sections, not in the public API)
    from tdmpc.config.planner import MPPIConfig

    return {f.name for c in (_Losses, _Sizes, MPPIConfig, NetworkSettings) for f in dataclasses.fields(c)}


def build_agent(fx: Fixture, checkpoint: str = "checkpoint_before.pt") -> tuple[Agent, dict[str, Tensor]]:
    """An agent with the fixture's dims and settings and the reference weights; also the reference state dict in
    our names (before any update)."""
    sd = fx.load(checkpoint)
    dims, ours = reference_to_ours(sd.get("model", sd), str(fx.path / checkpoint), fx.tasks or None)
    # What a checkpoint does not store (dropout, bins, SimNorm groups, log-std bounds) comes from the config.
    dims = dataclasses.replace(dims, **{f.name: getattr(fx.cfg, f.name) for f in dataclasses.fields(NetworkSettings)})
    if dims.episodic != fx.cfg.episodic:
        raise BadInput(f"{fx.path}: meta.json says episodic={fx.cfg.episodic}, the checkpoint "
                       f"{'has' if dims.episodic else 'has no'} termination head")
    agent = Agent(fx.cfg, dims, fx.episode_length, torch.device("cpu"))
    agent.load_state_dict({"model": ours}, str(fx.path / checkpoint))
    return agent, ours
