import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

import tdmpc.offline.format
from tdmpc.buffer import ReplayBuffer
from tdmpc.offline.format import DatasetError, Episode, open_dataset, read_episodes
from tdmpc.cli.dataset import main as cli_main
from tdmpc.offline.convert import convert_buffer, episodes_from_buffer
from tdmpc.offline.sampler import InMemoryDataset, StreamingDataset
from tdmpc.offline.writer import DatasetWriter

from helpers import import_or_skip

# obs = [episode id (>0), step in episode, task id]; action and reward = the step they led to.


def make_episode(ep_id: int, length: int, terminated: bool = False, task: int = 0, obs_dim: int = 3,
                 action_dim: int = 1) -> Episode:
    steps = np.arange(length + 1, dtype=np.float32)
    obs = np.zeros((length + 1, obs_dim), np.float32)
    obs[:, 0], obs[:, 1], obs[:, 2] = ep_id, steps, task
    action = np.repeat(steps[1:, None], action_dim, axis=1)
    return Episode(obs, action, steps[1:].copy(), terminated, not terminated, task)


def write(path: Path, episodes: list[Episode], tasks=("walker-walk",), obs_dim: int = 3, action_dim: int = 1,
          **kw) -> None:
    with DatasetWriter(path, (obs_dim,), action_dim, list(tasks), "state", 2, "test", **kw) as w:
        for ep in episodes:
            w.add_episode(**vars(ep))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def small_chunks(monkeypatch):
    """16-row chunks for 3-D obs and 1-D actions (22 bytes a row), so that small files span many chunks."""
    monkeypatch.setattr(tdmpc.offline.format, "CHUNK_BYTES", 16 * 22)


def assert_episodes_equal(got: list[Episode], want: list[Episode]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for name in ("obs", "action", "reward"):
            np.testing.assert_array_equal(getattr(g, name), getattr(w, name), err_msg=name)
        assert (g.terminated, g.truncated, g.task) == (w.terminated, w.truncated, w.task)


# --- format, writer, reader --------------------------------------------------------------


def test_rows_follow_the_replay_buffer_convention(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 2, terminated=True), make_episode(2, 1)])
    with h5py.File(path) as f:
        assert f["obs"][:, :2].tolist() == [[1, 0], [1, 1], [1, 2], [2, 0], [2, 1]]
        assert f["action"][:, 0].tolist() == [0, 1, 2, 0, 1] and f["reward"][...].tolist() == [0, 1, 2, 0, 1]
        assert f["terminated"][...].tolist() == [False, False, True, False, False]
        assert f["truncated"][...].tolist() == [False, False, False, False, True]
        assert f["episode_start"][...].tolist() == [0, 3] and f["episode_length"][...].tolist() == [2, 1]
        assert f["episode_task"][...].tolist() == [0, 0]
        assert f.attrs["format"] == "tdmpc-dataset" and f.attrs["version"] == 2
        assert f.attrs["action_type"] == "continuous"
        assert json.loads(f.attrs["tasks"]) == ["walker-walk"] and f.attrs["action_repeat"] == 2
        assert f["obs"].compression == "gzip" and f["obs"].maxshape == (None, 3)


def test_append_round_trip_and_task_list_extension(tmp_path):
    path = tmp_path / "d.h5"
    first = [make_episode(i + 1, 3 + i, terminated=i % 2 == 0) for i in range(4)]
    write(path, first)
    second = [make_episode(10 + i, 2 + i, task=i % 2, obs_dim=3) for i in range(3)]
    with DatasetWriter(path, (3,), 1, ["walker-walk", "cheetah-run"], "state", 2, "second run",
                       task_obs_dims=[3, 2]) as w:
        assert w.commit(second) == 3
    assert_episodes_equal(list(read_episodes(path)), first + second)
    info = open_dataset(path)
    assert info.schema.tasks == ("walker-walk", "cheetah-run") and info.schema.task_obs_dims == (3, 2)
    assert info.files[0].source.splitlines() == ["test", "second run"]


def _commit(path: Path, source: str, n: int, first_id: int) -> None:
    with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, source) as w:
        w.commit([make_episode(first_id + i, 2) for i in range(n)])


def _drop_own(path: Path, source: str, kept: int) -> list[int]:
    """A writer `source` reopening `path` drops its own episodes after the first `kept`; the ids left."""
    with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, source) as w:
        w.drop_own_after(kept)
    return [int(ep.obs[0, 0]) for ep in read_episodes(path)]


@pytest.mark.parametrize("order, left", [
    ("AA", [1, 2]),              # a resumed run's own episodes after its checkpoint: played again, dropped
    ("AB", [1, 2, 10, 11, 12]),  # another writer's, appended after the checkpoint: never dropped
    ("ABA", [1, 2, 10, 11, 12]),  # the run's own after the other's: dropped, the other's kept
])
def test_a_resumed_writer_drops_only_its_own_episodes(tmp_path, order, left):
    path = tmp_path / "d.h5"
    _commit(path, "run A", 2, 1)  # the checkpoint counts these 2
    ids = {"A": iter([20, 30]), "B": iter([10])}
    for who in order[1:]:
        _commit(path, f"run {who}", 3 if who == "B" else 2, next(ids[who]))
    assert _drop_own(path, "run A", 2) == left


def test_a_writer_refuses_to_drop_its_episodes_from_under_anothers(tmp_path):
    path = tmp_path / "d.h5"
    _commit(path, "run A", 2, 1)
    _commit(path, "run A", 2, 20)
    _commit(path, "run B", 3, 10)
    before = digest(path)
    with pytest.raises(DatasetError, match="run B"):
        _drop_own(path, "run A", 2)
    assert digest(path) == before


def test_episodes_of_unknown_origin_are_never_dropped(tmp_path):
    """A file written before writers were recorded (no 'segments'): nothing in it is known to be the run's."""
    path = tmp_path / "d.h5"
    _commit(path, "run A", 4, 1)
    with h5py.File(path, "a") as f:
        del f.attrs["segments"]
    assert _drop_own(path, "run A", 2) == [1, 2, 3, 4]


@pytest.mark.parametrize("change, field", [
    (dict(obs_shape=(4,)), "obs_shape"), (dict(action_dim=2), "action_dim"), (dict(obs_type="rgb"), "obs_type"),
    (dict(action_repeat=1), "action_repeat"), (dict(tasks=["cheetah-run"]), "tasks"),
    (dict(tasks=["walker-walk", "x"], task_obs_dims=[2, 3]), "task_obs_dims")])
def test_append_with_another_schema_is_refused(tmp_path, change, field):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 3)])
    before = digest(path)
    kw = dict(obs_shape=(3,), action_dim=1, tasks=["walker-walk"], obs_type="state", action_repeat=2, source="s")
    with pytest.raises(DatasetError, match=f"{path}: '{field}'") as e:
        DatasetWriter(path, **{**kw, **change})
    assert "\n" not in str(e.value) and digest(path) == before
    DatasetWriter(path, **kw).close()  # the refused writer released its lock


@pytest.mark.parametrize("bad, message", [
    (dict(reward=np.array([0, np.nan, 1], np.float32)), "'reward' is not finite at step 1"),
    (dict(action=np.zeros((3, 2), np.float32)), "'action' has shape"),
    (dict(obs=np.zeros((3, 3), np.float32)), "'obs' has shape"),
    (dict(truncated=False), "neither 'terminated' nor 'truncated'"),
    (dict(task=1), "'task' is 1")])
def test_bad_episodes_are_refused_before_anything_is_written(tmp_path, bad, message):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 3)])
    before = digest(path)
    with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "test") as w:
        with pytest.raises(DatasetError, match=message) as e:
            w.add_episode(**{**vars(make_episode(2, 3)), **bad})
        with pytest.raises(DatasetError, match=message):  # the same episode streamed into commit aborts it
            w.commit([make_episode(3, 2), Episode(**{**vars(make_episode(2, 3)), **bad})])
    assert str(path) in str(e.value) and "episode 1" in str(e.value)
    assert digest(path) == before


def test_one_writer_at_a_time(tmp_path):
    path = tmp_path / "d.h5"
    with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "a"):
        with pytest.raises(DatasetError, match="another writer"):
            DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "b")


def test_a_writer_leaves_no_lock_file_whether_it_writes_fails_or_is_refused(tmp_path):
    """The lock file lived on beside every dataset (.d.h5.lock): its holder now removes it as it lets go."""
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 3)])
    with pytest.raises(KeyError):
        with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "test"):
            raise KeyError
    with pytest.raises(DatasetError, match="'obs_shape'"):
        DatasetWriter(path, (4,), 1, ["walker-walk"], "state", 2, "test")
    (tmp_path / "notjson.json").write_text("{}")
    with pytest.raises(DatasetError, match="not an HDF5 file"):
        DatasetWriter(tmp_path / "notjson.json", (3,), 1, ["walker-walk"], "state", 2, "test")
    with pytest.raises(KeyError):  # a file never written: the folders made for it go too
        with DatasetWriter(tmp_path / "new" / "sub" / "e.h5", (3,), 1, ["walker-walk"], "state", 2, "test"):
            raise KeyError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5", "notjson.json"]


def test_a_lock_file_removed_under_a_waiting_writer_is_not_taken_as_the_lock(tmp_path, monkeypatch):
    """B opens the lock file, its holder A removes it and lets go, C locks a new one: B's flock then succeeds on
    the removed file, and B must see that and find C there, not write beside it."""
    import tdmpc.offline.writer as writer_module

    path = tmp_path / "d.h5"
    kw = dict(obs_shape=(3,), action_dim=1, tasks=["walker-walk"], obs_type="state", action_repeat=2)
    a = DatasetWriter(path, **kw, source="a")
    c: list[DatasetWriter] = []
    real_flock = writer_module.fcntl.flock

    def flock_after_a_goes(fd: int, op: int) -> None:
        if a._lock.fd >= 0:  # B, between its open and its flock
            a.close()
            c.append(DatasetWriter(path, **kw, source="c"))
        real_flock(fd, op)

    monkeypatch.setattr(writer_module.fcntl, "flock", flock_after_a_goes)
    with pytest.raises(DatasetError, match="another writer"):
        DatasetWriter(path, **kw, source="b")
    c[0].close()
    assert not list(tmp_path.iterdir())


def test_an_unwritable_folder_is_one_line_naming_the_dataset(tmp_path, monkeypatch, capsys):
    """It named the lock file (.d.h5.lock), which the user never asked for. (Root writes anywhere: the refusal is
    what an unwritable folder gives.)"""
    import builtins
    import errno

    def refusing(real_open):
        def refuse_in_ro(name, *args, **kw):
            if "ro" in Path(name).parts:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
            return real_open(name, *args, **kw)
        return refuse_in_ro

    monkeypatch.setattr(os, "open", refusing(os.open))
    monkeypatch.setattr(builtins, "open", refusing(builtins.open))
    buf, _ = run_buffer(2, 20, [[0, 0]] * 7 + [[1, 2]] + [[0, 0]] * 5)
    buf.save(tmp_path / "buffer.h5")
    out = tmp_path / "ro" / "new" / "d.h5"
    assert cli_main(["convert", str(tmp_path / "buffer.h5"), "--task", "Pendulum-v1", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out}: cannot write in its folder (Permission denied)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer.h5"]


def test_an_exception_drops_what_was_not_committed(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 3)])
    with pytest.raises(KeyError):
        with DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "test") as w:
            w.add_episode(**vars(make_episode(2, 3)))
            raise KeyError
    assert open_dataset(path).episodes == 1


# --- validation: one line naming the file and the field, nothing changed -------------------


def corrupt(path: Path, edit) -> None:
    with h5py.File(path, "a") as f:
        edit(f)


def _nan_reward(f):
    f["reward"][41] = np.nan


CORRUPTIONS = {
    "missing field": (lambda f: f.__delitem__("reward"), "missing field 'reward'"),
    "missing attribute": (lambda f: f.attrs.__delitem__("tasks"), "missing field 'tasks'"),
    "wrong format": (lambda f: f.attrs.__setitem__("format", "other"), "'format' is 'other'"),
    "newer version": (lambda f: f.attrs.__setitem__("version", 3), "'version' is 3"),
    "action type": (lambda f: f.attrs.__setitem__("action_type", "hybrid"), "'action_type' is 'hybrid'"),
    "lengths": (lambda f: f["episode_length"].__setitem__(1, 5), "'episode_start'/'episode_length' do not tile"),
    "task out of range": (lambda f: f["episode_task"].__setitem__(2, 3), "'episode_task' is 3 at episode 2"),
    "nan reward": (_nan_reward, r"'reward' is not finite at row 41 \(episode 5, step 1\)"),
    "inf obs": (lambda f: f["obs"].__setitem__((11, 1), np.inf),
                r"'obs' is not finite at row 11 \(episode 1, step 3\)"),
    "stray flag": (lambda f: f["terminated"].__setitem__(1, True), "'terminated'/'truncated' set inside an episode"),
}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_bad_files_fail_with_one_line_naming_file_and_field(tmp_path, small_chunks, name):
    edit, message = CORRUPTIONS[name]
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, 7) for i in range(8)])  # 8 rows an episode: rows 40.. are episode 5
    corrupt(path, edit)
    before = digest(path)
    with pytest.raises(DatasetError, match=message) as e:
        open_dataset(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    assert digest(path) == before
    with pytest.raises(DatasetError):  # nor can a writer append to it
        DatasetWriter(path, (3,), 1, ["walker-walk"], "state", 2, "test").close()
        open_dataset(path)
    assert digest(path) == before


def test_value_check_streams_in_blocks(tmp_path, small_chunks, monkeypatch):
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, 15) for i in range(20)])
    corrupt(path, lambda f: f["action"].__setitem__((300, 0), np.nan))
    reads = []
    original = h5py.Dataset.__getitem__
    monkeypatch.setattr(tdmpc.offline.format, "BLOCK_BYTES", 64 * 22)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda ds, key: reads.append((ds.name, key)) or original(ds, key))
    with pytest.raises(DatasetError, match=r"'action' is not finite at row 300 \(episode 18, step 12\)"):
        open_dataset(path)
    row_reads = [key for name, key in reads if name == "/action"]
    assert row_reads and all(k.stop - k.start <= 64 for k in row_reads)


def test_a_multitask_buffer_is_not_converted_as_one_task(tmp_path):
    """Its envs play several tasks (padded to one width): labelling every episode with one task would be wrong."""
    buf = ReplayBuffer(50, 2, (3,), 1, 3, env_tasks=np.array([0, 1]))
    buf.save(tmp_path / "buffer.h5")
    with pytest.raises(DatasetError, match="multi-task"):
        convert_buffer(tmp_path / "buffer.h5", tmp_path / "out.h5", "Pendulum-v1")
    assert not (tmp_path / "out.h5").exists()


def test_truncated_and_foreign_files(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, 50) for i in range(20)])
    cut = tmp_path / "cut.h5"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    text = tmp_path / "notes.h5"
    text.write_text("hello")
    before = {p: digest(p) for p in (path, cut, text)}
    for bad, message in ((cut, "truncated or corrupt HDF5 file"), (text, "not an HDF5 file"),
                         (tmp_path / "nope.h5", "no such file")):
        with pytest.raises(DatasetError, match=message) as e:
            open_dataset([path, bad])
        assert str(e.value).startswith(f"{bad}: ") and "\n" not in str(e.value)
    assert before == {p: digest(p) for p in before}


def test_data_of_other_sizes_than_their_task_are_refused_in_one_line(tmp_path):
    from tdmpc.config import Config
    from tdmpc.offline.data import model_spec

    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 4, obs_dim=4)], tasks=("Pendulum-v1",), obs_dim=4)
    with pytest.raises(DatasetError, match=rf"^{path}: the data hold obs \(4,\) / continuous actions of dim 1, but "
                                           rf"task 'Pendulum-v1' has obs \(3,\) / continuous actions of dim 1$"):
        model_spec(Config(task="Pendulum-v1"), open_dataset(path))


def test_expected_dims_name_the_file(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 4)])
    before = digest(path)
    with pytest.raises(DatasetError, match=rf"{path}: 'obs' rows are \(3,\); this run expects \(24,\)"):
        open_dataset(path, expect_obs_shape=(24,), expect_action_dim=1)
    with pytest.raises(DatasetError, match=rf"{path}: 'action' rows are \(1,\); this run expects \(6,\)"):
        open_dataset(path, expect_obs_shape=(3,), expect_action_dim=6)
    assert digest(path) == before and open_dataset(path, expect_obs_shape=(3,), expect_action_dim=1).episodes == 1


def test_files_merge_tasks_by_name_and_pad_dims(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    write(a, [make_episode(1, 4, task=0)], tasks=["walker-walk"])
    eps = [make_episode(2, 4, task=0, obs_dim=5, action_dim=2), make_episode(3, 4, task=1, obs_dim=5, action_dim=2)]
    write(b, eps, tasks=["cheetah-run", "walker-walk"], obs_dim=5, action_dim=2, task_obs_dims=[5, 3],
          task_action_dims=[2, 1])
    info = open_dataset([a, b])
    assert info.schema.tasks == ("walker-walk", "cheetah-run")
    assert info.schema.obs_shape == (5,) and info.schema.action_dim == 2
    assert info.schema.task_obs_dims == (3, 5) and info.files[1].task_ids.tolist() == [1, 0]
    batch = InMemoryDataset(info, horizon=2).sample(64)
    ids, task = batch.obs[0, :, 0], batch.task
    assert torch.equal(task, torch.where(ids == 2, 1, 0))  # episode 2 is cheetah-run, 1 and 3 walker-walk
    first_file = ids == 1
    assert (batch.obs[:, first_file, 3:] == 0).all() and (batch.action[:, first_file, 1] == 0).all()
    c = tmp_path / "c.h5"
    write(c, [make_episode(4, 4, obs_dim=4)], tasks=["cheetah-run"], obs_dim=4)
    with pytest.raises(DatasetError, match=rf"{c}: task 'cheetah-run' has obs/action dims 4/1 here but 5/2 in {b}"):
        open_dataset([a, b, c])


# --- sampling --------------------------------------------------------------------------------


def check_batch(batch, H: int, B: int, lengths: dict[int, int], terminated: set[int]) -> None:
    """Every sub-trajectory, up to and including its first terminal step (the steps after it are masked in the
    update): one episode, consecutive steps, with its own actions, rewards and flags."""
    assert batch.obs.shape == (H + 1, B, 3) and batch.action.shape == (H, B, 1)
    assert batch.reward.shape == (H, B) and batch.terminated.shape == (H, B) and batch.terminated.dtype == torch.bool
    ended = batch.terminated.long()
    own = (ended.cumsum(0) - ended == 0)  # (H, B) steps of the episode
    ids, steps = batch.obs[..., 0], batch.obs[..., 1]
    assert (ids[1:] == ids[0])[own].all() and (steps[1:] - steps[:-1] == 1)[own].all()
    assert torch.equal(batch.action[..., 0][own], steps[1:][own]) and torch.equal(batch.reward[own], steps[1:][own])
    ends = torch.tensor([lengths[int(i)] for i in ids[0]]).expand(H, B)
    assert (steps[1:][own] <= ends[own]).all()
    term = torch.tensor([int(i) in terminated for i in ids[0]]).expand(H, B)
    assert torch.equal(batch.terminated[own], ((steps[1:] == ends) & term)[own])
    full = ~own.all(0)  # the sub-trajectories that reach past a terminal step: only terminated episodes
    assert all(int(i) in terminated for i in ids[0, full])


def start_counts(sampler, batches: int, B: int = 256) -> dict:
    counts: dict = {}
    for _ in range(batches):
        first = sampler.sample(B).obs[0]
        for key in zip(first[:, 0].tolist(), first[:, 1].tolist()):
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_both_samplers_match_the_replay_buffer_contract(tmp_path, small_chunks):
    lengths = {i + 1: L for i, L in enumerate([5, 2, 9, 3, 30, 4, 1, 17])}
    terminated = {1, 5}
    path = tmp_path / "d.h5"
    write(path, [make_episode(i, L, terminated=i in terminated) for i, L in lengths.items()])
    info, H, B = open_dataset(path), 3, 64
    buf = ReplayBuffer(200, 1, (3,), 1, H)
    buf.start(torch.zeros(1, 3))
    for _ in range(H):
        buf.add(torch.zeros(1, 3), torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, dtype=torch.bool))
    reference = buf.sample(B)
    with StreamingDataset(info, H, window_rows=40, swap_every=2) as streaming:
        for sampler in (InMemoryDataset(info, H), streaming):
            for _ in range(20):
                batch = sampler.sample(B)
                check_batch(batch, H, B, lengths, terminated)
                for name in ("obs", "action", "reward", "terminated"):
                    got, want = getattr(batch, name), getattr(reference, name)
                    assert (got.shape, got.dtype, got.is_contiguous()) == (want.shape, want.dtype, True), name
                assert batch.task is None


def test_a_terminated_episode_is_sampled_from_every_row_but_its_last(tmp_path):
    """Its terminal transition is then the first, second and third step of some sub-trajectory (H = 3), as in
    ReplayBuffer; a truncated episode keeps the starts whose H steps are all its own."""
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 5, terminated=True), make_episode(2, 5), make_episode(3, 1, terminated=True)])
    counts = start_counts(InMemoryDataset(open_dataset(path), 3), 40)
    assert set(counts) == {(1.0, float(s)) for s in range(5)} | {(2.0, float(s)) for s in range(3)} | {(3.0, 0.0)}


def test_in_memory_sampling_is_uniform_over_valid_starts(tmp_path):
    lengths, H = [5, 8, 3, 12, 1], 2
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, L) for i, L in enumerate(lengths)])
    counts = start_counts(InMemoryDataset(open_dataset(path), H), 100)
    valid = {(i + 1.0, float(s)) for i, L in enumerate(lengths) for s in range(L - H + 1)}
    assert set(counts) == valid
    freq = np.array(list(counts.values()), dtype=float)
    assert freq.min() > 0.85 * freq.mean() and freq.max() < 1.15 * freq.mean()


def test_streaming_is_uniform_over_windows_and_covers_every_start(tmp_path, small_chunks):
    H, n, K = 3, 24, 25  # 24 episodes of 16 rows, one per chunk: every window has the same number of valid starts
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, 15) for i in range(n)])
    with StreamingDataset(open_dataset(path), H, window_rows=64, swap_every=K, deterministic=True) as sampler:
        assert len(sampler._all) == n and sampler._window.num_starts == 4 * (15 - H + 1)  # 4 segments a window
        counts = start_counts(sampler, 3 * (n // 4) * K)  # 3 passes over the data, K batches a window
        assert sampler.windows == 3 * (n // 4) and sampler.late_samples == 0
    valid = {(i + 1.0, float(s)) for i in range(n) for s in range(15 - H + 1)}
    assert set(counts) == valid
    freq = np.array(list(counts.values()), dtype=float)
    assert freq.min() > 0.8 * freq.mean() and freq.max() < 1.2 * freq.mean()


def test_streaming_covers_all_episodes_of_several_files(tmp_path, small_chunks):
    paths, ids = [tmp_path / "a.h5", tmp_path / "b.h5"], iter(range(1, 1000))
    rng = np.random.default_rng(0)
    lengths = {}
    for path in paths:
        eps = [make_episode(next(ids), int(rng.integers(1, 40))) for _ in range(25)]
        lengths.update({int(ep.obs[0, 0]): len(ep.reward) for ep in eps})
        write(path, eps)
    info = open_dataset(paths)
    wanted = {i for i, L in lengths.items() if L >= 2}
    seen = set()
    with StreamingDataset(info, 2, window_rows=48, swap_every=1) as sampler:
        deadline = time.monotonic() + 20
        while seen != wanted and time.monotonic() < deadline:
            batch = sampler.sample(32)
            seen |= set(batch.obs[0, :, 0].int().tolist())
    assert seen == wanted


def test_multitask_batches_carry_the_task_of_each_sub_trajectory(tmp_path, small_chunks):
    path = tmp_path / "d.h5"
    write(path, [make_episode(i + 1, 10, task=i % 3) for i in range(12)], tasks=["a", "b", "c"])
    info = open_dataset(path)
    with StreamingDataset(info, 3, window_rows=48, swap_every=1) as streaming:
        for sampler in (InMemoryDataset(info, 3), streaming):
            for _ in range(10):
                batch = sampler.sample(32)
                assert batch.task.dtype == torch.int64 and batch.task.shape == (32,)
                assert torch.equal(batch.task, batch.obs[0, :, 2].long())


def test_a_horizon_no_episode_reaches_is_an_error(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(1, 3), make_episode(2, 2)])
    with pytest.raises(DatasetError, match="no episode has 4 or more transitions"):
        InMemoryDataset(open_dataset(path), 4)


# --- replay buffer conversion --------------------------------------------------------------


def run_buffer(N: int, cap: int, ends: list[list[int]]) -> tuple[ReplayBuffer, list[list[tuple]]]:
    """Drive a ReplayBuffer; ends[t][e]: 0 continue, 1 terminate, 2 truncate. Returns it and each env's
    history of written rows (episode id, step, terminated) in time order."""
    buf = ReplayBuffer(cap * N, N, (3,), 1, 1)
    ids = iter(range(1, 10**6))
    ep, step = [next(ids) for _ in range(N)], [0] * N
    history: list[list[tuple]] = [[(ep[e], 0, False)] for e in range(N)]
    buf.start(torch.tensor([[ep[e], 0, 0] for e in range(N)], dtype=torch.float32))
    for row in ends:
        for e in range(N):
            step[e] += 1
            history[e].append((ep[e], step[e], row[e] == 1))
        buf.add(torch.tensor([[ep[e], step[e], row[e] == 1] for e in range(N)], dtype=torch.float32),
                torch.tensor(step, dtype=torch.float32).view(N, 1), torch.tensor(step, dtype=torch.float32),
                torch.tensor([r == 1 for r in row]))
        done = [e for e in range(N) if row[e]]
        for e in done:
            ep[e], step[e] = next(ids), 0
            history[e].append((ep[e], 0, False))
        buf.start(torch.tensor([[ep[e], 0, 0] for e in range(N)], dtype=torch.float32),
                  np.array([e in done for e in range(N)]))
    return buf, history


def expected_episodes(history: list[list[tuple]], cap: int) -> list[tuple]:
    """(id, length, terminated) of the episodes whose first row is still among each env's last `cap` rows."""
    out = []
    for rows in history:
        kept = rows[-cap:]
        for ep_id in dict.fromkeys(r[0] for r in kept):
            mine = [r for r in kept if r[0] == ep_id]
            if mine[0][1] == 0 and len(mine) > 1:
                out.append((ep_id, len(mine) - 1, mine[-1][2]))
    return out


@pytest.mark.parametrize("N, cap, ends", [
    (1, 50, [[0]] * 5 + [[1]] + [[0]] * 3 + [[2]] + [[0]] * 4),  # no wrap, episode in progress at the end
    (2, 12, [[0, 0]] * 9 + [[1, 0]] + [[0, 2]] * 8 + [[2, 1]] + [[0, 0]] * 3),  # wrapped, partial oldest dropped
    (3, 7, [[1, 0, 2], [0, 0, 0], [2, 1, 0]] * 5 + [[0, 0, 1]]),  # wrapped several times, a start as the last row
    (1, 6, [[0]] * 20),  # one endless episode whose start was overwritten: nothing
])
def test_episodes_from_buffer_recovers_each_envs_episodes(tmp_path, N, cap, ends):
    buf, history = run_buffer(N, cap, ends)
    buf.save(tmp_path / "buffer.h5")
    got = list(episodes_from_buffer(tmp_path / "buffer.h5"))
    want = expected_episodes(history, cap)
    assert [(int(ep.obs[0, 0]), len(ep.reward), ep.terminated) for ep in got] == want
    for ep in got:
        assert ep.truncated == (not ep.terminated)
        steps = np.arange(len(ep.reward) + 1, dtype=np.float32)
        np.testing.assert_array_equal(ep.obs[:, 1], steps)
        np.testing.assert_array_equal(ep.reward, steps[1:])
        np.testing.assert_array_equal(ep.action[:, 0], steps[1:])


def test_convert_buffer_cli_and_old_buffers(tmp_path, capsys):
    buf, history = run_buffer(2, 20, [[0, 0]] * 7 + [[1, 2]] + [[0, 0]] * 5)
    buf.save(tmp_path / "buffer.h5")
    out = tmp_path / "data.h5"
    assert cli_main(["convert", str(tmp_path / "buffer.h5"), "--task", "Pendulum-v1", "--out", str(out)]) == 0
    info = open_dataset(out)
    assert info.schema.tasks == ("Pendulum-v1",) and info.schema.action_repeat == 1
    assert info.episodes == len(expected_episodes(history, 20)) == 4
    capsys.readouterr()
    assert cli_main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 episodes, 30 rows" in text and "task Pendulum-v1: 4 episodes, return" in text
    capsys.readouterr()  # converting the same buffer into the file again would hold each episode twice
    assert cli_main(["convert", str(tmp_path / "buffer.h5"), "--task", "Pendulum-v1", "--out", str(out)]) == 2
    assert "already holds the episodes of replay buffer" in capsys.readouterr().err
    assert open_dataset(out).episodes == 4
    with h5py.File(tmp_path / "buffer.h5", "a") as f:
        del f["first"]
    with pytest.raises(DatasetError, match="saved before episode starts were recorded"):
        convert_buffer(tmp_path / "buffer.h5", tmp_path / "other.h5", "Pendulum-v1")
    assert cli_main(["info", str(tmp_path / "missing.h5")]) == 2


def test_module_entry_point_reports_bad_input_with_exit_code_2(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5")
    r = subprocess.run([sys.executable, "-m", "tdmpc.dataset", "info", str(bad)], capture_output=True, text=True,
                       cwd=Path(__file__).parents[1], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stderr.strip() == f"error: {bad}: not an HDF5 file (" + \
        r.stderr.strip().split("(", 1)[1]


# --- crash safety ---------------------------------------------------------------------------


def _appender(path: str, seed: int) -> None:
    """Child process: append a large batch of episodes in one commit."""
    rng = np.random.default_rng(seed)
    with DatasetWriter(path, (64,), 4, ["walker-walk"], "state", 2, f"child {seed}") as w:
        for i in range(40):
            obs = rng.standard_normal((1001, 64), dtype=np.float32)
            obs[:, 0] = seed * 1000 + i
            w.add_episode(obs, rng.standard_normal((1000, 4), dtype=np.float32),
                          rng.standard_normal(1000, dtype=np.float32), False, True)
    os._exit(0)


def episode_ids(path: Path) -> list[int]:
    info = open_dataset(path)  # opens and validates every row
    with h5py.File(path) as f:
        return [int(f["obs"][s, 0]) for s in info.files[0].episode_start]


def test_sigkilled_appends_never_corrupt_the_file(tmp_path):
    path = tmp_path / "data.h5"
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_appender, args=(str(path), 1))
    t0 = time.monotonic()
    child.start()
    child.join()
    duration = time.monotonic() - t0
    assert child.exitcode == 0
    ids = episode_ids(path)
    assert ids == [1000 + i for i in range(40)]
    killed_mid_commit = 0
    for k, fraction in enumerate([0.05, 0.25, 0.45, 0.65, 0.8, 0.95]):
        seed = k + 2
        child = ctx.Process(target=_appender, args=(str(path), seed))
        t0 = time.monotonic()
        child.start()
        time.sleep(fraction * duration)
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        now = episode_ids(path)
        new = [seed * 1000 + i for i in range(40)]
        assert now in (ids, ids + new), f"kill {k}: the file changed other than by one whole commit"
        ids = now
        leftovers = list(tmp_path.glob(".data.h5.*.tmp"))
        killed_mid_commit += bool(leftovers)
        DatasetWriter(path, (64,), 4, ["walker-walk"], "state", 2, "check").close()
        assert not list(tmp_path.glob(".data.h5.*.tmp"))
        assert episode_ids(path) == ids
    assert killed_mid_commit >= 2, "no kill landed inside a commit: make the child's commit longer"


# --- Minari ---------------------------------------------------------------------------------


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    import_or_skip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def read_all(path: Path) -> dict:
    with h5py.File(path) as f:
        return {**{name: f[name][...] for name in f}, **{k: f.attrs[k] for k in f.attrs}}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_minari_round_trip_preserves_every_array(tmp_path, minari_root):
    from tdmpc.offline.minari import from_minari, to_minari

    path = tmp_path / "ours.h5"
    eps = [make_episode(i + 1, 3 + i, terminated=i % 3 == 0, task=i % 2, obs_dim=4, action_dim=2) for i in range(7)]
    eps[2].action[:] = np.linspace(-1, 1, eps[2].action.size).reshape(eps[2].action.shape)
    write(path, eps, tasks=["walker-walk", "cheetah-run"], obs_dim=4, action_dim=2, task_obs_dims=[4, 3],
          task_action_dims=[2, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        directory = to_minari(path, "tdmpc/walker-test-v0")
    assert not [w for w in caught if "None" in str(w.message)], "Minari's unset-metadata warnings leaked"
    assert directory == minari_root / "tdmpc" / "walker-test-v0"
    assert from_minari("tdmpc/walker-test-v0", tmp_path / "back.h5") == 7
    want, got = read_all(path), read_all(tmp_path / "back.h5")
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    with pytest.raises(DatasetError, match="already exists"):
        to_minari(path, "tdmpc/walker-test-v0")
    with pytest.raises(DatasetError, match="no such local Minari dataset"):
        from_minari("tdmpc/absent-v0", tmp_path / "x.h5")
    with pytest.raises(DatasetError, match="would relabel its episodes"):  # --task was ignored for ours
        from_minari("tdmpc/walker-test-v0", tmp_path / "x.h5", task="cheetah-run")
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_minari_import_of_a_dataset_made_by_minari(tmp_path, minari_root):
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from tdmpc.offline.minari import from_minari

    env = gym.make("Pendulum-v1", max_episode_steps=20)
    rng = np.random.default_rng(0)
    buffers = []
    for i in range(3):
        obs, _ = env.reset(seed=i)
        obs_l, act_l, rew_l, term_l, trunc_l = [obs], [], [], [], []
        done = False
        while not done:
            a = rng.uniform(-2, 2, size=(1,)).astype(np.float32)
            obs, r, term, trunc, _ = env.step(a)
            obs_l.append(obs), act_l.append(a), rew_l.append(r), term_l.append(term), trunc_l.append(trunc)
            done = term or trunc
        buffers.append(EpisodeBuffer(observations=np.array(obs_l), actions=np.array(act_l), rewards=rew_l,
                                     terminations=term_l, truncations=trunc_l))
    minari.create_dataset_from_buffers("pendulum/random-v0", buffers, env=env)
    out = tmp_path / "pendulum.h5"
    assert from_minari(minari_root / "pendulum" / "random-v0", out) == 3
    with pytest.raises(DatasetError, match="already holds the episodes of minari"):  # not each twice
        from_minari(minari_root / "pendulum" / "random-v0", out)
    info = open_dataset(out)
    assert info.schema.tasks == ("Pendulum-v1",) and info.schema.obs_shape == (3,) and info.episodes == 3
    for ep, buf in zip(read_episodes(out), buffers):
        np.testing.assert_allclose(ep.obs, buf.observations, rtol=1e-6)
        np.testing.assert_allclose(ep.action, buf.actions / 2, rtol=1e-6)  # [-2, 2] -> [-1, 1], as UnitActions
        np.testing.assert_allclose(ep.reward, np.float32(buf.rewards))
        assert ep.truncated and not ep.terminated


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_minari_import_of_a_data_collector_dataset(tmp_path, minari_root):
    import_or_skip("jax", "minari.DataCollector needs minari[create] (jax)")
    import gymnasium as gym
    import minari

    from tdmpc.offline.minari import from_minari

    env = minari.DataCollector(gym.make("Pendulum-v1", max_episode_steps=15))
    for i in range(3):
        env.reset(seed=i)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc
    dataset = env.create_dataset("pendulum/collected-v0")
    assert from_minari("pendulum/collected-v0", tmp_path / "p.h5") == 3
    for ep, theirs in zip(read_episodes(tmp_path / "p.h5"), dataset.iterate_episodes()):
        np.testing.assert_allclose(ep.obs, theirs.observations, rtol=1e-6)
        np.testing.assert_allclose(ep.action, theirs.actions / 2, rtol=1e-6)
        assert len(ep.reward) == 15 and ep.truncated


# Runs `python -m tdmpc.dataset to-minari` with batches of 2 episodes, sending itself SIGTERM as the 6th episode is
# read (the third batch): a stop mid-export, at a point that does not depend on timing.
_STOP_MID_EXPORT = """
import os, signal, sys
import tdmpc.offline.minari as m
m.EXPORT_BATCH = 2
read = m.read_episodes
def episodes(path):
    for i, ep in enumerate(read(path)):
        if i == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        yield ep
m.read_episodes = episodes
from tdmpc.cli.dataset import main
sys.exit(main(["to-minari", sys.argv[1], "--dataset-id", "tdmpc/stopped-v0"]))
"""


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_stopped_minari_export_leaves_nothing_and_exits_3(tmp_path, minari_root):
    """SIGTERM mid-export left a dataset Minari opened as complete with part of the episodes (and a rerun refused:
    'already exists'). Now: one line, exit 3, no dataset and no partial folder; the rerun writes all of it."""
    import minari

    from tdmpc.offline.minari import from_minari

    path = tmp_path / "ours.h5"
    write(path, [make_episode(i, 4) for i in range(10)])
    r = subprocess.run([sys.executable, "-c", _STOP_MID_EXPORT, str(path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "MINARI_DATASETS_PATH": str(minari_root)})
    assert r.returncode == 3, r.stderr[-2000:]
    assert not any(line.startswith("error") for line in r.stderr.splitlines()), r.stderr  # a stop is no error
    assert r.stderr.splitlines()[-1] == (
        "stopped by SIGTERM before Minari dataset 'tdmpc/stopped-v0' was complete: nothing was written (run the "
        "command again)"), r.stderr
    with pytest.raises(FileNotFoundError):
        minari.load_dataset("tdmpc/stopped-v0")
    assert not (minari_root / "tdmpc" / "stopped-v0").exists()
    assert not list(tmp_path.rglob("*partial*")) and not list(minari_root.rglob("*.h*5"))
    assert cli_main(["to-minari", str(path), "--dataset-id", "tdmpc/stopped-v0"]) == 0
    assert minari.load_dataset("tdmpc/stopped-v0").total_episodes == 10
    assert from_minari("tdmpc/stopped-v0", tmp_path / "back.h5") == 10


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_minari_export_removes_the_folder_of_a_killed_one(tmp_path, minari_root, capsys):
    from tdmpc.offline.minari import to_minari

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = minari_root / f".tdmpc-partial-{int(dead.stdout)}"
    (left / "tdmpc" / "x-v0" / "data").mkdir(parents=True)
    write(tmp_path / "ours.h5", [make_episode(i, 4) for i in range(3)])
    assert to_minari(tmp_path / "ours.h5", "tdmpc/x-v0") == minari_root / "tdmpc" / "x-v0"
    assert not left.exists() and f"removed {left}" in capsys.readouterr().err


class StartsAtFive(gym.Env):
    """Discrete(3, start=5): its actions are 5, 6, 7, each its own reward; episodes of 8 steps."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(3, start=5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert int(action) in (5, 6, 7), action
        self.t += 1
        return np.full(2, self.t / 10, np.float32), float(action), False, False, {}


gym.register("StartsAtFive-v0", entry_point="test_dataset:StartsAtFive", max_episode_steps=8)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_discrete_space_with_a_start_is_exported_to_minari_as_the_env_takes_it(tmp_path, minari_root):
    """--save-data keeps the env's Discrete start beside the indices it stores, and to-minari exports the real
    space and actions (it declared Discrete(3) with actions 0-2); from-minari brings back the indices and the start."""
    import minari

    import tdmpc
    from helpers import TINY
    from tdmpc.offline.minari import from_minari, to_minari

    data = tmp_path / "five.h5"
    tdmpc.fit(env="test_dataset:StartsAtFive-v0", **{**TINY, "task": "test_dataset:StartsAtFive-v0", "steps": 40,
              "seed_steps": 24, "eval_episodes": 0, "eval_freq": 40, "save_every": 40, "log_every": 20,
              "save_data": str(data)}, run_dir=tmp_path / "run")
    file = open_dataset(data)
    assert file.schema.discrete and file.schema.action_start == 5 and file.episodes == 5
    to_minari(data, "tdmpc/five-v0")
    theirs = minari.load_dataset("tdmpc/five-v0")
    assert theirs.action_space == gym.spaces.Discrete(3, start=5)
    for ep in theirs.iterate_episodes():
        assert set(ep.actions.tolist()) <= {5, 6, 7}
        np.testing.assert_array_equal(ep.actions, ep.rewards)  # each reward is the action the env took
    assert from_minari("tdmpc/five-v0", tmp_path / "back.h5") == 5
    back = open_dataset(tmp_path / "back.h5").files[0]
    assert back.schema.action_start == 5
    for mine, again in zip(read_episodes(data), read_episodes(tmp_path / "back.h5")):
        np.testing.assert_array_equal(mine.action, again.action)
        assert set(mine.action.tolist()) <= {0, 1, 2}
    # tdmpc.collect keeps the start too
    from tdmpc.cli.collect import main as collect

    assert collect(["--checkpoint", str(tmp_path / "run" / "checkpoints" / "latest.pt"), "--out",
                    str(tmp_path / "collected.h5"), "--episodes", "2", "--device", "cpu", "--threads", "1"]) == 0
    assert open_dataset(tmp_path / "collected.h5").schema.action_start == 5
    # and so does converting the run's replay buffer
    (buffer,) = (tmp_path / "run" / "checkpoints").glob("buffer_*.h5")
    convert_buffer(buffer, tmp_path / "converted.h5", "test_dataset:StartsAtFive-v0")
    assert open_dataset(tmp_path / "converted.h5").schema.action_start == 5
