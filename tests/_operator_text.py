"""What an operator reads is words (issue 30 acceptance b): no Python repr in a console line or a
status text.

:func:`repr_leaks` finds, line by line, the marks a repr leaves: ``None``, a brace (a dict, a set,
a Counter), and a quote that opens or closes a list or tuple of strings (``['a', 'b']``,
``('a',)``). A single quoted name (``key 'edge.curve'``) is the house style for naming a key, so
it passes. :func:`run_texts` gathers what the process tests' peers said: each ``peer.log`` (a
process's stdout and stderr: its console) and ``hivemesh status``'s text of each ``status.json``,
one peer in detail and each network's table. tests/conftest.py applies it after every
``processes`` test to the files written since the last check.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from pathlib import Path

LEAKS = ((re.compile(r"\bNone\b"), "None"), (re.compile(r"[{}]"), "a brace"),
         (re.compile(r"[\[(]'|'[\])]|', '"), "a quoted list or tuple"))
TEXT_FILES = ("peer.log", "status.json")


def repr_leaks(text: str) -> list[str]:
    """The lines of ``text`` that carry a repr's mark, each with what was found."""
    return [f"{what}: {line}" for line in text.splitlines() for pattern, what in LEAKS
            if pattern.search(line)]


def assert_operator_text(text: str, *, where: str) -> None:
    leaks = repr_leaks(text)
    assert not leaks, f"{where}: a Python repr where an operator reads words:\n" + "\n".join(leaks[:20])


def status_texts(statuses: Iterable[dict[str, object]]) -> str:
    """``hivemesh status``'s text of each status, in detail and as one table, as the command shows
    it while the process runs and after it ended."""
    from peer.cli.status import render, render_table

    shown = []
    for found in statuses:
        age_s = time.time() - float(str(found.get("updated_at", 0.0)))
        shown += [{"age_s": age_s, **found, "running": running} for running in (True, False)]
    return "\n".join([*(render(s) for s in shown), render_table(shown) if shown else ""])


def run_texts(paths: Iterable[Path]) -> dict[str, str]:
    """What an operator reads of these ``peer.log`` and ``status.json`` files, by where it comes from:
    each log as it is, and the status text of the statuses of each network (one ``data`` folder)."""
    texts: dict[str, str] = {}
    networks: dict[Path, list[dict[str, object]]] = {}
    for path in paths:
        if path.name == "peer.log":
            texts[str(path)] = path.read_text(errors="replace")
            continue
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue        # being replaced, or a test's broken file: not what an operator reads
        if isinstance(found, dict):
            networks.setdefault(path.parent.parent, []).append(found)
    for folder, statuses in networks.items():
        texts[f"hivemesh status of {folder}"] = status_texts(statuses)
    return texts


class Checked:
    """The text files of peer processes (a status.json beside a peer.log: peer/runtime/launch.py)
    under a folder that changed since they were last checked."""

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[int, int]] = {}

    def changed(self, root: Path) -> list[Path]:
        found = []
        for name in TEXT_FILES:
            for path in root.rglob(name):
                try:
                    stat = path.stat()
                except OSError:
                    continue
                mark = (stat.st_mtime_ns, stat.st_size)
                written_by_a_process = (path.parent / "peer.log").exists()    # not a test's own file
                if written_by_a_process and self._seen.get(path) != mark:
                    self._seen[path] = mark
                    found.append(path)
        return found


CHECKED = Checked()     # one per test session (tests/conftest.py)
