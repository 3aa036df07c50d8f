"""tdmpc: TD-MPC2-style model-based reinforcement learning, on a CPU, one GPU or a Slurm cluster.

    import tdmpc
    run_dir, agent = tdmpc.fit(env="Pendulum-v1", steps=20_000, model_size=1)
    agent = tdmpc.Agent.from_checkpoint(run_dir / "checkpoints" / "latest.pt")
    action = agent.act(obs)

The command-line entry points are modules: python -m tdmpc.train, tdmpc.evaluate, ...
(tdmpc.train is the module of that command; the Python function is tdmpc.fit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

__all__ = ["Agent", "Config", "EvalResult", "__version__", "fit", "make_env", "make_vector_env", "run_episodes"]

if TYPE_CHECKING:
    from tdmpc.agent import Agent
    from tdmpc.config import Config
    from tdmpc.envs import make_env, make_vector_env
    from tdmpc.episodes import EvalResult, run_episodes
    from tdmpc.training.setup import fit

# Imported on first use, so that `import tdmpc` stays light.
_LAZY = {"Agent": "tdmpc.agent", "Config": "tdmpc.config", "make_env": "tdmpc.envs", "make_vector_env": "tdmpc.envs",
         "EvalResult": "tdmpc.episodes", "run_episodes": "tdmpc.episodes", "fit": "tdmpc.training.setup"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tdmpc' has no attribute {name!r}")
