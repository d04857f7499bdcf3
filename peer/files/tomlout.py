"""A small TOML writer for the files hivemesh generates (configs, rosters).

Only what those files hold: strings, booleans, integers, floats, lists of
scalars, nested tables and lists of tables. Tables are written after the
scalars of their parent, as TOML requires.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML text."""
    lines: list[str] = []
    _table(data, (), lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table_list(value: Any) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > 0
            and all(isinstance(item, Mapping) for item in value))


def _table(data: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    for key, value in data.items():
        if not isinstance(value, Mapping) and not _is_table_list(value):
            lines.append(f"{_key(key)} = {scalar(value)}")
    for key, value in data.items():
        if isinstance(value, Mapping):
            lines.append("")
            lines.append("[" + ".".join(_key(k) for k in (*path, key)) + "]")
            _table(value, (*path, key), lines)
        elif _is_table_list(value):
            for item in value:
                lines.append("")
                lines.append("[[" + ".".join(_key(k) for k in (*path, key)) + "]]")
                _table(item, (*path, key), lines)


def _key(key: str) -> str:
    if key and all(c.isalnum() or c in "_-" for c in key):
        return key
    return json.dumps(key)


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)   # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return "[" + ", ".join(scalar(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
