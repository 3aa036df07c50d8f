"""Command-line flags with tyro, each command's the same way: a parse error is one 'error:' line pointing to
--help (exit 2), Optional[bool] fields take --name / --no-name, and --help reads field docstrings as paragraphs."""

from __future__ import annotations

import contextlib
import decimal
import io
import os
import re
import shlex
import sys
from typing import Iterator, TypeVar

from tdmpc.errors import EXIT_BAD_INPUT, stdout_closed


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
        raise SystemExit(stdout_closed()) from None
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
        return tyro.cli(cls, args=normalized_argv(argv, cls), prog=prog, description=description)


def flag_names(argv: list[str]) -> list[str]:
    """The flags of an argv as tyro reads them (--run_dir is --run-dir; --flag=value), for commands that check
    another command's flags (tdmpc.reproduce's and slurm/'s for tdmpc.train)."""
    return [a.split("=", 1)[0].replace("_", "-") for a in argv if a.startswith("--")]


def normalized_argv(argv: list[str] | None, *classes: type) -> list[str]:
    """argv as tyro takes it for the classes' fields, written the ways users type them: `--name` and `--no-name` of
    an Optional[bool] field (None: decided later) as `--name True` / `--name False` (tyro gives such a field only
    the value form, where a bool field gets the flag pair), and an integer field's whole number in exponent form
    (`--steps 1e6`, as papers and the reference's configs write step counts) as its digits."""
    import dataclasses
    import typing

    hints = {f.name.replace("_", "-"): types[f.name]
             for c in classes for types in [typing.get_type_hints(c)] for f in dataclasses.fields(c)}
    names = {n for n, t in hints.items() if t == typing.Optional[bool]}
    integers = {n for n, t in hints.items() if t in (int, typing.Optional[int])}
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        given_value = i + 1 < len(args) and args[i + 1] in ("None", "True", "False")
        flag, eq, value = arg.partition("=")
        if arg.startswith("--no-") and arg[5:] in names:
            out += [f"--{arg[5:]}", "False"]
        elif arg.startswith("--") and arg[2:] in names and not given_value:
            out += [arg, "True"]
        elif eq and flag.startswith("--") and flag[2:].replace("_", "-") in integers:
            out.append(f"{flag}={_whole(value)}")
        elif i > 0 and args[i - 1].startswith("--") and args[i - 1][2:].replace("_", "-") in integers:
            out.append(_whole(arg))
        else:
            out.append(arg)
    return out


def _whole(value: str) -> str:
    """'1e6' -> '1000000'; anything else (a plain integer, a typo) as it is, for tyro to take or refuse."""
    if not re.fullmatch(r"[+-]?\d+(\.\d+)?[eE][+]?\d{1,2}", value):
        return value
    number = decimal.Decimal(value)
    return str(int(number)) if number == number.to_integral_value() else value


def named(field: str, value: object = None, from_python: bool = False) -> str:
    """A setting as its user gives it: tdmpc.fit's keyword (`field=value`; the name alone for None) or the command
    line's flag (`--field value`, shell-quoted; a switch for True and False, the name alone for None)."""
    if from_python:
        shown = str(value) if isinstance(value, os.PathLike) else value
        return field if value is None else f"{field}={shown!r}"
    flag = field.replace("_", "-")
    if value is None or value is True:
        return f"--{flag}"
    return f"--no-{flag}" if value is False else f"--{flag} {shlex.quote(str(value))}"
