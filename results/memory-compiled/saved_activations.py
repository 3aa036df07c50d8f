"""Bytes the world-model and policy losses keep for backward, eager and compiled (inductor), on the CPU,
beside the formulas the memory estimate uses (tdmpc.memory.world_model_saved_bytes, policy_saved_bytes).

Counted by tdmpc.memory.saved_tensor_bytes (autograd's saved-tensor hooks, which also see what a compiled
graph saves). Both run CUDA's code path (tdmpc.runtime.device.cuda_code_path: no fused CPU kernels), so the
eager saves are CUDA's; a compiled graph's are chosen by AOTAutograd's min-cut partitioner, the same for CPU
and CUDA inductor.

    python results/memory-compiled/saved_activations.py --sizes 1 5 19 48 > results/memory-compiled/saved.txt
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from tdmpc import Agent
from tdmpc.config import load_json
from tdmpc.losses import policy_loss, world_model_loss
from tdmpc.memory import policy_saved_bytes, saved_tensor_bytes, world_model_saved_bytes
from tdmpc.model.world_model import ModelDims
from tdmpc.runtime.device import cuda_code_path

MiB = 2**20
DOG_OBS, DOG_ACTIONS = (223,), 38  # dog-run, the largest single-task DMC observation (tests/test_memory.py)


def unit_scale(q: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
    return torch.ones(())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 19, 48])
    p.add_argument("--cfg", default="a4000.json")
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"# {args.cfg}, dog-run shapes (obs {DOG_OBS}, {DOG_ACTIONS} actions), fp32 updates, torch {torch.__version__}")
    print("# MiB kept for backward; 'formula': tdmpc.memory.world_model_saved_bytes, policy_saved_bytes")
    print("size  world eager  formula  world compiled  formula  compiled/eager  policy eager  formula"
          "  policy compiled  formula")
    for size in args.sizes:
        cfg = dataclasses.replace(load_json(args.cfg), task="dog-run", model_size=size, compile=False,
                                  cuda_graphs=False, train_precision="fp32")
        dims = ModelDims.from_config(cfg, DOG_OBS, DOG_ACTIONS, False)
        agent = Agent(cfg, dims, 1000, torch.device("cpu"))
        losses, H, B = agent.learner.losses, cfg.horizon, cfg.batch_size
        batch = (torch.randn(H + 1, B, *DOG_OBS), torch.rand(H, B, DOG_ACTIONS) * 2 - 1, torch.rand(H, B),
                 torch.zeros(H, B), None)
        agent.model.train()
        row: list[float] = []
        with cuda_code_path():
            for compiled in (False, True):
                fn = torch.compile(world_model_loss, dynamic=False) if compiled else world_model_loss
                n, (total, _, zs, reached) = saved_tensor_bytes(agent.model, fn, losses, *batch)
                total.backward()
                row += [n, world_model_saved_bytes(cfg, dims, agent.model, torch.float32, compiled)]
            for compiled in (False, True):  # a fixed Q scale: no running one
                fn = torch.compile(policy_loss, dynamic=False) if compiled else policy_loss
                n, (loss, _) = saved_tensor_bytes(agent.model, fn, losses, zs.detach(), None, reached, unit_scale)
                loss.backward()
                row += [n, policy_saved_bytes(cfg, dims, torch.float32, compiled)]
        we, fe, wc, fc, pe, fpe, pc, fpc = (v / MiB for v in row)
        print(f"{size:>4}  {we:11.1f}  {fe:7.1f}  {wc:14.1f}  {fc:7.1f}  {wc / we:14.2f}  {pe:12.1f}  {fpe:7.1f}"
              f"  {pc:15.1f}  {fpc:7.1f}", flush=True)
        torch.compiler.reset()


if __name__ == "__main__":
    main()
