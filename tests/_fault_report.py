"""The multi-host fault suite's report (issue 16, item 6): one row per fault kind, printed at the end
of the session and kept in docs/reliability.md.

A test calls :func:`record` once per fault kind it injected; ``conftest.py``
prints every recorded row as one table after the run (``pytest -s`` not
needed: it is pytest's terminal summary). Rows live in this process only: the
suite runs in one pytest process.

Columns (units in the names): how many of the fault were injected and how
many the network survived (every honest process alive, its invariants held);
the steps each restarted peer lost against the step the killed process had
reached; the measured time to re-converge after the fault ended, beside the
simulator's prediction for the same schedule where one was made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FaultRow:
    fault: str                                  # what was done, e.g. "kill -9 + restart"
    injected: int
    survived: int
    steps_lost: tuple[int, ...] = ()            # per restart; empty where nothing restarted
    recovery_s: float | None = None             # measured: fault over -> re-converged
    predicted_s: float | None = None            # the simulator's, same schedule
    note: str = ""


@dataclass
class _Report:
    rows: list[FaultRow] = field(default_factory=list)


REPORT = _Report()


def record(fault: str, *, injected: int, survived: int, steps_lost: Sequence[int] = (),
           recovery_s: float | None = None, predicted_s: float | None = None, note: str = "") -> FaultRow:
    """Add one row to the session's table; returns it (tests may print it too)."""
    row = FaultRow(fault, injected, survived, tuple(steps_lost), recovery_s, predicted_s, note)
    REPORT.rows.append(row)
    return row


def table(rows: Sequence[FaultRow]) -> str:
    """A Markdown table (docs/reliability.md keeps one as printed)."""
    def seconds(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    def cell(text: str) -> str:
        return text.replace("|", "\\|")   # a pipe in a cell would split it

    lines = ["| fault | injected | survived | steps lost per restart | recovery (s) | simulator (s) | note |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lost = ", ".join(str(n) for n in row.steps_lost) if row.steps_lost else "–"
        lines.append(f"| {cell(row.fault)} | {row.injected} | {row.survived} | {lost} "
                     f"| {seconds(row.recovery_s)} | {seconds(row.predicted_s)} | {cell(row.note)} |")
    return "\n".join(lines)
