"""Preallocated replay ring buffer for N parallel environments.

Each env writes its own stream of rows. A row holds an observation and the action,
reward and `terminated` flag that led to it; the first row of an episode holds only the
reset observation. Truncation needs no flag: the next row simply starts a new episode.

A start row s is *valid* when rows s..s+H are one episode, written in order, or when the
episode terminates at a row in s+1..s+H-1: then the steps after the terminal one are not the
episode's, and the update masks them (Agent: `alive`). Without those starts a terminal
transition would only ever be the last of a sub-trajectory, so the termination head and Q
would learn it on H-step rollout latents alone and never on the encoder's (RESULTS.md,
Hopper). Validity is settled at write time (writing row p with episode step >= H validates
p - H; a terminal row validates the H-1 before it too), so sampling is uniform over valid
starts with one multinomial and no Python loop.

Unlike the reference, which samples only finished episodes (its buffer stores whole
episodes), the episode in progress is sampled too, on purpose: its newest transitions are
learned from at once instead of up to an episode later (500 agent steps on DMC), and an
env that never ends an episode still trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import Tensor

from tdmpc.errors import BufferFileError
from tdmpc.runtime.files import atomic_write
from tdmpc.runtime.transfer import to_device


@dataclass
class Batch:
    """B sub-trajectories, time first: obs (H+1, B, ...), the rest (H, B[, A]); task (B,) ids of a
    multi-task batch (one per sub-trajectory), None for a single-task one. Discrete actions are (H, B) integers
    (the model makes one-hot rows of them: WorldModel.action_input)."""

    obs: Tensor
    action: Tensor
    reward: Tensor
    terminated: Tensor
    task: Tensor | None = None


# The per-row arrays a saved buffer holds, each (num_envs, filled, ...).
BUFFER_FIELDS = ("obs", "action", "reward", "terminated", "first", "valid")


class ReplayBuffer:
    def __init__(self, capacity: int, num_envs: int, obs_shape: tuple[int, ...], action_dim: int,
                 horizon: int, obs_dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 storage: torch.device | str | None = None, env_tasks: np.ndarray | None = None,
                 discrete: bool = False):
        """env_tasks: the task id of each env (a multi-task model's); sampled batches then carry the task of
        each sub-trajectory. discrete: actions are integers 0..action_dim-1, stored as one int32 per row."""
        self.N, self.H = num_envs, horizon
        self.num_actions = action_dim if discrete else None  # saved, so a buffer file says what its integers index
        self.C = capacity // num_envs  # rows per env
        if self.C <= horizon + 1:
            raise ValueError(f"buffer of {capacity} rows for {num_envs} envs cannot hold horizon {horizon}")
        self.device = torch.device(device)
        self.storage = torch.device(storage) if storage is not None else self.device
        pin = self.storage.type == "cpu" and self.device.type == "cuda"
        kw: dict[str, Any] = dict(device=self.storage, pin_memory=pin)
        N, C = self.N, self.C
        self.obs = torch.zeros((N, C, *obs_shape), dtype=obs_dtype, **kw)
        self.action = torch.zeros((N, C) if discrete else (N, C, action_dim), dtype=torch.int32 if discrete else
                                  torch.float32, **kw)
        self.reward = torch.zeros((N, C), **kw)
        self.terminated = torch.zeros((N, C), dtype=torch.bool, **kw)
        self.first = torch.zeros((N, C), dtype=torch.bool, device=self.storage)  # the row starts an episode
        self.valid = torch.zeros((N, C), dtype=torch.bool, device=self.storage)
        # Host bookkeeping: write pointers, episode steps, and a mirror of `valid` for counting.
        self.ptr = np.zeros(N, dtype=np.int64)
        self.ep_step = np.full(N, -1, dtype=np.int64)  # -1: no episode started yet
        self.filled = 0  # columns ever written (max over envs)
        self.transitions = 0  # transitions stored since creation
        # (not on the meta device, where the memory estimate builds a buffer only to ask its device bytes)
        self._valid_host = np.zeros((N, C if self.storage.type != "meta" else 0), dtype=bool)
        # made on the CPU and moved: arange on the meta device (the memory estimate's) imports sympy
        self._envs = torch.arange(N, device="cpu").to(self.storage)
        self._newest = torch.zeros(N, dtype=torch.long, device=self.storage)  # each env's last written row
        self.env_tasks = None if env_tasks is None else torch.as_tensor(env_tasks, dtype=torch.long, device=self.storage)
        self._offsets = torch.arange(horizon + 1, device="cpu").to(self.storage)

    @property
    def num_valid_starts(self) -> int:
        return int(self._valid_host.sum())

    @property
    def saved_bytes(self) -> int:
        """About what save() writes: the filled columns of every row field."""
        return self.nbytes * self.filled // self.C

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.obs, self.action, self.reward, self.terminated,
                                                           self.first, self.valid))

    def _rows(self, envs: np.ndarray) -> np.ndarray:
        """Claim the next row of each env in `envs` (host bookkeeping only)."""
        rows = self.ptr[envs].copy()
        self.ptr[envs] = (rows + 1) % self.C
        self.filled = max(self.filled, int(rows.max()) + 1)
        return rows

    def start(self, obs: Tensor, envs: np.ndarray | None = None) -> None:
        """Begin an episode in each env of `envs` (all by default) with its reset observation."""
        envs = np.arange(self.N) if envs is None else np.asarray(envs, dtype=np.int64)
        if len(envs) == 0:
            return
        rows = self._rows(envs)
        self._valid_host[envs, rows] = False
        e, r, o = to_device(self.storage, envs, rows, _host(obs, self.obs.dtype))
        self.obs[e, r] = o
        self.action[e, r] = 0
        self.reward[e, r] = 0
        self.terminated[e, r] = False
        self.first[e, r] = True
        self.valid[e, r] = False
        self._newest[e] = r
        self.ep_step[envs] = 0

    def add(self, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
            keep: np.ndarray | None = None) -> None:
        """One step of the N envs: obs is what each action led to (the final obs if the episode ended).
        keep: which envs' transitions to store (the others are dropped; their episodes must restart).

        Rows, indices and validity changes reach the device in one copy (runtime.transfer)."""
        envs = np.arange(self.N) if keep is None else np.flatnonzero(keep)
        if len(envs) == 0:
            return
        if (self.ep_step[envs] < 0).any():
            raise RuntimeError("ReplayBuffer.add() before start(): begin each env's episode first")
        obs_h, action_h = _host(obs, self.obs.dtype)[envs], _host(action, self.action.dtype)[envs]
        reward_h, ended = _host(reward, torch.float32)[envs], _host(terminated, torch.bool)[envs]
        rows = self._rows(envs)
        self.ep_step[envs] += 1
        # Validity: the rows written start no sub-trajectory yet; the start H rows back now has one, and so do
        # the starts whose sub-trajectory reaches past a terminal row (all distinct rows: no order to keep).
        ready = self.ep_step[envs] >= self.H
        changes = [(envs, rows, False), (envs[ready], (rows[ready] - self.H) % self.C, True)]
        for k in range(1, self.H):
            back = ended & (self.ep_step[envs] >= k)
            changes.append((envs[back], (rows[back] - k) % self.C, True))
        v_env = np.concatenate([c[0] for c in changes])
        v_row = np.concatenate([c[1] for c in changes])
        v_val = np.concatenate([np.full(len(c[0]), c[2]) for c in changes])
        self._valid_host[v_env, v_row] = v_val
        e, r, o, a, rw, t, ve, vr, vv = to_device(self.storage, envs, rows, obs_h, action_h, reward_h, ended,
                                                  v_env, v_row, v_val)
        self.obs[e, r] = o
        self.action[e, r] = a
        self.reward[e, r] = rw
        self.terminated[e, r] = t
        self.first[e, r] = False
        self.valid[ve, vr] = vv
        self._newest[e] = r
        self.transitions += len(envs)

    def newest(self) -> tuple[Tensor, Tensor]:
        """Each env's newest observation (N, ...) and whether it begins an episode (N,), on `device`: what the
        agent acts on next, already there, so acting copies nothing from the host (a host-stored buffer sends
        both in one copy)."""
        obs, first = self.obs[self._envs, self._newest], self.first[self._envs, self._newest]
        if self.storage != self.device:
            obs, first = to_device(self.device, obs, first)
        return obs, first

    def sample(self, batch_size: int) -> Batch:
        """B sub-trajectories of H+1 observations, uniform over valid starts, time-major."""
        if not self._any_valid():
            raise RuntimeError(f"no complete sub-trajectory of horizon {self.H} in the buffer yet")
        F = self.filled
        flat = torch.multinomial(self.valid[:, :F].reshape(-1).float(), batch_size, replacement=True)
        env = (flat // F).unsqueeze(1)
        rows = (flat % F).unsqueeze(1) + self._offsets  # (B, H+1)
        rows = torch.where(rows >= self.C, rows - self.C, rows)
        act_rows = rows[:, 1:]
        parts = [self.obs[env, rows].transpose(0, 1), self.action[env, act_rows].transpose(0, 1),
                 self.reward[env, act_rows].transpose(0, 1), self.terminated[env, act_rows].transpose(0, 1)]
        if self.env_tasks is not None:
            parts.append(self.env_tasks[env.squeeze(1)])
        if self.storage != self.device:  # rows kept in host memory: the batch goes over in one copy
            parts = to_device(self.device, *(t.contiguous() for t in parts))
        return Batch(*(t.contiguous() for t in parts))

    def _any_valid(self) -> bool:
        return bool(self._valid_host.any())

    def end_episodes(self) -> None:
        """Drop in-flight episodes (at resume): the next row of every env must be a start()."""
        self.ep_step[:] = -1

    # --- persistence (HDF5) --------------------------------------------------------
    def save(self, path: Path) -> None:
        F = self.filled

        def write(tmp: Path) -> None:
            with h5py.File(tmp, "w") as f:
                for name in BUFFER_FIELDS:
                    f.create_dataset(name, data=getattr(self, name)[:, :F].cpu().numpy())
                f.create_dataset("ptr", data=self.ptr)
                f.create_dataset("ep_step", data=self.ep_step)
                if self.env_tasks is not None:
                    f.create_dataset("env_tasks", data=self.env_tasks.cpu().numpy())
                f.attrs.update(capacity_per_env=self.C, num_envs=self.N, horizon=self.H, filled=F,
                               transitions=self.transitions)
                if self.num_actions is not None:
                    f.attrs["num_actions"] = self.num_actions

        atomic_write(Path(path), write)

    def load(self, path: Path) -> None:
        """Restore a saved buffer; a file that is missing, not HDF5, truncated, laid out for another run or
        holding non-finite values is a one-line BufferFileError naming it and what is wrong."""
        path = Path(path)
        if not path.is_file():
            raise BufferFileError(f"{path}: the replay buffer file is missing")
        try:
            with h5py.File(path, "r") as f:
                a = f.attrs
                if (a["capacity_per_env"], a["num_envs"], a["horizon"]) != (self.C, self.N, self.H):
                    raise BufferFileError(f"{path}: written for capacity/env {a['capacity_per_env']}, "
                                          f"{a['num_envs']} envs, horizon {a['horizon']}; this run has "
                                          f"{self.C}, {self.N}, {self.H}")
                F = int(a["filled"])
                if not 0 <= F <= self.C:
                    raise BufferFileError(f"{path}: 'filled' is {F}, outside 0..{self.C}")
                for name in BUFFER_FIELDS:
                    if name == "first" and name not in f:  # saved before episode starts were recorded
                        continue
                    target = getattr(self, name)
                    if f[name].shape != (self.N, F, *target.shape[2:]):
                        raise BufferFileError(f"{path}: '{name}' has shape {f[name].shape}, expected "
                                              f"{(self.N, F, *target.shape[2:])}")
                    target[:, :F] = torch.from_numpy(f[name][...]).to(self.storage)
                self.ptr[:] = f["ptr"][...]
                self.ep_step[:] = f["ep_step"][...]
                self.filled, self.transitions = F, int(a["transitions"])
        except BufferFileError:
            raise
        except (OSError, KeyError, ValueError, TypeError) as e:  # h5py's errors for damaged or foreign files
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise BufferFileError(f"{path}: not a readable replay buffer file ({first})") from None
        for name in ("obs", "action", "reward"):
            values = getattr(self, name)[:, :F]
            if values.is_floating_point() and not torch.isfinite(values).all():
                env, row = (~torch.isfinite(values)).reshape(self.N, F, -1).any(-1).nonzero()[0].tolist()
                raise BufferFileError(f"{path}: non-finite values in '{name}' (env {env}, row {row})")
        self._valid_host[:] = False
        self._valid_host[:, :F] = self.valid[:, :F].cpu().numpy()


class TensorReplayBuffer(ReplayBuffer):
    """The replay buffer of tensor-native envs (tdmpc.envs.tensor): the same rows, validity and sampling, with the
    bookkeeping (write pointers, episode steps) on the storage device, so that a step's rows go in with masks and
    no host sync or copy. Every start() or add() claims one row of every env and writes the masked ones (the
    others are written back as they were); `filled` counts those calls, a host-side upper bound on the rows any
    env has written. The host mirror of `valid` is not kept: num_valid_starts reads the device."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self._ptr = torch.zeros(self.N, dtype=torch.long, device=self.storage)
        self._ep_step = torch.full((self.N,), -1, dtype=torch.long, device=self.storage)
        self._count = torch.zeros((), dtype=torch.long, device=self.storage)  # transitions stored

    @property
    def num_valid_starts(self) -> int:
        return int(self.valid[:, :self.filled].sum())

    def _any_valid(self) -> bool:
        return True  # the trainer samples after seeding; an empty buffer fails in torch.multinomial instead

    def _write(self, name: str, mask: Tensor, value: Tensor | float) -> None:
        """Field `name` at each env's current row, where mask (N,) is True."""
        field = getattr(self, name)
        old = field[self._envs, self._ptr]
        m = mask.view(-1, *[1] * (old.dim() - 1))
        field[self._envs, self._ptr] = torch.where(m, value.to(field.dtype) if isinstance(value, Tensor) else value, old)

    def _mark(self, rows: Tensor, mask: Tensor, value: bool) -> None:
        self.valid[self._envs, rows] = torch.where(mask, value, self.valid[self._envs, rows])

    def _advance(self, mask: Tensor) -> None:
        self._newest = torch.where(mask, self._ptr, self._newest)
        self._ptr = torch.where(mask, (self._ptr + 1) % self.C, self._ptr)
        self.filled = min(self.C, self.filled + 1)

    def start(self, obs: Tensor, mask: Tensor | np.ndarray | None = None) -> None:
        """Begin an episode in the envs where `mask` (N,) is True (all when None), obs (N, ...) for every env: a
        mask, not the host buffer's env indices, so that nothing reads the device's values on the host."""
        mask = torch.ones(self.N, dtype=torch.bool, device=self.storage) if mask is None else \
            torch.as_tensor(mask, device=self.storage)
        obs = obs.to(self.storage)
        self._write("obs", mask, obs)
        for name, zero in (("action", 0), ("reward", 0.0), ("terminated", False)):
            self._write(name, mask, zero)
        self._write("first", mask, True)
        self._mark(self._ptr, mask, False)
        self._ep_step = torch.where(mask, 0, self._ep_step)
        self._advance(mask)

    def add(self, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
            keep: Tensor | np.ndarray | None = None) -> None:
        """One step's transitions of the envs where `keep` (N,) is True and an episode is in progress (an env
        whose episode was ended by end_episodes() or stop() stores nothing until its next start())."""
        keep_t = torch.ones(self.N, dtype=torch.bool, device=self.storage) if keep is None else \
            torch.as_tensor(keep, device=self.storage)
        mask = keep_t & (self._ep_step >= 0)
        term = terminated.to(self.storage) & mask
        for name, value in (("obs", obs), ("action", action), ("reward", reward), ("terminated", term)):
            self._write(name, mask, value.to(self.storage))
        self._write("first", mask, False)
        rows = self._ptr
        self._mark(rows, mask, False)
        self._ep_step = self._ep_step + mask.long()
        self._mark((rows - self.H) % self.C, mask & (self._ep_step >= self.H), True)
        for k in range(1, self.H):
            self._mark((rows - k) % self.C, term & (self._ep_step >= k), True)
        self._count += mask.sum()
        self._advance(mask)

    def stop(self, envs: Tensor) -> None:
        """End the episodes in flight in the envs where the mask is True: nothing more of them is stored."""
        self._ep_step = torch.where(envs.to(self.storage), -1, self._ep_step)

    def end_episodes(self) -> None:
        self._ep_step.fill_(-1)

    def save(self, path: Path) -> None:
        self.ptr[:], self.ep_step[:] = self._ptr.cpu().numpy(), self._ep_step.cpu().numpy()
        self.transitions = int(self._count)
        super().save(path)

    def load(self, path: Path) -> None:
        super().load(path)
        self._ptr.copy_(torch.from_numpy(self.ptr))
        self._ep_step.copy_(torch.from_numpy(self.ep_step))
        self._newest = (self._ptr - 1) % self.C
        self._count.fill_(self.transitions)


def _host(x: Tensor | np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """x as a host array of the buffer field's dtype (read back first if it is a device tensor)."""
    array = x.cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    return array.astype(_NUMPY[dtype], copy=False)


_NUMPY = {torch.float32: np.float32, torch.uint8: np.uint8, torch.bool: np.bool_, torch.int32: np.int32}  # the buffer fields' dtypes
