"""The re-convergence time after a fault (protocols/consensus.py ``reconvergence_time_s``): the one
definition the multi-host suite measures real peers with and the simulator predicts (issue 16)."""

from __future__ import annotations

import pytest

from protocols.consensus import REBOUND_FACTOR, reconvergence_time_s

# one sample a second: pre-fault at 1.0 (t 0..9), the fault from t 10, healed at t 20
PRE = [1.0] * 10
APART = [8.0] * 10
TIMES = [float(t) for t in range(40)]


def series(after: list[float]) -> tuple[list[float], list[float]]:
    distances = PRE + APART + after
    return TIMES[:len(distances)], distances


def when(after: list[float], window_s: float = 1.0) -> float | None:
    times, distances = series(after)
    return reconvergence_time_s(times, distances, pre_fault_s=(0.0, 10.0), heal_s=20.0, window_s=window_s)


def test_the_time_is_from_the_heal_to_the_first_sample_below_the_bar() -> None:
    # below 1.5 x 1.0 from t 23 on (1.4 is below, 1.5 is not: strictly below the bar)
    assert when([6.0, 3.0, 1.5, 1.4, 1.2, 1.0, 1.0, 1.1, 1.0, 1.0]) == 3.0
    assert REBOUND_FACTOR == 1.5


def test_a_dip_that_rises_again_is_not_a_reconvergence() -> None:
    # dips at t 20-21, rises at t 22-23, then stays down from t 24
    assert when([1.0, 1.0, 4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]) == 4.0
    # dips, then rises to the end: never re-converged
    assert when([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0]) is None
    # one sample after the heal that is not below the bar, the last one
    assert when([1.0, 1.0, 1.0, 1.6]) is None


def test_the_trailing_median_ignores_a_lone_outlier_and_lags_by_half_a_window() -> None:
    after = [1.0, 1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert when(after, window_s=1.0) == 5.0            # window of one sample: the spike resets it
    # a 3-sample window (t - 3 < t' <= t): the spike is outvoted, but the window first has to get
    # past the samples from before the heal (median of 8, 8, 1 at t 20; 8, 1, 1 at t 21)
    assert when(after, window_s=3.0) == 1.0


def test_a_series_that_ends_at_the_heal_or_never_drifted_is_answered_plainly() -> None:
    assert when([]) is None                              # no sample after the heal: no answer
    times = TIMES[:30]
    assert reconvergence_time_s(times, [1.0] * 30, pre_fault_s=(0.0, 10.0), heal_s=20.0,
                                window_s=5.0) == 0.0     # never apart: agreed at the heal


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="pre-fault"):
        reconvergence_time_s([0.0, 1.0], [1.0, 1.0], pre_fault_s=(5.0, 6.0), heal_s=0.5, window_s=1.0)
    with pytest.raises(ValueError, match="distances"):
        reconvergence_time_s([0.0, 1.0], [1.0], pre_fault_s=(0.0, 1.0), heal_s=0.5, window_s=1.0)
    with pytest.raises(ValueError, match="decrease"):
        reconvergence_time_s([1.0, 0.0], [1.0, 1.0], pre_fault_s=(0.0, 1.0), heal_s=0.5, window_s=1.0)
    with pytest.raises(ValueError, match="window"):
        reconvergence_time_s([0.0, 1.0], [1.0, 1.0], pre_fault_s=(0.0, 1.0), heal_s=0.5, window_s=0.0)


def test_members_in_exact_agreement_before_the_fault_reconverge_when_they_agree_exactly_again() -> None:
    # a pre-fault median of 0 (identical parameters, as exact averaging gives): the bar is 0, which no
    # distance is below; agreeing exactly again is re-converging
    times = TIMES[:30]
    distances = [0.0] * 10 + [8.0] * 10 + [4.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert reconvergence_time_s(times, distances, pre_fault_s=(0.0, 10.0), heal_s=20.0, window_s=1.0) == 2.0
