"""A member's config file that includes a shared file: ``include = "federation.toml"``.

What every member must agree on (a federation's ``[network]`` and ``[federation]``, which the run
id digests) is written once, in the shared file, and each member's own file names it with the
top-level key ``include``, taken relative to the including file's folder. One level: a shared file
includes nothing. A table belongs to one file: a member's own file that sets any key under a table
the shared file holds is refused, naming that key and the shared file, so that an edit of the
shared file (``hivemesh init --set``, or by hand) changes every member and no member drifts off
on its own. Relative paths inside the shared tables are taken from the shared file's folder.

``read_member(path)`` gives the tables merged, ready for the file's loader; a file without
``include`` reads as it is written.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_type_hints

from peer.files.config import ConfigError, accepted_fields, load, read_toml

INCLUDE_KEY = "include"


@dataclass(frozen=True)
class MemberText:
    """A member's file as read: its own tables and the shared file's, merged."""

    source: Path
    data: dict[str, Any]
    shared: Path | None = None              # the included file; None: nothing included
    shared_tables: tuple[str, ...] = ()     # the tables it gives

    def file_of(self, table: str) -> Path:
        """The file that writes ``table`` (what its errors name)."""
        return self.shared if self.shared is not None and table in self.shared_tables else self.source

    def folder_of(self, table: str) -> Path:
        """The folder that relative paths under ``table`` are taken from."""
        return self.file_of(table).resolve().parent


def read_member(path: str | Path) -> MemberText:
    """``path``'s tables with its ``include``'s merged in; ConfigError naming the file and the key
    for a missing shared file, a nested include, or a key set in both files."""
    path = Path(path)
    own = read_toml(path)
    name = own.pop(INCLUDE_KEY, None)
    if name is None:
        return MemberText(source=path, data=own)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: key '{INCLUDE_KEY}': expected the shared file's path (a string)",
                          key=INCLUDE_KEY)
    shared_path = Path(name) if Path(name).is_absolute() else path.parent / name
    if not shared_path.is_file():
        raise ConfigError(f"{path}: key '{INCLUDE_KEY}': {shared_path}: no such file", key=INCLUDE_KEY)
    shared = read_toml(shared_path)
    if INCLUDE_KEY in shared:
        raise ConfigError(f"{shared_path}: key '{INCLUDE_KEY}': a shared file includes nothing (one level)",
                          key=INCLUDE_KEY)
    for table, values in shared.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{shared_path}: key '{table}': a shared file holds tables only", key=table)
        if table in own:
            key = _first_key(table, own[table])
            raise ConfigError(f"{path}: key '{key}': [{table}] is set by the shared file {shared_path} "
                              f"(every member includes it): change it there, not in one member's file",
                              key=key)
    return MemberText(source=path, data={**own, **shared}, shared=shared_path, shared_tables=tuple(shared))


def check_shared(cls: type, text: MemberText) -> None:
    """Each table the shared file gives, checked against its field of the file's dataclass ``cls``,
    so that an error there names the shared file (not the member that includes it)."""
    if text.shared is None:
        return
    fields, hints = accepted_fields(cls), get_type_hints(cls)
    for table in text.shared_tables:
        if table not in fields:
            raise ConfigError(f"{text.shared}: unknown table [{table}] for {text.source.name} (its tables: "
                              f"{', '.join(sorted(fields))})", key=table)
        load(_table_class(hints[table]), text.data[table], source=str(text.shared), prefix=table)


def _table_class(hint: Any) -> Any:
    """``X`` for a field typed ``X | None`` (an optional table), else the hint itself."""
    if typing.get_origin(hint) is not None:
        options = [option for option in get_args(hint) if option is not type(None)]
        if len(options) == 1:
            return options[0]
    return hint


def _first_key(table: str, values: Any) -> str:
    """``table.key`` for the first key a member's table sets (nested tables followed down)."""
    while isinstance(values, Mapping) and values:
        name = next(iter(values))
        table, values = f"{table}.{name}", values[name]
    return table


__all__ = ["INCLUDE_KEY", "MemberText", "check_shared", "read_member"]
