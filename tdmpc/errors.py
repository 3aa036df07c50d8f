"""Exit codes, and every error a user can fix: one line, exit code 2. Imports nothing of tdmpc.

0 finished, 1 a failed write (disk full or read-only: one line) or anything unexpected (with its
traceback), 2 bad input (config, task, checkpoint, dataset, device, a damaged run file, a run
directory in use), 3 stopped by a signal after writing a checkpoint (requeue me), 130 interrupted at once (a
Ctrl-C outside training's loop, or a second one inside it): one line, no traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REQUEUE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C that stopped a command at once (128 + SIGINT, as shells report it)


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


class DiskError(OSError):
    """A write that failed or would fail for lack of space or permission; one line with the free space."""


USER_ERRORS = (ConfigError, CheckpointError, DeviceError, TaskError, DatasetError, BufferFileError, RunDirError,
               NonFiniteData, BadInput)


def run_cli(fn: Callable[[], int]) -> int:
    """Run a command's body: a user error is one line and exit 2, a failed write one line and exit 1, a Ctrl-C
    one line and exit 130."""
    try:
        return fn()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DiskError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
