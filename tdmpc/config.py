"""One typed config for everything: defaults < JSON file (--cfg) < CLI flags.

Field names follow the reference TD-MPC2 implementation where one exists, so people
coming from it find them. Validation runs before anything heavy and fails with one
line that names the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Optional, TypeVar

import tyro

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# model_size (millions of parameters) -> (enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q)
MODEL_SIZES: dict[int, tuple[int, int, int, int, int]] = {
    1: (256, 384, 128, 2, 2),
    5: (256, 512, 512, 2, 5),
    19: (1024, 1024, 768, 3, 5),
    48: (1792, 1792, 768, 4, 5),
    317: (4096, 4096, 1376, 5, 8),
}


class ConfigError(ValueError):
    """Bad configuration; the message is one line and names the field."""


@dataclass
class Config:
    # --- task -----------------------------------------------------------------------
    task: str = "walker-walk"
    """DMC name (walker-walk, cup-catch, ...) or a gymnasium id (Pendulum-v1, pkg.mod:Env-v0)."""
    obs: Literal["state", "rgb"] = "state"
    """Observation type: state vectors, or 64x64 RGB frames (DMC)."""
    episodic: Optional[bool] = None
    """Train a termination head. None: decided by the task."""
    action_repeat: Optional[int] = None
    """None: 2 for DMC, 1 for gymnasium tasks."""

    # --- training -------------------------------------------------------------------
    steps: int = 1_000_000
    """Environment steps to train for, action repeat included (published-curve convention)."""
    seed: int = 1
    num_envs: int = 1
    """Parallel environments; the planner plans for all of them in one call."""
    vectorization: Literal["sync", "async"] = "sync"
    seed_steps: Optional[int] = None
    """Env steps of random actions before learning. None: max(1000, 5 x episode length)."""
    update_every: int = 1
    """Agent steps (per env) between update rounds; 1 reproduces the reference."""
    updates_per_round: int = 1
    """Gradient steps per round. Default 1 with update_every 1 = the reference's ratio for one env."""
    batch_size: int = 256
    buffer_size: int = 1_000_000
    """Replay capacity in transitions, shared by all envs."""
    buffer_device: Literal["auto", "device", "host"] = "auto"
    """'auto' keeps the buffer on the training device when it fits, else in pinned host memory."""

    # --- losses and optimisation ---------------------------------------------------------
    lr: float = 3e-4
    enc_lr_scale: float = 0.3
    grad_clip_norm: float = 20.0
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    value_coef: float = 0.1
    termination_coef: float = 1.0
    entropy_coef: float = 1e-4
    rho: float = 0.5
    tau: float = 0.01
    discount_denom: float = 5.0
    discount_min: float = 0.95
    discount_max: float = 0.995

    # --- planning (MPPI) -----------------------------------------------------------
    mpc: bool = True
    """Plan with MPPI; False acts with the policy prior alone."""
    iterations: int = 6
    num_samples: int = 512
    num_elites: int = 64
    num_pi_trajs: int = 24
    horizon: int = 3
    min_std: float = 0.05
    max_std: float = 2.0
    temperature: float = 0.5

    # --- architecture ------------------------------------------------------------
    model_size: Optional[int] = 5
    """Preset (1, 5, 19, 48, 317) for the five fields below; set any of them to override."""
    enc_dim: Optional[int] = None
    mlp_dim: Optional[int] = None
    latent_dim: Optional[int] = None
    num_enc_layers: Optional[int] = None
    num_q: Optional[int] = None
    num_channels: int = 32
    simnorm_dim: int = 8
    dropout: float = 0.01
    num_bins: int = 101
    vmin: float = -10.0
    vmax: float = 10.0
    log_std_min: float = -10.0
    log_std_max: float = 2.0

    # --- evaluation and output ---------------------------------------------------------
    eval_freq: int = 50_000
    """Env steps between evaluations."""
    eval_episodes: int = 10
    save_video: bool = False
    save_every: int = 100_000
    """Env steps between checkpoints (one is always written at the end)."""
    save_buffer: bool = True
    """Store the replay buffer (HDF5) with checkpoints, for exact resume."""
    log_every: int = 1_000
    """Env steps between rows of train.csv (metrics are fetched from the device only then)."""
    run_dir: Optional[str] = None
    """Default: runs/<task>/<seed>/<time>."""
    exp_name: str = "default"
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = False
    wandb_project: str = "tdmpc"
    progress: bool = True

    # --- hardware ----------------------------------------------------------------
    device: str = "auto"
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Acting and planning. 'auto': bf16 where the hardware runs it fast (CUDA, AVX512-BF16/AMX CPUs)."""
    train_precision: Literal["fp32", "bf16"] = "fp32"
    """Updates. bf16 autocast is 2-3x faster on bf16 CPUs but learned far worse on cartpole-swingup
    (RESULTS.md); fp32 is what the reference trains in."""
    cuda_graphs: bool = True
    """Capture plan() and update() as CUDA graphs on CUDA (eager everywhere else)."""
    threads: Optional[int] = None
    """CPU threads for torch; None leaves torch's default."""
    debug: bool = False
    """Expensive checks (NaN scans) in the hot paths."""

    # --- derived -------------------------------------------------------------------
    def arch(self) -> dict[str, int]:
        """Architecture sizes: the model_size preset, with explicitly set fields winning."""
        names = ("enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q")
        preset = MODEL_SIZES.get(self.model_size, (None,) * 5) if self.model_size else (None,) * 5
        out = {n: getattr(self, n) if getattr(self, n) is not None else p for n, p in zip(names, preset)}
        return out  # type: ignore[return-value]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELD_NAMES = tuple(f.name for f in fields(Config))


def validate(cfg: Config) -> Config:
    """Check every field; raise ConfigError with one line naming the first bad field."""

    def bad(name: str, why: str) -> ConfigError:
        return ConfigError(f"config field '{name}' = {getattr(cfg, name)!r}: {why}")

    positive = ("steps", "num_envs", "update_every", "batch_size", "buffer_size", "iterations",
                "num_samples", "num_elites", "horizon", "num_channels", "simnorm_dim", "eval_freq",
                "save_every", "log_every")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise bad(name, "must be >= 1")
    for name in ("updates_per_round", "num_pi_trajs", "eval_episodes"):
        if getattr(cfg, name) < 0:
            raise bad(name, "must be >= 0")
    for name in ("lr", "grad_clip_norm", "temperature", "min_std", "max_std", "discount_denom"):
        if not getattr(cfg, name) > 0:
            raise bad(name, "must be > 0")
    for name in ("consistency_coef", "reward_coef", "value_coef", "termination_coef",
                 "entropy_coef", "enc_lr_scale"):
        if getattr(cfg, name) < 0:
            raise bad(name, "must be >= 0")
    for name in ("rho", "tau"):
        if not 0 < getattr(cfg, name) <= 1:
            raise bad(name, "must be in (0, 1]")
    if not 0 <= cfg.dropout < 1:
        raise bad("dropout", "must be in [0, 1)")
    if not 0 < cfg.discount_min <= cfg.discount_max < 1:
        raise bad("discount_min", "need 0 < discount_min <= discount_max < 1")
    if cfg.seed_steps is not None and cfg.seed_steps < 0:
        raise bad("seed_steps", "must be >= 0")
    if cfg.action_repeat is not None and cfg.action_repeat < 1:
        raise bad("action_repeat", "must be >= 1")
    if cfg.num_pi_trajs >= cfg.num_samples:
        raise bad("num_pi_trajs", f"must be < num_samples ({cfg.num_samples})")
    if cfg.num_elites > cfg.num_samples - cfg.num_pi_trajs:
        raise bad("num_elites", f"must be <= num_samples - num_pi_trajs "
                                f"({cfg.num_samples} - {cfg.num_pi_trajs} = {cfg.num_samples - cfg.num_pi_trajs})")
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
    for name, value in cfg.arch().items():
        if value is None:
            raise bad(name, "must be set when model_size is null")
        if value < (2 if name == "num_q" else 1):
            raise bad(name, "must be >= 2" if name == "num_q" else "must be >= 1")
    if cfg.arch()["latent_dim"] % cfg.simnorm_dim:
        raise bad("simnorm_dim", f"must divide latent_dim ({cfg.arch()['latent_dim']})")
    if cfg.buffer_size < cfg.num_envs * (cfg.horizon + 2):
        raise bad("buffer_size", f"too small to hold a sub-trajectory of horizon {cfg.horizon} per env")
    if cfg.device not in ("auto", "cpu", "cuda") and not (cfg.device.startswith("cuda:") and cfg.device[5:].isdigit()):
        raise bad("device", "use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if cfg.threads is not None and cfg.threads < 1:
        raise bad("threads", "must be >= 1")
    for name in ("obs", "vectorization", "buffer_device", "precision", "train_precision"):
        allowed = typing.get_args(_field_types()[name])
        if getattr(cfg, name) not in allowed:
            raise bad(name, f"must be one of {list(allowed)}")
    return cfg


def _field_types() -> dict[str, object]:
    return typing.get_type_hints(Config)


def _check_type(name: str, value: object) -> object:
    """Coerce a JSON value to the field's type, or raise ConfigError."""
    hint = _field_types()[name]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for opt in options:
        if opt is type(None) and value is None:
            return None
        if typing.get_origin(opt) is Literal and value in typing.get_args(opt):
            return value
        if opt is bool and isinstance(value, bool):
            return value
        if opt is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if opt is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if opt is str and isinstance(value, str):
            return value
    expected = " or ".join(
        "null" if o is type(None) else "one of " + str(list(typing.get_args(o))) if typing.get_origin(o) is Literal
        else getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(f"config field '{name}' = {value!r}: expected {expected}")


def unknown_key_error(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' in {source}{hint}")


def from_dict(data: dict, source: str = "config", base: Config | None = None) -> Config:
    """Build a Config from a plain dict (JSON), checking keys and types."""
    values = {}
    for key, value in data.items():
        if key.startswith("_"):  # "_comment" and the like
            continue
        if key not in FIELD_NAMES:
            raise unknown_key_error(key, source)
        values[key] = _check_type(key, value)
    return dataclasses.replace(base or Config(), **values)


def find_config_file(name: str) -> Path:
    """`--cfg a4000.json` finds configs/a4000.json; a path works as given; '.json' is optional."""
    candidates = [Path(name), CONFIG_DIR / name, Path.cwd() / "configs" / name]
    if not name.endswith(".json"):
        candidates += [Path(name + ".json"), CONFIG_DIR / (name + ".json")]
    for path in candidates:
        if path.is_file():
            return path
    available = ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.json")))
    raise ConfigError(f"config file '{name}' not found (looked in . and {CONFIG_DIR}; available: {available})")


def load_json(name: str, base: Config | None = None) -> Config:
    path = find_config_file(name)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file '{path}' is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a JSON object")
    return from_dict(data, source=str(path), base=base)


def save_json(cfg: Config, path: Path) -> None:
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")



T = TypeVar("T")


def peek_flag(argv: list[str], flag: str) -> str | None:
    """The value of `--flag X` or `--flag=X` in argv, read before the full parse needs it."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def parse_cli(run_args: type[T], argv: list[str], base: Config, prog: str | None = None,
              description: str | None = None) -> tuple[T, Config]:
    """Flat kebab-case flags for `run_args` and every Config field; `base` supplies the defaults."""
    args_cls = dataclasses.make_dataclass("Args", [
        ("run", run_args, dataclasses.field(default_factory=run_args)),
        ("config", Config, dataclasses.field(default_factory=Config))])
    run_default = run_args(**{k: peek_flag(argv, "--" + k.replace("_", "-")) for k in ("cfg",)
                              if k in {f.name for f in fields(run_args)}})
    args = tyro.cli(args_cls, default=args_cls(run_default, base), args=argv, prog=prog, description=description,
                    config=(tyro.conf.OmitArgPrefixes,))
    return args.run, validate(args.config)
