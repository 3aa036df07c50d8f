"""Peak device memory predicted from a config, before a run starts (tdmpc.memory.fit fits a config to a card).

Running out of GPU memory hours into a run wastes the run; this module gives a number
first. The estimate is built from the shapes the code allocates:

* exactly known (a CPU test checks them against the bytes really allocated):
  parameters, gradients and both Adam optimisers' states, target Qs and the planning
  copy are counted on a `meta`-device WorldModel (no memory, any model size); the
  planners and the replay buffer are built on the meta device too and report their own
  bytes (Planner.buffer_bytes, ReplayBuffer.nbytes).
* modelled (formulas from the layer widths): activations saved for backward in an
  update (beside the losses, tdmpc/losses.py), the largest plan() call's temporaries
  (below), CUDA graph pools.
* constants: the CUDA context (CUDA_CONTEXT), allocator slack (ALLOCATOR_SLACK) and, per memory pool (each
  stream's and each CUDA graph's), the part of its segments it cannot use (POOL_SEGMENTS): PyTorch's caching
  allocator serves small tensors from 2 MiB segments and 1-10 MiB ones from 20 MiB segments, per pool.
* cuBLAS workspaces: PyTorch allocates them per stream a matmul ran on through its caching
  allocator, so they are live tensors: the default stream's, and with CUDA graphs the one
  side stream every graph warms up and is captured on (tdmpc.runtime.cuda_graphs). Their size is
  PyTorch's default or what its environment variables set (cublas_workspace_bytes).

Update activations: tdmpc/losses.py estimates them beside the losses (update_activation_bytes), eager or
compiled (a compiled update keeps about half: it recomputes LayerNorm in backward).

Planner activations. One plan() call holds, at its peak, the inputs [z, a] of the
N x (S - P) sampled candidates, the fused dynamics+reward first layer (2 x mlp_dim)
with 2 LayerNorm/Mish temporaries, reward logits decoded in fp32; or, in the value
step, pi and 2 Q heads on N x S latents; plus the sampled actions. Every
(num_envs, role) pair has its own planner: training (num_envs) and evaluation (up to
16 episodes at once, EVAL_PARALLEL: tdmpc.episodes plays that many at a time; tensor envs play all of a
task's evaluation episodes at once).

CUDA graphs keep a private pool per captured call, sized by that call's temporaries:
one for update() and one per planner. The budget is the card's memory less
SAFETY_MARGIN; headroom is 1 - total / card memory.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from tdmpc.config import Config
from tdmpc.buffer import ReplayBuffer
from tdmpc.planners.make import make_planner
from tdmpc.config.planner import MPPIConfig
from tdmpc.errors import ConfigError
from tdmpc.runtime.args import named
from tdmpc.runtime.compile import compile_enabled
from tdmpc.runtime.device import resolve_dtype
from tdmpc.runtime.files import MiB, fmt_bytes
from tdmpc.losses import update_activation_bytes
from tdmpc.model.planning_copy import planning_copy
from tdmpc.model.world_model import ModelDims, WorldModel

if TYPE_CHECKING:
    from tdmpc.multitask import TaskSetup

CUDA_CONTEXT = 500 * MiB  # CUDA runtime, cuBLAS/cuDNN kernels: not seen by torch's allocator
ALLOCATOR_SLACK = 0.10  # caching allocator rounding and fragmentation, a fraction of what tensors use
POOL_SEGMENTS = 22 * MiB  # at most a 20 MiB and a 2 MiB segment per pool, unused (PyTorch's kLargeBuffer, kSmallBuffer)
SAFETY_MARGIN = 0.10  # of the card's memory, left unplanned (other processes, driver, estimate error)
EVAL_PARALLEL = 16  # evaluation episodes run at once (tdmpc.episodes), each group with a planner of its size
SIZE_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
              "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


# --- what we plan for --------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """The memory a run gets: a CUDA card (detected, or named by --gpu-mem) or host memory."""

    label: str
    capacity: Optional[int]  # bytes; None when unknown (host memory without --gpu-mem)
    cuda: bool
    dtype: torch.dtype  # planning dtype
    train_dtype: torch.dtype  # update (autocast) dtype
    cublas_workspace: int = 0  # bytes of a stream's cuBLAS + cuBLASLt workspaces; 0 off CUDA

    @property
    def budget(self) -> Optional[int]:
        return None if self.capacity is None else int(self.capacity * (1 - SAFETY_MARGIN))


def parse_size(text: str) -> int:
    """'16GB', '16G', '16000MB', '8GiB' -> bytes. GB/MB are decimal, GiB/MiB binary. The unit is required (a bare
    16000 could mean MB or GB) and a lowercase b (bits) is refused, so a size is never read other than it was meant."""
    example = "write e.g. 16GB, 16000MB or 8GiB"
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:([kmgt]i?)(B?)|(B))\s*", text, re.IGNORECASE)
    if re.fullmatch(r"\s*\d+(?:\.\d*)?\s*", text):
        raise ValueError(f"the memory size '{text}' has no unit (MB? GB?); {example}")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"cannot read the memory size '{text}'; {example}")
    if m.group(4) or "b" in text.rstrip():
        raise ValueError(f"the memory size '{text}' needs a unit of K, M, G or T bytes (B, not b: b is bits); {example}")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def gpu_mem_bytes(text: str, from_python: bool = False) -> int:
    """--gpu-mem's size in bytes (tdmpc.fit's gpu_mem= with from_python); a one-line ConfigError for one that cannot
    be read or is not more than 0."""
    zero = ConfigError(f"{named('gpu_mem', text, from_python)}: must be more than 0 (the memory of the card to plan "
                       f"for: 16GB, 16000MB or 8GiB)")
    try:
        size = parse_size(text)
    except ValueError as e:
        number = re.match(r"\s*(\d+(?:\.\d*)?)", text)
        if number and float(number.group(1)) == 0:
            raise zero from None
        raise ConfigError(f"{named('gpu_mem', None, from_python)}: {e}") from None
    if size <= 0:
        raise zero
    return size


def cuda_target(cfg: Config, capacity: int, label: str, device: torch.device | None = None) -> Target:
    """A CUDA card. 'auto' precision is bf16 there (Ampere and later; pass --precision fp32 for older cards)."""
    if device is not None and device.type == "cuda":
        dtype = resolve_dtype(cfg.precision, device)
    else:
        dtype = torch.float32 if cfg.precision == "fp32" else torch.bfloat16
    # train_precision is never "auto", so its dtype does not depend on the device
    major = torch.cuda.get_device_capability(device)[0] if device is not None and device.type == "cuda" else None
    return Target(label, capacity, True, dtype, update_dtype(cfg), cublas_workspace_bytes(major))


def cublas_workspace_bytes(major: int | None) -> int:
    """A stream's cuBLAS and cuBLASLt workspaces as PyTorch sizes them (measured on an H100 with torch 2.11:
    32 MiB and 1 MiB). cuBLAS: CUBLAS_WORKSPACE_CONFIG (':KiB:count' pairs) when set, else 32 MiB on compute
    capability 9 and later and 8 MiB + 128 KiB before; a card named only by --gpu-mem (major None) is planned
    at the larger size. cuBLASLt (linear layers with a bias): CUBLASLT_WORKSPACE_SIZE KiB, else 1 MiB."""
    pairs = re.findall(r":(\d+):(\d+)", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""))
    if pairs:
        cublas = sum(int(kib) * int(n) for kib, n in pairs) * 1024
    else:
        cublas = 32 * MiB if major is None or major >= 9 else 2 * 4 * MiB + 8 * 16 * 1024
    return cublas + int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024


def update_dtype(cfg: Config) -> torch.dtype:
    """The dtype update activations are counted in: 'mixed' keeps its largest ones (the Q ensemble's) in fp32,
    so it is counted as fp32, an upper bound. train_precision is never 'auto': no device is needed."""
    return torch.float32 if cfg.train_precision == "mixed" else resolve_dtype(cfg.train_precision, torch.device("cpu"))


def detect_target(cfg: Config, device: torch.device | None, gpu_mem: str | None = None,
                  from_python: bool = False) -> Target:
    """--gpu-mem wins; else the CUDA device's total memory; else host memory (no budget)."""
    if gpu_mem is not None:
        label = (f"{torch.cuda.get_device_name(device)} planned as {gpu_mem}"
                 if device is not None and device.type == "cuda" else f"a card of {gpu_mem}")
        return cuda_target(cfg, gpu_mem_bytes(gpu_mem, from_python), label, device)
    if device is not None and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return cuda_target(cfg, props.total_memory, props.name, device)
    cpu = torch.device("cpu")
    return Target("host memory (no CUDA device here)", None, False, resolve_dtype(cfg.precision, cpu),
                  update_dtype(cfg))


# --- the estimate ----------------------------------------------------------------------
@dataclass
class MemoryEstimate:
    """Predicted peak device memory, in bytes, by component.

    An update's temporaries (gradients + update_activations) and a plan's
    (planner_activations) never coexist: only the larger counts in `total`."""

    parameters: int  # fp32 masters and buffers, target Qs excluded
    gradients: int  # fp32, the world model's (pi's come later and are fewer)
    optimizer: int  # Adam exp_avg + exp_avg_sq per parameter, and a step tensor each
    target_qs: int
    planning_copy: int  # matmul weights in the planning dtype, LayerNorm in fp32
    planner_buffers: int  # every planner's preallocated tensors
    replay_buffer: int  # on the device; 0 when it lives in pinned host memory
    update_activations: int  # saved for backward, the batch, TD targets, backward working set
    planner_activations: int  # the largest plan() call's temporaries
    cuda_graph_pools: int
    cuda_context: int
    pool_segments: int = 0  # POOL_SEGMENTS per memory pool: reserved, never live
    cublas_workspaces: int = 0  # one per stream a matmul runs on, allocated through torch's allocator
    host_buffer: int = 0  # pinned host memory for the replay buffer (not in the total)
    learnable: int = 0  # learnable parameters (count)
    notes: dict[str, str] = field(default_factory=dict)

    PERSISTENT = ("parameters", "optimizer", "target_qs", "planning_copy", "planner_buffers", "replay_buffer",
                  "cublas_workspaces")

    @property
    def transient(self) -> int:
        return max(self.gradients + self.update_activations, self.planner_activations)

    @property
    def peak_allocated(self) -> int:
        """What torch.cuda.max_memory_allocated() should read: live tensors at the peak (graph
        pools, slack and the context are reserved memory, not live tensors)."""
        return sum(getattr(self, p) for p in self.PERSISTENT) + self.transient

    @property
    def allocator_slack(self) -> int:
        return int(ALLOCATOR_SLACK * (self.peak_allocated + self.cuda_graph_pools))

    @property
    def total(self) -> int:
        return (self.peak_allocated + self.cuda_graph_pools + self.allocator_slack + self.pool_segments
                + self.cuda_context)

    def table(self) -> str:
        """The breakdown, one component a line, in MiB."""
        update_peak = self.gradients + self.update_activations >= self.planner_activations
        rows = [("parameters (fp32)", self.parameters, self.notes.get("parameters", "")),
                ("Adam states (2 optimizers)", self.optimizer, "exp_avg, exp_avg_sq, step"),
                ("target Qs", self.target_qs, ""),
                ("planning copy", self.planning_copy, self.notes.get("planning_copy", "")),
                ("planner buffers", self.planner_buffers, self.notes.get("planner_buffers", "")),
                ("replay buffer", self.replay_buffer, self.notes.get("replay_buffer", "")),
                ("cuBLAS workspaces", self.cublas_workspaces, self.notes.get("cublas_workspaces", "")),
                ("gradients (fp32)", self.gradients, "" if update_peak else "not at the peak (a plan is larger)"),
                ("update activations", self.update_activations,
                 self.notes.get("update_activations", "") + ("" if update_peak else "; not at the peak")),
                ("planner activations", self.planner_activations,
                 "largest plan() call" + ("; not at the peak (an update is larger)" if update_peak else "")),
                ("CUDA graph pools", self.cuda_graph_pools, self.notes.get("cuda_graph_pools", "")),
                (f"allocator slack ({ALLOCATOR_SLACK:.0%})", self.allocator_slack, ""),
                ("pool segments", self.pool_segments, self.notes.get("pool_segments", "")),
                ("CUDA context", self.cuda_context, "runtime, kernels" if self.cuda_context else "")]
        width = max(len(r[0]) for r in rows)
        lines = [f"  {name:<{width}} {_mib(v):>13}  {note}".rstrip() for name, v, note in rows]
        lines.append(f"  {'total (peak)':<{width}} {_mib(self.total):>13}  {fmt_bytes(self.total)}")
        return "\n".join(lines)


def saved_tensor_bytes(model: torch.nn.Module, fn: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """fn(*args) and the bytes of the distinct storages its autograd graph keeps for backward, the model's
    parameters (and views of them) excluded: what update_activation_bytes models. A compiled graph's saves
    are seen too (its autograd.Function saves through the same hooks)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(kept.values()), out


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def eval_sizes(cfg: Config, tensor_envs: bool = False) -> list[int]:
    """The env counts evaluation plans for: eval_episodes in groups of up to EVAL_PARALLEL; a run on tensor envs
    plays all of them at once (a task's evaluation envs are one batch on the device)."""
    if tensor_envs:
        return [cfg.eval_episodes] if cfg.eval_episodes else []
    sizes, left = set(), cfg.eval_episodes
    while left > 0:
        sizes.add(min(EVAL_PARALLEL, left))
        left -= min(EVAL_PARALLEL, left)
    return sorted(sizes)


def planner_buffer_bytes(cfg: Config, num_envs: int, dims: ModelDims, plan_dtype: torch.dtype) -> int:
    """What the planner for num_envs envs keeps between calls: built on the meta device (no memory) from a planning
    copy in the planning dtype, it reports its own bytes (MPPILoop.buffer_bytes)."""
    meta = torch.device("meta")
    with meta:
        model = planning_copy(WorldModel(dims), plan_dtype)
        discount: float | torch.Tensor = torch.ones(len(dims.tasks)) if dims.multitask else 1.0
        planner = make_planner(cfg.planner, model, MPPIConfig.from_config(cfg, dims.action_dim), num_envs,
                               dims.action_dim, discount, meta)
    return planner.buffer_bytes()


def replay_buffer_bytes(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, num_envs: int,
                        discrete: bool = False) -> int:
    """ReplayBuffer.nbytes, of a buffer built on the meta device (no memory): its rows of obs, action, reward,
    terminated, first and valid."""
    return ReplayBuffer(cfg.buffer_size, num_envs, obs_shape, action_dim, cfg.horizon,
                        torch.uint8 if cfg.obs == "rgb" else torch.float32, device="meta", discrete=discrete).nbytes


def _row_bytes(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, discrete: bool) -> int:
    return math.prod(obs_shape) * (1 if cfg.obs == "rgb" else 4) + 4 * (1 if discrete else action_dim) + 4 + 1 + 1 + 1


def plan_activation_bytes(cfg: Config, num_envs: int, dims: ModelDims, plan_dtype: torch.dtype) -> int:
    """Temporaries of one plan() call for num_envs environments (formulas in the module docstring)."""
    N, S, P, H = num_envs, cfg.num_samples, cfg.num_pi_trajs, MPPIConfig.from_config(cfg, dims.action_dim).horizon
    L, A, M, nb = dims.latent_dim, dims.action_dim, dims.mlp_dim, dims.num_bins
    dp = plan_dtype.itemsize
    chunk = min(N, cfg.plan_chunk_envs or N)  # rollouts and values run a chunk of envs at a time
    Rp, Rs = chunk * (S - P), chunk * S
    rollout = Rp * ((L + A) * dp + 3 * 2 * M * dp + 2 * L * dp + nb * (dp + 2 * 4))
    value = Rs * (L * dp + 3 * M * dp + 2 * A * 4 * 3) + 2 * Rs * ((L + A) * dp + 3 * M * dp + nb * (dp + 2 * 4))
    sampling = 2 * H * N * (S - P) * A * 4  # every env's noise is drawn at once
    obs = N * math.prod(dims.obs_shape) * 4 * (3 if dims.pixels else 1)
    return max(rollout, value) + sampling + obs


def estimate(cfg: Config, obs_shape: tuple[int, ...], action_dim: int, episodic: bool, target: Target,
             buffer_on_device: bool = True, tasks: TaskSetup | None = None, discrete: bool = False,
             tensor_envs: bool = False) -> MemoryEstimate:
    """Peak device memory of a run of `cfg` on `target` (the model is in the module docstring); `tasks`:
    a multi-task run's (its embedding, and num_envs envs of each task); discrete: Discrete(action_dim) actions;
    tensor_envs: a run on tensor envs (its evaluation plans for all its episodes at once)."""
    dims = ModelDims.from_config(cfg, tuple(obs_shape), action_dim, episodic, tasks.task_set if tasks else (),
                                 tasks.action_dims if tasks else (), discrete=discrete)
    num_envs = cfg.num_envs * (len(tasks.tasks) if tasks else 1)
    with torch.device("meta"):  # exact shapes, no memory, any model size
        model = WorldModel(dims)
        plan_model = planning_copy(model, target.dtype)
    target_q = list(model._target_Qs.parameters())
    in_target = {id(p) for p in target_q}
    learnable = [p for p in model.parameters() if p.requires_grad]
    evals = eval_sizes(cfg, tensor_envs)
    envs = ([] if cfg.dataset else [num_envs]) + evals  # one planner per (num_envs, role)
    plan_acts = [plan_activation_bytes(cfg, n, dims, target.dtype) for n in envs] if cfg.mpc else [0]
    gradients = _nbytes(model.world_model_parameters())
    compiled = compile_enabled(cfg.compile, torch.device("cuda" if target.cuda else "cpu"))
    update = update_activation_bytes(cfg, dims, model, target.train_dtype, compiled)
    buffer = 0 if cfg.dataset else replay_buffer_bytes(cfg, obs_shape, action_dim, num_envs, discrete)  # offline: none
    graphs = target.cuda and cfg.cuda_graphs
    # the default stream's pool; with CUDA graphs, the side stream's (their warm-up) and one private pool per graph
    pools = (1 + (2 + (len(envs) if cfg.mpc else 0) if graphs else 0)) if target.cuda else 0
    plan_horizon = MPPIConfig.from_config(cfg, action_dim).horizon
    dt, train_dt = (str(d).replace("torch.", "") for d in (target.dtype, target.train_dtype))
    row = _row_bytes(cfg, obs_shape, action_dim, discrete)
    rows = f"{buffer // row:,} x {row:,} B"
    return MemoryEstimate(
        parameters=_nbytes(p for p in model.parameters() if id(p) not in in_target) + _nbytes(model.buffers()),
        gradients=gradients,
        optimizer=sum(2 * 4 * p.numel() + 4 for p in learnable),
        target_qs=_nbytes(target_q),
        planning_copy=_nbytes(plan_model.parameters()) + _nbytes(plan_model.buffers()),
        planner_buffers=sum(planner_buffer_bytes(cfg, n, dims, target.dtype) for n in envs) if cfg.mpc else 0,
        replay_buffer=buffer if buffer_on_device else 0,
        update_activations=update,
        planner_activations=max(plan_acts, default=0),
        cuda_graph_pools=(gradients + update + sum(plan_acts)) if graphs else 0,
        cuda_context=CUDA_CONTEXT if target.cuda else 0,
        pool_segments=pools * POOL_SEGMENTS,
        cublas_workspaces=(2 if graphs else 1) * target.cublas_workspace,
        host_buffer=0 if buffer_on_device else buffer,
        learnable=sum(p.numel() for p in learnable),
        notes={"parameters": f"{sum(p.numel() for p in learnable) / 1e6:.2f}M learnable",
               "planning_copy": f"matmul weights in {dt}",
               "update_activations": f"batch {cfg.batch_size}, horizon {cfg.horizon}, {train_dt}"
                                     + (", compiled" if compiled else ", eager"),
               "planner_buffers": f"{cfg.num_samples} samples, horizon {plan_horizon}; train {num_envs} env(s)"
                                  + (f", eval {'/'.join(map(str, evals))}" if evals else ""),
               "replay_buffer": rows if buffer_on_device else f"in pinned host memory: {fmt_bytes(buffer)} ({rows})",
               "cuda_graph_pools": "update() + one per planner" if graphs else "",
               "pool_segments": f"{pools} pools (streams and graphs) x {fmt_bytes(POOL_SEGMENTS)}, at most" if pools else "",
               "cublas_workspaces": (f"{'2 streams' if graphs else '1 stream'} x {fmt_bytes(target.cublas_workspace)}"
                                     if target.cuda else "")})
