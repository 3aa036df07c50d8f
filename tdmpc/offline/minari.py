"""Minari import and export (the optional extra `offline`), local only: nothing is downloaded.

A Minari episode is ours without the row convention: observations (L+1), actions, rewards,
terminations, truncations (L). Export keeps every array exactly (pixels unencoded, not
JPEG) and stores our attributes and each episode's task in Minari's metadata, so that
ours -> Minari -> ours is lossless. Import of foreign data maps Box actions onto [-1, 1]
as tdmpc.envs' UnitActions does, and casts float observations to float32.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
from gymnasium import spaces

from tdmpc.offline.format import DatasetError, Episode, open_h5, read_episodes, read_file
from tdmpc.offline.writer import DatasetWriter

METADATA_KEY = "tdmpc"  # our attributes, as JSON, in the Minari dataset's metadata
EXPORT_BATCH = 256  # episodes handed to Minari at a time
# Minari's warnings for metadata left None (utils.get_dataset_metadata): one per field, none of them a fault
UNSET_METADATA = r"(`\w+`|env_spec) is (set to )?None"


def _minari():
    try:
        import minari
    except ImportError:
        raise DatasetError('Minari import/export needs the "offline" extra: pip install "tdmpc[offline]"') from None
    return minari


def to_minari(dataset_path: str | Path, dataset_id: str, author: str | None = None, author_email: str | None = None,
              code_permalink: str | None = None) -> Path:
    """Write a dataset file as the local Minari dataset `dataset_id` (under $MINARI_DATASETS_PATH, default
    ~/.minari/datasets); returns its directory. Minari's warnings about metadata left unset are silenced: our
    datasets have no gymnasium env spec to give, and the CLI names the author fields left unset in one line."""
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    path = Path(dataset_path)
    with open_h5(path) as f:
        file = read_file(f, path)
    s = file.schema
    obs_space = (spaces.Box(0, 255, s.obs_shape, np.uint8) if s.obs_type == "rgb"
                 else spaces.Box(-np.inf, np.inf, s.obs_shape, np.float32))
    ours = dict(tasks=list(s.tasks), obs_type=s.obs_type, action_repeat=s.action_repeat, source=file.source,
                task_obs_dims=list(s.task_obs_dims), task_action_dims=list(s.task_action_dims))
    dataset, episodes = None, read_episodes(path)
    try:
        while batch := [ep for _, ep in zip(range(EXPORT_BATCH), episodes)]:
            buffers = [EpisodeBuffer(observations=ep.obs, actions=ep.action, rewards=ep.reward,
                                     terminations=_last(len(ep.reward), ep.terminated),
                                     truncations=_last(len(ep.reward), ep.truncated)) for ep in batch]
            if dataset is None:
                try:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", UNSET_METADATA, UserWarning)
                        dataset = minari.create_dataset_from_buffers(
                            dataset_id, buffers, observation_space=obs_space,
                            action_space=spaces.Discrete(s.action_dim) if s.discrete else
                            spaces.Box(-1, 1, (s.action_dim,), np.float32), algorithm_name="tdmpc",
                            author=author, author_email=author_email, code_permalink=code_permalink,
                            description=file.source, data_format="hdf5", jpeg_encoding=False)
                except ValueError as e:  # a malformed or existing id
                    raise DatasetError(f"Minari dataset {dataset_id!r}: {str(e).splitlines()[0]}") from None
            else:
                dataset.update_dataset_from_buffer(buffers)
            first = dataset.total_episodes - len(batch)
            dataset.storage.update_episode_metadata([{"task": ep.task} for ep in batch],
                                                    range(first, dataset.total_episodes))
        if dataset is None:
            raise DatasetError(f"{path}: holds no episode to export")
        dataset.storage.update_metadata({METADATA_KEY: json.dumps(ours)})
    except BaseException:
        if dataset is not None:  # no half-written Minari dataset left behind
            shutil.rmtree(Path(dataset.storage.data_path).parent)
        raise
    return Path(dataset.storage.data_path).parent


def _last(n: int, flag: bool) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[-1] = flag
    return out


def from_minari(source: str | Path, out_path: str | Path, task: str | None = None) -> int:
    """Write (or append) a local Minari dataset, by id or directory, to a dataset file; returns episodes written.

    Ours come back exactly; for others the task is `task` (default: the dataset's env id, else its id).
    """
    dataset = _load(source)
    meta = json.loads(dataset.storage.metadata.get(METADATA_KEY, "{}"))
    obs_space, act_space = dataset.observation_space, dataset.action_space
    discrete = isinstance(act_space, spaces.Discrete)
    for name, space in (("observation", obs_space), ("action", act_space)):
        if not (isinstance(space, spaces.Box) or (name == "action" and discrete)) or (
                name == "action" and not discrete and len(space.shape) != 1):
            raise DatasetError(f"{source}: its {name} space is {space}; only Box observations and 1-D Box or "
                               "Discrete actions can be imported")
    obs_type = meta.get("obs_type", "rgb" if obs_space.dtype == np.uint8 and len(obs_space.shape) == 3 else "state")
    tasks = meta.get("tasks") or [task or (dataset.env_spec.id if dataset.env_spec else dataset.id)]
    if discrete:
        return _write(dataset, source, out_path, obs_space, int(act_space.n), tasks, obs_type, meta,
                      lambda ep: np.asarray(ep.actions, np.int64) - int(act_space.start))
    low, high = act_space.low.astype(np.float64), act_space.high.astype(np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise DatasetError(f"{source}: its action space {act_space} is unbounded; actions cannot be mapped to [-1, 1]")
    unit = bool((low == -1).all() and (high == 1).all())

    span = np.where(high > low, high - low, 1.0)

    def unit_actions(ep) -> np.ndarray:
        """[low, high] onto [-1, 1]; a dimension with low == high (a constant) maps to 0, not to 0 / 0."""
        return ep.actions if unit else np.where(high > low, (np.asarray(ep.actions, np.float64) - low) / span * 2 - 1, 0.0)

    return _write(dataset, source, out_path, obs_space, act_space.shape[0], tasks, obs_type, meta, unit_actions)


def _write(dataset, source: str | Path, out_path: str | Path, obs_space: spaces.Box, action_dim: int, tasks: list,
           obs_type: str, meta: dict, actions) -> int:
    """A Minari dataset's episodes into a dataset file, each episode's actions as `actions(episode)` makes them:
    in [-1, 1], or discrete action indices from 0."""
    def episodes() -> Iterator[Episode]:
        indices = dataset.episode_indices
        for ep, info in zip(dataset.iterate_episodes(indices), dataset.storage.get_episode_metadata(indices)):
            terminated = bool(ep.terminations[-1])
            yield Episode(ep.observations, actions(ep), ep.rewards, terminated,
                          bool(ep.truncations[-1]) or not terminated, int(info.get("task", 0)))

    with DatasetWriter(out_path, obs_space.shape, action_dim, tasks, obs_type,
                       meta.get("action_repeat", 1), meta.get("source", f"minari {source}"),
                       meta.get("task_obs_dims"), meta.get("task_action_dims"),
                       discrete=isinstance(dataset.action_space, spaces.Discrete)) as writer:
        return writer.commit(episodes())


def _load(source: str | Path):
    """A local Minari dataset: a directory (the dataset's, or its `data`), else an id under the datasets root."""
    minari = _minari()
    path = Path(source)
    try:
        if path.is_dir():
            return minari.MinariDataset(path / "data" if (path / "data").is_dir() else path)
        return minari.load_dataset(str(source), download=False)
    except (FileNotFoundError, ValueError) as e:
        raise DatasetError(f"{source}: no such local Minari dataset ({str(e).splitlines()[0][:160]})") from None
