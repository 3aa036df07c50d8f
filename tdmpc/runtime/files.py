"""Safe file writes: atomic replacement, free-space checks, and how sizes are shown to people.

Checkpoints, replay buffers and dataset files are written through atomic_write, so a crash or a kill
leaves the old file or the new one, never half of one. Imports nothing heavy.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from tdmpc.errors import DiskError
from tdmpc.runtime.faults import kill_point

MiB, GiB = 2**20, 2**30


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# What open() would give a new file: mkstemp's temp files are 0600, and a rename keeps that, so every checkpoint,
# CSV and report would be private to its owner (unreadable to a lab's group on a shared cluster). Read once, at
# import, so no thread ever writes while the umask is briefly changed.
NEW_FILE_MODE = 0o666 & ~_umask()


def make_dirs(path: Path) -> Path | None:
    """path.mkdir(parents=True, exist_ok=True), where a file in the way is said as such: mkdir's own word is
    'File exists', naming the file, which reads as if the folder were there. Returns the topmost folder it made
    (None: all were there), for remove_made_dirs to take back when what they were made for is not written."""
    path = Path(path)
    made = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        made = folder
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:
        raise NotADirectoryError(errno.ENOTDIR, "a file where a folder goes", e.filename) from None
    return made


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` when it is not a folder (a file where a folder goes): a write to
    `path` would fail, so a command checks it before its work."""
    blocked = next((p for p in Path(path).parents if p.exists() or p.is_symlink()), None)
    return blocked if blocked is not None and not blocked.is_dir() else None


def read_only_folder(path: Path) -> Path | None:
    """The nearest existing folder above `path` when a write there would fail, or when no one may write to it
    (a folder made read-only on purpose, such as shared checkpoints, is left alone by root too)."""
    folder = next((p for p in Path(path).parents if p.is_dir()), None)
    if folder is None:
        return None
    return folder if not os.access(folder, os.W_OK) or not folder.stat().st_mode & 0o222 else None


def remove_made_dirs(inner: Path, made: Path | None) -> None:
    """The folders make_dirs made, from `inner` up to `made`, while they are empty: a write that failed leaves no
    folder it made behind."""
    if made is None:
        return
    for folder in (inner, *inner.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == made:
            return


def atomic_write(path: Path, write: Callable[[Path], Any], suffix: str = ".tmp", point: str = "write") -> None:
    """Write via `write(tmp_path)` to a temp file in the same directory, fsync, then rename. `suffix` ends the
    temp file's name (a writer that picks the format by extension needs the real one at the end); `point` names
    the tests' kill point between the two (runtime.faults).

    The file gets the mode a plain write would leave (an existing file keeps its own, a new one follows the umask).
    A crash at any point leaves either the old file or the new one, never half of one. A write that
    fails leaves no temp file, and is an OSError naming `path` (torch.save reports a write cut short
    by a full disk as a RuntimeError, h5py names the temp file, a writer through a pipe names none).
    """
    path = Path(path)
    made = make_dirs(path.parent)
    try:
        _write_replacing(path, write, suffix, point)
    except BaseException:
        remove_made_dirs(path.parent, made)
        raise


def _write_replacing(path: Path, write: Callable[[Path], Any], suffix: str, point: str) -> None:
    """atomic_write's work, in a folder that exists."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:  # the mode a plain write would leave: the file's own if it exists, else a new file's
        os.fchmod(fd, path.stat().st_mode & 0o7777 if path.exists() else NEW_FILE_MODE)
    finally:
        os.close(fd)
    try:
        try:
            write(Path(tmp))
        except RuntimeError as e:
            if "unexpected pos" not in str(e) and "write" not in str(e).lower():
                raise
            raise OSError(errno.ENOSPC, f"the write of {path} was cut short (is the disk full?)") from None
        except OSError as e:  # named as the file being written (h5py names the temp file, a pipe to ffmpeg none)
            if e.filename not in (None, tmp) or isinstance(e, DiskError):
                raise
            why = os.strerror(e.errno) if e.errno else (str(e).strip().splitlines() or ["write failed"])[0]
            raise OSError(e.errno, why, str(path)) from None
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        kill_point(point)  # the tests' kill -9 between a complete temp file and its rename
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """path.write_text(text) through atomic_write: a reader or a crash never sees half of it, and a failed write
    keeps what the file held."""
    atomic_write(path, lambda tmp: tmp.write_text(text), point="write-text")  # "write": checkpoints' only


def keep_previous(path: Path, previous: Path) -> None:
    """Make `previous` the file `path` holds now (a hard link, else a copy), atomically, before `path` is replaced:
    a checkpoint damaged later still has its predecessor to fall back to."""
    tmp = previous.with_name(f".{previous.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # a filesystem without hard links
        shutil.copy2(path, tmp)
    os.replace(tmp, previous)


def shipped_dir(name: str) -> Path:
    """A folder the repository keeps at its top level and the wheel ships inside the package (configs, slurm;
    pyproject.toml maps them): tdmpc/<name> in an installed wheel, else <repository>/<name> (an editable
    install or a checkout)."""
    package = Path(__file__).resolve().parents[1]
    inside = package / name
    return inside if inside.is_dir() else package.parent / name


def json_text(obj: Any) -> str:
    """Indented JSON in which NaN and inf, which JSON does not have, are written as null."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), indent=2, allow_nan=False) + "\n"


def available_host_memory() -> int:
    """Host memory available to a new allocation (Linux's MemAvailable), else a conservative 8 GB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30 if os.name != "nt" else 4 << 30


def free_bytes(path: Path) -> int:
    """Free space where `path` is (or would be) written."""
    existing = next(p for p in [path, *path.parents] if p.exists())
    return shutil.disk_usage(existing).free


def write_margin(needed: int) -> int:
    """The space kept free beside a write's estimated size: 1% of it and 1 MB, for filesystem blocks and metadata
    and what the estimate misses. A write that would leave less is refused before it starts (HDF5 and torch.save
    fail badly on a full disk)."""
    return needed // 100 + 1_000_000


def ensure_space(path: Path, needed: int, what: str, freed: int = 0, parts: str = "") -> None:
    """Refuse a write of about `needed` bytes into path's folder that would not leave write_margin() free, in one
    line saying the need, the margin and the free space. `freed`: bytes the write frees before it needs the space
    (a file it replaces first); `parts`: what `needed` is made of, said in brackets."""
    free = free_bytes(path.parent)
    margin = write_margin(needed)
    if free + freed < needed + margin:
        less = f", less {fmt_bytes(freed, decimal=True)} it frees first" if freed else ""
        raise DiskError(f"not enough space to write {what} {path}: it needs about {fmt_bytes(needed, decimal=True)}"
                        f"{f' ({parts})' if parts else ''}{less}, and {fmt_bytes(margin, decimal=True)} more kept free "
                        f"as a margin; {fmt_bytes(free, decimal=True)} are free on {path.parent}")


def tensor_bytes(obj: Any) -> tuple[int, int]:
    """(bytes, count) of the tensors in nested dicts, lists and tuples: what torch.save writes of them."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size(), 1
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    total, count = 0, 0
    for item in items:
        b, c = tensor_bytes(item)
        total, count = total + b, count + c
    return total, count


def saved_size(tensor_bytes_and_count: tuple[int, int]) -> int:
    """About the size of a torch.save file holding these tensors: each tensor's record (name, alignment) and the
    pickled rest (config, counters) besides the data."""
    nbytes, count = tensor_bytes_and_count
    return nbytes + 256 * count + 32_000


def fmt_bytes(n: float | None, decimal: bool = False) -> str:
    """Sizes for people ('?' when unknown): device memory in binary units (GiB from 1 GiB up, else MiB), as
    cards and allocators count it; with decimal=True disk space in decimal ones (B, KB, MB, GB, TB), as disks
    and `df -H` count it."""
    if n is None:
        return "?"
    if decimal:
        for unit in ("B", "KB", "MB", "GB"):
            if abs(n) < 1000:
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1000
        return f"{n:.1f} TB"
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / MiB:.0f} MiB"
