import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdmpc.buffer import ReplayBuffer

# obs = [episode id (>0; 0 = never written), step in episode, terminal-by-termination flag]


def fill(N, H, cap_per_env, ends):
    """Run N envs for len(ends) steps; ends[t][e] in {0: continue, 1: terminate, 2: truncate}."""
    buf = ReplayBuffer(cap_per_env * N, N, (3,), 1, H)
    next_id = iter(range(1, 10**6))
    ep = np.array([next(next_id) for _ in range(N)])
    step = np.zeros(N, dtype=np.int64)
    buf.start(torch.tensor([[ep[e], 0, 0] for e in range(N)], dtype=torch.float32))
    for row in ends:
        step += 1
        term = np.array([r == 1 for r in row])
        obs = torch.tensor([[ep[e], step[e], float(term[e])] for e in range(N)], dtype=torch.float32)
        buf.add(obs, torch.tensor(step, dtype=torch.float32).view(N, 1), torch.tensor(step, dtype=torch.float32),
                torch.tensor(term))
        done = np.array([r != 0 for r in row])
        for e in np.flatnonzero(done):
            ep[e], step[e] = next(next_id), 0
        buf.start(torch.tensor([[ep[e], 0, 0] for e in range(N)], dtype=torch.float32), done)
    return buf


def oracle_valid(buf):
    """Brute force from the contents: rows s..s+k hold one episode at consecutive steps, with k = H, or with
    k < H when row s+k is the episode's terminal one (the sub-trajectory reaches past its end)."""
    obs = buf.obs.numpy()
    N, C, H = buf.N, buf.C, buf.H
    valid = np.zeros((N, C), dtype=bool)
    for e in range(N):
        for s in range(C):
            for k in range(1, H + 1):
                rows = [(s + i) % C for i in range(k + 1)]
                ids, steps, term = obs[e, rows, 0], obs[e, rows, 1], obs[e, rows, 2]
                one_episode = ids[0] > 0 and (ids == ids[0]).all() and (np.diff(steps) == 1).all()
                valid[e, s] |= one_episode and (k == H or term[-1] == 1)
    return valid


ends_strategy = st.integers(1, 3).flatmap(lambda N: st.lists(
    st.lists(st.sampled_from([0, 0, 0, 0, 1, 2]), min_size=N, max_size=N), min_size=1, max_size=70))


@settings(max_examples=60, deadline=None)
@given(ends=ends_strategy, H=st.integers(1, 4), extra=st.integers(2, 20))
def test_valid_starts_match_brute_force_including_wraparound(ends, H, extra):
    N = len(ends[0])
    buf = fill(N, H, H + extra, ends)
    expected = oracle_valid(buf)
    assert np.array_equal(buf.valid.numpy(), expected)
    if expected.any():
        b = buf.sample(64)
        ids, steps, term = b.obs[..., 0], b.obs[..., 1], b.obs[..., 2]
        # the rows up to and including the first terminal one (all, without one) are the episode's
        ended = b.terminated.long()
        own = torch.cat([torch.ones_like(ended[:1]), (ended.cumsum(0) - ended == 0).long()]).bool()  # (H+1, B)
        assert (ids[own] > 0).all()  # never an unwritten slot
        assert (ids == ids[0])[own].all()  # never across an episode boundary
        assert (steps[1:] - steps[:-1] == 1)[own[1:]].all()
        assert torch.equal(b.action[..., 0][own[1:]], steps[1:][own[1:]])
        assert torch.equal(b.reward[own[1:]], steps[1:][own[1:]])
        assert torch.equal(b.terminated[own[1:]], term[1:].bool()[own[1:]])  # terminated flags kept with their step
        assert b.obs.shape == (H + 1, 64, 3) and b.action.shape == (H, 64, 1)


def test_sampling_is_uniform_over_valid_starts():
    buf = fill(2, 2, 40, [[0, 0]] * 15 + [[1, 2]] + [[0, 0]] * 10)
    valid_keys = {(buf.obs[e, s, 0].item(), buf.obs[e, s, 1].item()) for e, s in np.argwhere(buf.valid.numpy())}
    counts: dict = {}
    torch.manual_seed(0)
    for _ in range(100):
        first = buf.sample(256).obs[0]
        for key in zip(first[:, 0].tolist(), first[:, 1].tolist()):
            counts[key] = counts.get(key, 0) + 1
    assert set(counts) == valid_keys  # every valid start is reached, and nothing else
    freq = np.array(list(counts.values()), dtype=float)
    assert freq.min() > 0.7 * freq.mean() and freq.max() < 1.3 * freq.mean()


def reference_start_probabilities(buf, finished_only=True):
    """The reference's draw (torchrl's SliceSampler, strict_length): an episode uniformly among those with at least
    H+1 rows, then a start uniformly among its first length - H rows. Only finished episodes: its buffer gets an
    episode when it ends. Returns {(episode id, step): probability}."""
    obs = buf.obs.numpy()
    episodes: dict = {}
    for e in range(buf.N):
        for s in range(buf.C):
            if obs[e, s, 0] > 0:
                episodes.setdefault(obs[e, s, 0], []).append(obs[e, s, 1])
    in_progress = {obs[e, (buf.ptr[e].item() - 1) % buf.C, 0] for e in range(buf.N)}
    lengths = {i: len(steps) for i, steps in episodes.items()
               if len(steps) >= buf.H + 1 and not (finished_only and i in in_progress)}
    return {(i, float(s)): 1 / len(lengths) / (n - buf.H) for i, n in lengths.items() for s in range(n - buf.H)}


def our_start_probabilities(buf):
    obs, valid = buf.obs.numpy(), buf.valid.numpy()
    p = valid / valid.sum()
    return {(obs[e, s, 0], obs[e, s, 1]): p[e, s] for e, s in np.argwhere(valid)}


def test_sampling_equals_the_references_when_episodes_have_one_length():
    """DMC's episodes all have one length (500 agent steps; the MT30/MT80 datasets' 501 and 101 rows): then a start
    uniform over valid starts is the reference's episode-then-start draw exactly. The episode in progress, which the
    reference cannot sample, is ours only (docs/deviations.md)."""
    H = 3
    buf = fill(2, H, 60, ([[0, 0]] * 9 + [[2, 2]]) * 4)  # 2 envs x 4 truncated 10-step episodes, none in progress
    ours, reference = our_start_probabilities(buf), reference_start_probabilities(buf)
    assert set(ours) == set(reference) and len(ours) == 2 * 4 * (11 - H)
    assert all(abs(ours[k] - reference[k]) < 1e-12 for k in ours)


def test_sampling_differs_from_the_references_with_episodes_of_several_lengths():
    """With terminations (episodes of several lengths) the reference gives every episode the same share, so a
    short one's starts weigh more; ours gives every start the same share (docs/deviations.md). This pins what
    that row of the docs says: the test fails if either side changes."""
    H = 3
    buf = fill(1, H, 60, [[0]] * 19 + [[2]] + [[0]] * 4 + [[2]])  # truncated episodes of 21 and 6 rows
    ours, reference = our_start_probabilities(buf), reference_start_probabilities(buf)
    assert set(ours) == set(reference)
    long_start, short_start = (1.0, 0.0), (2.0, 0.0)
    assert abs(ours[long_start] - ours[short_start]) < 1e-12
    assert reference[short_start] / reference[long_start] == pytest.approx(18 / 3)


def test_overwrites_oldest_when_full():
    buf = fill(1, 1, 5, [[0]] * 12)  # one endless episode, 13 rows into a 5-row ring
    steps = sorted(buf.obs[0, :, 1].tolist())
    assert steps == [8.0, 9.0, 10.0, 11.0, 12.0]


def test_empty_buffer_sampling_is_a_clear_error():
    buf = ReplayBuffer(100, 1, (3,), 1, 3)
    with pytest.raises(RuntimeError, match="no complete sub-trajectory"):
        buf.sample(4)


def test_hdf5_round_trip(tmp_path):
    buf = fill(2, 3, 12, [[0, 0]] * 9 + [[1, 0]] + [[0, 2]] * 8)
    buf.save(tmp_path / "buffer.h5")
    other = ReplayBuffer(24, 2, (3,), 1, 3)
    other.load(tmp_path / "buffer.h5")
    for name in ("obs", "action", "reward", "terminated", "valid"):
        assert torch.equal(getattr(buf, name), getattr(other, name)), name
    assert torch.equal(buf.ptr, other.ptr) and torch.equal(buf.ep_step, other.ep_step)
    assert other.num_valid_starts == buf.num_valid_starts


def test_first_marks_exactly_the_rows_that_start_episodes():
    buf = fill(2, 2, 10, [[0, 1], [2, 0], [0, 0], [1, 2]])
    obs = buf.obs.numpy()
    starts = obs[..., 1] == 0  # step 0 in the episode (written rows have episode ids > 0)
    written = obs[..., 0] > 0
    assert np.array_equal(buf.first.numpy(), starts & written)


def test_a_terminal_transition_is_sampled_at_every_step_of_the_horizon():
    """Starts up to H-1 rows before a terminal row are valid too (their later steps are masked in the update),
    so the terminal transition is the first, second and third step of some sub-trajectory; an episode that is
    only truncated keeps the starts whose H steps are all its own."""
    H = 3
    buf = fill(1, H, 40, [[0]] * 4 + [[1]] + [[0]] * 4 + [[2]] + [[1]])  # 5 steps, terminated; 5, truncated; 1
    starts = np.flatnonzero(buf.valid[0].numpy())
    assert starts.tolist() == [0, 1, 2, 3, 4] + [6, 7, 8] + [12]
    b = buf.sample(4000)
    terminal_at = b.terminated.float().argmax(0)[b.terminated.any(0)]
    assert set(terminal_at.tolist()) == {0, 1, 2}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=3), min_size=1, max_size=30))
def test_newest_is_what_each_env_acts_on_next(ends):
    """newest(): each env's latest observation (the step's, or a new episode's first after an end) and whether it
    begins an episode, across the ring's wrap-around (capacity 6 rows per env)."""
    buf = fill(3, 2, 6, ends)
    obs, first = buf.newest()
    last = ends[-1]
    for e in range(3):
        steps_since_start = 0
        for row in reversed(ends):  # the steps of the episode in flight
            if row[e] != 0:
                break
            steps_since_start += 1
        assert obs[e, 1].item() == (0 if last[e] != 0 else steps_since_start), (e, obs[e])
        assert bool(first[e]) == (last[e] != 0)
