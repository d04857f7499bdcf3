"""Where two members' shared settings part: the first key whose values differ, in words.

The run id (protocols.roster.run_id) digests what every member must agree on (``[network]`` and, in
a federation, ``[federation]``); a digest says only *that* two differ. ``flatten`` writes settings
as dotted keys and the words an operator writes (``federation.fraction`` -> ``0.5``), which a
member refused for its run id is sent (messages.SettingsRefusal, meta); ``first_difference`` of two
such tables says where they part: the table, the first differing key in sorted order, and each
side's value, which ``describe`` turns into one line an operator can act on,
``[federation] differs (fraction 0.5 at gw0 != 0.3 here)``. A key one side leaves out is
``unset`` there. ``MismatchAnswers`` says when to send a refused member our settings: at most once
per interval each, so a member that keeps sending is answered, not flooded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNSET = "unset"
SHOWN_CHARS = 80  # of a key or value another member sent, in one line


@dataclass(frozen=True)
class SettingsDifference:
    """``key`` (dotted, inside ``table``) is ``ours`` here and ``theirs`` there, as words."""

    table: str
    key: str
    ours: str
    theirs: str

    def describe(self, them: str = "theirs", us: str = "ours") -> str:
        """``[federation] differs (fraction 0.5 at gw0 != 0.3 here)`` for ``them="at gw0", us="here"``:
        theirs first."""
        return f"[{self.table}] differs ({self.key} {self.theirs} {them} != {self.ours} {us})"


def flatten(settings: Mapping[str, Any]) -> dict[str, str]:
    """Dotted key -> the value in words, nested tables followed down (an empty table: no key)."""
    flat: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for name in value:
                walk(value[name], f"{key}.{name}" if key else str(name))
        else:
            flat[key] = words(value)

    walk(settings, "")
    return flat


def first_difference(ours: Mapping[str, str], theirs: Mapping[str, str]) -> SettingsDifference | None:
    """The first dotted key (sorted) whose words differ between two :func:`flatten` tables (a key
    missing on one side is ``unset`` there), or None when they agree. The first dot ends the table."""
    for key in sorted(set(ours) | set(theirs)):
        mine, other = ours.get(key, UNSET), theirs.get(key, UNSET)
        if mine != other:
            table, _, rest = key.partition(".")
            return SettingsDifference(table=table, key=rest or table, ours=mine, theirs=other)
    return None


def refusal_line(refuser: str, ours: Mapping[str, Any], theirs: Mapping[str, str]) -> str:
    """What a member refused by ``refuser`` says on receiving its settings ``theirs`` (flattened):
    ``gw0 refuses us: [federation] differs (fraction 0.5 at gw0 != 0.3 here)``."""
    found = first_difference(flatten(ours), theirs)
    if found is None:   # equal settings and still refused: the run ids differ for another reason
        return (f"{refuser} refuses us: our run ids differ, but not in the settings it sent (a member of "
                "another version of hivemesh?)")
    shown = SettingsDifference(table=_shown(found.table), key=_shown(found.key), ours=_shown(found.ours),
                               theirs=_shown(found.theirs))
    return f"{refuser} refuses us: {shown.describe(them=f'at {refuser}', us='here')}"


def _shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """A member's words as one console line may carry them: printable characters only (no newline or
    terminal escape reaches an operator's screen from another member), at most ``limit`` of them."""
    printable = "".join(char if char.isprintable() else "?" for char in text)
    return printable if len(printable) <= limit else printable[:limit - 3] + "..."


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


class MismatchAnswers:
    """When to answer a member whose messages we refuse for its settings: at most once per
    ``interval_s`` each (a gateway: its ``round_timeout_s``, the longest a client waits for a round).
    Senders are roster members (the run id is checked after the signature), so the table is
    bounded by the roster."""

    def __init__(self, interval_s: float) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
        self.interval_s = interval_s
        self._answered: dict[str, float] = {}

    def due(self, sender: str, now: float) -> bool:
        """Whether to answer ``sender`` now (and, if so, the interval starts again)."""
        last = self._answered.get(sender)
        if last is not None and now - last < self.interval_s:
            return False
        self._answered[sender] = now
        return True


__all__ = ["MismatchAnswers", "SettingsDifference", "first_difference", "flatten", "refusal_line", "words"]
