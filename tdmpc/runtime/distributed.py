"""Data-parallel training over processes with torch.distributed (NCCL on GPUs, gloo on CPUs).

Launched as clusters launch it: `torchrun --nproc-per-node N -m tdmpc.train ...` sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; slurm/train_multi.sh sets them from
Slurm's variables for srun. Every rank holds the same model and takes its own slice of every
batch (tdmpc.offline.sampler); after each backward pass the gradients are averaged (one
all-reduce per optimiser over a flat buffer), so every rank takes the same optimiser step.
The update is not one module's forward, so the collectives are called directly instead of
through DistributedDataParallel's forward hooks. Random draws per batch row (the policy's
noise) are drawn for the whole global batch on every rank and sliced, and the running value
scale reads the global batch, so N ranks at batch B/N compute what one process computes at B.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from tdmpc.errors import DeviceError


@dataclass(frozen=True)
class Shard:
    """This process's place among the data-parallel ranks."""

    rank: int
    world: int
    local_rank: int

    @property
    def main(self) -> bool:
        """Rank 0 evaluates, logs and writes checkpoints."""
        return self.rank == 0

    def average(self, tensors: list[Tensor]) -> None:
        """Average `tensors` (gradients) over the ranks, in place: one all-reduce of a flat buffer."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        flat /= self.world
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))

    def gather(self, x: Tensor) -> Tensor:
        """The ranks' `x` concatenated along dim 0, in rank order (the global batch's rows)."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def rows(self, draw: Tensor, batch: int, dim: int) -> Tensor:
        """This rank's `batch` rows along `dim` of a draw made for the global batch (world x batch rows)."""
        return draw.narrow(dim, self.rank * batch, batch) if self.world > 1 else draw

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank if it is true on any (a stop signal that reached one rank stops all)."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


SINGLE = Shard(0, 1, 0)


def from_environment(device: str) -> Shard:
    """The shard torchrun or srun (slurm/train_multi.sh) describes in the environment; SINGLE without one.
    Starts the process group: NCCL when the ranks train on GPUs (`device` 'auto' or 'cuda' on a machine with
    CUDA), else gloo, so `--device cpu` ranks on a GPU machine leave its GPUs alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    shard = Shard(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        on_gpu = device_for(shard, device).startswith("cuda:")
        if on_gpu:
            if shard.local_rank >= torch.cuda.device_count():
                raise DeviceError(f"local rank {shard.local_rank} has no GPU of its own: this node has "
                                  f"{torch.cuda.device_count()}; start at most that many processes per node, "
                                  "or train on CPUs with --device cpu")
            torch.cuda.set_device(shard.local_rank)
        dist.init_process_group("nccl" if on_gpu else "gloo")
    return shard


def command(args: str, world: int) -> str:
    """The command line that runs tdmpc.train with `args` as this run was launched: one process, torchrun's on one
    node, or (srun, several nodes) the same launch named by its process count."""
    if world == 1:
        return f"python -m tdmpc.train {args}"
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("LOCAL_WORLD_SIZE") == str(world):
        return f"torchrun --nproc-per-node {world} -m tdmpc.train {args}"
    return f"the same launch of {world} data-parallel processes with tdmpc.train {args}"


def device_for(shard: Shard, name: str) -> str:
    """A rank's device: its local GPU under 'auto' or 'cuda' (one GPU per rank), else as named."""
    if shard.world > 1 and name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{shard.local_rank}"
    return name
