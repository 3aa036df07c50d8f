"""Fitting a config to a card: the --fit-memory ladder, a run's memory plan, and what --dry-run prints.

The estimate itself is tdmpc.memory.peak; this module decides what to do with it before a run starts.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import torch

from tdmpc.config import MODEL_SIZES, SIZE_FIELDS, Config
from tdmpc.memory.peak import ALLOCATOR_SLACK, SAFETY_MARGIN, MemoryEstimate, Target, detect_target, estimate
from tdmpc.runtime.args import named
from tdmpc.runtime.files import fmt_bytes

if TYPE_CHECKING:
    from tdmpc.multitask import TaskSetup

MIN_BATCH_SIZE, MIN_NUM_SAMPLES = 64, 256  # --fit-memory lowers no further


# --- fitting a config to the budget ------------------------------------------------------
@dataclass
class Change:
    """One lowered setting (or a few that go together), with the estimate before and after."""

    values: dict[str, tuple[Any, Any]]  # field -> (old, new)
    before: int
    after: int

    def describe(self) -> str:
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in self.values.items())
        return f"{what} (estimate {fmt_bytes(self.before)} -> {fmt_bytes(self.after)})"


Step = Callable[[Config, Target, bool], Optional[dict]]


def _buffer_to_host(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    return {"buffer_device": "host"} if target.cuda and cfg.buffer_device == "device" else None


def _graphs_off(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    return {"cuda_graphs": False} if target.cuda and cfg.cuda_graphs else None


def _halve_envs(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    return {"num_envs": cfg.num_envs // 2} if cfg.num_envs > 1 and not resuming else None


def _halve_batch(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    return {"batch_size": max(cfg.batch_size // 2, MIN_BATCH_SIZE)} if cfg.batch_size > MIN_BATCH_SIZE else None


def _halve_samples(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    if cfg.num_samples <= MIN_NUM_SAMPLES:
        return None
    S = max(cfg.num_samples // 2, MIN_NUM_SAMPLES)
    out: dict = {"num_samples": S}
    P = min(cfg.num_pi_trajs, S // 2)
    if P != cfg.num_pi_trajs:
        out["num_pi_trajs"] = P
    if cfg.num_elites > S - P:
        out["num_elites"] = S - P
    return out


def _smaller_model(cfg: Config, target: Target, resuming: bool) -> Optional[dict]:
    sizes = sorted(MODEL_SIZES)
    if resuming or cfg.model_size not in sizes[1:] or any(getattr(cfg, n) is not None for n in SIZE_FIELDS):
        return None
    return {"model_size": sizes[sizes.index(cfg.model_size) - 1]}


# --fit-memory's order: settings that cost only speed first, the reference hyperparameters last.
LADDER: tuple[tuple[str, Step], ...] = (
    ("replay buffer to pinned host memory (buffer_device device -> host)", _buffer_to_host),
    ("CUDA graphs off", _graphs_off),
    ("halve num_envs (not when resuming)", _halve_envs),
    (f"halve batch_size, not below {MIN_BATCH_SIZE}", _halve_batch),
    (f"halve num_samples, not below {MIN_NUM_SAMPLES} (num_elites, num_pi_trajs kept valid)", _halve_samples),
    ("the next smaller model_size preset (not when resuming)", _smaller_model),
)
FIT_ORDER = "; ".join(f"{i + 1}. {name}" for i, (name, _) in enumerate(LADDER))


@dataclass
class MemoryPlan:
    """A config's estimate on a target, and the way to fit it.

    `cfg` is the config to run: as given, or lowered when fitting was asked for.
    `changes` are the ladder steps applied (fit=True) or the ones that would be needed."""

    cfg: Config
    target: Target
    estimate: MemoryEstimate
    buffer_on_device: bool
    auto_host: bool  # buffer_device 'auto' put the replay buffer in host memory
    changes: list[Change]
    applied: bool
    reachable: bool  # the ladder (or nothing) reaches a fit
    chunked_from: int | None = None  # plan_chunk_envs unset and chosen: the estimate with all envs at once
    runs_on: str | None = None  # a card of --gpu-mem planned for a run on this other device ('cpu'): said so
    from_python: bool = False  # tdmpc.fit's run: its messages name fit's keywords, not the command line's flags

    def _name(self, field: str, value: object = None) -> str:
        return named(field, value, self.from_python)

    def _off_card(self) -> str:
        """What is true for a run that is not on the card planned for (a CPU run given --gpu-mem)."""
        return (f"this run is on the {self.runs_on.upper() if self.runs_on == 'cpu' else self.runs_on}: all of it is "
                f"host memory, and {self._name('gpu_mem')} caps nothing")

    @property
    def fits(self) -> bool:
        return self.target.budget is None or self.estimate.total <= self.target.budget

    def verdict(self) -> str:
        t, e = self.target, self.estimate
        if t.capacity is None:
            return ("verdict: no CUDA device here, so no GPU budget; the estimate above is host memory. "
                    f"Plan for a card with {self._name('gpu_mem', '16GB')}")
        where = "on the device" if self.buffer_on_device else "in pinned host memory"
        if self.runs_on:
            where = f"{where.replace('the device', 'the card')}, for a run on one ({self._off_card()})"
        return (f"verdict: {'FITS' if self.fits else 'DOES NOT FIT'} {t.label} ({fmt_bytes(t.capacity)}): "
                f"estimate {fmt_bytes(e.total)}, budget {fmt_bytes(t.budget)} (the card less a "
                f"{SAFETY_MARGIN:.0%} safety margin), headroom {1 - e.total / t.capacity:.0%}; replay buffer {where}")

    def advice(self) -> str:
        """What to lower ('' when nothing needs to change)."""
        name = self._name
        if not self.changes:
            return "" if self.fits else (f"no setting that {name('fit_memory')} lowers is left: use a smaller "
                                         f"{name('model_size')}, a shorter {name('horizon')} or a larger card")
        if self.applied:
            done = "fit-memory changed: " + "; ".join(c.describe() for c in self.changes)
            return done if self.fits else done + f"; still too large: use a smaller {name('model_size')} or a larger card"
        flags = self.flags()
        if not self.reachable:
            return f"even {flags} leaves {fmt_bytes(self.changes[-1].after)}: use a larger card"
        return f"lower: {flags} (or pass {name('fit_memory', True)} to apply these)"

    def lowered(self) -> dict[str, Any]:
        """The changes, each setting once with its final value."""
        return {k: new for c in self.changes for k, (_, new) in c.values.items()}

    def flags(self) -> str:
        """The changes as command-line flags (or tdmpc.fit's keywords)."""
        return (", " if self.from_python else " ").join(self._name(k, v) for k, v in self.lowered().items())

    def error(self) -> str:
        """One line for BadInput."""
        t = self.target
        host = " even with the replay buffer in host memory" if self.auto_host or not self.buffer_on_device else ""
        return (f"estimated peak memory {fmt_bytes(self.estimate.total)} exceeds the budget {fmt_bytes(t.budget)} of "
                f"{t.label}{host}; {self.advice()}")

    def host_error(self, available: int) -> str | None:
        """One line when what the run keeps in host memory (all of it without CUDA, else a host-stored replay
        buffer) exceeds the `available` bytes; None when it fits."""
        e = self.estimate
        need, buffer = (e.host_buffer, e.host_buffer) if self.target.cuda else (e.total, e.replay_buffer)
        if need <= available:
            return None
        per_row = buffer * (1 if self.target.cuda else 1 + ALLOCATOR_SLACK) / self.cfg.buffer_size  # slack: CPU's too
        rows = max(0, int((available - (need - per_row * self.cfg.buffer_size)) / max(per_row, 1e-9)))
        return (f"the run needs about {fmt_bytes(need)} of host memory ({fmt_bytes(buffer)} of it the replay buffer "
                f"of {self.cfg.buffer_size:,} transitions), and {fmt_bytes(available)} is available here: lower "
                f"{self._name('buffer_size')} (about {rows:,} transitions fit)")

    def chunk_line(self) -> str:
        """What choosing plan_chunk_envs did ('' when it was given or not needed)."""
        if self.chunked_from is None:
            return ""
        return (f"plan_chunk_envs auto: plan() rolls out {self.cfg.plan_chunk_envs} envs' candidates per model call "
                f"(estimate {fmt_bytes(self.chunked_from)} with all at once -> {fmt_bytes(self.estimate.total)}); "
                f"the plans are the same")

    def report(self, heading: str) -> str:
        lines = [heading, self.estimate.table(), self.verdict()]
        if self.chunk_line():
            lines.append(self.chunk_line())
        if self.auto_host:
            lines.append(f"buffer_device auto: the replay buffer ({fmt_bytes(self.estimate.host_buffer)}) goes to "
                         f"pinned host memory, as the whole estimate would not fit with it on the device")
        if self.advice():
            lines.append(self.advice())
        return "\n".join(lines)


def assess(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, episodic: bool, target: Target,
           fit: bool = False, resuming: bool = False, log: Callable[[str], None] | None = None,
           tasks: TaskSetup | None = None, discrete: bool = False, tensor_envs: bool = False) -> MemoryPlan:
    """Estimate `cfg` on `target` (the run's shape as `estimate` takes it). An unset plan_chunk_envs becomes the most envs per planning model call that
    fit, when all at once would not (the plans are the same); buffer_device 'auto' moves the replay buffer to
    host memory when the whole does not fit; beyond that, walk LADDER until it fits, applying each step
    (fit=True, each one logged) or only listing them as advice. A user's settings change only
    with fit=True."""
    budget = target.budget

    def est(c: Config, on_device: bool) -> MemoryEstimate:
        return estimate(c, obs_shape, action_dim, episodic, target, on_device, tasks, discrete, tensor_envs)

    on_device = cfg.buffer_device != "host" or not target.cuda  # without CUDA all of it is host memory
    given = est(cfg, on_device)
    chunked_from = None  # the estimate planning all envs at once, when chunks were chosen instead
    if target.cuda and budget is not None and given.total > budget and cfg.plan_chunk_envs is None and cfg.mpc:
        unchunked = given.total
        cfg, given = _chunk_planning(cfg, given, lambda c: est(c, on_device), budget,
                                     cfg.num_envs * (len(tasks.tasks) if tasks else 1))
        chunked_from = unchunked if cfg.plan_chunk_envs is not None else None
    auto_host = (target.cuda and budget is not None and given.total > budget and cfg.buffer_device == "auto")
    if auto_host:
        on_device = False
        given = est(cfg, on_device)
    current, e, changes = cfg, given, []
    if budget is not None:
        for _, step in LADDER:
            while e.total > budget and (lowered := step(current, target, resuming)):
                before = {k: getattr(current, k) for k in lowered}
                current = dataclasses.replace(current, **lowered)
                on_device = on_device and current.buffer_device != "host"
                new = est(current, on_device)
                changes.append(Change({k: (before[k], v) for k, v in lowered.items()}, e.total, new.total))
                if fit and log is not None:
                    log(f"fit-memory: {changes[-1].describe()}")
                e = new
    reachable = budget is None or e.total <= budget
    if fit and auto_host and changes and budget is not None and (back := est(current, True)).total <= budget:
        e, on_device, auto_host = back, True, False  # lowered settings made room for the buffer again
    if fit:
        return MemoryPlan(current, target, e, on_device, auto_host, changes, True, reachable, chunked_from)
    return MemoryPlan(cfg, target, given, (cfg.buffer_device != "host" or not target.cuda) and not auto_host, auto_host,
                changes, False, reachable, chunked_from)


def _chunk_planning(cfg: Config, given: MemoryEstimate, est: Callable[[Config], MemoryEstimate], budget: int,
                    num_envs: int) -> tuple[Config, MemoryEstimate]:
    """Halve the envs per planning model call until the run fits; if none fits, the smallest estimate chunking
    reaches (other settings must then give way). cfg unchanged when chunking does not lower the estimate."""
    best, chunk = (cfg, given), num_envs
    while chunk > 1:
        chunk = (chunk + 1) // 2
        trial = dataclasses.replace(cfg, plan_chunk_envs=chunk)
        e = est(trial)
        if e.total < best[1].total:
            best = (trial, e)
        if e.total <= budget:
            break
    return best


# --- a run's plan, decided once before it starts -------------------------------------------
def assess_run(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, episodic: bool,
               device: torch.device | None, gpu_mem: str | None = None, fit: bool = False,
               resuming: bool = False, tasks: TaskSetup | None = None, discrete: bool = False,
               tensor_envs: bool = False, from_python: bool = False) -> MemoryPlan:
    """The estimate for this run on this device (or a card of `gpu_mem`), with the replay buffer's place
    decided; with fit=True, lowered settings (each change printed). `plan.cfg` is the config to run; from_python:
    its messages name tdmpc.fit's keywords."""
    target = detect_target(cfg, device, gpu_mem, from_python)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    plan = assess(cfg, obs_shape, action_dim, episodic, target, fit=fit, resuming=resuming, log=log, tasks=tasks,
                  discrete=discrete, tensor_envs=tensor_envs)
    if target.cuda and device is not None and device.type != "cuda":
        plan.runs_on = device.type
    plan.from_python = from_python
    return plan


def buffer_storage(p: MemoryPlan, device: torch.device) -> torch.device:
    """Where the replay buffer lives: on the device, or in (pinned) host memory."""
    return device if p.buffer_on_device and p.cfg.buffer_device != "host" else torch.device("cpu")


def dry_run_report(p: MemoryPlan, obs_shape: tuple[int, ...], action_dim: int, device: torch.device | None,
                   discrete: bool = False) -> str:
    """What --dry-run prints: the run's settings, the breakdown and the verdict."""
    actions = f"{action_dim} discrete actions" if discrete else f"action dim {action_dim}"
    cfg, s = p.cfg, p.cfg.sizes()
    size = f"model size {cfg.model_size}" if cfg.model_size else "custom model"
    where = device if device is not None else f"{cfg.device} (not available here)"
    return (f"dry run: {cfg.task} (obs {obs_shape} {cfg.obs}, {actions}), device {where}, "
            f"run dir {cfg.run_dir}\n"
            f"{size}: enc_dim {s['enc_dim']}, mlp_dim {s['mlp_dim']}, latent_dim {s['latent_dim']}, num_q {s['num_q']}; "
            f"num_envs {cfg.num_envs}, batch_size {cfg.batch_size}, num_samples {cfg.num_samples}, horizon "
            f"{cfg.horizon}, buffer_size {cfg.buffer_size:,}\n"
            + p.report(f"peak device memory estimate for {p.target.label}:"))


def summary_line(p: MemoryPlan) -> str | None:
    """One line before a real run on a card: estimate, budget, headroom, where the buffer is."""
    t, e = p.target, p.estimate
    if t.capacity is None or not p.fits:
        return None
    assert t.budget is not None
    if p.runs_on:
        return (f"memory: estimate {fmt_bytes(e.total)} for a run on {t.label} (a {fmt_bytes(t.budget)} budget, "
                f"headroom {1 - e.total / t.capacity:.0%}); {p._off_card()}")
    return (f"memory: estimate {fmt_bytes(e.total)} of a {fmt_bytes(t.budget)} budget on {t.label}, headroom "
            f"{1 - e.total / t.capacity:.0%}; replay buffer "
            + ("on the device" if p.buffer_on_device else "in pinned host memory"))


def out_of_memory_report(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, episodic: bool,
                         target: Target, buffer_on_device: bool, device: torch.device,
                         discrete: bool = False, tasks: TaskSetup | None = None,
                         tensor_envs: bool = False) -> tuple[str, dict[str, Any]]:
    """After running out of device memory: the estimate beside torch's own peak, and the settings that take
    the estimate 25% lower (what a resume may change; empty where none would)."""
    where: Literal["device", "host"] = "device" if buffer_on_device else "host"

    def on(c: Config, t: Target) -> MemoryPlan:
        return assess(c, obs_shape, action_dim, episodic, t, resuming=True, tasks=tasks, discrete=discrete,
                      tensor_envs=tensor_envs)

    p = on(dataclasses.replace(cfg, buffer_device=where), target)
    est = p.estimate
    if device.type == "cuda":
        actual = (f"actual peak {fmt_bytes(torch.cuda.max_memory_allocated(device))} allocated, "
                  f"{fmt_bytes(torch.cuda.max_memory_reserved(device))} reserved")
    else:
        actual = "actual peak not measurable here (no CUDA device)"
    lower = dataclasses.replace(target, capacity=int(0.75 * est.total / (1 - SAFETY_MARGIN)))
    return (f"memory: estimate {fmt_bytes(est.total)} in all, {fmt_bytes(est.peak_allocated)} of tensors at the "
            f"peak, on {target.label}; {actual}."), on(p.cfg, lower).lowered()
