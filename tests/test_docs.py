"""The documentation's own checks: relative links point at files (and headings) that exist, and the README stays short.

Fast and self-contained: it reads the markdown files only (no tdmpc import).
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "RESULTS.md"]
    files += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "results").glob("*.md"))
    return [f for f in files if f.is_file()]


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            out.append((n, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
            fence = None
    return out


_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
# Reference definitions: [label]: target
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")


def _links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a markdown file, outside code."""
    found: list[tuple[int, str]] = []
    lines = _prose_lines(path.read_text(encoding="utf-8"))
    # Join the prose so that a link's text may wrap over lines; keep each line's start offset for its number.
    starts, chunks, pos = [], [], 0
    for n, line in lines:
        line = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        starts.append((pos, n))
        chunks.append(line)
        pos += len(line) + 1
        ref = _REF_DEF.match(line)
        if ref:
            found.append((n, ref.group(1)))
    joined = "\n".join(chunks)

    def line_of(offset: int) -> int:
        n = starts[0][1] if starts else 1
        for start, num in starts:
            if start > offset:
                break
            n = num
        return n

    for m in _INLINE_LINK.finditer(joined):
        found.append((line_of(m.start()), m.group(1)))
    return [(n, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for n, t in found]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped but hyphens and spaces, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and underscores, as GitHub does
    return text.replace(" ", "-")


_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 suffixes for repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        if slug in seen:
            seen[slug] += 1
            anchors.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            anchors.add(slug)
    return anchors


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def _broken_links(path: Path) -> list[str]:
    problems = []
    for n, target in _links(path):
        if not target or _is_external(target) or target.startswith("#"):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part.split("?", 1)[0])
        dest = (path.parent / file_part).resolve()
        where = f"{path.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor and dest.is_file() and dest.suffix.lower() == ".md" and unquote(anchor).lower() not in _anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("path", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = _broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_docs_pages_exist() -> None:
    assert (ROOT / "docs" / "README.md").is_file(), "docs/README.md (the index of the pages) is missing"


def test_docs_index_lists_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / unquote(t.partition("#")[0])).resolve() for _, t in _links(index) if not _is_external(t)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link to: {', '.join(missing)}"


def test_readme_is_short() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, at most {README_MAX_LINES}: move detail into docs/"


def test_readme_has_the_test_command() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^\s*python -m pytest\b", text, re.MULTILINE), "README.md lost its `python -m pytest` line (CI runs it)"


def test_github_slug() -> None:
    assert github_slug("Multi-task: one model for three tasks, online") == "multi-task-one-model-for-three-tasks-online"
    assert github_slug("Data-parallel training (several GPUs, several nodes)") == "data-parallel-training-several-gpus-several-nodes"
    assert github_slug("Second run: a Q scale per task (`--task-scales`); why") == "second-run-a-q-scale-per-task---task-scales-why"
    assert github_slug("Weights & Biases") == "weights--biases"
    assert github_slug("Mixed-precision updates: 1.29x faster") == "mixed-precision-updates-129x-faster"
