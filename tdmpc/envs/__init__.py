"""Environments: DeepMind Control and gymnasium tasks behind one name-based API.

    env, spec = make_env("walker-walk", seed=1)             # DMC: domain-task
    envs, spec = make_vector_env("HalfCheetah-v5", 8, seed=1)  # any gymnasium id
"""

from tdmpc.envs import gl

gl.set_default()  # before anything imports dm_control, which reads MUJOCO_GL once
gl.load_triton_first()  # before any env loads a renderer

from tdmpc.envs.make import (EnvSource, EnvSpec, VectorEnvs, check_observations, env_rng_state, make_env,  # noqa: E402
                             make_envs, make_task_envs, make_vector_env, set_env_rng_state)
from tdmpc.envs.names import UnknownTaskError, episode_length  # noqa: E402
from tdmpc.errors import TaskError  # noqa: E402

__all__ = ["EnvSource", "EnvSpec", "TaskError", "UnknownTaskError", "VectorEnvs", "check_observations", "env_rng_state",
           "episode_length",
           "make_env", "make_envs", "make_task_envs", "make_vector_env", "set_env_rng_state"]
