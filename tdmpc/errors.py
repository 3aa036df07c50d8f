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
import io
import os
import re
import signal
import sys
import threading
from typing import Callable, Iterator, TypeVar

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
        return _stdout_closed()
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


@contextlib.contextmanager
def one_line_parse_errors(prog: str) -> Iterator[None]:
    """Around tyro.cli: its boxed parse error (exit 2: a bad value, an unknown flag, a missing subcommand) as
    one 'error:' line that points to --help; anything else it prints passes through unchanged."""
    _join_field_docstrings()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except SystemExit as e:
        text, captured = captured.getvalue(), io.StringIO()
        if e.code == EXIT_BAD_INPUT and text.strip() and not text.lstrip().startswith("error:"):
            text = f"error: {_condensed(text)} (see {prog} --help)\n"
        sys.stderr.write(text)
        raise
    except BrokenPipeError:  # --help | head
        raise SystemExit(_stdout_closed()) from None
    finally:
        with contextlib.suppress(BrokenPipeError):  # 2>&1 | head: stderr is the closed pipe too
            sys.stderr.write(captured.getvalue())


def _join_field_docstrings() -> None:
    """--help's text of a field whose docstring spans lines reads as one paragraph. Tyro removes a docstring's
    single line breaks before its indentation, so it keeps a break before every indented line (a field
    docstring's every line but the first) and wraps around it: "several, separated" / "by commas". The
    docstrings tyro reads are given with their lines joined (blank-line paragraphs and "- " items kept); a tyro
    without this function is left as it is."""
    import inspect

    import tyro._docstrings as docstrings

    parse = getattr(docstrings, "parse_docstring_from_object", None)
    if parse is None or getattr(parse, "_tdmpc_joined", False):
        return

    def joined(obj: object) -> dict[str, str]:
        return {name: re.sub(r"(?<!\n)\n(?![\n-])", " ", inspect.cleandoc(text)) for name, text in parse(obj).items()}

    joined._tdmpc_joined = True  # type: ignore[attr-defined]
    docstrings.parse_docstring_from_object = joined  # type: ignore[assignment]


def _stdout_closed() -> int:
    """The reader of stdout left (| head): stop quietly, without the flush at exit failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE_CLOSED


def _condensed(box: str) -> str:
    """A tyro error box in one line: its title, then each section's text, without the help text it repeats (a
    suggested flag's help, indented under it)."""
    inner = [re.sub(r"^\s*[│|]", "", row).rstrip().rstrip("│|") for row in box.strip("\n").splitlines()]
    indents = [len(row) - len(row.lstrip()) for row in inner]  # boxed (rich or ASCII) or plain, the same steps
    base = min((n for row, n in zip(inner[1:], indents[1:]) if re.search(r"\w", row)), default=0)
    rows = [row.strip() for i, (row, n) in enumerate(zip(inner, indents)) if i == 0 or n < base + 8]
    title = rows[0].strip("╭╮─-+ ") if rows else "error"
    sections: list[list[str]] = [[]]
    for row in rows[1:-1] if rows and set(rows[-1]) <= set("╰╯─-+ ") else rows[1:]:
        if set(row) <= set("─-+ "):
            sections.append([])
        elif row:
            sections[-1].append(row)
    kept = [s[0] + " " + " or ".join(s[1:]) if s[0].endswith("you meant:") else " ".join(s)
            for s in sections if s and not s[0].startswith(("For full helptext", "Argument helptext"))]
    text = re.sub(r"\s+", " ", "; ".join(kept))
    # Python's own words for a bad number, said as the flag's
    text = re.sub(r"Error parsing (--[\w-]+): invalid literal for int\(\) with base 10: ('[^']*')",
                  r"\1 takes an integer, not \2", text)
    text = re.sub(r"Error parsing (--[\w-]+): could not convert string to float: ('[^']*')",
                  r"\1 takes a number, not \2", text)
    text = re.sub(r"invalid choice ('[^']*') for argument '(--[\w-]+)'\. Expected one of (\([^)]*\))\s*\.?",
                  r"\2 takes one of \3, not \1", text)
    if re.match(r"--[\w-]+ takes ", text):  # said as the flag's: tyro's title ("Value error") adds nothing
        title = ""
    text = text if text.startswith(title) else f"{title}: {text}"
    return re.sub(r"\bUnrecognized options: ([^;]*)", lambda m: _unknown_flags(m.group(1)), text)


def _unknown_flags(listed: str) -> str:
    """Tyro's list of what it could not place, without the values of unknown flags (`--stepz 10` lists `10`
    too): an unknown flag is named alone, a stray word that follows no flag is kept."""
    words = listed.strip().split(", ")
    kept = [w for i, w in enumerate(words)
            if w.startswith("-") or i == 0 or not words[i - 1].startswith("--") or "=" in words[i - 1]]
    return f"Unrecognized option{'s' if len(kept) > 1 else ''}: {', '.join(kept)}"


T = TypeVar("T")


def parse_args(cls: type[T], argv: list[str] | None, prog: str, description: str) -> T:
    """A command's flags (tyro), a parse error as one line (one_line_parse_errors)."""
    import tyro

    with one_line_parse_errors(prog):
        return tyro.cli(cls, args=optional_bool_flags(argv, cls), prog=prog, description=description)


def flag_names(argv: list[str]) -> list[str]:
    """The flags of an argv as tyro reads them (--run_dir is --run-dir; --flag=value), for commands that check
    another command's flags (tdmpc.reproduce's and slurm/'s for tdmpc.train)."""
    return [a.split("=", 1)[0].replace("_", "-") for a in argv if a.startswith("--")]


def optional_bool_flags(argv: list[str] | None, *classes: type) -> list[str]:
    """argv with `--name` and `--no-name` of the classes' Optional[bool] fields (None: decided later) written as
    `--name True` and `--name False`: tyro gives such a field only the value form, `--name {None,True,False}`, where
    a bool field gets the flag pair users type."""
    import dataclasses
    import typing

    names = {f.name.replace("_", "-") for c in classes for f in dataclasses.fields(c)
             if typing.get_type_hints(c)[f.name] == typing.Optional[bool]}
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        given_value = i + 1 < len(args) and args[i + 1] in ("None", "True", "False")
        if arg.startswith("--no-") and arg[5:] in names:
            out += [f"--{arg[5:]}", "False"]
        elif arg.startswith("--") and arg[2:] in names and not given_value:
            out += [arg, "True"]
        else:
            out.append(arg)
    return out


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
