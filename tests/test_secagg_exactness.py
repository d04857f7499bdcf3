"""Acceptance a: the unmasked aggregate is exactly the sum of the survivors' quantised updates.

Ten clients, plain SecAgg (k = n - 1) and SecAgg+ (k < n - 1), with nobody dropping, with 30% of the
clients leaving after key sharing (their pairwise masks are rebuilt from their mask-key shares),
and with clients leaving after sending their masked input (their input stays in the sum, their
self mask is rebuilt from its shares); and with one client leaving at each other stage (before
advertising, after advertising, after signing the survivor set).
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.secagg import SecAggConfig, ServerPhase, dequantise_sum, quantise
from protocols.secagg.fixedpoint import RING_MASK, to_signed
from protocols.secagg.local import LocalRound
from protocols.secagg.messages import MaskedInput, UnmaskShares

NAMES = [f"client{i:02d}" for i in range(10)]
NUMEL = 1000
CLIP = 0.5
BITS = 16

CONFIGS = {
    "plain k=n-1": SecAggConfig(clip_value=CLIP, bits=BITS),  # auto degree at n=10 is n - 1
    "secagg+ k=8 t=5": SecAggConfig(degree=8, threshold=5, clip_value=CLIP, bits=BITS),  # 2t > k
    "secagg+ k=8": SecAggConfig(degree=8, clip_value=CLIP, bits=BITS),
}


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: quantise(rng.normal(0.0, 0.3, NUMEL), clip_value=CLIP, bits=BITS) for name in NAMES}


def _expected(inputs: dict[str, np.ndarray], survivors: list[str]) -> np.ndarray:
    return np.sum([inputs[name] for name in survivors], axis=0) & RING_MASK


@pytest.mark.parametrize("label", sorted(CONFIGS))
@pytest.mark.parametrize(("scenario", "drop_before"), [
    ("nobody drops", {}),
    ("30% drop after key sharing", {"client01": 2, "client04": 2, "client08": 2}),
    ("20% drop after masked input", {"client02": 3, "client07": 3}),
    ("drops after sharing and after input", {"client03": 2, "client06": 3}),
    ("one drop at every other stage", {"client00": 0, "client02": 1, "client05": 3, "client09": 4}),
])
def test_unmasked_sum_is_the_exact_sum_of_quantised_updates(
        label: str, scenario: str, drop_before: dict[str, int]) -> None:
    # Prepare
    config = CONFIGS[label]
    inputs = _inputs(seed=len(scenario))
    local = LocalRound(config, inputs, run_id="exact", round_index=3, seed=7)

    # Execute
    result = local.run(drop_before=drop_before)

    # Assert
    assert result is not None, (local.server.failure, {n: c.aborts for n, c in local.clients.items()})
    in_sum = [name for name in NAMES if drop_before.get(name, 5) > 2]  # sent a masked input
    assert list(result.survivors) == in_sum
    assert list(result.dropped) == [name for name in NAMES if drop_before.get(name) == 2]
    assert sorted(local.server.adverts) == [name for name in NAMES if drop_before.get(name, 5) > 0]
    assert np.array_equal(result.ring_sum, _expected(inputs, in_sum))
    assert local.server.phase is ServerPhase.DONE
    assert all(not client.aborts for client in local.clients.values())
    # the masked inputs really were masked: none equals its plain input
    for name in in_sum:
        masked = [m for m in local.sent[name] if isinstance(m, MaskedInput)]
        assert len(masked) == 1 and not np.array_equal(
            np.frombuffer(masked[0].masked, dtype="<u4").astype(np.int64), inputs[name])


def test_the_decoded_sum_is_the_float_sum_within_the_rounding_step() -> None:
    rng = np.random.default_rng(11)
    floats = {name: rng.uniform(-2 * CLIP, 2 * CLIP, NUMEL) for name in NAMES}  # half get clipped
    inputs = {name: quantise(x, clip_value=CLIP, bits=BITS) for name, x in floats.items()}
    result = LocalRound(CONFIGS["secagg+ k=8 t=5"], inputs).run()
    assert result is not None
    decoded = dequantise_sum(result.ring_sum, clip_value=CLIP, bits=BITS)
    clipped_sum = np.sum([np.clip(x, -CLIP, CLIP) for x in floats.values()], axis=0)
    step = CLIP / ((1 << (BITS - 1)) - 1)
    assert np.max(np.abs(decoded - clipped_sum)) <= len(NAMES) * step / 2 + 1e-12
    assert np.array_equal(to_signed(result.ring_sum), np.sum([to_signed(v) for v in inputs.values()], axis=0))


def test_each_client_reveals_one_kind_of_share_per_peer() -> None:
    drop_before = {"client01": 2, "client05": 2}
    local = LocalRound(CONFIGS["plain k=n-1"], _inputs(5))
    assert local.run(drop_before=drop_before) is not None
    for name in local.clients:
        if name in drop_before:
            continue
        (reply,) = [m for m in local.sent[name] if isinstance(m, UnmaskShares)]
        self_owners = {entry[0] for entry in reply.self_seed_shares}
        key_owners = {entry[0] for entry in reply.mask_key_shares}
        assert not self_owners & key_owners
        assert key_owners == set(drop_before)
        assert self_owners == set(NAMES) - set(drop_before) - {name}


def test_too_many_drops_fail_the_round_with_a_reason() -> None:
    drop_before = {name: 2 for name in NAMES[:6]}  # 4 left, fewer than t + 1 = 6
    local = LocalRound(CONFIGS["plain k=n-1"], _inputs(1))
    assert local.run(drop_before=drop_before) is None
    assert local.server.phase is ServerPhase.FAILED
    assert local.server.failure == "too_few_inputs"


@pytest.mark.parametrize(("scenario", "drop_before"), [
    ("one leaves before it advertises", {"client05": 0}),
    ("two leave after key sharing", {"client01": 2, "client04": 2}),
    ("one leaves after its masked input", {"client07": 3}),
    ("one leaves at every other stage", {"client00": 0, "client02": 1, "client05": 3, "client09": 4}),
])
def test_a_client_that_says_it_leaves_is_a_dropout_no_deadline_waits_for(
        scenario: str, drop_before: dict[str, int]) -> None:
    """SecAggServer.gone: the same survivors and sum as when the deadlines pass, at time 0."""
    # Prepare: the same round twice, the dropouts silent in one and saying goodbye in the other
    config = CONFIGS["secagg+ k=8"]
    inputs = _inputs(seed=len(scenario))
    silent = LocalRound(config, inputs, run_id="leave", round_index=2, seed=5)
    said = LocalRound(config, inputs, run_id="leave", round_index=2, seed=5)
    # Execute
    waited = silent.run(drop_before=drop_before)
    told = said.run(drop_before=drop_before, goodbye=True)
    # Assert: the same outcome, with no deadline in the told round (its clock never moved)
    assert waited is not None and told is not None, (silent.server.failure, said.server.failure)
    assert told.survivors == waited.survivors and told.dropped == waited.dropped
    assert np.array_equal(told.ring_sum, waited.ring_sum)
    assert silent.now_s > 0 and said.now_s == 0.0
    assert not [key for key in said.server.counters if key.startswith("deadline_")]
    assert said.server.counters["left"] == len(drop_before)
