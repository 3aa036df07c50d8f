"""Every field of Config, declared once by section: its name, type, default and docstring (which `--help` shows).

The planner's settings (MPPIConfig, planner.py) and the network settings (NetworkSettings, here) are sections
too, which the planners and the model read; Config inherits all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import tyro

from tdmpc.config.planner import MPPIConfig
from tdmpc.tasks.sets import expand

if TYPE_CHECKING:
    from tdmpc.envs import EnvSpec

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
    """Environment steps to train for, action repeat included (published-curve convention); a multi-task run
    counts all its tasks' steps together (docs/multitask.md)."""
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
    (docs/results/many-envs-updates.md)."""
    overlap_updates: Optional[bool] = None
    """Run the updates due after a step once the next step's actions are chosen, so a GPU does them while the host
    steps the envs (the reference waits for them before planning: each action sees one round of updates more).
    None: on with a CUDA device and host envs, where it hides the env step; off elsewhere (nothing to overlap).
    --overlap-updates / --no-overlap-updates."""
    update_stream: bool = False
    """With overlap_updates on a CUDA device: run each round of updates on a stream of its own, beside the next
    plan, with the same staleness (tdmpc/runtime/streams.py). Off until measured on a GPU; elsewhere it changes
    nothing (given there, a note says so)."""
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
    reference computes it since Dec 2024 (e9f5932); it never penalises saturated actions. 'squashed': that plus
    the tanh correction sum log(1 - a^2), as the 2023 release that produced the published curves computed it:
    saturation lowers the bonus (docs/multitask.md)."""
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
    """Updates: fp32, bf16 autocast, or mixed (the Q heads, TD targets and value decoding in fp32, the rest in
    bf16). How each learned: RESULTS.md, "Update precision"."""
    cuda_graphs: bool = True
    """Capture plan() and update() as CUDA graphs on CUDA (eager everywhere else: given there, a note says so)."""
    plan_chunk_envs: Optional[int] = None
    """Envs whose candidates one model call rolls out in plan(): fewer hold less memory and plan the same. None:
    all at once on a GPU, unless the memory estimate needs chunks for the run to fit (then the most that fit,
    said before the run starts); cache-sized chunks on a CPU."""
    compile: Optional[bool] = None
    """Run plan() and update() through torch.compile (inductor): far fewer, fused kernels. The first call of each
    compiles (its time is printed; inductor's cache shortens the next start); a failed compile runs eagerly. None:
    on with CUDA, off on the CPU (docs/speed.md). --compile / --no-compile."""
    matmul_precision: Optional[Literal["highest", "high"]] = None
    """fp32 matmuls: 'high' runs them in TF32 on GPUs that have it, as the reference trains; 'highest' keeps full
    fp32. None: 'high' on CUDA, 'highest' elsewhere."""
    threads: Optional[int] = None
    """CPU threads for torch, at most the CPUs this process may use. None: the cores other processes leave idle
    (give 1 to each of several runs)."""
    debug: bool = False
    """Expensive checks (NaN scans) in the hot paths."""
    nonfinite_data: Literal["error", "drop"] = "error"
    """NaN or inf from an env: stop, naming the env, step and field ('error'), or skip the transition and restart
    that env's episode ('drop')."""


# Every setting of a run, from the sections above in this order (a dataclass lists its bases' fields last base
# first): task, training, losses, acting, planning (MPPIConfig, planner.py: the planners take it), sizes, network
# (NetworkSettings: the model's ModelDims inherits it), task set, output, hardware. No docstring: --help would show it.
@dataclass
class Config(_Hardware, _Output, _TaskSet, NetworkSettings, _Sizes, MPPIConfig, _Acting, _Losses, _Training, _Task):

    def __post_init__(self) -> None:
        # One spelling for a task list, however it was given: ("a,b",), ("a", "b") and ("mt30",) all expand.
        self.task_set = tuple(t for entry in self.task_set for t in expand(entry))

    # --- derived -------------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """The size fields: the model_size preset, with explicitly set fields winning."""
        preset = dict(MODEL_SIZES.get(self.model_size or 0, {}))
        if self.task == "mt30" and self.model_size == 19:
            preset["latent_dim"] = 512  # the reference's (common/parser.py): its released mt30 size-19 model's
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


@functools.cache
def field_types() -> dict[str, object]:
    """Field name -> its type (the annotations resolved once per process: callers ask per field)."""
    return typing.get_type_hints(Config)
