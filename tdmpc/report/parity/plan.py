"""The fixture's plan calls: the action, the mean kept for the warm start, the std, the prior's rollouts, the values and
the elite set; and how far bf16 planning is from them."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from tdmpc.agent import Agent
from tdmpc.planners.mppi import GaussianMPPI

from .compare import Check, Report, close
from .fixture import Fixture, ParityError, Recorded, build_agent

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
    io, calls = fx.calls("plan_io.pt")
    rec = Recorded()
    agent.use_random(rec)
    obs = io["obs"]
    results = []
    for call in calls:
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
    return calls, results


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
