"""Minari import and export (the optional extra `offline`), local only: nothing is downloaded.

A Minari episode is ours without the row convention: observations (L+1), actions, rewards,
terminations, truncations (L). Export keeps every array exactly (pixels unencoded, not
JPEG) and stores our attributes and each episode's task in Minari's metadata, so that
ours -> Minari -> ours is lossless. Discrete actions go out as the env took them: the space is
Discrete(n, start) with the file's action_start, the actions start + the stored index (and come back as
indices, the start kept). Import of foreign data maps Box actions onto [-1, 1] as tdmpc.envs'
UnitActions does, and casts float observations to float32.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gymnasium import spaces

from tdmpc.offline.format import DatasetError, Episode, open_h5, read_episodes, read_file
from tdmpc.offline.writer import DatasetWriter
from tdmpc.runtime.files import make_dirs

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


class ExportStopped(Exception):
    """to_minari's `stop()` said to stop: nothing was written (the partial dataset is removed)."""


PARTIAL = ".tdmpc-partial"  # <datasets root>/.tdmpc-partial-<pid>: an export in progress (Minari lists no hidden folder)


def to_minari(dataset_path: str | Path, dataset_id: str, author: str | None = None, author_email: str | None = None,
              code_permalink: str | None = None, stop: Callable[[], bool] | None = None) -> Path:
    """Write a dataset file as the local Minari dataset `dataset_id` (under $MINARI_DATASETS_PATH, default
    ~/.minari/datasets); returns its directory. Minari's warnings about metadata left unset are silenced: our
    datasets have no gymnasium env spec to give, and the CLI names the author fields left unset in one line.

    Whole or not at all: the dataset is built in a hidden folder of the datasets root, which Minari does not list,
    and renamed into place at the end. `stop()`, asked between batches of episodes (and before the rename), ends the
    export with ExportStopped, leaving nothing; so does any error. A folder left by an export that was killed
    (its process gone) is removed by the next export."""
    minari = _minari()
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.namespace import create_namespace, list_local_namespaces
    from minari.storage import get_dataset_path

    path = Path(dataset_path)
    with open_h5(path) as f:
        file = read_file(f, path)
    if not file.episodes:
        raise DatasetError(f"{path}: holds no episode to export")
    if not re.search(r"-v\d+$", dataset_id):  # else minari's parser fails with a TypeError
        raise DatasetError(f"Minari dataset {dataset_id!r}: an id ends in its version, -vN (e.g. {dataset_id}-v0)")
    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except ValueError as e:
        raise DatasetError(f"Minari dataset {dataset_id!r}: {str(e).splitlines()[0]}") from None
    dest = get_dataset_path(dataset_id)
    if dest.exists():
        raise DatasetError(f"Minari dataset {dataset_id!r} already exists ({dest}); choose another name or version")
    root = get_dataset_path()
    _remove_stale_partials(root)
    partial = root / f"{PARTIAL}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with _datasets_root(partial):
            _export(minari, path, file, dataset_id, author, author_email, code_permalink, stop)
        if stop is not None and stop():
            raise ExportStopped(dataset_id)
        if namespace is not None and namespace not in list_local_namespaces():
            create_namespace(namespace)
        if dest.exists():
            raise DatasetError(f"Minari dataset {dataset_id!r} already exists ({dest}): made by another process "
                               "while this export ran; choose another name or version")
        make_dirs(dest.parent)
        os.rename(partial / dataset_id, dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def _export(minari, path: Path, file, dataset_id: str, author: str | None, author_email: str | None,
            code_permalink: str | None, stop: Callable[[], bool] | None) -> None:
    """Every episode of `file` into a new Minari dataset `dataset_id` (under the root set now)."""
    from minari.data_collector import EpisodeBuffer

    s = file.schema
    obs_space = (spaces.Box(0, 255, s.obs_shape, np.uint8) if s.obs_type == "rgb"
                 else spaces.Box(-np.inf, np.inf, s.obs_shape, np.float32))
    ours = dict(tasks=list(s.tasks), obs_type=s.obs_type, action_repeat=s.action_repeat, source=file.source,
                task_obs_dims=list(s.task_obs_dims), task_action_dims=list(s.task_action_dims))
    dataset, episodes = None, read_episodes(path)
    while batch := [ep for _, ep in zip(range(EXPORT_BATCH), episodes)]:
        if stop is not None and stop():
            raise ExportStopped(dataset_id)
        buffers = [EpisodeBuffer(observations=ep.obs, actions=ep.action + s.action_start if s.discrete else ep.action,
                                 rewards=ep.reward,
                                 terminations=_last(len(ep.reward), ep.terminated),
                                 truncations=_last(len(ep.reward), ep.truncated)) for ep in batch]
        if dataset is None:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", UNSET_METADATA, UserWarning)
                    dataset = minari.create_dataset_from_buffers(
                        dataset_id, buffers, observation_space=obs_space,
                        action_space=spaces.Discrete(s.action_dim, start=s.action_start) if s.discrete else
                        spaces.Box(-1, 1, (s.action_dim,), np.float32), algorithm_name="tdmpc",
                        author=author, author_email=author_email, code_permalink=code_permalink,
                        description=file.source, data_format="hdf5", jpeg_encoding=False)
            except ValueError as e:  # a malformed id
                raise DatasetError(f"Minari dataset {dataset_id!r}: {str(e).splitlines()[0]}") from None
        else:
            dataset.update_dataset_from_buffer(buffers)
        first = dataset.total_episodes - len(batch)
        dataset.storage.update_episode_metadata([{"task": ep.task} for ep in batch],
                                                range(first, dataset.total_episodes))
    assert dataset is not None
    dataset.storage.update_metadata({METADATA_KEY: json.dumps(ours)})


@contextlib.contextmanager
def _datasets_root(root: Path) -> Iterator[None]:
    """Minari's datasets root ($MINARI_DATASETS_PATH, which Minari reads at each call) set to `root` for a while."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if before is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def _remove_stale_partials(root: Path) -> None:
    """The folders of exports that were killed (their process is gone), said on stderr."""
    for stale in root.glob(f"{PARTIAL}-*"):
        pid = stale.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"removed {stale}, left by a Minari export that was killed", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
    if meta.get("tasks") and task is not None and [task] != list(meta["tasks"]):
        raise DatasetError(f"{source} was written by tdmpc for {', '.join(meta['tasks'])}, which it keeps; --task "
                           f"{task} would relabel its episodes (leave --task out)")
    tasks = meta.get("tasks") or [task or (dataset.env_spec.id if dataset.env_spec else dataset.id)]
    if discrete:
        return _write(dataset, source, out_path, obs_space, int(act_space.n), tasks, obs_type, meta,
                      lambda ep: np.asarray(ep.actions, np.int64) - int(act_space.start), int(act_space.start))
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
           obs_type: str, meta: dict, actions, action_start: int = 0) -> int:
    """A Minari dataset's episodes into a dataset file, each episode's actions as `actions(episode)` makes them:
    in [-1, 1], or discrete action indices from 0 (the Discrete space's start kept as the file's action_start)."""
    def episodes() -> Iterator[Episode]:
        indices = dataset.episode_indices
        for ep, info in zip(dataset.iterate_episodes(indices), dataset.storage.get_episode_metadata(indices)):
            terminated = bool(ep.terminations[-1])
            yield Episode(ep.observations, actions(ep), ep.rewards, terminated,
                          bool(ep.truncations[-1]) or not terminated, int(info.get("task", 0)))

    with DatasetWriter(out_path, obs_space.shape, action_dim, tasks, obs_type,
                       meta.get("action_repeat", 1), meta.get("source", f"minari {source}"),
                       meta.get("task_obs_dims"), meta.get("task_action_dims"),
                       discrete=isinstance(dataset.action_space, spaces.Discrete), action_start=action_start,
                       whole=True) as writer:
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
