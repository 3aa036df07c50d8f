"""DatasetWriter: append episodes to a dataset file without ever risking what it already holds."""

from __future__ import annotations

import fcntl
import glob
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import h5py
import numpy as np
from gymnasium import spaces

from tdmpc.runtime.files import atomic_write, make_dirs, remove_made_dirs
from tdmpc.offline.format import (CHUNK_BYTES, COMPRESSION, EPISODE_CHUNK, EPISODE_FIELDS, FORMAT, ROW_FIELDS, VERSION,
                           DatasetError, DatasetFile, Episode, Schema, check_episode, make_schema, open_h5, read_file)


class DatasetWriter:
    """Append episodes to a dataset file (created if missing), crash-safely.

    `add_episode` checks an episode and holds it in memory; `commit()` writes what is held:
    it copies the file to a temp file beside it, appends there, fsyncs and renames it over
    the original. A crash at any moment leaves the file as it was before the commit or as
    it is after, never half of one; the price is that every commit copies the whole file,
    so commit in large batches. One writer per file at a time (WriterLock: a `.NAME.lock` file that
    exists while a writer holds it); opening removes temp files that killed writers left behind. On
    leaving a `with` block normally the writer commits; on an exception it drops what was not committed.
    """

    def __init__(self, path: str | Path, obs_shape: Sequence[int], action_dim: int, tasks: Sequence[str],
                 obs_type: str, action_repeat: int, source: str, task_obs_dims: Sequence[int] | None = None,
                 task_action_dims: Sequence[int] | None = None, discrete: bool = False, action_start: int = 0,
                 whole: bool = False):
        """discrete: actions are integers 0..action_dim-1 (action_dim: the number of actions); action_start: the
        `start` of the env's Discrete space (what its actions are offset by), kept for readers of the file.
        whole: the writer appends all of its source at once (a converted buffer, an imported Minari dataset), so a
        file whose sources name it already holds those episodes: refused, rather than each counted twice."""
        self.path = Path(path)
        self.schema = make_schema(self.path, obs_shape, action_dim, tasks, obs_type, action_repeat,
                                  task_obs_dims, task_action_dims, discrete, action_start)
        self.source, self.writer = source, source
        self._lock = WriterLock(self.path)
        self._pending: list[Episode] = []
        self.episodes = 0  # in the file
        self.segments: list[list] = []  # [writer, first episode, count] per run of commits, as the file records them
        try:
            for leftover in self.path.parent.glob(glob.escape(f".{self.path.name}.") + "*.tmp"):
                leftover.unlink(missing_ok=True)
            if self.path.exists():
                with open_h5(self.path) as f:
                    old = read_file(f, self.path)
                self._check_extends(old)
                self.episodes = old.episodes
                self.segments = _segments(self.path, old.episodes)
                if whole and set(source.splitlines()) <= set(old.source.splitlines()):
                    raise DatasetError(f"{self.path} already holds the episodes of {source.splitlines()[0]}: "
                                       f"writing them again would count each twice; choose another --out")
                if source not in old.source.splitlines():
                    self.source = f"{old.source}\n{source}" if old.source else source
        except BaseException:
            self._lock.close()
            raise

    def _check_extends(self, old: DatasetFile) -> None:
        for name in ("obs_shape", "action_dim", "discrete", "action_start", "obs_type", "action_repeat"):
            have, want = getattr(old.schema, name), getattr(self.schema, name)
            if have != want:
                raise DatasetError(f"{self.path}: '{name}' is {have!r} in the file, {want!r} for the episodes "
                                   "to append")
        n = len(old.schema.tasks)
        for name in ("tasks", "task_obs_dims", "task_action_dims"):
            have, want = getattr(old.schema, name), getattr(self.schema, name)
            if want[:n] != have:
                raise DatasetError(f"{self.path}: '{name}' is {list(have)} in the file; appending needs it or an "
                                   f"extension of it, got {list(want)}")

    def add_episode(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminated: bool,
                    truncated: bool, task: int = 0) -> None:
        """Check one episode (obs (L+1, ...), action (L, A) or (L,) integers, reward (L,)) and hold it until
        commit()."""
        where = f"{self.path} (episode {self.episodes + len(self._pending)}, being added)"
        copies = Episode(np.array(obs), np.array(action), np.array(reward), terminated, truncated, task)  # callers
        self._pending.append(check_episode(copies, self.schema, where))  # may reuse their arrays

    def commit(self, episodes: Iterable[Episode] = ()) -> int:
        """Write the held episodes, then `episodes` (streamed: e.g. a generator over another dataset), in
        one atomic step; returns how many were written. A bad episode in `episodes` aborts the whole commit."""
        first = self.episodes + len(self._pending)
        checked = (check_episode(ep, self.schema, f"{self.path} (episode {first + i}, being added)")
                   for i, ep in enumerate(episodes))
        stream = iter(itertools.chain(self._pending, checked))
        head = next(stream, None)
        if head is None:
            return 0
        written = [0]

        def write(tmp: Path) -> None:
            exists = self.path.exists()
            if exists:
                shutil.copyfile(self.path, tmp)
            with h5py.File(tmp, "a" if exists else "w", rdcc_nbytes=4 * CHUNK_BYTES) as f:
                if not exists:
                    self._create(f)
                self._write_attrs(f)
                written[0] = _append_all(f, itertools.chain([head], stream), self.schema)
                f.attrs["segments"] = json.dumps(self._segments_with(written[0]))

        atomic_write(self.path, write)  # on failure the held episodes stay held
        self._pending = []
        self.segments = self._segments_with(written[0])
        self.episodes += written[0]
        return written[0]

    def _segments_with(self, n: int) -> list[list]:
        """The file's segments once this writer appends `n` more episodes (one segment per run of its commits)."""
        last = self.segments[-1] if self.segments else None
        if last is not None and last[0] == self.writer and last[1] + last[2] == self.episodes:
            return [*self.segments[:-1], [self.writer, last[1], last[2] + n]]
        return [*self.segments, [self.writer, self.episodes, n]]

    def drop_own_after(self, episodes: int) -> None:
        """A run resumed from a checkpoint that counted `episodes` in the file: drop the episodes this writer
        appended after them (it plays them again), atomically, as a commit. Another writer's episodes (collect,
        another run sharing the file) and those of unknown origin are never dropped; when the run's own lie
        before another's, a one-line DatasetError says so and the file is left as it is."""
        own_from = self.episodes  # where the run's own episodes at the end of the file begin
        for writer, first, count in reversed(self.segments):
            if first + count <= episodes or writer != self.writer:
                break
            own_from = max(first, episodes)
        between = [(w, f, c) for w, f, c in self.segments if max(f, episodes) < min(f + c, own_from)]
        if any(w == self.writer for w, _, _ in between):
            others = sorted({str(w or "a writer not recorded") for w, _, _ in between if w != self.writer})
            raise DatasetError(f"{self.path}: after this run's checkpoint it holds episodes of this run followed by "
                               f"another writer's ({'; '.join(others)}); a resume would have to drop those. Move "
                               f"them out, or resume with config field 'save_data' naming another file")
        if own_from >= self.episodes:
            return
        segments = [[w, f, min(c, own_from - f)] for w, f, c in self.segments if f < own_from]

        def write(tmp: Path) -> None:
            shutil.copyfile(self.path, tmp)
            with h5py.File(tmp, "a") as f:
                rows = int(f["episode_start"][own_from]) if own_from else 0
                for name in ROW_FIELDS:
                    f[name].resize(rows, axis=0)
                for name in EPISODE_FIELDS:
                    f[name].resize(own_from, axis=0)
                f.attrs["segments"] = json.dumps(segments)

        atomic_write(self.path, write)
        self.episodes, self.segments = own_from, segments

    def _create(self, f: h5py.File) -> None:
        chunk = self.schema.chunk_rows()
        for name, (shape, dtype) in self.schema.row_fields().items():
            f.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=(chunk, *shape),
                             **COMPRESSION)
        for name in EPISODE_FIELDS:
            f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(EPISODE_CHUNK,), **COMPRESSION)

    def _write_attrs(self, f: h5py.File) -> None:
        s = self.schema
        f.attrs.update(format=FORMAT, version=VERSION, tasks=json.dumps(list(s.tasks)), obs_type=s.obs_type,
                       action_repeat=s.action_repeat, source=self.source,
                       action_type="discrete" if s.discrete else "continuous")
        if s.discrete:
            f.attrs.update(num_actions=s.action_dim, action_start=s.action_start)
        if len(s.tasks) > 1 or s.padded(0):
            # several tasks, or one task's episodes padded to a multi-task model's dims (tdmpc.collect)
            f.attrs.update(task_obs_dims=json.dumps(list(s.task_obs_dims)),
                           task_action_dims=json.dumps(list(s.task_action_dims)))

    def close(self) -> None:
        """Commit what is held and release the file."""
        try:
            self.commit()
        finally:
            self._lock.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._pending = []
            self._lock.close()


def action_start(env: Any) -> int:
    """The `start` of an env's Discrete action space, on the env or a wrapper inside it (tdmpc.envs maps the agent's
    0..n-1 onto it with a wrapper whose own space starts at 0); 0 for any other space."""
    while env is not None:
        space = getattr(env, "action_space", None)
        if isinstance(space, spaces.Discrete) and int(space.start):
            return int(space.start)
        env = getattr(env, "env", None)
    return 0


def task_action_start(source: Any, **make: Any) -> int:
    """action_start of a task: an id or a factory (one env made with `make`'s keywords, and closed), or a user's env
    object (read as it is)."""
    import gymnasium as gym

    from tdmpc.envs import make_env

    if isinstance(source, gym.Env):
        return action_start(source)
    env, _ = make_env(source, **make)
    try:
        return action_start(env)
    finally:
        env.close()


class WriterLock:
    """One writer per dataset file: an exclusive flock on `.NAME.lock` beside it, a file that exists only while a
    writer holds it (or a killed one left it: the next writer takes it over, and removes it in turn).

    The holder removes the lock file before letting go (unlink, then close), so no file is left behind. That alone
    would break the guarantee: B opens the file, A unlinks it and closes it, B's flock succeeds on a file no longer
    in the folder, and C creates a new one and locks that too. So a writer that gets the flock checks that the
    name still leads to the file it locked (the same inode) and starts again if not. Only a holder unlinks, and it
    holds the file the name leads to, so once that check passes no one can take the name from it. The folders a
    writer made for a file it then never wrote are removed as it lets go. A filesystem without flock (some network
    mounts) is written unlocked.
    """

    def __init__(self, path: Path):
        self.path, self.file, self.made = path, path.parent / f".{path.name}.lock", None
        try:
            self.made = make_dirs(path.parent)
            self.fd = self._acquire()
        except OSError as e:  # said of the user's file, not of the lock file they never asked for
            remove_made_dirs(path.parent, self.made)
            why = e.strerror if e.filename in (None, str(self.file)) else f"{e.filename}: {e.strerror}"
            raise OSError(e.errno, f"cannot write in its folder ({why})", str(path)) from None

    def _acquire(self) -> int:
        """The lock file, open and locked, that the lock file's name leads to."""
        while True:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DatasetError(f"{self.path}: another writer is appending to it (tdmpc.collect, a run's "
                                   "--save-data or tdmpc.dataset); run this when it is done") from None
            except OSError:
                pass
            if self._names(fd):
                return fd
            os.close(fd)  # its holder removed it as it let go: lock the one the name leads to now

    def _names(self, fd: int) -> bool:
        """Whether the lock file's name still leads to the open file `fd`."""
        try:
            on_disk, held = os.stat(self.file), os.fstat(fd)
        except FileNotFoundError:
            return False
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)

    def close(self) -> None:
        """Remove the lock file while still holding it, then let go (again: nothing)."""
        if self.fd < 0:
            return
        if self._names(self.fd):
            self.file.unlink()
        os.close(self.fd)
        self.fd = -1
        if not self.path.exists():
            remove_made_dirs(self.path.parent, self.made)


def _append_all(f: h5py.File, episodes: Iterator[Episode], schema: Schema) -> int:
    """Append checked episodes in batches of about BLOCK_BYTES; returns how many."""
    block = schema.block_rows(schema.chunk_rows())
    count, batch, rows = 0, [], 0
    for ep in itertools.chain(episodes, [None]):
        if ep is not None:
            batch.append(ep)
            rows += len(ep.obs)
        if batch and (ep is None or rows >= block):
            _append(f, batch)
            count, batch, rows = count + len(batch), [], 0
    return count


def _append(f: h5py.File, episodes: list[Episode]) -> None:
    R, E = f["reward"].shape[0], f["episode_start"].shape[0]
    length = np.array([len(ep.reward) for ep in episodes], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(length + 1)[:-1]])
    last = start + length
    n = int(last[-1]) + 1
    zero_row = {name: np.zeros((1, *ep_field.shape[1:]), ep_field.dtype)
                for name, ep_field in (("action", episodes[0].action), ("reward", episodes[0].reward))}
    terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
    terminated[last], truncated[last] = [ep.terminated for ep in episodes], [ep.truncated for ep in episodes]
    data = {"obs": np.concatenate([ep.obs for ep in episodes]),
            **{name: np.concatenate([a for ep in episodes for a in (zero_row[name], getattr(ep, name))])
               for name in ("action", "reward")},
            "terminated": terminated, "truncated": truncated, "episode_start": R + start, "episode_length": length,
            "episode_task": np.array([ep.task for ep in episodes], dtype=np.int64)}
    for name, values in data.items():
        ds = f[name]
        old = R if name in ROW_FIELDS else E
        ds.resize(old + len(values), axis=0)
        ds[old:] = values


def _segments(path: Path, episodes: int) -> list[list]:
    """Who wrote which episodes: the file's 'segments' attribute, or, in a file written before writers were
    recorded, one segment of unknown origin (writer None)."""
    with h5py.File(path, "r") as f:
        raw = f.attrs.get("segments")
    if raw is None:
        return [[None, 0, episodes]] if episodes else []
    return [list(seg) for seg in json.loads(raw)]


class EpisodeRecorder:
    """The finished episodes of an online run's envs, held for a DatasetWriter (train --save-data). An episode
    enters when it ends; those in flight at a checkpoint are dropped at a resume, as by the replay buffer."""

    def __init__(self, writer: DatasetWriter, env_tasks: np.ndarray):
        self.writer, self.env_tasks = writer, env_tasks
        n = len(env_tasks)
        self.obs: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.action: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.reward: list[list[float]] = [[] for _ in range(n)]

    def start(self, obs: np.ndarray, envs: np.ndarray) -> None:
        """Episodes begin in `envs` with these first observations."""
        for i, e in enumerate(envs):
            self.obs[e], self.action[e], self.reward[e] = [obs[i].copy()], [], []

    def add(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, keep: np.ndarray) -> None:
        """One step of every env in `keep`: the action taken, its reward and the observation it led to."""
        for e in np.flatnonzero(keep):
            self.obs[e].append(obs[e].copy())
            self.action[e].append(action[e].copy())
            self.reward[e].append(float(reward[e]))

    def end(self, envs: np.ndarray, terminated: np.ndarray) -> None:
        """The episodes of `envs` ended (terminated or cut by a time limit): they join the held ones."""
        for e in envs:
            if self.action[e]:
                self.writer.add_episode(np.stack(self.obs[e]), np.stack(self.action[e]), np.array(self.reward[e]),
                                        bool(terminated[e]), not terminated[e], int(self.env_tasks[e]))
            self.obs[e], self.action[e], self.reward[e] = [], [], []
