"""Every `python -m tdmpc.train ...` command the README and docs/*.md show runs, with --dry-run appended: the
config resolves for the task and the memory estimate prints, exit 0. So no documented command goes stale.

A command that needs what no machine has before the user makes it (a run directory to resume, a checkpoint, a
dataset file, a package of an extra not installed) is skipped with the reason listed here, never silently.
The runs are in-process (tdmpc.train.main), in a temporary directory: a dry run writes nothing.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from helpers import import_or_skip

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python -m tdmpc.train"

# Commands that need files the docs assume the user has: skipped, with this reason (the first pattern found).
NEEDS_FILES = {
    r"--resume\b": "continues an existing run directory (the docs' runs/... is an example): there is none here",
    r"--init-from\b": "starts from a checkpoint file the user has (dog-run-1.pt, mt30-5.pt): there is none here",
    r"--dataset\b": "trains on dataset files the user has (finger.h5, more.h5): there are none here",
}
# Commands that need a package of an extra: skipped, with this reason, where it is not installed.
NEEDS_PACKAGE = {
    r"LunarLander": ("Box2D", 'LunarLander-v3 needs box2d (pip install "tdmpc[box2d]"), not installed here'),
    r"phys2d/": ("jax", 'gymnasium\'s JAX envs need jax (pip install -e ".[jax]"), not installed here'),
}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)((?:(?!\1).)+?)\1", re.DOTALL)


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every `python -m tdmpc.train` command in a markdown file: in fenced code blocks (a
    trailing `# comment` dropped, backslash continuations joined) and in inline code spans, which may wrap."""
    found: list[tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line, n = lines[i], i + 1
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None
        elif fence is not None:
            if COMMAND in line:
                cmd = line[line.index(COMMAND):]
                while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                found.append((n, re.sub(r"\s+#.*$", "", cmd).strip()))
        else:
            prose.append((n, line))
        i += 1
    # Inline code spans, paragraph by paragraph (a span may wrap onto the next line).
    paragraph: list[tuple[int, str]] = []
    for n, line in [*prose, (0, "")]:
        if line.strip():
            paragraph.append((n, line))
            continue
        text, starts = "", []
        for pn, pline in paragraph:
            starts.append((len(text), pn))
            text += pline.strip() + " "
        for m in _CODE_SPAN.finditer(text):
            span = " ".join(m.group(2).split())
            if COMMAND in span:
                where = max(pn for start, pn in starts if start <= m.start(2))
                found.append((where, span[span.index(COMMAND):]))
        paragraph = []
    return sorted(found)


def all_commands() -> dict[str, list[str]]:
    """Each distinct command -> where the docs show it (file:line)."""
    out: dict[str, list[str]] = {}
    for path in _doc_files():
        for n, cmd in doc_commands(path):
            out.setdefault(cmd, []).append(f"{path.relative_to(ROOT)}:{n}")
    return out


COMMANDS = all_commands()


def skip_reason(cmd: str) -> str | None:
    for pattern, reason in NEEDS_FILES.items():
        if re.search(pattern, cmd):
            return reason
    for pattern, (module, reason) in NEEDS_PACKAGE.items():
        if re.search(pattern, cmd) and importlib.util.find_spec(module) is None:
            return reason
    return None


def test_the_commands_are_found():
    """The extraction finds what it must (a fenced command, a wrapped inline one), and every listed reason to skip
    still applies to a command (a stale entry is removed)."""
    assert len(COMMANDS) >= 15, COMMANDS
    wrapped = ("python -m tdmpc.train --cfg a4000.json --task phys2d/Pendulum-v0 --num-envs 4096 --dry-run "
               "--gpu-mem 16GiB")
    assert any(w.startswith("docs/gpu-simulators.md:") for w in COMMANDS.get(wrapped, [])), sorted(COMMANDS)
    assert "docs/memory.md:8" in COMMANDS["python -m tdmpc.train --cfg gpu-24gb.json --gpu-mem 2GB --fit-memory --dry-run"]
    for pattern in [*NEEDS_FILES, *NEEDS_PACKAGE]:
        assert any(re.search(pattern, cmd) for cmd in COMMANDS), f"no documented command matches {pattern!r}"


@pytest.mark.parametrize("cmd", sorted(COMMANDS), ids=lambda c: COMMANDS[c][0])
def test_documented_command_runs_dry(cmd, tmp_path, monkeypatch, capsys):
    reason = skip_reason(cmd)
    if reason:
        pytest.skip(f"{reason} ({', '.join(COMMANDS[cmd])})")
    import_or_skip("dm_control", "the docs' commands train DMC tasks (pip install -e '.[dmc]')")
    from tdmpc.cli.train import main

    monkeypatch.chdir(tmp_path)  # a dry run writes nothing; were it to, not into the checkout
    argv = cmd[len(COMMAND):].split()
    argv += [] if "--dry-run" in argv else ["--dry-run"]
    try:
        code = main(argv)
    except SystemExit as e:  # --help
        code = e.code
    out, err = capsys.readouterr()
    where = ", ".join(COMMANDS[cmd])
    assert code == 0, f"{where}: `{cmd}` (with --dry-run) exits {code}:\n{err[-2000:]}"
    if "--help" in argv:
        assert "--dry-run" in out, f"{where}: --help does not list the flags"
    else:
        assert "verdict:" in out and "Traceback" not in err, f"{where}: no memory estimate:\n{out}\n{err[-2000:]}"
    assert not list(tmp_path.iterdir()), f"{where}: the dry run wrote {list(tmp_path.iterdir())}"
