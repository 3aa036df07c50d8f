"""What a run directory holds, and the housekeeping around it.

    <run_dir>/config.json        the resolved config
    <run_dir>/train.csv, eval.csv
    <run_dir>/checkpoints/latest.pt, previous.pt and the buffer_<step>.h5 each names
    <run_dir>/wandb_id           the run's wandb id, kept across resumes and requeues
    <run_dir>/.lock              held (flock) by the one process writing the run

A damaged file is never deleted: it is renamed <name>.damaged and the error says how to go on.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from tdmpc.config import AS_BEFORE_ADDED, Config, from_dict, read_json
from tdmpc.errors import CheckpointError, ConfigError, RunDirError
from tdmpc.runtime.args import named
from tdmpc.runtime.files import make_dirs, write_text_atomic




def checkpoint_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "latest.pt"


def previous_checkpoint_path(run_dir: Path) -> Path:
    """The checkpoint before latest.pt, kept (with its replay buffer) until a newer one is complete."""
    return run_dir / "checkpoints" / "previous.pt"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether a resume has a checkpoint to start from: latest.pt, or previous.pt where latest.pt is gone."""
    return checkpoint_path(run_dir).is_file() or previous_checkpoint_path(run_dir).is_file()


def resume_checkpoint(run_dir: Path, say: bool = True) -> Path:
    """The checkpoint a resume starts from: latest.pt, or, when that is damaged, previous.pt, with a line saying
    what is lost (unless not `say`: said already; the damaged file is set aside once the run has restored:
    set_aside_on_resume). Neither usable: a one-line CheckpointError."""
    from tdmpc.model.checkpoint import load_file  # the checkpoint module imports the model

    latest, previous = checkpoint_path(run_dir), previous_checkpoint_path(run_dir)
    try:
        load_file(latest, mmap=True)
        return latest
    except CheckpointError as e:
        damaged = str(e)
    try:
        step = saved_step(load_file(previous, mmap=True)["train"])
    except (CheckpointError, KeyError, TypeError):
        raise CheckpointError(f"{damaged}; there is no older checkpoint to fall back to: copy one you have over "
                              f"{latest} and --resume, or start a new run with --init-from it") from None
    if say:
        say_once(f"resume: {damaged}. Resuming from {previous.name}, the checkpoint before it (step {step:,}): the "
                 f"steps after it run again")
    return previous


def default_run_dir(cfg: Config) -> Path:
    """runs/TASK/seedS/TIME; a task list's commas (and a module's colon) kept out of the path for shells."""
    task = cfg.task.replace(":", "_").replace(",", "+")
    return Path("runs") / task / f"seed{cfg.seed}" / time.strftime("%Y%m%d-%H%M%S")


def resume_dir(path: Path) -> Path:
    """The run directory --resume names: a run's checkpoints/latest.pt stands for its directory (said in a line);
    another checkpoint file is refused, since a resume continues from latest.pt and nothing else."""
    if path.suffix != ".pt" or path.is_dir():
        return path
    run_dir = path.parent.parent
    if path.name == "latest.pt" and path.parent.name == "checkpoints":
        say_once(f"resume: {path} is a run's latest checkpoint; continuing the run in {run_dir}")
        return run_dir
    raise ConfigError(f"--resume {path}: --resume takes a run directory and continues from its checkpoints/latest.pt; "
                      f"to start a new run from this checkpoint's weights, pass --init-from {shlex.quote(str(path))}")


def saved_config(run_dir: Path, from_checkpoint: bool = False, from_python: bool = False) -> Config:
    """The config a run was started with (for --resume); fields added to Config since are said, one line each.

    A damaged config.json is a one-line error with the way out: from_checkpoint=True takes the config the
    checkpoint holds (the damaged file is set aside once the run has restored: set_aside_on_resume); from_python:
    the way out named as fit()'s keyword."""
    path = run_dir / "config.json"
    resume = f"fit(run_dir={str(run_dir)!r}, resume=True)" if from_python else f"--resume {run_dir}"
    if not run_dir.is_dir():
        raise ConfigError(f"{resume}: no such directory")
    if not has_checkpoint(run_dir):
        if holder := RunDirLock.held(run_dir):
            raise RunDirError(f"{resume}: the run directory is in use by {holder}, a run with no checkpoint "
                              f"yet; one process writes a run at a time (wait for it, or stop it)")
        raise ConfigError(f"{resume}: no run to continue there (no checkpoints/latest.pt or previous.pt)")
    if from_checkpoint:
        return _config_from_checkpoint(run_dir)
    way_out = (f"fit(run_dir={str(run_dir)!r}, resume=True, config_from_checkpoint=True)" if from_python
               else f"--resume {shlex.quote(str(run_dir))} --config-from-checkpoint")
    try:
        raw = read_json(path, "the run's config") if path.is_file() else None
        cfg = from_dict(raw, source=str(path)) if raw is not None else None
    except ConfigError as e:
        raise ConfigError(f"{e}; resume with the config the checkpoint holds: {way_out}") from None
    if cfg is None:
        raise ConfigError(f"{path} is missing; resume with the config the checkpoint holds: {way_out}")
    assert raw is not None
    return _with_added_fields(cfg, raw, path)


def _with_added_fields(cfg: Config, raw: dict, source: Path) -> Config:
    """cfg, read from `raw`, with the fields added to Config since: the value the run ran with where the default
    differs from it (AS_BEFORE_ADDED, also where `raw` holds null for such a field), else the default; one line
    each for the missing ones."""
    missing = sorted(set(cfg.to_dict()) - set(raw))
    as_ran = [k for k in AS_BEFORE_ADDED if raw.get(k) is None]  # missing, or saved as null (plan_horizon)
    cfg = dataclasses.replace(cfg, **{k: v(cfg) if callable(v := AS_BEFORE_ADDED[k]) else v for k in as_ran})
    for name in missing:
        how = "the value it ran with, not the default" if name in AS_BEFORE_ADDED else "the default"
        say_once(f"resume: {source} has no '{name}' (added to tdmpc since the run started); using {how}, "
             f"{getattr(cfg, name)!r}")
    return cfg


def say_once(line: str) -> None:
    """A run's line, once per launch: data-parallel ranks all run alike (rank 0 speaks, read from the
    environment, so also before their process group starts)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr)


def _config_from_checkpoint(run_dir: Path) -> Config:
    """The config of the checkpoint a resume starts from: latest.pt, or previous.pt when latest.pt is damaged too
    (resume_checkpoint says so when it picks the same file)."""
    from tdmpc.model.checkpoint import load_file  # the checkpoint module imports the model

    try:
        path, obj = checkpoint_path(run_dir), load_file(checkpoint_path(run_dir), mmap=True)
    except CheckpointError as e:
        if not previous_checkpoint_path(run_dir).is_file():
            raise
        damaged = e
        try:
            path, obj = previous_checkpoint_path(run_dir), load_file(previous_checkpoint_path(run_dir), mmap=True)
        except CheckpointError:
            raise damaged from None
    if not isinstance(obj.get("config"), dict):
        raise ConfigError(f"{path} holds no config to resume with")
    cfg = _with_added_fields(from_dict(obj["config"], source=str(path)), obj["config"], path)
    say_once(f"resume: the config comes from {path}")
    return cfg


def _readable_config(path: Path) -> bool:
    """Whether path holds a config this version reads (a readable one is not set aside as damaged)."""
    try:
        from_dict(read_json(path, "the run's config"), source=str(path))
        return True
    except (ConfigError, OSError):
        return False


def set_aside_on_resume(run_dir: Path, checkpoint: Path) -> list[str]:
    """A resume's damaged files, renamed once it has restored its checkpoint, before it writes anything: latest.pt
    when it started from previous.pt, a config.json this version cannot read (the config came from the
    checkpoint). Not sooner: a resume refused or failing on the way, or of a finished run, leaves the run as it
    was, resumable as before. Returns the lines that say what was kept where."""
    damaged = [checkpoint_path(run_dir)] if checkpoint != checkpoint_path(run_dir) else []
    if (run_dir / "config.json").exists() and not _readable_config(run_dir / "config.json"):
        damaged.append(run_dir / "config.json")
    return [f"resume: the damaged {path.name} is kept as {kept.name}" for path in damaged
            if (kept := set_aside_damaged(path)) is not None]


def set_aside_damaged(path: Path) -> Path | None:
    """Rename a damaged file to <name>.damaged (numbered if taken); never delete it."""
    if not path.exists():
        return None
    target, n = path.with_name(path.name + ".damaged"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged{n}")
    path.rename(target)
    return target


class RunDirLock:
    """One writer per run directory: an flock on <run_dir>/.lock, which the kernel releases when its holder
    exits or dies (kill -9, OOM killer, node failure of a local disk), so a stale lock never blocks.

    Whoever moves or changes a run directory takes this lock first (the trainer, tdmpc.reproduce setting aside a
    directory left without a checkpoint), so a live run is never moved away under its writer."""

    TRIES = 5  # a lock held for an instant (a probe, held()) is waited for; one held longer is an error

    def __init__(self, run_dir: Path):
        self.path = run_dir / ".lock"
        self.file: IO[str] | None = None
        self.created: Path | None = None  # the topmost directory acquire() made, removed by abandon()

    def acquire(self, from_python: bool = False) -> None:
        """from_python: tdmpc.fit's, whose message names its run_dir keyword, not the flag."""
        import fcntl

        for attempt in range(self.TRIES):
            try:
                if attempt == 0:
                    self.created = next((p for p in reversed([self.path.parent, *self.path.parent.parents])
                                         if not p.exists()), None)
                make_dirs(self.path.parent)
                f: IO[str] = open(self.path, "a+")
            except OSError as e:
                raise RunDirError(f"cannot use the run directory {self.path.parent}: {e.strerror or e}") from None
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                if attempt + 1 < self.TRIES:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise RunDirError(f"the run directory {self.path.parent} is in use by {holder}; one process writes a "
                                  f"run at a time (wait for it, stop it, or choose another "
                                  f"{named('run_dir', None, from_python)})") from None
            if _same_file(f, self.path):
                break
            f.close()  # the directory was moved away (set aside) between open() and flock(): lock the new one
        else:
            raise RunDirError(f"the run directory {self.path.parent} keeps being moved away; is another process "
                              f"setting it aside?")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        self.file = f

    @staticmethod
    def held(run_dir: Path) -> str | None:
        """Who holds the lock of `run_dir` now ('pid N on HOST'), or None: a run going on there. Takes the lock for
        an instant when it is free (acquire() waits for such an instant)."""
        import fcntl

        try:
            f = open(run_dir / ".lock")
        except (FileNotFoundError, NotADirectoryError):
            return None
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return f.read().strip() or "another process"
            fcntl.flock(f, fcntl.LOCK_UN)
            return None

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing releases the flock
            self.file = None

    def abandon(self) -> None:
        """Release, and remove the directories acquire() made: a run that never started leaves nothing."""
        if self.file is not None and self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
        self.release()


def _same_file(f: IO[str], path: Path) -> bool:
    """Whether `path` still names the open file `f`."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(f.fileno())
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def remove_stale_temp_files(run_dir: Path) -> list[Path]:
    """Temp files of writes a killed process left (.latest.pt.*.tmp, .buffer_*.h5.*.tmp, .config.json.*.tmp); call
    with the lock held."""
    stale = sorted([*run_dir.glob(".*.tmp"), *(run_dir / "checkpoints").glob(".*.tmp")])
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def check_fresh(run_dir: Path, from_python: bool = False) -> None:
    """A fresh start never takes over a directory that holds a run. from_python: tdmpc.fit's, whose keywords the
    message names."""
    if has_checkpoint(run_dir):  # previous.pt alone too: a resume goes on from it
        how = ("resume=True, or choose another run_dir" if from_python
               else f"--resume {shlex.quote(str(run_dir))} or choose another --run-dir")
        raise RunDirError(f"run directory {run_dir} already holds a run; continue it with {how}")


def set_aside_unfinished(run_dir: Path) -> None:
    """A fresh start in a directory that an earlier session left without a checkpoint (a node
    failure, say): move its files into no-checkpoint-<time>/, so no step appears twice in
    train.csv and nothing is deleted."""
    check_fresh(run_dir)
    names = ("train.csv", "eval.csv", "config.json", "tb", "checkpoints", "videos", "wandb_id")
    leftovers = [p for p in run_dir.glob("*") if p.name in names] if run_dir.is_dir() else []
    if not leftovers:
        return
    stale = run_dir / f"no-checkpoint-{time.strftime('%Y%m%d-%H%M%S')}"
    stale.mkdir()
    for p in leftovers:
        p.rename(stale / p.name)
    print(f"{run_dir} held files of a session that left no checkpoint; moved them to {stale}", file=sys.stderr)


def wandb_run_id(run_dir: Path) -> str:
    """A unique wandb run id for this run directory, made at its first start and kept (resumes, requeues)."""
    path = run_dir / "wandb_id"
    if path.is_file():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    write_text_atomic(path, run_id + "\n")
    return run_id


def saved_step(train: dict) -> int:
    """A checkpoint's step (its counters, `train`): 'step', or 'env_step' as checkpoints named it before."""
    return int(train["step"] if "step" in train else train["env_step"])
