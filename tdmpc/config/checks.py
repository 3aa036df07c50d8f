"""validate: every field of a Config checked before anything heavy, one line naming the first bad field.

Whether `planner` names a registered planner is checked where planners are made (tdmpc.planners.make), which
every run reaches before it trains (the memory estimate builds its planners): the registry is above this layer.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields
from typing import Literal

from tdmpc.config.fields import MODEL_SIZES, Config, field_types
from tdmpc.errors import ConfigError
from tdmpc.runtime.args import named
from tdmpc.tasks.sets import expand, gymnasium_form


def validate(cfg: Config, from_python: bool = False) -> Config:
    """Check every field; raise ConfigError with one line naming the first bad field (its advice names tdmpc.fit's
    keywords with from_python, else the command line's flags)."""

    def bad(name: str, why: str) -> ConfigError:
        return ConfigError(f"config field '{name}' = {getattr(cfg, name)!r}: {why}")

    positive = ("steps", "num_envs", "update_every", "batch_size", "buffer_size", "iterations",
                "num_samples", "num_elites", "horizon", "num_channels", "simnorm_dim", "eval_freq",
                "save_every", "log_every", "updates_per_round")
    for field in fields(cfg):  # inf or nan in any float field (--lr inf) is never meant
        value = getattr(cfg, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(field.name, "must be a finite number")
    for name in positive:  # updates_per_round may be None (chosen later)
        if (value := getattr(cfg, name)) is not None and value < 1:
            raise bad(name, "must be >= 1")
    if cfg.seed < 0:
        raise bad("seed", "must be >= 0 (gymnasium and numpy take non-negative seeds)")
    if cfg.seed >= 2**32:  # its evaluations' seed (tdmpc.episodes.eval_seed) must fit torch's 64-bit seed
        raise bad("seed", "must be < 2**32")
    for name in ("num_pi_trajs", "eval_episodes"):
        if (getattr(cfg, name) or 0) < 0:
            raise bad(name, "must be >= 0")
    if cfg.plan_horizon is not None and cfg.plan_horizon < 1:
        raise bad("plan_horizon", "must be >= 1 (or unset: horizon)")
    if cfg.plan_chunk_envs is not None and cfg.plan_chunk_envs < 1:
        raise bad("plan_chunk_envs", "must be >= 1 (or unset: chosen from the memory estimate)")
    for name in ("lr", "grad_clip_norm", "temperature", "min_std", "max_std", "discount_denom"):
        if not getattr(cfg, name) > 0:
            raise bad(name, "must be > 0")
    for name in ("consistency_coef", "reward_coef", "value_coef", "termination_coef",
                 "entropy_coef", "uniform_prior_coef", "enc_lr_scale"):
        if getattr(cfg, name) < 0:
            raise bad(name, "must be >= 0")
    for name in ("rho", "tau"):
        if not 0 < getattr(cfg, name) <= 1:
            raise bad(name, "must be in (0, 1]")
    if not 0 <= cfg.min_prob <= 1:
        raise bad("min_prob", "must be in [0, 1] (the weight of uniform probabilities in each refit)")
    if not 0 <= cfg.dropout < 1:
        raise bad("dropout", "must be in [0, 1)")
    if not 0 < cfg.discount_min <= cfg.discount_max < 1:
        raise bad("discount_min", "need 0 < discount_min <= discount_max < 1")
    if cfg.seed_steps is not None and cfg.seed_steps < 1:
        raise bad("seed_steps", "must be >= 1: learning starts from the data of the seed steps")
    if cfg.action_repeat is not None and cfg.action_repeat < 1:
        raise bad("action_repeat", "must be >= 1")
    # num_elites first where it is what is too large: {num_samples: 8, num_elites: 32} names num_elites, not the
    # num_pi_trajs default the user never set.
    if cfg.num_pi_trajs < cfg.num_samples and cfg.num_elites > cfg.num_samples - cfg.num_pi_trajs:
        raise bad("num_elites", f"must be <= num_samples - num_pi_trajs "
                                f"({cfg.num_samples} - {cfg.num_pi_trajs} = {cfg.num_samples - cfg.num_pi_trajs})")
    if cfg.num_elites > cfg.num_samples:
        raise bad("num_elites", f"must be <= num_samples ({cfg.num_samples})")
    if cfg.num_pi_trajs >= cfg.num_samples:
        raise bad("num_pi_trajs", f"must be < num_samples ({cfg.num_samples})")
    if cfg.min_std > cfg.max_std:
        raise bad("min_std", f"must be <= max_std ({cfg.max_std})")
    if cfg.num_bins < 2:
        raise bad("num_bins", "must be >= 2 (discrete regression)")
    if not cfg.vmin < cfg.vmax:
        raise bad("vmin", f"must be < vmax ({cfg.vmax})")
    if not cfg.log_std_min < cfg.log_std_max:
        raise bad("log_std_min", f"must be < log_std_max ({cfg.log_std_max})")
    if cfg.model_size is not None and cfg.model_size not in MODEL_SIZES:
        raise bad("model_size", f"unknown size; choose one of {sorted(MODEL_SIZES)} (millions of parameters)")
    for name, value in cfg.sizes().items():
        if value is None:
            raise bad(name, "must be set when model_size is null")
        if value < (2 if name == "num_q" else 1):
            raise bad(name, "must be >= 2" if name == "num_q" else "must be >= 1")
    latent = cfg.sizes()["latent_dim"]
    gymnasium = [t for t in expand(cfg.task) if gymnasium_form(t)] if cfg.obs == "rgb" else []
    if gymnasium:  # said before the pixel encoder's sizes, which would not help
        raise bad("obs", f"'rgb' is supported for DMC tasks only; {gymnasium[0]!r} takes 'state'")
    if cfg.obs == "rgb" and latent != 16 * cfg.num_channels:  # the pixel encoder's output is the latent
        fits = (named("num_channels", latent // 16, from_python) if latent % 16 == 0
                else "a latent_dim that is a multiple of 16")
        size5 = named("model_size", 5, from_python)
        raise bad("num_channels", f"{cfg.num_channels} gives pixel observations a latent of 16 x {cfg.num_channels} = "
                                  f"{16 * cfg.num_channels}, but latent_dim is {latent}: use {fits}, or a model "
                                  f"size with latent_dim {16 * cfg.num_channels} ({size5})")
    if latent % cfg.simnorm_dim:  # after pixels' own rule for latent_dim, which says more
        raise bad("simnorm_dim", f"must divide latent_dim ({latent})")
    envs = cfg.num_envs * max(1, len(expand(cfg.task)))
    if cfg.buffer_size < envs * (cfg.horizon + 2):
        raise bad("buffer_size", f"too small to hold a sub-trajectory of horizon {cfg.horizon} for each of "
                                 f"{envs:,} env(s) ({named('num_envs', None, from_python)}, per task): at least "
                                 f"{envs * (cfg.horizon + 2):,}")
    seed_floor = envs * (cfg.action_repeat or 1) * cfg.horizon  # the first update samples a sub-trajectory
    if cfg.seed_steps is not None and cfg.seed_steps < seed_floor and not cfg.dataset:
        raise bad("seed_steps", f"too few for {envs} env(s) to each hold a sub-trajectory of horizon {cfg.horizon} "
                                f"before the first update: at least {seed_floor:,} env steps (action repeat included)")
    if cfg.device not in ("auto", "cpu", "cuda") and not (cfg.device.startswith("cuda:") and cfg.device[5:].isdigit()):
        raise bad("device", "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if cfg.threads is not None and cfg.threads < 1:
        raise bad("threads", "must be >= 1")
    if cfg.task_dim is not None and cfg.task_dim < 1:
        raise bad("task_dim", "must be >= 1")
    if len(set(cfg.task_set)) != len(cfg.task_set):
        raise bad("task_set", "names a task twice")
    if len(set(cfg.dataset)) < len(cfg.dataset):
        raise bad("dataset", "names a file twice (its episodes would count double)")
    if cfg.dataset and cfg.save_data:
        raise bad("save_data", "keeps the episodes of an online run; an offline run (dataset) has none")
    for name, hint in field_types().items():  # every field with a fixed set of values
        allowed = typing.get_args(hint)
        if typing.get_origin(hint) is Literal and getattr(cfg, name) not in allowed:
            raise bad(name, f"must be one of {list(allowed)}")
    return cfg
