"""Offline datasets: episodes in one HDF5 file, rows in the replay buffer's convention.

A row holds an observation and the action, reward and flags that led to it; an episode of
L transitions is L+1 rows, the first holding only the reset observation (action 0, reward 0).
The README ("Offline training and datasets") documents the schema.

Modifying an HDF5 file in place is not crash-safe, so the writer never does: each commit
writes a complete new file (a copy of the old one plus the new episodes) beside it and
renames it over. Readers check every file before use and fail with one line naming the
file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, NoReturn, Sequence, cast

import h5py
import numpy as np

from tdmpc.errors import ActionRangeError, DatasetError

# Version 2 added discrete actions: an 'action_type' attribute ("continuous" or "discrete"); a discrete file's
# 'action' rows are int32 action indices, one per row, and its 'num_actions' attribute says how many there are.
# Version 1 files (continuous, without the attribute) are still read. A discrete file's optional 'action_start'
# attribute (0 when absent) is the `start` of the env's Discrete space: the env's action is start + the index stored.
FORMAT, VERSION, READABLE_VERSIONS = "tdmpc-dataset", 2, (1, 2)
OBS_DTYPES: dict[str, np.dtype] = {"state": np.dtype(np.float32), "rgb": np.dtype(np.uint8)}
OBS_TYPES = tuple(OBS_DTYPES)
ROW_FIELDS = ("obs", "action", "reward", "terminated", "truncated")
EPISODE_FIELDS = ("episode_start", "episode_length", "episode_task")
REQUIRED_ATTRS = ("format", "version", "tasks", "obs_type", "action_repeat", "source")
# gzip 4 + shuffle: universally readable HDF5 filters; on DMC data 1.2x (state) and ~10x (pixels)
# smaller at ~200 MB/s decompression, where lzf gave 1.0x / 1.3x.
COMPRESSION = dict(compression="gzip", compression_opts=4, shuffle=True)
CHUNK_BYTES = 1 << 20  # one chunk of rows holds about this many raw bytes of every row field
EPISODE_CHUNK = 4096
BLOCK_BYTES = 16 << 20  # rows read or written per HDF5 call when streaming



def _fail(where: object, message: str) -> NoReturn:
    raise DatasetError(f"{where}: {message}")


@dataclass
class Episode:
    """One episode: obs (L+1, ...) from the reset observation on; action (L, A), or (L,) integers for discrete
    actions, and reward (L,) per transition."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: bool  # ended in a true terminal state
    truncated: bool  # cut by a time limit or by the end of collection
    task: int = 0  # index into the dataset's task list


@dataclass(frozen=True)
class Schema:
    """What every row of a dataset looks like: the writer's promise and the reader's check."""

    obs_shape: tuple[int, ...]
    action_dim: int
    tasks: tuple[str, ...]
    obs_type: str
    action_repeat: int
    task_obs_dims: tuple[int, ...]  # per task, obs features before zero padding (pixels: channels)
    task_action_dims: tuple[int, ...]  # per task, action dims before zero padding
    discrete: bool = False  # action rows are integers 0..action_dim-1 (action_dim: the number of actions)
    action_start: int = 0  # discrete: the env's Discrete(n, start) start; its action is start + the stored index

    @property
    def obs_dtype(self) -> np.dtype:
        return OBS_DTYPES[self.obs_type]

    def row_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape of one row and dtype of each row field."""
        f32, b = np.dtype(np.float32), np.dtype(bool)
        action = ((), np.dtype(np.int32)) if self.discrete else ((self.action_dim,), f32)
        return {"obs": (self.obs_shape, self.obs_dtype), "action": action, "reward": ((), f32),
                "terminated": ((), b), "truncated": ((), b)}

    def padded(self, task: int) -> bool:
        """Whether task `task`'s rows are zero-padded: its own dims are smaller than the file's."""
        return (self.task_obs_dims[task], self.task_action_dims[task]) != (self.obs_shape[0], self.action_dim)

    def row_bytes(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize for shape, dt in self.row_fields().values())

    def chunk_rows(self) -> int:
        return max(1, CHUNK_BYTES // self.row_bytes())

    def block_rows(self, chunk_rows: int) -> int:
        """Rows per streamed read or write: about BLOCK_BYTES, a whole number of chunks (each decompressed once)."""
        return chunk_rows * max(1, BLOCK_BYTES // (chunk_rows * self.row_bytes()))


def make_schema(where: object, obs_shape: Sequence[int], action_dim: int, tasks: Sequence[str], obs_type: str,
                action_repeat: int, task_obs_dims: Sequence[int] | None = None,
                task_action_dims: Sequence[int] | None = None, discrete: bool = False,
                action_start: int = 0) -> Schema:
    """A checked Schema; task dims default to the full dims (no padding). `where` names the file in errors.
    discrete: action rows are integers 0..action_dim-1, the env's actions action_start.. action_start+n-1."""
    if action_start and not discrete:
        _fail(where, f"'action_start' is {action_start}: only discrete actions have one")
    obs_shape, tasks = tuple(int(d) for d in obs_shape), tuple(tasks)
    if obs_type not in OBS_TYPES:
        _fail(where, f"'obs_type' is {obs_type!r}, not one of {list(OBS_TYPES)}")
    if not obs_shape or min(obs_shape) < 1 or action_dim < 1:
        _fail(where, f"'obs' rows of shape {obs_shape}, 'action' rows of {action_dim} values: both must be non-empty")
    if not tasks or len(set(tasks)) != len(tasks) or not all(isinstance(t, str) and t for t in tasks):
        _fail(where, f"'tasks' must be a non-empty list of distinct names, got {list(tasks)}")
    if action_repeat < 1:
        _fail(where, f"'action_repeat' is {action_repeat}; it must be at least 1")
    if discrete and (action_dim < 2 or len(tasks) > 1):
        _fail(where, f"discrete actions need 'num_actions' >= 2 (got {action_dim}) and one task (got {len(tasks)})")
    dims = {}
    for name, given, full in (("task_obs_dims", task_obs_dims, obs_shape[0]),
                              ("task_action_dims", task_action_dims, action_dim)):
        dims[name] = tuple(int(d) for d in given) if given is not None else (full,) * len(tasks)
        if len(dims[name]) != len(tasks) or not all(1 <= d <= full for d in dims[name]):
            _fail(where, f"'{name}' is {list(dims[name])}: one dim per task (of {len(tasks)}), each 1..{full}")
    return Schema(obs_shape, int(action_dim), tasks, obs_type, int(action_repeat), **dims, discrete=discrete,
                  action_start=int(action_start))


def _first_nonfinite(a: np.ndarray) -> int | None:
    """Index along axis 0 of the first row holding a NaN or inf, None if all are finite."""
    bad = ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    return int(bad.argmax()) if bad.any() else None


def _first_out_of_range(action: np.ndarray) -> int | None:
    """The first row with an action outside [-1, 1] (float32 rounding allowed), or None."""
    out = np.flatnonzero((np.abs(action) > 1 + 1e-6).reshape(len(action), -1).any(1))
    return int(out[0]) if len(out) else None


def _first_bad_index(action: np.ndarray, n: int) -> int | None:
    """The first discrete action outside 0..n-1, or None."""
    out = np.flatnonzero((action < 0) | (action >= n))
    return int(out[0]) if len(out) else None


OUT_OF_RANGE = "actions are stored in [-1, 1], the agent's range: map the env's action bounds onto it"


def check_episode(ep: Episode, schema: Schema, where: str) -> Episode:
    """The episode as stored (dtypes converted), or a one-line DatasetError naming the field."""
    if schema.obs_type == "rgb" and np.asarray(ep.obs).dtype != np.uint8:
        _fail(where, f"'obs' is {np.asarray(ep.obs).dtype}; pixel observations must be uint8")
    obs = np.asarray(ep.obs, dtype=schema.obs_dtype)
    action, reward = np.asarray(ep.action), np.asarray(ep.reward, dtype=np.float32)
    if schema.discrete and action.size and not np.issubdtype(action.dtype, np.integer):
        if not np.array_equal(action, np.round(action)):
            _fail(where, "'action' holds non-integer values; a discrete dataset stores action indices")
    action = action.astype(schema.row_fields()["action"][1])
    L = len(reward)
    if reward.shape != (L,) or L < 1:
        _fail(where, f"'reward' has shape {reward.shape}; expected (L,) with L >= 1 transitions")
    for name, a, shape in (("obs", obs, (L + 1, *schema.obs_shape)), ("action", action, (L, *schema.row_fields()["action"][0]))):
        if a.shape != shape:
            _fail(where, f"'{name}' has shape {a.shape}; expected {shape} for {L} transitions")
    if not (ep.terminated or ep.truncated):
        _fail(where, "neither 'terminated' nor 'truncated' is set: an episode ends one way or the other")
    if schema.discrete and (step := _first_bad_index(action, schema.action_dim)) is not None:
        _fail(where, f"'action' is {action[step]} at step {step}; the {schema.action_dim} discrete actions are "
                     f"0..{schema.action_dim - 1}")
    if not 0 <= ep.task < len(schema.tasks):
        _fail(where, f"'task' is {ep.task}; the dataset has {len(schema.tasks)} task(s) {list(schema.tasks)}")
    for name, a in (("obs", obs), ("action", action), ("reward", reward)):
        if schema.obs_type == "state" or name != "obs":
            if (step := _first_nonfinite(a)) is not None:
                _fail(where, f"'{name}' is not finite at {'row' if name == 'obs' else 'step'} {step}")
    return Episode(obs, action, reward, bool(ep.terminated), bool(ep.truncated), int(ep.task))


# --- reading -----------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetFile:
    """One checked file: its schema and episode table (small), not its rows."""

    path: Path
    schema: Schema  # as stored (obs/action possibly padded for multi-task data)
    source: str
    rows: int
    chunk_rows: int
    episode_start: np.ndarray  # (E,) int64
    episode_length: np.ndarray  # (E,) int64, transitions
    episode_task: np.ndarray  # (E,) int64, index into schema.tasks
    episode_terminated: np.ndarray  # (E,) bool: ended in a true terminal state (else truncated)
    task_ids: np.ndarray  # (len(schema.tasks),) this file's task ids in the merged task list

    @property
    def episodes(self) -> int:
        return len(self.episode_start)


@dataclass(frozen=True)
class DatasetInfo:
    """Checked files read together: tasks merged by name; obs/action zero-padded to the largest dims."""

    files: tuple[DatasetFile, ...]
    schema: Schema

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def episodes(self) -> int:
        return sum(f.episodes for f in self.files)


def open_h5(path: str | Path) -> h5py.File:
    """Open for reading, with one-line errors for a missing, non-HDF5 or truncated file."""
    path = Path(path)
    if not path.is_file():
        _fail(path, "no such file" if not path.exists() else "not a file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        what = "truncated or corrupt HDF5 file" if h5py.is_hdf5(path) else "not an HDF5 file"
        _fail(path, f"{what} ({str(e).splitlines()[0][:160]})")


def _attr(f: h5py.File, name: str, path: Path):
    if name not in f.attrs:
        if name == "format" and "ptr" in f and "first" in f:  # a training run's saved replay buffer
            _fail(path, "a saved replay buffer, not a dataset file: python -m tdmpc.dataset convert makes one of it")
        _fail(path, f"missing field '{name}' (a root attribute)")
    value = f.attrs[name]
    return value.decode() if isinstance(value, bytes) else value


def _int_attr(f: h5py.File, name: str, path: Path) -> int:
    value = _attr(f, name, path)
    if not isinstance(value, (int, np.integer)):
        _fail(path, f"'{name}' is {value!r}, not an integer")
    return int(value)


def _json_list(f: h5py.File, name: str, path: Path) -> list:
    try:
        value = json.loads(_attr(f, name, path))
    except (TypeError, json.JSONDecodeError):
        value = None
    if not isinstance(value, list):
        _fail(path, f"'{name}' is not a JSON list")
    return value


def read_file(f: h5py.File, path: Path) -> DatasetFile:
    """Check the structure of an open file (attrs, fields, shapes, dtypes, episode table); no row is read."""
    fmt = _attr(f, "format", path)
    if fmt != FORMAT:
        _fail(path, f"'format' is {fmt!r}: not a {FORMAT} file")
    if _int_attr(f, "version", path) not in READABLE_VERSIONS:
        _fail(path, f"'version' is {_attr(f, 'version', path)}; this reader knows versions "
                    f"{', '.join(map(str, READABLE_VERSIONS))}")
    for name in REQUIRED_ATTRS:
        _attr(f, name, path)
    for name in ROW_FIELDS + EPISODE_FIELDS:
        if not isinstance(f.get(name), h5py.Dataset):
            _fail(path, f"missing field '{name}'")
    action_type = _attr(f, "action_type", path) if "action_type" in f.attrs else "continuous"  # version 1
    if action_type not in ("continuous", "discrete"):
        _fail(path, f"'action_type' is {action_type!r}, not 'continuous' or 'discrete'")
    discrete = action_type == "discrete"
    if f["obs"].ndim < 2 or f["action"].ndim != (1 if discrete else 2):
        _fail(path, f"'obs' has shape {f['obs'].shape} and 'action' {f['action'].shape}: rows of obs and of "
                    f"{'action indices' if discrete else 'action vectors'}")
    dims = {n: _json_list(f, n, path) if n in f.attrs else None for n in ("task_obs_dims", "task_action_dims")}
    schema = make_schema(path, f["obs"].shape[1:], _int_attr(f, "num_actions", path) if discrete else f["action"].shape[1],
                         _json_list(f, "tasks", path), _attr(f, "obs_type", path), _int_attr(f, "action_repeat", path),
                         **dims, discrete=discrete,
                         action_start=_int_attr(f, "action_start", path) if "action_start" in f.attrs else 0)
    rows = f["reward"].shape[0]
    for name, (shape, dtype) in schema.row_fields().items():
        ds = f[name]
        if ds.shape != (rows, *shape) or ds.dtype != dtype:
            _fail(path, f"'{name}' is {ds.dtype} {ds.shape}; expected {dtype} {(rows, *shape)} "
                        f"({rows} rows, as 'reward')")
    table = [f[name] for name in EPISODE_FIELDS]
    if any(ds.ndim != 1 or ds.dtype.kind not in "iu" or len(ds) != len(table[0]) for ds in table):
        _fail(path, "'episode_start', 'episode_length', 'episode_task' must be integer vectors of one length "
                    f"(got {[(str(ds.dtype), ds.shape) for ds in table]})")
    start, length, task = (ds[...].astype(np.int64) for ds in table)
    if (length < 1).any():
        _fail(path, f"'episode_length' is {length[length < 1][0]} at episode {int(np.argmax(length < 1))}; "
                    "every episode has at least one transition")
    expected_start = np.concatenate([[0], np.cumsum(length + 1)])
    if not np.array_equal(start, expected_start[:-1]) or expected_start[-1] != rows:
        bad = np.flatnonzero(start != expected_start[:-1])
        where = (f"episode {bad[0]} starts at row {start[bad[0]]}, expected {expected_start[bad[0]]}" if len(bad)
                 else f"the episodes cover {expected_start[-1]} rows")
        _fail(path, f"'episode_start'/'episode_length' do not tile the {rows} rows: {where}")
    if len(task) and (task.min() < 0 or task.max() >= len(schema.tasks)):
        e = int(np.argmax((task < 0) | (task >= len(schema.tasks))))
        _fail(path, f"'episode_task' is {task[e]} at episode {e}; 'tasks' lists {len(schema.tasks)}")
    chunks = f["obs"].chunks
    return DatasetFile(path, schema, str(_attr(f, "source", path)), rows, chunks[0] if chunks else schema.chunk_rows(),
                       start, length, task, f["terminated"][...][start + length], np.arange(len(schema.tasks)))


def _row_blocks(file: DatasetFile) -> Iterator[tuple[int, int]]:
    """Row ranges of about BLOCK_BYTES, aligned to chunks: each chunk is decompressed once."""
    step = file.schema.block_rows(file.chunk_rows)
    for lo in range(0, file.rows, step):
        yield lo, min(lo + step, file.rows)


def _episode_of(file: DatasetFile, row: int) -> str:
    e = int(np.searchsorted(file.episode_start, row, side="right")) - 1
    return f"row {row} (episode {e}, step {row - file.episode_start[e]})"


def check_values(f: h5py.File, file: DatasetFile, unit_actions: bool = False) -> None:
    """Stream over the rows once: obs/action/reward finite, flags set exactly on the last row of each episode, and
    with unit_actions every action in [-1, 1] (what training and `dataset info` ask); discrete actions are always
    checked to be one of the file's actions."""
    ends = file.episode_start + file.episode_length
    flagged = 0
    for lo, hi in _row_blocks(file):
        for name in ("obs", "action", "reward") if file.schema.obs_type == "state" else ("action", "reward"):
            values = _read(f, file, name, lo, hi)
            if (bad := _first_nonfinite(values)) is not None:
                _fail(file.path, f"'{name}' is not finite at {_episode_of(file, lo + bad)}")
            if name == "action" and file.schema.discrete:
                if (bad := _first_bad_index(values, file.schema.action_dim)) is not None:
                    _fail(file.path, f"'action' is {values[bad]} at {_episode_of(file, lo + bad)}; the "
                                     f"{file.schema.action_dim} discrete actions are 0..{file.schema.action_dim - 1}")
            elif unit_actions and name == "action" and (bad := _first_out_of_range(values)) is not None:
                raise ActionRangeError(f"{file.path}: 'action' is outside [-1, 1] at {_episode_of(file, lo + bad)}; "
                                       f"{OUT_OF_RANGE}")
        rows = np.flatnonzero(_read(f, file, "terminated", lo, hi) | _read(f, file, "truncated", lo, hi)) + lo
        stray = rows[~np.isin(rows, ends)]
        if len(stray):
            _fail(file.path, f"'terminated'/'truncated' set inside an episode at {_episode_of(file, int(stray[0]))}")
        flagged += len(rows)
    if flagged != file.episodes:
        _fail(file.path, f"'terminated'/'truncated': {file.episodes - flagged} episode(s) end with neither set")


def _read(f: h5py.File, file: DatasetFile, name: str, lo: int, hi: int) -> np.ndarray:
    try:
        return f[name][lo:hi]
    except OSError as e:
        _fail(file.path, f"cannot read '{name}' rows {lo}..{hi}: the file is corrupt ({str(e).splitlines()[0][:120]})")


def _merge(files: list[DatasetFile]) -> DatasetInfo:
    """Tasks merged by name (ids remapped); obs/action dims the largest, where the files differ."""
    first = files[0]
    tasks: dict[str, tuple[int, int, Path]] = {}
    for file in files:
        s = file.schema
        for name in ("obs_type", "action_repeat", "discrete", "action_start"):
            if (have := getattr(s, name)) != (want := getattr(first.schema, name)):
                _fail(file.path, f"'{name}' is {have!r} but {want!r} in {first.path}")
        if s.discrete and s.action_dim != first.schema.action_dim:
            _fail(file.path, f"'num_actions' is {s.action_dim} but {first.schema.action_dim} in {first.path}")
        if s.obs_shape != first.schema.obs_shape and (s.obs_type == "rgb" or len(s.obs_shape) > 1):
            _fail(file.path, f"'obs' rows are {s.obs_shape} but {first.schema.obs_shape} in {first.path}; only "
                             "state vectors of different lengths can be read together (zero-padded)")
        for name, od, ad in zip(s.tasks, s.task_obs_dims, s.task_action_dims):
            od_, ad_, where = tasks.setdefault(name, (od, ad, file.path))
            if (od, ad) != (od_, ad_):
                _fail(file.path, f"task {name!r} has obs/action dims {od}/{ad} here but {od_}/{ad_} in {where}")
    names = list(tasks)
    files = [replace(file, task_ids=np.array([names.index(t) for t in file.schema.tasks])) for file in files]
    schema = replace(first.schema, obs_shape=(max(f.schema.obs_shape[0] for f in files), *first.schema.obs_shape[1:]),
                     action_dim=max(f.schema.action_dim for f in files), tasks=tuple(names),
                     task_obs_dims=tuple(v[0] for v in tasks.values()),
                     task_action_dims=tuple(v[1] for v in tasks.values()))
    return DatasetInfo(tuple(files), schema)


def open_dataset(paths: str | Path | Sequence[str | Path], expect_obs_shape: Sequence[int] | None = None,
                 expect_action_dim: int | None = None, check_rows: bool = True,
                 unit_actions: bool = False) -> DatasetInfo:
    """Check every file and read them together, or raise a one-line DatasetError naming the file and field.

    `expect_*` are the dims the caller's model uses (for multi-task data, the padded ones).
    `check_rows` streams over every row once (NaN/inf, episode flags; with `unit_actions`, actions in [-1, 1],
    the agent's range, as training needs them): the one check that costs a pass over the data (~200 MB/s);
    the rest reads attributes and the episode table.
    """
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise DatasetError("no dataset file given")
    files = []
    for path in paths:
        with open_h5(path) as f:
            files.append(read_file(f, cast(Path, path)))
    info = _merge(files)
    for name, want in (("obs", expect_obs_shape), ("action", expect_action_dim)):
        want = None if want is None else tuple(cast(Sequence[int], want)) if name == "obs" else (cast(int, want),)
        have = info.schema.row_fields()[name][0]
        if want is not None and have != want:
            file = next(f for f in info.files if f.schema.row_fields()[name][0] == have)
            _fail(file.path, f"'{name}' rows are {have}; this run expects {want} (tasks {list(file.schema.tasks)})")
    if check_rows:
        for file in info.files:
            with open_h5(file.path) as f:
                check_values(f, file, unit_actions)
    return info


def episode_blocks(file: DatasetFile) -> Iterator[tuple[int, int, int, int]]:
    """(first episode, end episode, first row, end row) of runs of whole episodes of about BLOCK_BYTES each."""
    ends = file.episode_start + file.episode_length + 1
    target = file.schema.block_rows(file.chunk_rows)
    e = 0
    while e < file.episodes:
        e1 = max(e + 1, int(np.searchsorted(ends, file.episode_start[e] + target, side="right")))
        yield e, e1, int(file.episode_start[e]), int(ends[e1 - 1])
        e = e1


def read_episodes(path: str | Path) -> Iterator[Episode]:
    """The episodes of one file in order, read in blocks (tasks as the file numbers them)."""
    with open_h5(path) as f:
        file = read_file(f, Path(path))
        for e0, e1, lo, hi in episode_blocks(file):
            rows = {name: _read(f, file, name, lo, hi) for name in ROW_FIELDS}
            for e in range(e0, e1):
                a, b = file.episode_start[e] - lo, file.episode_start[e] + file.episode_length[e] + 1 - lo
                yield Episode(rows["obs"][a:b], rows["action"][a + 1:b], rows["reward"][a + 1:b],
                              bool(rows["terminated"][b - 1]), bool(rows["truncated"][b - 1]),
                              int(file.episode_task[e]))

