"""Exit codes and one-line errors shared by the command-line entry points.

0 finished, 1 a failed write (disk full or read-only: one line) or anything unexpected (with its
traceback), 2 bad input (config, task, checkpoint, dataset, device, a damaged run file, a run
directory in use), 3 stopped by a signal after writing a checkpoint (requeue me).
"""

from __future__ import annotations

import sys
from typing import Callable

from tdmpc.buffer import BufferFileError
from tdmpc.checkpoint import CheckpointError
from tdmpc.config import ConfigError
from tdmpc.dataset import DatasetError
from tdmpc.device import DeviceError
from tdmpc.run_dir import DiskError, RunDirError
from tdmpc.task_sets import TaskError

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REQUEUE = 0, 1, 2, 3


class BadInput(ValueError):
    """Any other input the user can fix; one line."""


USER_ERRORS = (ConfigError, CheckpointError, DeviceError, TaskError, DatasetError, BufferFileError, RunDirError, BadInput)


def run_cli(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DiskError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
