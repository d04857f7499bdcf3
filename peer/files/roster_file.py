"""Reading and writing the roster TOML file (``[[member]]`` tables).

The roster is rewritten whole and atomically (a temporary file renamed over
the old one), so a crash never leaves half a roster behind.
"""

from __future__ import annotations

import os
from pathlib import Path

from peer.files import tomlout
from peer.files.config import read_toml
from protocols.roster import Roster

HEADER = "# hivemesh roster: the one source of membership (edit with `hivemesh roster`)\n"


def read(path: str | Path, *, missing_ok: bool = False) -> Roster:
    """The roster in ``path``; an empty one if it does not exist and ``missing_ok``."""
    path = Path(path)
    if missing_ok and not path.exists():
        return Roster(())
    return Roster.from_dict(read_toml(path), source=str(path))


def write(path: str | Path, roster: Roster) -> None:
    """Replace ``path`` with ``roster`` atomically."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temporary.write_text(HEADER + tomlout.dumps(roster.to_dict()), encoding="utf-8")
    os.replace(temporary, path)
