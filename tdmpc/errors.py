"""Exit codes, and every error a user can fix: one line, exit code 2. Imports nothing of tdmpc.

0 finished, 1 a failed write (disk full or read-only: one line) or anything unexpected (with its
traceback), 2 bad input (config, task, checkpoint, dataset, device, a damaged run file, a run
directory in use), 3 stopped by a signal after writing a checkpoint (requeue me), 130 interrupted at once (a
Ctrl-C before training's loop started, or a second one while the first one's checkpoint is written): one line, no
traceback; 141 the reader of stdout left (| head), quietly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from typing import Callable, Iterator

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REQUEUE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C that stopped a command at once (128 + SIGINT, as shells report it)
EXIT_PIPE_CLOSED = 141  # the reader of stdout left (| head): 128 + SIGPIPE, as a tool killed by it reports
# what stops a run, a dataset export or a grid cleanly (USR1: Slurm's warning before its time limit)
STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, s))


class ConfigError(ValueError):
    """Bad configuration; the message is one line and names the field."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line."""


class DeviceError(ValueError):
    """A device that does not exist here, or a precision it cannot run; one line."""


class TaskError(ValueError):
    """A task that cannot be used here; the message is one line."""


class DatasetError(ValueError):
    """A dataset file that cannot be used; one line naming the file and what is wrong."""


class ActionRangeError(DatasetError):
    """A dataset whose actions leave [-1, 1], the agent's range: training refuses it, `dataset info` warns."""


class BufferFileError(ValueError):
    """A saved replay buffer that cannot be restored; the message is one line naming the file."""


class RunDirError(ValueError):
    """The run directory cannot be used as asked (held by another process, unwritable); one line."""


class NonFiniteData(ValueError):
    """An env returned NaN or inf; the message names the env, the step and the field. (Training writes a
    checkpoint first and exits 1: see tdmpc.training.trainer.)"""


class BadInput(ValueError):
    """Any other input the user can fix; one line."""


class RunFailed(RuntimeError):
    """tdmpc.fit's run stopped on an error it reported (out of memory, NaN from an env, a failed write) after
    keeping its last checkpoint: where the command exits 1."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a write that failed for want of space: not the user's input, exit 1


class DiskError(OSError):
    """A write that failed or would fail for lack of space or permission; one line with the free space."""


class Interrupted(BaseException):
    """A signal stopped a command at once (a second Ctrl-C, or a stop signal before a training run's loop); the
    message is one line saying what was kept. run_cli prints it and exits with `code` (130 for Ctrl-C, else 128 + the
    signal, as a shell reports a process the signal ended). Not a KeyboardInterrupt: nothing on the way out mistakes
    it for a first Ctrl-C."""

    def __init__(self, message: str, code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.code = code


USER_ERRORS = (ConfigError, CheckpointError, DeviceError, TaskError, DatasetError, BufferFileError, RunDirError,
               NonFiniteData, BadInput)


_commands = 0  # run_cli bodies running in this process


def in_command() -> bool:
    """Whether a command's body (run_cli) runs this process, which exits when the body returns: a training run keeps
    its stop-signal handlers from the moment it is built to that exit (tdmpc.training.trainer), where a run driven
    from Python (tdmpc.fit) has them only while its loop runs."""
    return _commands > 0


def run_cli(fn: Callable[[], int]) -> int:
    """Run a command's body: a user error (or a path that cannot be used) is one line and exit 2, a failed write
    one line and exit 1, a Ctrl-C one line and exit 130."""
    global _commands
    _commands += 1
    try:
        return fn()
    except BrokenPipeError:
        return stdout_closed()
    except Interrupted as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DiskError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:  # a path given that cannot be used as one (a file where a folder goes, no permission),
        disk = e.errno in DISK_FULL  # or a write the disk refused
        if e.filename is None and not disk:
            raise
        print(f"error: {e.filename if e.filename else 'a write failed'}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR if disk else EXIT_BAD_INPUT
    finally:
        _commands -= 1


def stdout_closed() -> int:
    """The reader of stdout left (| head): stop quietly, without the flush at exit failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE_CLOSED


@contextlib.contextmanager
def stop_signals() -> Iterator[list[str]]:
    """SIGTERM, SIGINT or SIGUSR1 (a scheduler's) recorded, by name, in the list it gives, for the work to stop at its
    next safe point, as training does; a second Ctrl-C stops at once (KeyboardInterrupt)."""
    stopped: list[str] = []

    def on_signal(signum: int, frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    main_thread = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS} if main_thread else {}
    try:
        yield stopped
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
