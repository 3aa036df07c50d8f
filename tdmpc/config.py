"""One typed config for everything: defaults < JSON file (--cfg) < CLI flags.

Field names follow the reference TD-MPC2 implementation where one exists, so people
coming from it find them. Every field has a one-line docstring, which `--help` shows.
Validation runs before anything heavy and fails with one line that names the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Optional, TypeVar

import tyro

from tdmpc.errors import ConfigError, one_line_parse_errors, optional_bool_flags
from tdmpc.planners.settings import MPPIConfig
from tdmpc.runtime.files import shipped_dir, write_text_atomic
from tdmpc.tasks.sets import expand

if TYPE_CHECKING:
    from tdmpc.envs import EnvSpec

CPU_CONFIG = "cpu.json"  # what a machine without a GPU starts from when no --cfg is given
CONFIG_DIR = shipped_dir("configs")  # the repository's configs/, packaged with the code
MAX_DEFAULT_UPDATES = 64  # updates per round per task when updates_per_round is unset (its docstring says why)

# model_size (millions of parameters) -> the sizes it stands for. The keys are the size fields of Config.
MODEL_SIZES: dict[int, dict[str, int]] = {
    1: dict(enc_dim=256, mlp_dim=384, latent_dim=128, num_enc_layers=2, num_q=2),
    5: dict(enc_dim=256, mlp_dim=512, latent_dim=512, num_enc_layers=2, num_q=5),
    19: dict(enc_dim=1024, mlp_dim=1024, latent_dim=768, num_enc_layers=3, num_q=5),
    48: dict(enc_dim=1792, mlp_dim=1792, latent_dim=768, num_enc_layers=4, num_q=5),
    317: dict(enc_dim=4096, mlp_dim=4096, latent_dim=1376, num_enc_layers=5, num_q=8),
}
SIZE_FIELDS: tuple[str, ...] = tuple(MODEL_SIZES[1])


@dataclass
class NetworkSettings:
    """Encoder, latent, regression and policy-prior settings besides the sizes; the model's ModelDims inherits them
    too, so a checkpoint's dims and a config name them alike."""

    num_channels: int = 32
    """Channels of the pixel encoder's conv layers (latent_dim must be 16 x num_channels for rgb)."""
    simnorm_dim: int = 8
    """Group size of the SimNorm softmax on latents."""
    dropout: float = 0.01
    """Dropout after the first layer of each Q head."""
    num_bins: int = 101
    """Bins of the two-hot discrete regression of rewards and values."""
    vmin: float = -10.0
    """Lowest bin, in symlog space."""
    vmax: float = 10.0
    """Highest bin, in symlog space."""
    log_std_min: float = -10.0
    """Lower bound of the policy prior's log std."""
    log_std_max: float = 2.0
    """Upper bound of the policy prior's log std."""


@dataclass
class _Task:
    """What to train on."""

    task: Annotated[str, tyro.conf.arg(aliases=("--tasks",))] = "walker-walk"
    """DMC name (walker-walk, cup-catch, ...) or a gymnasium id (Pendulum-v1, pkg.mod:Env-v0); several, separated
    by commas (--tasks is the same flag), or mt30 train one multi-task model."""
    obs: Literal["state", "rgb"] = "state"
    """Observation type: state vectors, or 64x64 RGB frames (DMC)."""
    episodic: Optional[bool] = None
    """Learn a termination head and stop planned returns at predicted terminations. None: what the task declares.
    --episodic / --no-episodic."""
    action_repeat: Optional[int] = None
    """Env steps per agent decision, rewards summed. None: 2 for DMC, 1 for gymnasium tasks."""


@dataclass
class _Training:
    """The training loop: steps, envs, seeding, updates, the replay buffer, offline data."""

    steps: int = 1_000_000
    """Environment steps to train for, action repeat included (published-curve convention)."""
    seed: int = 1
    """Seeds torch, numpy, the envs and evaluation."""
    num_envs: int = 1
    """Parallel environments (of each task, in a multi-task run); the planner plans for all of them in one call."""
    vectorization: Literal["sync", "async"] = "sync"
    """Step the envs in this process (sync) or one subprocess each (async: for slow simulators)."""
    seed_steps: Optional[int] = None
    """Env steps of random actions before learning. None: max(1000, 5 x episode length) agent steps of each task
    (a multi-task run seeds every task as a single-task run seeds its one), or num_envs x horizon where that is
    more (each env holds a sub-trajectory before the first update)."""
    update_every: int = 1
    """Agent steps (per env) between update rounds; 1 reproduces the reference."""
    updates_per_round: Optional[int] = None
    """Gradient steps per round. None: one per env stepped, up to MAX_DEFAULT_UPDATES (64) per task: with
    update_every 1 and up to 64 envs every env step gets one update, the reference's ratio; beyond, 64 a round
    (at 256 envs 64 learned as 256 did per env step, 2.6x faster; RESULTS.md, "Updates for many envs")."""
    overlap_updates: Optional[bool] = None
    """Run the updates due after a step once the next step's actions are chosen, so a GPU does them while the host
    steps the envs (the reference waits for them before planning: each action sees one round of updates more).
    None: on with a CUDA device and host envs, where it hides the env step; off elsewhere (nothing to overlap).
    --overlap-updates / --no-overlap-updates."""
    batch_size: int = 256
    """Sub-trajectories per gradient step."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions, shared by all envs."""
    buffer_device: Literal["auto", "device", "host"] = "auto"
    """Where the replay buffer lives. 'auto': on the training device when it fits, else pinned host memory."""
    dataset: tuple[str, ...] = ()
    """Train offline from these dataset files (HDF5, the README's schema): no env is stepped but to evaluate, and
    steps, eval_freq, save_every and log_every count updates."""
    dataset_stream: Literal["auto", "memory", "stream"] = "auto"
    """Offline data in host memory, or streamed from disk in windows with prefetching. 'auto': streamed when the
    data would take more than half of the free host memory."""
    save_data: Optional[str] = None
    """Append every finished episode of an online run to this dataset file, at each checkpoint."""


@dataclass
class _Losses:
    """Losses and optimisation."""

    lr: float = 3e-4
    """Adam learning rate of the world model and the policy prior."""
    enc_lr_scale: float = 0.3
    """The encoder's learning rate as a fraction of lr."""
    grad_clip_norm: float = 20.0
    """Gradients are clipped to this global norm."""
    consistency_coef: float = 20.0
    """Weight of the latent consistency loss (predicted vs encoded next latent)."""
    reward_coef: float = 0.1
    """Weight of the reward prediction loss."""
    value_coef: float = 0.1
    """Weight of the TD value loss, averaged over the Q heads."""
    termination_coef: float = 1.0
    """Weight of the termination loss (episodic tasks only)."""
    entropy_coef: float = 1e-4
    """Weight of the policy prior's entropy bonus."""
    entropy_bonus: Literal["gaussian", "squashed"] = "gaussian"
    """The bonus's form. 'gaussian': -(action dims) x the Gaussian log-prob before the tanh squash, as the
    reference computes it since Dec 2024 (e9f5932); it never penalises saturated actions, and can leave the
    policy at its largest std (RESULTS.md). 'squashed': that plus the tanh correction sum log(1 - a^2), as
    the 2023 release that produced the published curves computed it: saturation lowers the bonus."""
    uniform_prior_coef: float = 1e-3
    """Discrete actions: weight of the categorical prior's mean log-probability over its n actions (the
    cross-entropy from uniform, negated) in its objective, which keeps the prior from collapsing onto one action
    (docs/discrete.md). 0: the reference's objective alone (its `discrete` branch)."""
    mask_policy_after_terminal: bool = True
    """Episodic tasks: the policy loss leaves out the latent after a terminal step, which is not the episode's.
    The reference has no such mask (a deliberate difference, docs/deviations.md); False: its loss."""
    task_scales: bool = False
    """Multi-task models: divide each task's Q-values in the policy loss by that task's own running 5-95%
    range, as a single-task run would, instead of by one range over all tasks (the reference's). With one
    range, a task whose returns are still near 0 beside a task at 50 gets a 50x weaker policy gradient."""
    rho: float = 0.5
    """Per-step decay of the loss weights over the horizon (rho^t)."""
    tau: float = 0.01
    """Polyak rate of the target Q heads and of the policy loss's running value scale."""
    discount_denom: float = 5.0
    """Discount from episode length L: f = L / discount_denom, gamma = (f - 1) / f, then clipped."""
    discount_min: float = 0.95
    """Lower clip of the discount."""
    discount_max: float = 0.995
    """Upper clip of the discount."""


@dataclass
class _Acting:
    """How the agent acts (the planner's own settings are MPPIConfig's)."""

    mpc: bool = True
    """Plan (with `planner`); False acts with the policy prior alone."""
    planner: str = "mppi"
    """The planner, by its name in tdmpc.planners.make.PLANNERS: 'mppi' (MPPI over a Gaussian for continuous
    actions, over categorical probabilities for discrete ones, as the reference plans)."""
    plan_horizon: Optional[int] = None
    """Steps the planner looks ahead; training's sub-trajectories keep `horizon`. None: 1 for discrete actions
    (docs/discrete.md says why, and what that rests on), else `horizon` (as in the reference, where one field
    sets both); config.json records the value used."""


@dataclass
class _Sizes:
    """The network sizes: a model_size preset, or each size set."""

    model_size: Optional[int] = 5
    """Preset (1, 5, 19, 48, 317 million parameters) for the five size fields below; set any of them to override."""
    enc_dim: Optional[int] = None
    """Width of the state encoder's hidden layers. None: from model_size."""
    mlp_dim: Optional[int] = None
    """Width of the hidden layers of dynamics, reward, termination, policy and Q heads. None: from model_size."""
    latent_dim: Optional[int] = None
    """Size of the latent state. None: from model_size."""
    num_enc_layers: Optional[int] = None
    """Layers of the state encoder. None: from model_size."""
    num_q: Optional[int] = None
    """Q heads in the ensemble. None: from model_size."""


@dataclass
class _TaskSet:
    """A multi-task model's task set."""

    task_set: tuple[str, ...] = ()
    """A multi-task model's tasks, one embedding row each in id order, written as `task` is (a,b,c or mt30).
    (): the tasks trained on (one: no embedding)."""
    task_dim: Optional[int] = None
    """Task embedding size of a multi-task model. None: the reference's (96 for 80 tasks or model size 1/317, else 64)."""


@dataclass
class _Output:
    """Evaluation, checkpoints and logs."""

    eval_freq: int = 50_000
    """Env steps between evaluations."""
    eval_episodes: int = 10
    """Episodes per evaluation, without exploration noise (0: no evaluation)."""
    save_video: bool = False
    """Record the first episode of every evaluation to videos/ (MuJoCo offscreen rendering)."""
    save_every: int = 100_000
    """Env steps between checkpoints (one is always written at the end)."""
    save_buffer: bool = True
    """Store the replay buffer (HDF5) with checkpoints, for exact resume."""
    log_every: int = 1_000
    """Env steps between rows of train.csv (metrics are fetched from the device only then)."""
    run_dir: Optional[str] = None
    """Where the run writes. None: runs/<task>/seed<seed>/<time>."""
    exp_name: str = "default"
    """A label for the run, used to group runs in plots and comparisons."""
    tensorboard: bool = True
    """Write TensorBoard events when tensorboard is installed."""
    wandb: bool = False
    """Log to Weights & Biases as well (needs the wandb package)."""
    wandb_project: str = "tdmpc"
    """wandb project."""
    wandb_entity: Optional[str] = None
    """wandb entity (user or team). None: wandb's default."""
    wandb_group: Optional[str] = None
    """wandb group. None: the Slurm array job when run by slurm/sweep.sh, else no group."""
    wandb_tags: tuple[str, ...] = ()
    """wandb tags."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class _Hardware:
    """Device, precision, threads and checks."""

    device: str = "auto"
    """'auto' (CUDA when available), 'cpu', 'cuda' or 'cuda:N'."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Acting and planning. 'auto': bf16 where the hardware runs it fast (CUDA, AVX512-BF16/AMX CPUs)."""
    train_precision: Literal["fp32", "bf16", "mixed"] = "fp32"
    """Updates. bf16 autocast is 2-3x faster on bf16 CPUs but learned far worse on cartpole-swingup (RESULTS.md);
    mixed runs the Q heads, TD targets and value decoding in fp32 and the rest in bf16."""
    cuda_graphs: bool = True
    """Capture plan() and update() as CUDA graphs on CUDA (eager everywhere else: given there, a note says so)."""
    plan_chunk_envs: Optional[int] = None
    """Envs whose candidates one model call rolls out in plan(): fewer hold less memory and plan the same. None:
    all at once on a GPU, unless the memory estimate needs chunks for the run to fit (then the most that fit,
    said before the run starts); cache-sized chunks on a CPU."""
    compile: bool = False
    """Run plan() and update() through torch.compile (inductor): far fewer, fused kernels (BENCHMARKS.md). The
    first call of each compiles (minutes on a small CPU; inductor's cache shortens the next start). Off until a
    GPU run shows it faster there; on the CPU the fused C++ kernels of the default path are faster."""
    matmul_precision: Optional[Literal["highest", "high"]] = None
    """fp32 matmuls: 'high' runs them in TF32 on GPUs that have it, as the reference trains; 'highest' keeps full
    fp32. None: 'high' on CUDA, 'highest' elsewhere."""
    threads: Optional[int] = None
    """CPU threads for torch. None: the cores other processes leave idle (give 1 to each of several runs)."""
    debug: bool = False
    """Expensive checks (NaN scans) in the hot paths."""
    nonfinite_data: Literal["error", "drop"] = "error"
    """NaN or inf from an env: stop, naming the env, step and field ('error'), or skip the transition and restart
    that env's episode ('drop')."""


# Every setting of a run, from the sections above in this order (a dataclass lists its bases' fields last base
# first): task, training, losses, acting, planning (MPPIConfig, declared with the planner), sizes, network
# (NetworkSettings, declared with the model), task set, output, hardware. No docstring: --help would show it.
@dataclass
class Config(_Hardware, _Output, _TaskSet, NetworkSettings, _Sizes, MPPIConfig, _Acting, _Losses, _Training, _Task):

    def __post_init__(self) -> None:
        # One spelling for a task list, however it was given: ("a,b",), ("a", "b") and ("mt30",) all expand.
        self.task_set = tuple(t for entry in self.task_set for t in expand(entry))

    # --- derived -------------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """The size fields: the model_size preset, with explicitly set fields winning."""
        preset = MODEL_SIZES.get(self.model_size or 0, {})
        return {n: v if (v := getattr(self, n)) is not None else preset.get(n) for n in SIZE_FIELDS}  # type: ignore[misc]

    def embedding_dim(self, num_tasks: int) -> int:
        """The task embedding size: task_dim, or the reference's choice (common/parser.py)."""
        if self.task_dim is not None:
            return self.task_dim
        return 96 if num_tasks == 80 or self.model_size in (1, 317) else 64

    def for_task(self, spec: EnvSpec, tasks: int = 1) -> Config:
        """A copy with the task-dependent fields filled in (None: the task's value), so that config.json
        records what the run really used. tasks: how many a multi-task run trains on."""
        # Unset: the reference's count, or more where many envs need more for each to hold a sub-trajectory before
        # the first update (validate's floor: 4,096 envs at horizon 3 seed 12,288 env steps, not 1,000).
        seed_steps = self.seed_steps if self.seed_steps is not None else \
            max(1000, 5 * spec.episode_length, self.num_envs * self.horizon) * spec.action_repeat * tasks
        updates = self.updates_per_round if self.updates_per_round is not None else \
            min(self.num_envs, MAX_DEFAULT_UPDATES) * tasks
        plan_horizon = self.plan_horizon if self.plan_horizon is not None else 1 if spec.discrete else self.horizon
        return dataclasses.replace(self, task=spec.task, action_repeat=spec.action_repeat, seed_steps=seed_steps,
                                   updates_per_round=updates, plan_horizon=plan_horizon,
                                   episodic=spec.episodic if self.episodic is None else self.episodic)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELD_NAMES = tuple(f.name for f in fields(Config))

# Fields whose default is not what a run started before the field existed ran with: the value that reproduces
# that run (or a function of its config giving it), which a resume of such a run takes (saved_config). A saved
# plan_horizon of None is from before for_task filled it in: that run planned over `horizon` too.
AS_BEFORE_ADDED: dict[str, Any] = {"uniform_prior_coef": 0.0, "plan_horizon": lambda cfg: cfg.horizon}


def validate(cfg: Config) -> Config:
    """Check every field; raise ConfigError with one line naming the first bad field."""

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
    for name in ("num_pi_trajs", "eval_episodes"):
        if (getattr(cfg, name) or 0) < 0:
            raise bad(name, "must be >= 0")
    if cfg.plan_horizon is not None and cfg.plan_horizon < 1:
        raise bad("plan_horizon", "must be >= 1 (or unset: horizon)")
    from tdmpc.planners.make import PLANNERS  # noqa: PLC0415 (torch: not when a config is only read)

    if cfg.planner not in PLANNERS:
        raise bad("planner", f"not a planner: one of {', '.join(sorted(PLANNERS))}")
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
    if cfg.sizes()["latent_dim"] % cfg.simnorm_dim:
        raise bad("simnorm_dim", f"must divide latent_dim ({cfg.sizes()['latent_dim']})")
    latent = cfg.sizes()["latent_dim"]
    if cfg.obs == "rgb" and latent != 16 * cfg.num_channels:  # the pixel encoder's output is the latent
        fits = f"--num-channels {latent // 16}" if latent % 16 == 0 else "a latent_dim that is a multiple of 16"
        raise bad("num_channels", f"{cfg.num_channels} gives pixel observations a latent of 16 x {cfg.num_channels} = "
                                  f"{16 * cfg.num_channels}, but latent_dim is {latent}: use {fits}, or a model "
                                  f"size with latent_dim {16 * cfg.num_channels} (--model-size 5)")
    envs = cfg.num_envs * max(1, len(expand(cfg.task)))
    if cfg.buffer_size < envs * (cfg.horizon + 2):
        raise bad("buffer_size", f"too small to hold a sub-trajectory of horizon {cfg.horizon} per env")
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
    for name, hint in _field_types().items():  # every field with a fixed set of values
        allowed = typing.get_args(hint)
        if typing.get_origin(hint) is Literal and getattr(cfg, name) not in allowed:
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
        if typing.get_origin(opt) is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if opt is bool and isinstance(value, bool):
            return value
        if opt is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)  # numpy's integers too (fit(seed=np.int64(3)))
        if opt is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if opt is str and isinstance(value, str):
            return value
    expected = " or ".join(
        "null" if o is type(None) else "one of " + str(list(typing.get_args(o))) if typing.get_origin(o) is Literal
        else "a list of strings" if typing.get_origin(o) is tuple else getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(f"config field '{name}' = {value!r}: expected {expected}")


def unknown_key_error(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' in {source}{hint}")


def from_dict(data: dict, source: str = "config", base: Config | None = None) -> Config:
    """Build a Config from a plain dict (JSON), checking keys and types."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key.startswith("_"):  # "_comment" and the like
            continue
        if key not in FIELD_NAMES:
            raise unknown_key_error(key, source)
        values[key] = _check_type(key, value)
    return dataclasses.replace(base or Config(), **values)


def available_configs() -> list[str]:
    return sorted(p.name for p in CONFIG_DIR.glob("*.json"))


def find_config_file(name: str) -> Path:
    """`--cfg a4000.json` finds ./configs/a4000.json or the packaged one; a path works as given; '.json' is optional."""
    if not name or Path(name).is_dir():
        raise ConfigError(f"--cfg {name!r}: give a config file (available: {', '.join(available_configs())})")
    names = [name] if name.endswith(".json") else [name, name + ".json"]
    for candidate in [d / n for d in (Path("."), Path("configs"), CONFIG_DIR) for n in names]:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config file '{name}' not found (looked in ., ./configs and {CONFIG_DIR}; "
                      f"available: {', '.join(available_configs())})")


def read_json(path: Path, what: str = "config file") -> dict:
    """A JSON object from `path`, or a one-line ConfigError saying what is wrong with the file."""
    def no_repeats(pairs: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in pairs]
        if len(set(keys)) < len(keys):
            raise ConfigError(f"{what} '{path}' sets '{next(k for k in keys if keys.count(k) > 1)}' twice")
        return dict(pairs)

    try:
        data = json.loads(path.read_text(), object_pairs_hook=no_repeats)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} '{path}' is not valid JSON: {e.msg} at line {e.lineno}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} '{path}' cannot be read: {e}") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise ConfigError(f"{what} '{path}' must hold a JSON object, not {kind}")
    return data


def load_json(name: str, base: Config | None = None) -> Config:
    path = find_config_file(name)
    return from_dict(read_json(path), source=str(path), base=base)


def save_json(cfg: Config, path: Path) -> None:
    write_text_atomic(path, json.dumps(cfg.to_dict(), indent=2) + "\n")  # a resume reads it: never half of one


T = TypeVar("T")


def parse_cli(run_args: type[T], argv: list[str], base_for: Callable[[T], Config], prog: str | None = None,
              description: str | None = None) -> tuple[T, Config, Config, set[str]]:
    """Two tyro passes over argv: `run_args` first (its flags may choose the base config: --cfg, --resume),
    then every Config field as a flat kebab-case flag over `base_for(run)`. Returns the run args, the
    validated config, the base, and the names of the Config fields given on the command line."""
    argv = optional_bool_flags(argv, run_args, Config)
    with one_line_parse_errors(prog or "python -m tdmpc.train"):
        run, _ = tyro.cli(run_args, args=argv, return_unknown_args=True, add_help=False, prog=prog)
    base = base_for(run)
    args_cls = dataclasses.make_dataclass("Args", [
        ("run", run_args, dataclasses.field(default_factory=run_args)),
        ("config", Config, dataclasses.field(default_factory=Config))])

    def parse(defaults: Config) -> Config:
        with one_line_parse_errors(prog or "python -m tdmpc.train"):
            return tyro.cli(args_cls, default=args_cls(run, defaults), args=argv, prog=prog, description=description,
                            config=(tyro.conf.OmitArgPrefixes,)).config

    cfg = parse(base)
    # A field given on the command line parses to the same value over any base; one that was not given
    # takes the base's. So a second parse over a base whose every field differs tells them apart.
    shadow = parse(Config(**{name: _another(name, getattr(base, name)) for name in FIELD_NAMES}))
    given = {name for name in FIELD_NAMES if getattr(cfg, name) == getattr(shadow, name)}
    return run, validate(cfg), base, given


def _another(name: str, value: object) -> Any:
    """A value of field `name`'s type other than `value`."""
    hint = _field_types()[name]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kind = next(o for o in options if o is not type(None))
    if typing.get_origin(kind) is Literal:
        return next(v for v in typing.get_args(kind) if v != value)
    if value is None:
        return {bool: True, int: -1, float: -1.0, str: "~"}[kind] if typing.get_origin(kind) is not tuple else ("~",)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return value + ("~",) if isinstance(value, tuple) else f"{value}~"


def changed_fields(base: Config, cfg: Config) -> dict[str, tuple[object, object]]:
    """Fields whose value differs between two configs: name -> (old, new)."""
    return {n: (getattr(base, n), getattr(cfg, n)) for n in FIELD_NAMES if getattr(base, n) != getattr(cfg, n)}
