"""The catch-up bound's pure rules (protocols/gossip/catchup.py): confirmations, the confirmed round,
and one sender's reach."""

from __future__ import annotations

import pytest

from protocols.gossip.catchup import ROUNDS_TIMED, Reach, confirmations, confirmed_round


@pytest.mark.parametrize(("in_degree", "byzantine", "needed"), [
    (1, -1, 0), (2, -1, 2), (3, -1, 2), (5, -1, 2),    # auto: f = 1, wherever two in-neighbours can claim
    (1, 0, 1), (5, 0, 1),                              # f = 0: one claim is trusted
    (2, 2, 0), (3, 2, 3), (7, 3, 4),                   # in-degree >= f + 1, else none
])
def test_confirmations_need_f_plus_one_distinct_in_neighbours(in_degree: int, byzantine: int,
                                                              needed: int) -> None:
    assert confirmations(in_degree, byzantine) == needed


def test_the_confirmed_round_is_the_f_plus_first_highest_claim() -> None:
    claims = {"a": 2**63 - 1, "b": 40, "c": 35}
    assert confirmed_round(claims, 2) == 40      # one liar's round is never the answer
    assert confirmed_round(claims, 3) == 35
    assert confirmed_round(claims, 4) is None and confirmed_round(claims, 0) is None


def test_a_senders_reach_is_its_believed_position_plus_our_own_training_and_waits_since() -> None:
    reach = Reach()
    reach.started(10)
    assert reach.reach("j") == 10.0                # nothing trained or waited since Start
    reach.advanced(0, 60.0)                        # a wait is worth nothing until a rate is measured,
    assert reach.reach("j") == 10.0                # then that rate's steps
    for seconds in (0.5, 0.5, 60.0):               # a held round does not set the rate
        reach.worked(1, seconds)
    assert reach.step_s == 0.5
    reach.advanced(1, 0.0)                         # a step trained: one step of reach
    assert reach.credit("j", 11) == 11.0           # believed: the new reference
    reach.advanced(1, 1.0)                         # a step, and a deadline's 1 s wait: 1 + 2 steps
    assert reach.reach("j") == 14.0               # (the 60 s wait came before j was believed)
    assert reach.credit("j", 1000) == 14.0         # beyond: credited the reach, reference kept
    assert reach.credit("j", 1000) == 14.0         # repeated, it gains nothing
    assert reach.credit("j", 9) == 9.0             # an older claim never moves the reference back
    assert reach.reach("j") == 14.0
    assert reach.reach("k") == 10.0 + 2 + 61.0 / 0.5  # never believed: from Start
    for _ in range(ROUNDS_TIMED):
        reach.worked(2, 0.5)                       # only the last rounds count
    assert reach.step_s == 0.25
    reach.started(0)                               # a new life: references from Start,
    assert reach.reach("j") == 0.0                 # but our pace (a duration) is kept
    reach.advanced(1, 5.0)
    assert reach.step_s == 0.25 and reach.reach("j") == 1 + 5.0 / 0.25
    again = Reach()                                # (and a checkpoint keeps it)
    again.restore(reach.export())
    assert again.step_s == 0.25 and list(again.timed) == list(reach.timed)
