"""Episodes of a saved ReplayBuffer (tdmpc/buffer.py), as a dataset file.

A saved buffer is a ring per env: once wrapped, row ptr[e] is the oldest. Read from there,
each row flagged `first` starts an episode that runs until the next one; rows before the
first start belong to an episode whose start was overwritten and are dropped. An episode
that does not end in `terminated` (a time limit, a resume, or the one still in progress
when the buffer was saved) is `truncated`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from tdmpc.buffer import BUFFER_FIELDS
from tdmpc.offline.format import DatasetError, Episode, open_h5
from tdmpc.offline.writer import DatasetWriter, action_start


def _open_buffer(path: Path) -> h5py.File:
    """A saved buffer: the row arrays ReplayBuffer.save writes (BUFFER_FIELDS) and its write pointers."""
    f = open_h5(path)
    if missing := [name for name in (*BUFFER_FIELDS, "ptr") if name not in f and name != "first"]:
        f.close()
        raise DatasetError(f"{path}: missing field '{missing[0]}': not a saved replay buffer")
    if "first" not in f:
        f.close()
        raise DatasetError(f"{path}: no field 'first': this buffer was saved before episode starts were "
                           "recorded, so its episodes cannot be told apart")
    return f


def episodes_from_buffer(path: str | Path) -> Iterator[Episode]:
    """The buffer's complete-start episodes, env by env, in time order within each env (task 0)."""
    path = Path(path)
    with _open_buffer(path) as f:
        filled = f["reward"].shape[1]
        for env in range(f["reward"].shape[0]):
            order = np.roll(np.arange(filled), -int(f["ptr"][env]))
            rows = {name: f[name][env][order] for name in ("obs", "action", "reward", "terminated", "first")}
            starts = np.flatnonzero(rows["first"])
            for s, t in zip(starts, [*starts[1:], filled]):
                if t - s < 2:  # a reset observation and nothing after it
                    continue
                terminated = bool(rows["terminated"][t - 1])
                yield Episode(rows["obs"][s:t], rows["action"][s + 1:t], rows["reward"][s + 1:t], terminated,
                              not terminated)


def _check_task(task: str, obs_type: str, obs_shape: tuple[int, ...], action_dim: int, discrete: bool,
                buffer_path: Path) -> int:
    """A buffer whose sizes are not the task's is refused before a dataset is labelled with that task. Returns the
    task's discrete action start (0 for other actions)."""
    from tdmpc.envs import make_env
    from tdmpc.model.checkpoint import describe_sizes

    env, spec = make_env(task, seed=0, obs=obs_type)
    start = action_start(env)
    env.close()
    if (spec.obs_shape, spec.action_dim, spec.discrete) != (obs_shape, action_dim, discrete):
        raise DatasetError(f"{buffer_path} holds {describe_sizes(obs_shape, action_dim, discrete)}, but task '{task}' "
                           f"has {describe_sizes(spec.obs_shape, spec.action_dim, spec.discrete)}: name the task the "
                           f"run trained on")
    return start


def convert_buffer(buffer_path: str | Path, out_path: str | Path, task: str, obs_type: str | None = None,
                   action_repeat: int | None = None, source: str | None = None) -> int:
    """Write (or append) a saved buffer's episodes to a dataset; returns how many were written.

    `obs_type` defaults to what the buffer's obs dtype says (uint8: "rgb"); `action_repeat` to
    the task's default (the buffer does not record it: pass what the run used).
    """
    with _open_buffer(Path(buffer_path)) as f:
        obs_shape, obs_dtype = f["obs"].shape[2:], f["obs"].dtype
        discrete = "num_actions" in f.attrs  # a discrete run's buffer: one integer action per row
        action_dim = int(f.attrs["num_actions"]) if discrete else f["action"].shape[2]
        if "env_tasks" in f:
            raise DatasetError(f"{buffer_path} is a multi-task run's replay buffer (its envs play "
                               f"{len(set(f['env_tasks'][:].tolist()))} tasks, padded to one width), which convert "
                               f"cannot label with one task; a multi-task run keeps its episodes with --save-data")
    if action_repeat is None:
        from tdmpc.envs.names import resolve_task

        action_repeat = resolve_task(task).default_action_repeat
    obs_type = obs_type or ("rgb" if obs_dtype == np.uint8 else "state")
    start = _check_task(task, obs_type, tuple(obs_shape), action_dim, discrete, Path(buffer_path))
    source = source or f"replay buffer {Path(buffer_path).resolve()}"
    with DatasetWriter(out_path, obs_shape, action_dim, [task], obs_type, action_repeat, source,
                       discrete=discrete, action_start=start, whole=True) as writer:
        return writer.commit(episodes_from_buffer(buffer_path))
