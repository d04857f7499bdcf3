"""Whether a member can go on, from its neighbours' presence (issue 11, item 6a): the table of
protocols/node/liveness.py, enumerated, and the lines a member says."""

from __future__ import annotations

import pytest

from protocols.node import Presence, Verdict, reason, verdict, waiting_line

UP, DOWN, DONE, NEVER = Presence.UP, Presence.DOWN, Presence.FINISHED, Presence.NEVER_HEARD
TABLE = [
    # (neighbours, resumed, start wait over) -> verdict
    ({}, True, True, Verdict.GO_ON),
    ({"a": UP, "b": DONE}, True, True, Verdict.GO_ON),
    ({"a": UP, "b": NEVER}, True, True, Verdict.GO_ON),
    ({"a": DONE, "b": DONE}, False, True, Verdict.NEIGHBOURS_FINISHED),
    ({"a": DONE, "b": DOWN}, False, False, Verdict.NEIGHBOURS_FINISHED),
    ({"a": DONE, "b": NEVER}, True, True, Verdict.NEIGHBOURS_FINISHED),
    ({"a": NEVER, "b": NEVER}, True, True, Verdict.NOBODY_RUNNING),
    ({"a": NEVER, "b": NEVER}, True, False, Verdict.GO_ON),   # still waiting at start-up
    ({"a": NEVER, "b": NEVER}, False, True, Verdict.GO_ON),   # a fresh start: they may come
    ({"a": DOWN, "b": DOWN}, True, True, Verdict.GO_ON),      # a cut heals: wait (rounds.py)
    ({"a": DOWN, "b": NEVER}, True, True, Verdict.GO_ON),
]


@pytest.mark.parametrize(("presence", "resumed", "over", "expected"), TABLE)
def test_the_liveness_table(presence: dict[str, Presence], resumed: bool, over: bool,
                            expected: Verdict) -> None:
    assert verdict(presence, resumed=resumed, start_wait_over=over) is expected


def test_the_reason_names_every_neighbour_by_what_became_of_it() -> None:
    line = reason({"p03": NEVER, "p01": NEVER}, Verdict.NOBODY_RUNNING)
    assert "p01, p03 never heard" in line and "\n" not in line
    line = reason({"p03": DOWN, "p01": DONE}, Verdict.NEIGHBOURS_FINISHED)
    assert "p01 finished" in line and "p03 down" in line
    assert reason({"p01": UP}, Verdict.GO_ON) == ""


def test_the_waiting_line_names_whom_a_member_waits_for() -> None:
    assert waiting_line({"p03": NEVER, "p01": DOWN, "p02": UP}) == "waiting for p01, p03 (1/3 up)"
    assert waiting_line({"p01": UP}) == ""
