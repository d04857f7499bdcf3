"""Where two members' shared settings part: the first key whose values differ, in words.

The run id (protocols.roster.run_id) digests what every member must agree on (``[network]`` and, in
a federation, ``[federation]``); a digest says only *that* two differ. Given both sides' settings,
``first_difference`` says where: the table, the first differing key (tables walked in sorted key
order, nested tables followed down) and each side's value, which ``describe`` turns into one line an
operator can act on, ``[federation] differs (fraction 0.5 != 0.3)``. A key one side leaves out is
"unset" there (its default applies, so the two may still run alike: the line says which is which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNSET = "unset"


@dataclass(frozen=True)
class SettingsDifference:
    """``key`` (dotted, inside ``table``) is ``ours`` here and ``theirs`` there, as words."""

    table: str
    key: str
    ours: str
    theirs: str

    def describe(self) -> str:
        """``[federation] differs (fraction 0.5 != 0.3)``: ours first."""
        return f"[{self.table}] differs ({self.key} {self.ours} != {self.theirs})"


def first_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> SettingsDifference | None:
    """The first key (sorted, depth first) whose value differs between the two settings, or None
    when they are equal. The top level names the tables (``network``, ``federation``)."""
    for table in sorted(set(ours) | set(theirs)):
        found = _walk(ours.get(table), theirs.get(table), "")
        if found is not None:
            key, mine, other = found
            return SettingsDifference(table=table, key=key or "(the whole table)", ours=mine, theirs=other)
    return None


def _walk(mine: Any, other: Any, key: str) -> tuple[str, str, str] | None:
    if isinstance(mine, Mapping) and isinstance(other, Mapping):
        for name in sorted(set(mine) | set(other), key=str):
            found = _walk(mine.get(name), other.get(name), f"{key}.{name}" if key else str(name))
            if found is not None:
                return found
        return None
    if _same(mine, other):
        return None
    return key, words(mine), words(other)


def _same(mine: Any, other: Any) -> bool:
    if isinstance(mine, list | tuple) and isinstance(other, list | tuple):
        return len(mine) == len(other) and all(_same(a, b) for a, b in zip(mine, other, strict=True))
    if _is_number(mine) and _is_number(other):
        return float(mine) == float(other)      # the run id digests 1 and 1.0 alike
    return type(mine) is type(other) and bool(mine == other)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def words(value: Any) -> str:
    """A setting as an operator writes it: ``0.5``, ``"ring"``, ``true``, ``[1, 2]``; ``unset``."""
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(words(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "a table"
    return str(value)


__all__ = ["SettingsDifference", "first_difference", "words"]
