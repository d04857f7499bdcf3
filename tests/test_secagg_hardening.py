"""SecAgg+ against a hostile gateway (issue 13, review findings 1, 2, 3 and 5).

1. An unmask share whose index is not the one its owner gave that holder (negative, 0, past the
   neighbours, or another holder's) is a counted refusal at the gateway, and
   ``crypto.combine_secret`` refuses such indices itself: pycryptodome's GF(2^128) code never
   returns on a negative index, so these tests carry a timeout: a regression fails, not hangs.
2. A second RoundStart of the same round (a gateway restored from a checkpoint re-asks it; a
   hostile one may do it at will) is a new attempt: new keys, self mask and noise share; and a
   reveal in one attempt binds the next (never both shares of one peer).
3. A fixed threshold must be a strict majority of every k the config allows (2t > k), and a
   client refuses a roster outside the sizes its config was checked for.
5. A client refuses a key roster smaller than its own config's floor (``min_roster``), so a
   gateway cannot shrink its neighbourhood until two colluders hold both of its secrets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch

from protocols.events import Action, Received, Send, Start, WorkDone
from protocols.federation.distributed_dp import discrete_gaussian, noise_generator
from protocols.federation.secure import SecureClient, unwrap
from protocols.messages import RoundStart, SecAggMessage
from protocols.secagg import ClientPhase, SecAggClient, SecAggConfig, SecAggConfigError, crypto, quantise
from protocols.secagg.client import share_index
from protocols.secagg.fixedpoint import RING_MASK
from protocols.secagg.local import LocalRound
from protocols.secagg.messages import (
    AdvertiseKeys,
    ConsistencyProof,
    ForwardedShares,
    KeyRoster,
    MaskedInput,
    UnmaskShares,
)
from protocols.secagg.server import Deliver
from tests.test_federation_ddp import GATEWAY, Federation, configs

pytestmark = pytest.mark.timeout(60)  # a share index pycryptodome loops on must fail the test, not hang it

NAMES = [f"c{i}" for i in range(5)]


def _unmask_replies(run_id: str) -> tuple[LocalRound, dict[str, UnmaskShares]]:
    """Five clients (k = 4, t = 3) run to the consistency proofs; each answers its proof."""
    rng = np.random.default_rng(0)
    inputs = {name: quantise(rng.normal(0.0, 0.3, 8), clip_value=1.0, bits=16) for name in NAMES}
    local = LocalRound(SecAggConfig(), inputs, run_id=run_id, round_index=1)
    proofs: list[Deliver] = []

    def keep_proofs(deliveries: list[Deliver]) -> list[Deliver]:
        held = [d for d in deliveries if isinstance(d.message, ConsistencyProof)]
        proofs.extend(held)
        return [] if held else deliveries

    assert local.run(tamper=keep_proofs) is None and len(proofs) == len(NAMES)
    replies: dict[str, UnmaskShares] = {}
    for delivery in proofs:
        (reply,) = local.clients[delivery.recipient].receive(delivery.message, local.now_s)
        assert isinstance(reply, UnmaskShares)
        replies[delivery.recipient] = reply
    return local, replies


# ------------------------------------------------------------------ 1. share indices


@pytest.mark.parametrize("wrong", ["negative", "zero", "past the neighbours", "another holder's"])
def test_an_unmask_share_with_a_wrong_index_is_refused_and_the_round_still_sums(wrong: str) -> None:
    # Prepare: c0 rewrites the index of its first self-seed share
    local, replies = _unmask_replies(f"index-{wrong}")
    evil = NAMES[0]
    owner, index, share, salt = replies[evil].self_seed_shares[0]
    holders = local.server.graph[owner]
    other = next(h for h in sorted(holders) if h != evil)
    bad = {"negative": -1, "zero": 0, "past the neighbours": len(holders) + 1,
           "another holder's": share_index(holders, other)}[wrong]
    assert index == share_index(holders, evil) != bad
    replies[evil] = replace(replies[evil], self_seed_shares=((owner, bad, share, salt),
                                                             *replies[evil].self_seed_shares[1:]))
    # Execute: every reply in, then the unmask deadline
    for name in NAMES:
        local.server.receive(name, replies[name], local.now_s)
    local.server.tick(local.server.deadline_s)
    # Assert: c0's reply refused, counted; the other four neighbours' shares (>= t = 3) rebuild the sum
    assert local.server.refused == {"bad_unmask": 1}
    result = local.server.result
    assert result is not None, local.server.failure
    expected = np.sum([local.inputs[name] for name in NAMES], axis=0) & RING_MASK
    assert np.array_equal(result.ring_sum, expected)


@pytest.mark.parametrize("indices", [(-1, 2, 3), (0, 2, 3), (1, 2, 7), (1, 2, 2)])
def test_combine_secret_refuses_an_index_split_secret_never_hands_out(indices: tuple[int, ...]) -> None:
    # Prepare: a 3-of-6 sharing, its indices replaced
    secret = hashlib.sha256(b"seed").digest()
    shares = crypto.split_secret(secret, 3, 6)
    chosen = [(index, share) for index, (_, share) in zip(indices, shares, strict=False)]
    # Execute / Assert: a ValueError, not an endless loop nor a wrong secret
    with pytest.raises(ValueError, match="index"):
        crypto.combine_secret(chosen, 3, 6)
    assert crypto.combine_secret(shares[:3], 3, 6) == secret


def test_a_share_that_carries_another_index_than_its_sender_owes_gets_its_sender_blamed() -> None:
    # Prepare: c1 (dishonest) re-encrypts and signs the share it sends c0 under the index 0
    inputs = {name: quantise(np.zeros(4), clip_value=1.0, bits=16) for name in NAMES}
    local = LocalRound(SecAggConfig(), inputs, run_id="own-index", round_index=1)
    c0, c1 = local.clients["c0"], local.clients["c1"]

    def forge(deliveries: list[Deliver]) -> list[Deliver]:
        out = []
        for delivery in deliveries:
            message = delivery.message
            if delivery.recipient == "c0" and isinstance(message, ForwardedShares):
                public = crypto.load_public(c0.secrets.cipher_public)
                assert public is not None
                plaintext = (0).to_bytes(4, "big") + bytes(2 * crypto.SHARE_BYTES + 2 * crypto.SALT_BYTES)
                forged = crypto.encrypt_share(c1.secrets.cipher_key, public, run_id="own-index",
                                              round_index=1, sender="c1", recipient="c0", plaintext=plaintext)
                commitment = bytes(64)
                signature = local.roster.signer("c1")(crypto.share_statement(
                    "own-index", 1, "c1", "c0", crypto.digest(forged), commitment))
                message = replace(message, ciphertexts=tuple(
                    (sender, forged, commitment, signature) if sender == "c1" else (sender, *rest)
                    for sender, *rest in message.ciphertexts))  # type: ignore[misc]
                server = local.server  # as the gateway took it, so c1's signature holds there too
                server.bundles[("c1", "c0")] = (forged, commitment, signature)
            out.append(Deliver(delivery.recipient, message))
        return out

    # Execute
    local.run(tamper=forge)
    # Assert: c0 masks without c1 and accuses it; the gateway opens the bundle itself, blames c1 and
    # sums the other five exactly; nothing c0 holds could rebuild a secret wrongly
    assert c0.accused == ("c1",) and "c1" not in c0._held and not c0.aborts
    (masked,) = [m for m in local.sent["c0"] if isinstance(m, MaskedInput)]
    assert masked.accused == ("c1",) and masked.cipher_private == c0.secrets.cipher_key.private_bytes_raw()
    assert local.server.blamed == {"c1": "bad_shares"}
    result = local.server.result
    assert result is not None and "c1" in result.dropped and "c1" not in result.survivors
    expected = np.sum([inputs[name] for name in result.survivors], axis=0) & RING_MASK
    assert np.array_equal(result.ring_sum, expected)


# ------------------------------------------------------------------ 2. a round asked twice


def _round_start(fed: Federation) -> RoundStart:
    for action in fed.server.handle(Start(), fed.now):
        if isinstance(action, Send) and isinstance(action.message, RoundStart):
            return action.message
    raise AssertionError("no RoundStart")


def _advert(actions: Sequence[Action]) -> AdvertiseKeys:
    for action in actions:
        if isinstance(action, Send) and isinstance(action.message, SecAggMessage):
            inner = unwrap(action.message)
            if isinstance(inner, AdvertiseKeys):
                return inner
    raise AssertionError("no AdvertiseKeys")


def test_a_round_started_twice_advertises_fresh_keys_and_masks_and_draws_fresh_noise() -> None:
    # Prepare: a client of a 5-client federation, asked round 0
    fed = Federation(configs(z=1.0, clients=5, threshold=3), clients=5, numel=4)
    start = _round_start(fed)
    client = fed.clients[fed.names[0]]
    secure = client.secure
    assert isinstance(secure, SecureClient)
    # Execute: the same RoundStart again after training (a restored gateway re-asking its round)
    first = _advert(client.handle(Received(sender=GATEWAY, message=start), 0.0))
    assert secure.machine is not None
    first_seed = secure.machine.secrets.self_seed
    client.handle(WorkDone(steps=1, loss=0.0), 1.0)
    second = _advert(client.handle(Received(sender=GATEWAY, message=start), 2.0))
    # Assert: other keys (so other pairwise masks and shares), another self mask, other noise
    assert secure.machine is not None and secure.attempt == 1
    assert client.counters["secagg_round_restarted"] == 1
    assert first.cipher_public != second.cipher_public and first.mask_public != second.mask_public
    assert secure.machine.secrets.self_seed != first_seed
    draws = [discrete_gaussian(100, 30.0, noise_generator(secure.client_secret, secure.run_id, start.round,
                                                          attempt=attempt)) for attempt in (0, 1)]
    assert not torch.equal(draws[0], draws[1])


def test_a_round_asked_again_after_the_client_sent_its_masked_input_gets_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a whole masked round, its RoundStarts recorded
    fed = Federation(configs(z=1.0, clients=5, threshold=3), clients=5, numel=4)
    starts: list[RoundStart] = []
    act = fed._act

    def recording(owner: str, actions: list[Action]) -> None:
        starts.extend(a.message for a in actions if isinstance(a, Send) and isinstance(a.message, RoundStart))
        act(owner, actions)

    monkeypatch.setattr(fed, "_act", recording)
    fed.run()
    secure = fed.clients[fed.names[0]].secure
    assert isinstance(secure, SecureClient) and secure.input_sent
    secure.drain()
    # Execute: the gateway asks that round again
    actions = secure.start(starts[-1], fed.now)
    # Assert: no second masked input (nor keys) for one round: its noised update is released once
    assert actions == [] and secure.machine is None
    assert secure.drain() == {"secagg_round_restarted": 1, "secagg_refused_round_already_input": 1}


def test_an_older_round_is_refused_by_the_secure_side() -> None:
    # Prepare: a client that took round 0
    fed = Federation(configs(z=0.0, clients=5, threshold=3), clients=5, numel=4)
    start = _round_start(fed)
    secure = fed.clients[fed.names[0]].secure
    assert isinstance(secure, SecureClient)
    secure.start(replace(start, round=1), 0.0)
    # Execute: round 0 after round 1
    actions = secure.start(start, 1.0)
    # Assert: nothing sent, counted; round 1 still the one held
    assert actions == [] and secure.drain()["secagg_refused_old_round"] == 1 and secure.round_index == 1


def test_a_second_attempt_that_would_reveal_a_peers_other_share_aborts_revealing_nothing() -> None:
    # Prepare: attempt 0 of round 1 ran to its end: c1 revealed every neighbour's self-seed share
    inputs = {name: quantise(np.full(6, 0.1), clip_value=1.0, bits=16) for name in NAMES}
    first = LocalRound(SecAggConfig(), inputs, run_id="again", round_index=1)
    assert first.run() is not None
    revealed = first.clients["c1"].revealed
    assert revealed and set(revealed.values()) == {"self_seed"}
    # attempt 1 of the same round: c1's machine gets the same record; c3 drops before its input
    second = LocalRound(SecAggConfig(), inputs, run_id="again", round_index=1)
    old = second.clients["c1"]
    second.clients["c1"] = SecAggClient(
        old.config, name="c1", run_id="again", round_index=1, cohort=old.cohort, attempt=1, revealed=revealed,
        client_secret=hashlib.sha256(b"c1").digest(), sign=old.sign, verify=old.verify)
    # Execute
    second.run(drop_before={"c3": 2})
    # Assert: c1 would now reveal c3's mask-key share: it aborts, counted, and sent no UnmaskShares
    c1 = second.clients["c1"]
    assert c1.phase is ClientPhase.ABORTED and c1.aborts == {"would_reveal_both": 1}
    assert not any(isinstance(m, UnmaskShares) for m in second.sent["c1"])
    assert revealed["c3"] == "self_seed"
    assert c1.secrets.mask_public != first.clients["c1"].secrets.mask_public  # attempt 1's own keys


# ------------------------------------------------------------------ 3. 2t > k


@pytest.mark.parametrize(("settings", "largest_k"), [
    ({"degree": 9, "threshold": 4, "max_clients": 10}, 9),  # t = 4 of 9 neighbours: two halves reach t
    ({"degree": 6, "threshold": 3}, 6),
    ({"threshold": 4, "max_clients": 10}, 9),  # auto degree: plain SecAgg at 10 clients
    ({"threshold": 7, "max_clients": 100}, 20),  # auto degree grows with the cohort: k = 20 at 100
])
def test_a_fixed_threshold_that_is_not_a_majority_of_k_is_a_config_error(
        settings: dict[str, int], largest_k: int) -> None:
    # Execute / Assert
    with pytest.raises(SecAggConfigError, match=f"threshold = {settings['threshold']} is not a strict "
                                                f"majority of the up to {largest_k} neighbours"):
        SecAggConfig(**settings)
    SecAggConfig(**{**settings, "threshold": largest_k // 2 + 1})


def test_the_automatic_threshold_is_a_strict_majority_at_every_cohort() -> None:
    for degree in (0, 4, 8, 30):
        config = SecAggConfig(degree=degree)
        assert all(2 * config.threshold_for(n) > config.degree_for(n) for n in range(3, 1001)), degree


def test_a_client_refuses_a_roster_larger_than_its_config_was_checked_for() -> None:
    # Prepare: t = 5 is a majority of k <= 9 (max_clients = 10); the gateway sends a roster of 12
    names = [f"c{i:02d}" for i in range(12)]
    config = SecAggConfig(threshold=5, max_clients=10)
    inputs = {name: quantise(np.zeros(4), clip_value=1.0, bits=16) for name in names}
    local = LocalRound(replace(config, max_clients=12, threshold=6), inputs, run_id="big")
    victim = SecAggClient(config, name="c00", run_id="big", round_index=1, cohort=frozenset(names),
                          client_secret=bytes(32), sign=local.roster.signer("c00"),
                          verify=local.roster.verify)
    adverts = [victim.start(0.0)[0], *(local.clients[n].start(0.0)[0] for n in names[1:])]
    # Execute
    replies = victim.receive(KeyRoster("big", 1, tuple(adverts)), 0.0)  # type: ignore[arg-type]
    # Assert
    assert replies == [] and victim.aborts == {"roster_above_max": 1} and victim.phase is ClientPhase.ABORTED


# ------------------------------------------------------------------ 5. the roster floor


@pytest.mark.parametrize(("min_roster", "kept"), [(5, 2), (5, 3), (8, 6)])
def test_a_client_refuses_a_roster_trimmed_below_its_own_floor(min_roster: int, kept: int) -> None:
    # Prepare: ten clients advertise; the gateway shows c0 only itself and ``kept`` others
    names = [f"c{i}" for i in range(10)]
    config = SecAggConfig(min_roster=min_roster)
    inputs = {name: quantise(np.zeros(4), clip_value=1.0, bits=16) for name in names}
    local = LocalRound(config, inputs, run_id="trim", round_index=1)
    adverts = {name: local.clients[name].start(0.0)[0] for name in names}
    trimmed = KeyRoster("trim", 1, tuple(adverts[n] for n in names[:kept + 1]))  # type: ignore[misc]
    # Execute
    replies = local.clients["c0"].receive(trimmed, 0.0)
    # Assert: nothing shared, counted
    assert replies == [] and local.clients["c0"].aborts == {"roster_below_floor": 1}


def test_a_roster_at_the_floor_goes_on_with_a_threshold_no_smaller_than_the_floors() -> None:
    # Prepare
    names = [f"c{i}" for i in range(10)]
    config = SecAggConfig(min_roster=5)
    inputs = {name: quantise(np.zeros(4), clip_value=1.0, bits=16) for name in names}
    local = LocalRound(config, inputs, run_id="floor", round_index=1)
    adverts = {name: local.clients[name].start(0.0)[0] for name in names}
    # Execute: five adverts, the floor
    replies = local.clients["c0"].receive(KeyRoster("floor", 1, tuple(adverts[n] for n in names[:5])), 0.0)  # type: ignore[misc]
    # Assert: shares go out, with t = threshold_for(5) = 3 of k = 4
    assert len(replies) == 1 and local.clients["c0"].threshold == config.threshold_for(5) == 3


def test_the_floor_is_at_least_three_and_t_plus_one_and_at_most_max_clients() -> None:
    with pytest.raises(SecAggConfigError, match="min_roster must be >= 3"):
        SecAggConfig(min_roster=2)
    assert SecAggConfig().roster_floor() == 5  # the default: a gateway needs 3 colluders around a client
    assert SecAggConfig(degree=8, threshold=6).roster_floor() == 7
    assert SecAggConfig(max_clients=4).roster_floor() == 4
