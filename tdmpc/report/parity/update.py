"""The fixture's update calls: info values, the running scale, weights and target Qs after them, Adam's state."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch import Tensor

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.model.reference import reference_key, reference_to_ours

from .compare import Check, Report, close, moved
from .fixture import Fixture, ParityError, Recorded, build_agent

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
    for k, call in enumerate(fx.calls("update_io.pt")[1], 1):
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
