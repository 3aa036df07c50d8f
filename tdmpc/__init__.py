"""tdmpc: TD-MPC2-style model-based reinforcement learning, on a CPU, one GPU or a Slurm cluster.

    import tdmpc
    run_dir, agent = tdmpc.train(env="Pendulum-v1", steps=20_000, model_size=1)
    agent = tdmpc.Agent.from_checkpoint(run_dir / "checkpoints" / "latest.pt")
    action = agent.act(obs)

The command-line entry points are modules: python -m tdmpc.train, tdmpc.evaluate, ...
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

__all__ = ["Agent", "Config", "EvalResult", "__version__", "make_env", "make_vector_env", "run_episodes", "train"]

if TYPE_CHECKING:
    from tdmpc.agent import Agent
    from tdmpc.config import Config
    from tdmpc.envs import make_env, make_vector_env
    from tdmpc.evaluate import EvalResult, run_episodes
    from tdmpc.train import train

# Imported on first use, so that `import tdmpc` stays light and `python -m tdmpc.train` runs its module once.
_LAZY = {"Agent": "tdmpc.agent", "Config": "tdmpc.config", "make_env": "tdmpc.envs", "make_vector_env": "tdmpc.envs",
         "EvalResult": "tdmpc.evaluate", "run_episodes": "tdmpc.evaluate", "train": "tdmpc.train"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tdmpc' has no attribute {name!r}")


class _Package(types.ModuleType):
    """`tdmpc.train` is the function tdmpc.train(...). Importing the module of the same name (the CLI,
    python -m tdmpc.train) would make Python set the package attribute to that module and hide the
    function; this keeps the function (the module stays in sys.modules: from tdmpc.train import main)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name == "train" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
