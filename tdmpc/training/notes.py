"""The lines a run says before it starts about what its settings do that they do not say: settings given that
do nothing here (CUDA-only ones off CUDA, another kind of action's), an end past --steps, its ranks' global batch."""

from __future__ import annotations

import torch

from tdmpc.config import Config
from tdmpc.multitask import TaskSetup
from tdmpc.runtime import distributed
from tdmpc.runtime.args import named


def run_notes(cfg: Config, tasks: TaskSetup | None, shard: distributed.Shard, from_python: bool) -> list[str]:
    """What a run's settings do that they do not say: its ranks' global batch, a multi-task run's tasks that can
    terminate, an end past --steps (whole steps of its envs) or within its seed steps."""
    notes = []
    if shard.world > 1:
        notes.append(f"data-parallel: {shard.world} processes, global batch {shard.world * cfg.batch_size} "
                     f"({named('batch_size', cfg.batch_size, from_python)} per process)")
    if ending := [i.name for i in tasks.infos if i.episodic and i.name in tasks.tasks] if tasks else []:
        notes.append(f"note: {', '.join(ending)} can terminate, but a multi-task model has no termination head (as "
                     f"the reference's): TD targets stop at those endings, planning does not foresee them")
    envs = cfg.num_envs * (len(tasks.tasks) if tasks else 1)  # num_envs per task
    per = 1 if cfg.dataset else envs * (cfg.action_repeat or 1)  # env steps a step of the envs counts
    end = -(-cfg.steps // per) * per
    if not cfg.dataset and end < (cfg.seed_steps or 0):
        notes.append(f"note: the run ends at step {end:,}, within its {cfg.seed_steps:,} seed steps: it acts at "
                     f"random and makes no update (raise {named('steps', None, from_python)} or lower "
                     f"{named('seed_steps', None, from_python)})")
    elif end != cfg.steps:
        notes.append(f"note: the run ends at step {end:,}, the first whole step of its {envs} envs x action "
                     f"repeat {cfg.action_repeat or 1} at or after {'steps=' if from_python else '--steps '}"
                     f"{cfg.steps:,}")
    return notes


CONTINUOUS_ONLY = ("entropy_bonus", "min_std", "max_std", "log_std_min", "log_std_max")  # docs/discrete.md
DISCRETE_ONLY = ("min_prob", "uniform_prior_coef")


def unused_setting_notes(cfg: Config, discrete: bool, given: frozenset[str], from_python: bool = False) -> list[str]:
    """A line for settings given explicitly that this run never reads: said, not refused (a config shared between
    tasks keeps them); from_python: named as fit()'s keywords."""
    kind, unused = ("discrete", CONTINUOUS_ONLY) if discrete else ("continuous", DISCRETE_ONLY)
    names = [named(n, None, from_python) for n in unused if n in given]
    notes = [f"note: {', '.join(names)} do{'es' if len(names) == 1 else ''} nothing with {kind} actions "
             f"({cfg.task}); docs/discrete.md"] if names else []
    if cfg.save_video and not cfg.eval_episodes:
        notes.append(f"note: {named('save_video', None, from_python)} records evaluation episodes, and "
                     f"{named('eval_episodes', 0, from_python)} plays none")
    return notes


def cuda_only_notes(cfg: Config, device: torch.device | None, given: frozenset[str],
                    from_python: bool = False) -> list[str]:
    """A line for each CUDA-only setting given explicitly (flag or keyword) to a run where it does nothing (another
    device; --update-stream without overlapped updates): said, not refused, as a config shared between machines
    keeps it on. cfg: the run's, its overlap_updates resolved; from_python: named as fit()'s keywords."""
    if device is None:  # a dry run for a device not here, planned as asked
        return []
    notes = []
    if device.type != "cuda" and "cuda_graphs" in given and cfg.cuda_graphs:
        notes.append(f"note: {named('cuda_graphs', None, from_python)} does nothing on the {device.type.upper()}: "
                     f"CUDA graphs replay CUDA kernels, so plan() and update() run eagerly here")
    if "update_stream" in given and cfg.update_stream and (device.type != "cuda" or not cfg.overlap_updates):
        why = (f"on the {device.type.upper()}" if device.type != "cuda"
               else f"without {named('overlap_updates', None, from_python)} (off for this run)")
        notes.append(f"note: {named('update_stream', None, from_python)} does nothing {why}: it runs overlapped "
                     f"CUDA updates on a stream of their own, so updates run in order here")
    return notes
