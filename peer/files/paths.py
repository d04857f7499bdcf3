"""Relative paths in a config file are relative to that file's folder, never the working directory.

Resolved for use only: what members compare is the text as written (the run id digests it), so
members whose files sit in different folders, or on different machines, still agree.
"""

from __future__ import annotations

from pathlib import Path

from topology.spec import is_graph_file


def from_folder(base: Path, value: str) -> str:
    """``value`` (a path as written in a file) taken against ``base``; absolute and ``~`` paths stay put."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def topology_spec(base: Path, spec: str) -> str:
    """A graph file's path resolved against ``base``; a generator spec ("ring:16") is kept."""
    return from_folder(base, spec) if is_graph_file(spec) else spec
