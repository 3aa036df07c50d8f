"""Offline training's data: the dataset files of a run, checked against its task(s), and a sampler.

A single-task dataset trains the model of its task (--task must name it); a multi-task dataset
trains one model over its task list, evaluated on the tasks --task names (mt30, a,b,c). The data
are held in host memory, or streamed from disk in windows that load while the previous one is
sampled (tdmpc.offline.sampler), when they would take more than half of the free host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tdmpc.config import Config
from tdmpc.offline.format import DatasetError, DatasetInfo, Schema, open_dataset
from tdmpc.offline.sampler import DatasetSampler, InMemoryDataset, StreamingDataset
from tdmpc.runtime.files import available_host_memory
from tdmpc.envs import EnvSpec, make_env
from tdmpc.model.checkpoint import describe_sizes
from tdmpc.multitask import TaskSetup
from tdmpc.tasks.sets import TaskInfo, expand, reference_info

STREAM_WINDOW_BYTES = 1 << 30  # a streamed window holds about this much (two are in memory)


@dataclass
class OfflineData:
    info: DatasetInfo
    spec: EnvSpec  # what the model is built for
    tasks: TaskSetup | None  # a multi-task dataset's setup; its tasks are those evaluated on
    sampler: DatasetSampler


def open_offline(cfg: Config, device: torch.device, seed: int, shard: tuple[int, int] = (0, 1)) -> OfflineData:
    """Open cfg.dataset for training on `device`; `shard` (rank, world size) takes this rank's part of every
    batch. Bad files, and data for other tasks or dims, are one-line DatasetErrors."""
    info = open_dataset(cfg.dataset, unit_actions=True)
    spec, tasks = model_spec(cfg, info)
    if tasks is None and _padded(info.schema):  # read each row's task's own columns only (sampler._read_into)
        info = replace(info, schema=replace(info.schema, obs_shape=(info.schema.task_obs_dims[0],),
                                            action_dim=info.schema.task_action_dims[0]))
    return OfflineData(info, spec, tasks, _sampler(cfg, info, device, seed, shard))


def _padded(schema: Schema) -> bool:
    """One state task's episodes zero-padded to a multi-task model's dims (tdmpc.collect from such a model)."""
    return len(schema.tasks) == 1 and len(schema.obs_shape) == 1 and not schema.discrete and schema.padded(0)


def offline_spec(cfg: Config) -> tuple[EnvSpec, TaskSetup | None]:
    """What the model of an offline run is built for, from the files' headers (no row is read)."""
    return model_spec(cfg, open_dataset(cfg.dataset, check_rows=False))


def model_spec(cfg: Config, info: DatasetInfo) -> tuple[EnvSpec, TaskSetup | None]:
    """The single task of the data (which --task must name), or a multi-task model over the data's task list
    evaluated on the tasks --task names."""
    schema, wanted = info.schema, expand(cfg.task)
    if len(schema.tasks) == 1 and not cfg.task_set:
        task = schema.tasks[0]
        if wanted != (task,):
            raise DatasetError(f"{info.files[0].path}: the data are of task {task!r}; pass --task {task}")
        env, spec = make_env(task, obs=cfg.obs, action_repeat=schema.action_repeat)
        env.close()
        rows = ((schema.task_obs_dims[0],), schema.task_action_dims[0]) if _padded(schema) else \
            (schema.obs_shape, schema.action_dim)
        if (tuple(spec.obs_shape), spec.action_dim, spec.discrete) != (*rows, schema.discrete):
            raise DatasetError(f"{info.files[0].path}: the data hold {describe_sizes(*rows, schema.discrete)}, but "
                               f"task {task!r} has {describe_sizes(spec.obs_shape, spec.action_dim, spec.discrete)}")
        tasks = None
    else:
        missing = [t for t in wanted if t not in schema.tasks]
        if missing:
            raise DatasetError(f"{info.files[0].path}: no data of task {missing[0]!r} to evaluate on; the data hold "
                               f"{', '.join(schema.tasks[:6])}{' ...' if len(schema.tasks) > 6 else ''}")
        infos = tuple(TaskInfo(t, o, a, _episode_length(t, schema.action_repeat))
                      for t, o, a in zip(schema.tasks, schema.task_obs_dims, schema.task_action_dims))
        tasks = TaskSetup(wanted, schema.tasks, infos, schema.action_repeat)
        spec = tasks.spec(cfg)
    return spec, tasks


def _episode_length(task: str, action_repeat: int) -> int:
    known = reference_info(task)
    if known is not None and action_repeat == 2:
        return known.episode_length
    from tdmpc.envs import episode_length

    return episode_length(task, action_repeat)


def _sampler(cfg: Config, info: DatasetInfo, device: torch.device, seed: int,
             shard: tuple[int, int]) -> DatasetSampler:
    data_bytes = info.rows * info.schema.row_bytes()
    stream = cfg.dataset_stream == "stream" or (cfg.dataset_stream == "auto" and data_bytes > available_host_memory() / 2)
    if not stream:
        return InMemoryDataset(info, cfg.horizon, device, seed=seed, shard=shard)
    window = max(cfg.batch_size, STREAM_WINDOW_BYTES // info.schema.row_bytes())
    return StreamingDataset(info, cfg.horizon, window_rows=window, swap_every=max(1, window // cfg.batch_size),
                            device=device, seed=seed, shard=shard)
