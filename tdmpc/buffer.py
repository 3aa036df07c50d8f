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
env that never ends an episode still trains (docs/deviations.md, with the other difference:
starts are uniform over transitions, not over episodes first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import Tensor

from tdmpc.envs.tensor import TensorStep
from tdmpc.errors import BufferFileError
from tdmpc.runtime.device import cpu_fast_paths
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
    """Every env's rows, written by mask: each start() or add() claims the next row of the envs its mask selects,
    so that a step's rows go in with no host sync, whatever device the buffer is on (write pointers and episode
    steps live there too). `filled` counts the columns ever written: exact on the CPU; on a GPU an upper bound
    (one per call), so that nothing reads the device.

    Each field holds a spare row per env past its C: an env the mask leaves out writes there, so a masked write
    is one indexed write (not a read, a select and a write back), whoever steps the envs. The fields seen from
    outside (obs, valid, ...) are views without it."""

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
        self._rows: dict[str, Tensor] = {  # (N, C + 1, ...): the spare row last
            "obs": torch.zeros((N, C + 1, *obs_shape), dtype=obs_dtype, **kw),
            "action": torch.zeros((N, C + 1) if discrete else (N, C + 1, action_dim),
                                  dtype=torch.int32 if discrete else torch.float32, **kw),
            "reward": torch.zeros((N, C + 1), **kw),
            "terminated": torch.zeros((N, C + 1), dtype=torch.bool, **kw),
            "first": torch.zeros((N, C + 1), dtype=torch.bool, device=self.storage),  # the row starts an episode
            "valid": torch.zeros((N, C + 1), dtype=torch.bool, device=self.storage)}
        self.obs, self.action, self.reward, self.terminated, self.first, self.valid = (
            self._rows[name][:, :C] for name in BUFFER_FIELDS)
        self.ptr = torch.zeros(N, dtype=torch.long, device=self.storage)  # each env's next row
        self.ep_step = torch.full((N,), -1, dtype=torch.long, device=self.storage)  # -1: no episode in progress
        self._newest = torch.zeros(N, dtype=torch.long, device=self.storage)  # each env's last written row
        self._count = torch.zeros((), dtype=torch.long, device=self.storage)  # transitions stored
        self.filled = 0
        # made on the CPU and moved: arange on the meta device (the memory estimate's) imports sympy
        self._envs = torch.arange(N, device="cpu").to(self.storage)
        self._all = torch.ones(N, dtype=torch.bool, device=self.storage)
        self.env_tasks = None if env_tasks is None else torch.as_tensor(env_tasks, dtype=torch.long, device=self.storage)
        offsets = torch.arange(horizon + 1, device="cpu")
        self._offsets, self._back, self._farthest = (t.to(self.storage) for t in (offsets, offsets[1:],
                                                                                  offsets[1:] == horizon))
        self._constants: dict[tuple[object, torch.dtype], Tensor] = {}

    @property
    def transitions(self) -> int:
        """Transitions stored since creation (read from the device)."""
        return int(self._count)

    @property
    def num_valid_starts(self) -> int:
        return int(self.valid[:, :self.filled].sum())

    @property
    def saved_bytes(self) -> int:
        """About what save() writes: the filled columns of every row field."""
        return self.nbytes * self.filled // self.C

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.obs, self.action, self.reward, self.terminated,
                                                           self.first, self.valid))

    def start(self, obs: Tensor, mask: Tensor | np.ndarray | None = None) -> None:
        """Begin an episode in the envs where `mask` (N,) is True (all when None) with their reset observations,
        rows of obs (N, ...)."""
        if isinstance(mask, np.ndarray) and not mask.any():
            return
        mask = self._mask(mask)
        rows = self._rows_of(mask, self.ptr)
        self._write("obs", rows, obs.to(self.storage))
        for name, zero in (("action", 0), ("reward", 0.0), ("terminated", False), ("valid", False)):
            self._write(name, rows, zero)
        self._write("first", rows, True)
        self.ep_step = torch.where(mask, 0, self.ep_step)
        self._advance(mask)

    def add(self, obs: Tensor, action: Tensor, reward: Tensor, terminated: Tensor,
            keep: Tensor | np.ndarray | None = None) -> None:
        """One step's transitions of the envs where `keep` (N,) is True (all when None) and an episode is in
        progress (an env whose episode was ended by end_episodes() or stop() stores nothing until its next
        start()). obs is what each action led to (the final observation where an episode ended).

        Validity: the rows written start no sub-trajectory yet; the start H rows back now has one, and so do the
        starts whose sub-trajectory reaches past a terminal row."""
        mask = self._mask(keep) & (self.ep_step >= 0)
        term = terminated.to(self.storage) & mask
        rows = self._rows_of(mask, self.ptr)
        for name, value in (("obs", obs), ("action", action), ("reward", reward), ("terminated", term)):
            self._write(name, rows, value.to(self.storage))
        self._write("first", rows, False)
        self._write("valid", rows, False)
        self.ep_step = self.ep_step + mask.long()
        # the starts k = 1..H rows back (N, H): the H-th where the episode is that long, the nearer ones too where
        # this row is terminal and they are in its episode
        k = self._back
        reach = (term.unsqueeze(1) | mask.unsqueeze(1) & self._farthest) & (self.ep_step.unsqueeze(1) >= k)
        self._write("valid", self._rows_of(reach, (self.ptr.unsqueeze(1) - k) % self.C), True)
        self._count += mask.sum()
        self._advance(mask)

    def record(self, s: TensorStep, action: Tensor) -> TensorStep:
        """A vector step's rows: its transitions (a non-finite one is not stored, and its env's episode stores
        nothing more: stop()), then the episodes that start. Returns the step on the storage device, where a step
        of host data arrives in one copy."""
        starts = not s.on_host or bool(s.started.any())  # on host data the check is free
        fields = [s.obs, s.next_obs, s.reward, s.terminated, s.truncated, s.transition, s.started, s.finite]
        # a host action (seeding's, or the planner's a numpy env took) is sent along; device types compared, as
        # "cuda" != "cuda:0"
        host_action = s.on_host and action.device.type == "cpu" and not cpu_fast_paths(self.storage)
        if s.on_host:
            fields = to_device(self.storage, *fields, *([action] if host_action else []))
            action = fields.pop() if host_action else action
        obs, next_obs, reward, terminated, truncated, transition, started, finite = (f.to(self.storage) for f in fields)
        sent = TensorStep(obs, next_obs, reward, terminated, truncated, transition, started, finite)
        if not s.on_host or not bool(s.finite.all()):  # (a host env's rows: known for free)
            self.stop(sent.transition & ~sent.finite)
        self.add(sent.next_obs, action, sent.reward, sent.terminated, sent.transition & sent.finite)
        if starts:
            self.start(sent.obs, sent.started)
        return sent

    def stop(self, mask: Tensor) -> None:
        """End the episodes in flight in the envs where `mask` is True: nothing more of them is stored."""
        self.ep_step = torch.where(mask.to(self.storage), -1, self.ep_step)

    def end_episodes(self) -> None:
        """Drop in-flight episodes (at resume): the next row of every env must be a start()."""
        self.ep_step.fill_(-1)

    def _mask(self, mask: Tensor | np.ndarray | None) -> Tensor:
        return self._all if mask is None else torch.as_tensor(mask, device=self.storage)

    def _rows_of(self, mask: Tensor, rows: Tensor) -> Tensor:
        """Each env's rows in `rows` (N,) or (N, K) where mask is True, its spare row where not."""
        return torch.where(mask, rows, self.C)

    def _write(self, name: str, rows: Tensor, value: Tensor | float | bool) -> None:
        """Field `name` at each env's rows in `rows` (N,) or (N, K) (_rows_of: a masked write in one indexed write,
        with no read of the device). A constant is made on the device once, not at each write."""
        field = self._rows[name]
        if not isinstance(value, Tensor):
            key = (value, field.dtype)
            if key not in self._constants:
                self._constants[key] = torch.tensor(value, dtype=field.dtype).to(self.storage)
            value = self._constants[key]
        envs = self._envs if rows.dim() == 1 else self._envs.unsqueeze(1)
        field[envs, rows] = value.to(field.dtype)

    def _advance(self, mask: Tensor) -> None:
        """The masked envs' rows are written: their pointers move on."""
        rows = self.ptr
        self._newest = torch.where(mask, rows, self._newest)
        self.ptr = torch.where(mask, (rows + 1) % self.C, rows)
        if not cpu_fast_paths(self.storage):
            self.filled = min(self.C, self.filled + 1)
        elif mask.any():
            self.filled = max(self.filled, int(rows[mask].max()) + 1)

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
        F = self.filled
        if cpu_fast_paths(self.storage) and not self.valid[:, :F].any():  # on a GPU: torch.multinomial says so
            raise RuntimeError(f"no complete sub-trajectory of horizon {self.H} in the buffer yet")
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

    # --- persistence (HDF5) --------------------------------------------------------
    def save(self, path: Path) -> None:
        F = self.filled

        def write(tmp: Path) -> None:
            with h5py.File(tmp, "w") as f:
                for name in BUFFER_FIELDS:
                    f.create_dataset(name, data=getattr(self, name)[:, :F].cpu().numpy())
                f.create_dataset("ptr", data=self.ptr.cpu().numpy())
                f.create_dataset("ep_step", data=self.ep_step.cpu().numpy())
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
                self.ptr.copy_(torch.from_numpy(f["ptr"][...].astype(np.int64)))
                self.ep_step.copy_(torch.from_numpy(f["ep_step"][...].astype(np.int64)))
                self.filled = F
                self._count.fill_(int(a["transitions"]))
        except BufferFileError:
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:  # h5py's errors for damaged or foreign files
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise BufferFileError(f"{path}: not a readable replay buffer file ({first})") from None
        self._newest = (self.ptr - 1) % self.C
        for name in ("obs", "action", "reward"):
            values = getattr(self, name)[:, :F]
            if values.is_floating_point() and not torch.isfinite(values).all():
                env, row = (~torch.isfinite(values)).reshape(self.N, F, -1).any(-1).nonzero()[0].tolist()
                raise BufferFileError(f"{path}: non-finite values in '{name}' (env {env}, row {row})")


