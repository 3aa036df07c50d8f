"""One update and one plan against the reference TD-MPC2's own numbers, from a fixture it wrote.

A fixture (../shared/fixtures/reference-update-ms1/, its README) holds the reference's weights, a batch, three
`_update` calls on it and four `_plan` calls, each with every random draw it made. The agent is built to match
(dims from the checkpoint, settings and episodic flag from meta.json), its draws replaced by the recorded ones
(`Recorded`, through tdmpc/model/random.py's seam), and every quantity compared with a stated tolerance.

Tolerances: the reference against itself moves by up to 1.2e-5 relative in its info values between 1 and 2
threads (the fixture's noise floor, meta.json), float32 reordering alone. Our kernels differ more than a thread
count does (fused Adam, one encoder pass for H+1 observations, fused first layers in planning), so each quantity
gets a bound a few times that floor, and a wrong formula (a scale not updated, a clip at the wrong norm) misses
it by orders of magnitude (tests/test_update_parity.py breaks both on purpose).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from torch import Tensor

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.errors import BadInput
from tdmpc.model.reference import reference_key, reference_to_ours
from tdmpc.model.settings import NetworkSettings
from tdmpc.planners.mppi import GaussianMPPI
from tdmpc.model.random import RandomSource

FILES = ("meta.json", "checkpoint_before.pt", "checkpoint_after.pt", "optim_after.pt", "batch.pt", "update_io.pt",
         "plan_io.pt")


# --- the seam's replaying side ------------------------------------------------------------------------------------

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


# --- the fixture --------------------------------------------------------------------------------------------------

@dataclass
class Fixture:
    path: Path
    meta: dict
    cfg: Config
    episode_length: int | list[int]
    tasks: tuple[str, ...]
    compact: bool

    def load(self, name: str) -> Any:
        return torch.load(self.path / name, weights_only=True, map_location="cpu")


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
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput(f"{path / 'meta.json'}: not a fixture's meta.json ({type(e).__name__}: {e})") from None
    multitask = bool(ref.get("multitask"))
    tasks = tuple(ref["tasks"]) if multitask else ()
    fields = _reference_fields() | {"batch_size", "mpc"}
    values = {k: ref[k] for k in fields if k in ref and ref[k] != "???"}
    values.update(task=ref.get("task", "walker-walk") if not multitask else ",".join(tasks),
                  episodic=bool(fixture.get("episodic", ref.get("episodic", False))),
                  device="cpu", precision="fp32", train_precision="fp32", compile=False, cuda_graphs=False,
                  plan_horizon=None, entropy_bonus="gaussian", task_scales=False, uniform_prior_coef=0.0,
                  task_set=tasks, task_dim=ref.get("task_dim") or None)
    cfg = Config(**{**values, **overrides})
    length = [int(n) for n in ref["episode_lengths"]] if multitask else int(ref["episode_length"])
    return Fixture(path, meta, cfg, length, tasks, bool(meta.get("args", {}).get("compact", False)))


def _reference_fields() -> set[str]:
    """Config fields that the reference's config.yaml names alike (losses, planning, network settings, sizes)."""
    from tdmpc.config import _Losses, _Sizes  # noqa: PLC0415 (the sections, not in the public API)
    from tdmpc.planners.settings import MPPIConfig

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


# --- comparing ----------------------------------------------------------------------------------------------------

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


# Tolerances (module docstring). The info values of the reference against itself differ by up to 1.2e-5 relative
# between thread counts, the most in pi_scaled_entropy, a mean of terms that nearly cancel (-0.80 from terms of mean
# size 16 in call 3): a mean whose terms the fixture holds is held to INFO_RTOL of their mean size too.
INFO_RTOL_DEFAULT = 2e-5
# Weights after 3 updates, as a fraction of the largest move: three Adam steps from this start amplify rounding where
# an element's gradient changes sign between steps (its steps nearly cancel): ulp-sized noise on the start weights
# moves our own result by up to 2.8% of the largest move, at the same tensors (rounding_sensitivity(), run by
# `python -m tdmpc.parity DIR --sensitivity`).
WEIGHTS_MOVED_FRAC = 0.05
ADAM_RTOL, ADAM_ATOL_SQ = 1e-3, 1e-12  # Adam moments: relative to the element, and a floor for v near zero


# --- update ---------------------------------------------------------------------------------------------------------

UPDATE_DRAWS = {"_td_target.pi_eps": "td_target.pi_eps", "_td_target.q_pair_perm": "td_target.q_pair",
                "update_pi.pi_eps": "pi.pi_eps", "update_pi.q_pair_perm": "pi.q_pair"}


def update_draws(draws: list[dict]) -> dict[str, list[Tensor]]:
    """The reference's recorded draws of one _update call, under our names and in our shapes."""
    out: dict[str, list[Tensor]] = {}
    for d in draws:
        name = UPDATE_DRAWS.get(d["name"])
        if name is None:
            raise ParityError(f"the fixture records a draw '{d['name']}' that this package has no counterpart for")
        value = d["value"]
        out.setdefault(name, []).append(value[:2].view(1, 2) if name.endswith("q_pair") else value)
    return out


def _batch(fx: Fixture) -> Batch:
    b = fx.load("batch.pt")
    task = b.get("task")
    return Batch(b["obs"], b["action"], b["reward"].squeeze(-1), b["terminated"].squeeze(-1).bool(),
                 None if task is None else task.long())


def run_updates(agent: Agent, fx: Fixture, each: Callable[[int, dict, dict[str, Tensor], Recorded], None]) -> None:
    """The fixture's update calls on `agent`, each with its recorded draws; each(k, call, info, source) after call k."""
    rec = Recorded()
    agent.use_random(rec)
    batch = _batch(fx)
    for k, call in enumerate(fx.load("update_io.pt")["calls"], 1):
        rec.set(update_draws(call["draws"]))
        each(k, call, agent.update(batch), rec)


def check_update(fx: Fixture) -> Report:
    """The fixture's three updates from its start weights, its batch and its draws: info values, scale, weights and
    target Qs after, Adam's moments and steps."""
    agent, before = build_agent(fx)
    report = Report()

    def compare(k: int, call: dict, info: dict[str, Tensor], rec: Recorded) -> None:
        if rec.untaken():
            report.notes.append(f"update {k}: draws never asked for: {', '.join(rec.untaken())}")
        for key, ref in call["info"].items():
            ours = info.get(key, torch.zeros(()) if key == "termination_loss" and not fx.cfg.episodic else None)
            if ours is None:
                report.checks.append(Check(f"update {k}: {key}", math.inf, math.inf, "present", False,
                                           "this package reports no such value"))
                continue
            inter = call.get("intermediates", {})
            terms = inter.get(key)  # a mean of terms that nearly cancel: to their size
            atol = INFO_RTOL_DEFAULT * float(terms.abs().mean()) if terms is not None else 0.0
            if key == "pi_entropy" and "pi_action" in inter:
                atol += squash_ulp_sensitivity(inter["pi_action"])
            report.checks.append(close(f"update {k}: {key}", ours.float().mean(), ref, INFO_RTOL_DEFAULT, atol))
        report.checks.append(close(f"update {k}: scale after", agent.scale.reshape(-1), call["scale_after"].reshape(-1),
                                   INFO_RTOL_DEFAULT))

    run_updates(agent, fx, compare)
    _, after = reference_to_ours(fx.load("checkpoint_after.pt")["model"], str(fx.path / "checkpoint_after.pt"),
                                 fx.tasks or None)
    ours_sd = agent.model.state_dict()
    for key, ref in after.items():
        if key not in ours_sd:
            report.checks.append(Check(f"weights: {key}", math.inf, math.inf, "present", False, "not in our model"))
        elif torch.equal(ref, before[key]):
            report.checks.append(close(f"weights: {key} (unchanged)", ours_sd[key], ref, 0.0))
        else:
            report.checks.append(moved(f"weights: {key}", ours_sd[key], ref, before[key], WEIGHTS_MOVED_FRAC))
    report.checks += check_adam(fx, agent)
    return report


def squash_ulp_sensitivity(action: Tensor) -> float:
    """How far the mean entropy moves when every action moves by one float32 ulp toward 0: its tanh correction
    log(1 - a^2 + 1e-6) hangs on the last bit where |a| rounds to 1 (0.11 an element), and a compiled tanh rounds
    differently from ATen's. The metric only: the loss's bonus (scaled_entropy) has no such term."""
    def squash(a: Tensor) -> Tensor:
        return torch.log(torch.relu(1 - a.pow(2)) + 1e-6)
    return float((squash(torch.nextafter(action, torch.zeros_like(action))) - squash(action)).abs().mean())


def rounding_sensitivity(fx: Fixture, relative: float = 1e-7, seeds: int = 3) -> list[str]:
    """How much the weights after the fixture's updates hang on float32 rounding, in our own implementation: the
    updates rerun from start weights multiplied by (1 + relative N(0, 1)) (1e-7: about one ulp), each tensor's
    largest difference from the unperturbed run as a fraction of the reference's largest move, worst first. The
    same measure as the weights' check, so its tolerance can be read against it."""
    agent, before = build_agent(fx)
    run_updates(agent, fx, lambda *_: None)
    base = {k: v.clone() for k, v in agent.model.state_dict().items()}
    _, after = reference_to_ours(fx.load("checkpoint_after.pt")["model"], str(fx.path / "checkpoint_after.pt"),
                                 fx.tasks or None)
    worst: dict[str, float] = {}
    for seed in range(seeds):
        agent, _ = build_agent(fx)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in agent.model.parameters():
                p.mul_(1 + relative * torch.randn(p.shape, generator=g))
        run_updates(agent, fx, lambda *_: None)
        for key, value in agent.model.state_dict().items():
            move = float((after[key].double() - before[key].double()).abs().max())
            if move > 0:
                frac = float((value.double() - base[key].double()).abs().max()) / move
                worst[key] = max(worst.get(key, 0.0), frac)
    ranked = sorted(worst.items(), key=lambda kv: -kv[1])
    return [f"rounding sensitivity: start weights x (1 + {relative:g} N(0, 1)), {seeds} draws: the weights after the "
            f"updates move by up to {ranked[0][1]:.3g} of the largest move ({ranked[0][0]}); then "
            + ", ".join(f"{k} {v:.3g}" for k, v in ranked[1:4])]


def check_adam(fx: Fixture, agent: Agent) -> list[Check]:
    """Each parameter's Adam step count and moments (tensors, or a compact fixture's float64 sums and norms)."""
    saved = fx.load("optim_after.pt")
    params = dict(agent.model.named_parameters())
    checks = []
    for optim_key, ours_optim in (("optim", agent.optim), ("pi_optim", agent.pi_optim)):
        state, names = saved[optim_key], saved.get(f"{optim_key}_param_names") or saved[optim_key].get("param_names")
        flat = [n for group in names for n in group] if names and isinstance(names[0], list) else list(names)
        by_name = _adam_states(state, flat)
        for ref_name, st in by_name.items():
            ours_name = reference_key(ref_name)
            p = params.get(ours_name)
            if p is None or p not in ours_optim.state:
                checks.append(Check(f"adam {ref_name}", math.inf, math.inf, "present", False,
                                    f"{ours_name}: no Adam state here"))
                continue
            mine = ours_optim.state[p]
            checks.append(close(f"adam {ours_name}: step", mine["step"], st["step"], 0.0))
            for moment in ("exp_avg", "exp_avg_sq"):
                ref = st[moment]
                atol = ADAM_ATOL_SQ if moment == "exp_avg_sq" else 0.0
                if isinstance(ref, Tensor):
                    checks.append(_moment_check(f"adam {ours_name}: {moment}", mine[moment], ref, atol))
                else:
                    # a signed sum cancels: held to its abs-sum's size
                    checks += [close(f"adam {ours_name}: {moment} {stat}", value, ref[stat], ADAM_RTOL,
                                     atol + (ADAM_RTOL * ref["abs_sum"] if stat == "sum" and "abs_sum" in ref else 0.0))
                               for stat, value in _summary(mine[moment]).items() if stat in ref]
    return checks


def _moment_check(name: str, ours: Tensor, ref: Tensor, atol: float) -> Check:
    """Adam moments, held to ADAM_RTOL of the tensor's largest element (an element near zero is all rounding)."""
    scale = float(ref.abs().max())
    c = close(name, ours, ref, 0.0, ADAM_RTOL * scale + atol)
    return dataclasses.replace(c, max_rel=c.max_abs / scale if scale else c.max_abs,
                               tol=f"{ADAM_RTOL:g} of its largest element {scale:.3g}", note="rel: of the largest element")


def _adam_states(state: dict, names: list[str]) -> dict[str, dict]:
    """name -> {step, exp_avg, exp_avg_sq} from a torch Adam state dict (indexed by position) or a compact summary."""
    inner = state.get("state", state)
    if all(isinstance(k, int) for k in inner):
        return {names[i]: st for i, st in inner.items()}
    return dict(inner)


def _summary(t: Tensor) -> dict[str, float]:
    """A compact fixture's statistics of a moment, computed in float64."""
    x = t.double()
    return {"sum": float(x.sum()), "abs_sum": float(x.abs().sum()), "l2": float(x.norm()),
            "max_abs": float(x.abs().max())}


# --- plan -----------------------------------------------------------------------------------------------------------

# Planning: the values of the candidates agree to PLAN_VALUE_RTOL (float32 sums over the horizon of values near 200
# here); the elites' softmax at temperature 0.5 turns a value difference d into a weight difference of 0.5 d, so the
# actions, the mean kept for the warm start and the std (all in [-1, 1] or [min_std, max_std]) get PLAN_ATOL.
PLAN_VALUE_RTOL, PLAN_ATOL = 2e-5, 1e-4


def plan_draws(draws: list[dict], agent: Agent, eval_mode: bool) -> dict[str, list[Tensor]]:
    """The reference's draws of one _plan call (one env), assembled into our planner's draws (GaussianMPPI.draw_views)."""
    c, A = agent.planner_cfg, agent.dims.action_dim
    if c.horizon != agent.cfg.horizon:
        raise ParityError("the fixture plans over the training horizon; this config plans over another")
    flat = torch.zeros(GaussianMPPI.draw_size(c, 1, A))
    views = GaussianMPPI.draw_views(flat, c, 1, A)
    by_name: dict[str, list[Tensor]] = {}
    for d in draws:
        by_name.setdefault(d["name"], []).append(d["value"])
    expected = {"_plan.pi_eps": c.horizon, "_plan.mppi_noise": c.iterations, "_estimate_value.pi_eps": c.iterations,
                "_estimate_value.q_pair_perm": c.iterations, "_plan.gumbel_exponential": 1}
    for name, n in expected.items():
        if len(by_name.get(name, [])) != n:
            raise ParityError(f"the fixture records {len(by_name.get(name, []))} '{name}' draws; "
                              f"this config's plan makes {n}")
    for t, eps in enumerate(by_name["_plan.pi_eps"]):
        views["prior"][t, 0] = eps
    for i in range(c.iterations):
        views["noise"][i, :, 0] = by_name["_plan.mppi_noise"][i]
        views["value"][i, 0] = by_name["_estimate_value.pi_eps"][i]
    if not eval_mode:
        views["action"][0] = by_name["_plan.action_noise"][0]
    pairs = torch.stack([p[:2] for p in by_name["_estimate_value.q_pair_perm"]])
    return {"plan.normal": [flat], "plan.q_pairs": [pairs],
            "plan.exponential": [by_name["_plan.gumbel_exponential"][0].view(1, -1)]}


def run_plans(fx: Fixture, precision: Literal["fp32", "bf16"] = "fp32") -> tuple[list[dict], list[dict[str, Tensor]]]:
    """The fixture's plan calls, in order, on a fresh agent from the start weights: (reference calls, ours)."""
    fx = dataclasses.replace(fx, cfg=dataclasses.replace(fx.cfg, precision=precision))
    agent, _ = build_agent(fx)
    io = fx.load("plan_io.pt")
    rec = Recorded()
    agent.use_random(rec)
    obs = io["obs"]
    results = []
    for call in io["calls"]:
        eval_mode = bool(call["eval_mode"])
        rec.set(plan_draws(io["draws"][:int(call["num_draws"])], agent, eval_mode))
        action = agent.act(obs[0].numpy(), first_step=bool(call["t0"]), eval_mode=eval_mode)
        planner = agent.planner(1, "eval" if eval_mode else "train")
        assert isinstance(planner, GaussianMPPI)
        P, E = agent.planner_cfg.num_pi_trajs, agent.planner_cfg.num_elites
        elites = torch.topk(planner.value[0], E).indices
        results.append({"action": torch.as_tensor(action), "prev_mean_out": planner.prev_mean[:, 0].clone(),
                        "final_std": planner.std[:, 0].clone(), "pi_actions": planner.actions[:, 0, :P].clone(),
                        "final_value": planner.value[0].clone(), "final_elites": elites})
    return io["calls"], results


def check_plan(fx: Fixture) -> Report:
    """The fixture's four plans in fp32 planning: the action, the mean kept for the warm start, the final std, the
    prior's rollout actions and the last iteration's elite set."""
    report = Report()
    calls, ours = run_plans(fx)
    for call, mine in zip(calls, ours):
        label = call["label"]
        report.checks += [
            close(f"plan {label}: action", mine["action"], call["action"], 0.0, PLAN_ATOL),
            close(f"plan {label}: mean kept (prev_mean)", mine["prev_mean_out"], call["prev_mean_out"], 0.0, PLAN_ATOL),
            close(f"plan {label}: final std", mine["final_std"], call["final_std"], 0.0, PLAN_ATOL),
            close(f"plan {label}: prior's actions", mine["pi_actions"], call["pi_actions"], 0.0, PLAN_ATOL),
            close(f"plan {label}: last iteration's values", mine["final_value"], call["iter_value"][-1].view(-1),
                  PLAN_VALUE_RTOL)]
        same = set(mine["final_elites"].tolist()) == set(call["iter_elite_idxs"][-1].tolist())
        report.checks.append(Check(f"plan {label}: elite set", 0.0 if same else 1.0, 0.0 if same else 1.0,
                                   "the same candidates", same))
    return report


def bf16_distance(fx: Fixture) -> list[str]:
    """How far bf16 planning is from the reference's fp32 plans: the elite set and the action's error, per call."""
    calls, ours = run_plans(fx, "bf16")
    lines = []
    for call, mine in zip(calls, ours):
        ref_elites = set(call["iter_elite_idxs"][-1].tolist())
        shared = len(ref_elites & set(mine["final_elites"].tolist()))
        err = float((mine["action"].double() - call["action"].double()).abs().max())
        lines.append(f"bf16 plan {call['label']}: {shared} of {len(ref_elites)} final elites shared, "
                     f"action max abs error {err:.3g}")
    return lines


# --- deliberate differences -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Deviation:
    """A deliberate difference from the reference (docs/deviations.md), how to turn it off, and whether a fixture
    exercises it."""

    name: str
    off: dict[str, Any]  # Config fields that give the reference's behaviour ({} when update/plan do not see it)
    exercised: Callable[[Fixture], bool]
    why_not: str  # said when a fixture does not exercise it


DEVIATIONS = (
    Deviation("policy loss masked after a terminal step", {"mask_policy_after_terminal": False},
              lambda fx: bool(fx.cfg.episodic and fx.meta.get("fixture", {}).get("terminated_columns")),
              "no terminal step in the fixture's batch"),
    Deviation("sub-trajectories sampled up to a terminal step, the steps after it masked", {},
              lambda fx: False, "the replay buffer's sampling: a fixture gives its batch"),
    Deviation("discrete actions planned one step ahead", {},
              lambda fx: False, "continuous actions (the reference has no discrete planner)"),
)


def check(path: str | Path, compile: bool = False, keep_deviations: bool = False) -> tuple[Report, list[str]]:
    """Every comparison of a fixture; the lines that say which deliberate differences were off, and bf16's distance."""
    fx = read_fixture(path, compile=compile)
    lines = []
    for dev in DEVIATIONS:
        if not dev.exercised(fx):
            lines.append(f"deviation '{dev.name}': not exercised here ({dev.why_not})")
        elif keep_deviations:
            lines.append(f"deviation '{dev.name}': kept (--keep-deviations): differences below may be it")
        else:
            fx = dataclasses.replace(fx, cfg=dataclasses.replace(fx.cfg, **dev.off))
            lines.append(f"deviation '{dev.name}': off, as the reference (results agree with the reference when it "
                         f"is off)")
    report = check_update(fx)
    plans = check_plan(fx)
    report.checks += plans.checks
    report.notes += plans.notes
    return report, lines + bf16_distance(fx)
