"""Numbers as the console, ``hivemesh status`` and the reports print them (``12.3 MB``, ``-``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def format_number(value: Any, spec: str, unit: str = "") -> str:
    """``value`` formatted with ``spec`` and ``unit``; "-" for a missing or non-finite number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec) + unit


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def counts_in_words(counts: Mapping[str, int], empty: str = "none") -> str:
    """Counters as an operator reads them: ``heartbeat 3, client_update 1``, sorted; ``empty`` when
    there are none (never a dict's repr)."""
    return ", ".join(f"{key} {value}" for key, value in sorted(counts.items()) if value) or empty
