"""The catch-up bound's pure rules (protocols/gossip/catchup.py): confirmations, the confirmed round,
and one sender's reach."""

from __future__ import annotations

import pytest

from protocols.gossip.catchup import ROUNDS_TIMED, Reach, confirmations, confirmed_round


@pytest.mark.parametrize(("in_degree", "byzantine", "needed"), [
    (1, -1, 0), (2, -1, 0), (3, -1, 2), (5, -1, 2),    # auto: f = 1 from in-degree 3
    (5, 0, 0),                                         # f = 0: no claims lift the time bound
    (4, 2, 0), (5, 2, 3), (7, 3, 4),                   # in-degree >= 2f + 1, else none
])
def test_confirmations_need_f_plus_one_where_the_in_degree_is_at_least_2f_plus_1(
        in_degree: int, byzantine: int, needed: int) -> None:
    assert confirmations(in_degree, byzantine) == needed


def test_the_confirmed_round_is_the_f_plus_first_highest_claim() -> None:
    claims = {"a": 2**63 - 1, "b": 40, "c": 35}
    assert confirmed_round(claims, 2) == 40      # one liar's round is never the answer
    assert confirmed_round(claims, 3) == 35
    assert confirmed_round(claims, 4) is None and confirmed_round(claims, 0) is None


def test_a_senders_reach_grows_at_twice_our_median_step_rate_from_its_last_believed_claim() -> None:
    reach = Reach()
    reach.started(10, 100.0)
    assert reach.reach("j", 1000.0) == 10.0        # no round of ours timed: nothing beyond Start
    for seconds in (0.5, 0.5, 60.0):               # a held round does not set the rate
        reach.worked(1, seconds)
    assert reach.step_s == 0.5
    assert reach.reach("j", 101.0) == 10.0 + 2 * 1.0 / 0.5
    assert reach.credit("j", 12, 101.0) == 12.0    # believed: the new reference
    assert reach.credit("j", 1000, 101.5) == 14.0  # beyond: credited the reach, reference kept
    assert reach.credit("j", 1000, 102.0) == 16.0
    assert reach.credit("j", 11, 102.0) == 11.0    # an older claim never moves the reference back
    assert reach.reach("j", 102.0) == 16.0
    for _ in range(ROUNDS_TIMED):
        reach.worked(2, 0.5)                       # only the last rounds count
    assert reach.step_s == 0.25
    reach.started(0, 0.0)                          # a new life: another clock, references from Start,
    assert reach.reach("j", 0.0) == 0.0            # but our pace (a duration) is kept
    assert reach.step_s == 0.25 and reach.reach("j", 5.0) == 2 * 5.0 / 0.25
    again = Reach()                                # (and a checkpoint keeps it)
    again.restore(reach.export())
    assert again.step_s == 0.25 and list(again.timed) == list(reach.timed)
