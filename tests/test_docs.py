"""The README and docs/ hold together: every relative link resolves, and the README stays short.

A link is ``[text](target)`` outside code; a target with a scheme (``https:``) or
``mailto:`` is not checked. A relative target names a file (from the linking
file's folder) and, after ``#``, a heading of that file, as GitHub makes its
anchors: lower case, punctuation other than ``-`` and ``_`` dropped, spaces made
hyphens, a repeated heading numbered ``-1``, ``-2``. ``.ci/run`` reads the test
command from the README, so its marker and the two commands are checked too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
README_MAX_LINES = 300


def unfenced(text: str) -> str:
    """The text without its fenced code blocks."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def prose(text: str) -> str:
    """The text without code blocks and inline code spans (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in unfenced(path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor}")
    return broken


def test_the_slug_is_githubs() -> None:
    assert slug("Measured: the fault suite's table") == "measured-the-fault-suites-table"
    assert (slug("Status, metrics.jsonl, Prometheus, TensorBoard")
            == "status-metricsjsonl-prometheus-tensorboard")
    assert slug("Differential privacy (central)") == "differential-privacy-central"
    assert slug("The Node (`protocols/node/node.py`)") == "the-node-protocolsnodenodepy"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n[ok](#top) [file](b.md) [gone](c.md) [bad](b.md#nope)\n"
                                   "`[code](x.md)`\n```\n[fenced](y.md)\n```\n[web](https://example.org)\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == ["c.md: no such file", "b.md#nope: no heading #nope"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_docs_table_of_contents_links_every_doc() -> None:
    toc = ROOT / "docs" / "README.md"
    linked = {(toc.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(prose(toc.read_text())) if not SCHEME.match(target)}
    design = ROOT / "docs" / "design" / "README.md"
    linked |= {(design.parent / target.partition("#")[0]).resolve()
               for target in LINK.findall(prose(design.read_text())) if not SCHEME.match(target)}
    unlisted = sorted(str(p.relative_to(ROOT)) for p in DOCS[1:] if p != toc and p.resolve() not in linked)
    assert unlisted == []


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):
        at = lines.index(marker)
        assert lines[at + 1] == "```" and lines[at + 2].startswith("python3 -m venv .venv && ")
    test_command = lines[lines.index("<!-- test-command -->") + 2]
    assert test_command.endswith("&& .venv/bin/python -m pytest")    # what .ci/run runs


def test_every_docs_path_a_module_docstring_names_exists() -> None:
    named = {}
    for root in ("peer", "protocols", "sim", "topology"):
        for module in sorted((ROOT / root).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(module.read_text())) or ""
            for path in re.findall(r"\bdocs/[\w./-]*\.md", docstring):
                named.setdefault(path, str(module.relative_to(ROOT)))
    missing = sorted(f"{module}: {path}" for path, module in named.items() if not (ROOT / path).exists())
    assert missing == []
