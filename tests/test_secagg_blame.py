"""SecAgg with blame (issue 32, item 3), on the pure machines: one insider per round
(protocols/secagg/insider.py), the round completes over the honest survivors with their exact sum,
and the insider, and only it, is named for what it did (protocols/secagg/blame.py).

Six clients, SecAgg+ with k = 4, t = 3 (``degree = 4``): an insider has 4 neighbours, so the round
goes on without it. The sum checked is the ring sum of the honest survivors' inputs, bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from protocols.events import Start
from protocols.federation import FedAvgServer, FederationConfig, SecureAggregationConfig, SecureServer
from protocols.secagg import SecAggConfig, crypto, quantise
from protocols.secagg.client import ClientPhase
from protocols.secagg.fixedpoint import RING_MASK
from protocols.secagg.local import LocalRound, holding
from protocols.secagg.messages import (
    ConsistencyProof,
    ForwardedShares,
    MaskedInput,
    RecoveryRequest,
    ShareKeys,
    UnmaskShares,
)
from protocols.secagg.server import Deliver, ServerPhase

NAMES = [f"c{i}" for i in range(6)]
INSIDER = "c2"


def _round(behaviours: dict[str, str], run_id: str = "blame") -> LocalRound:
    rng = np.random.default_rng(7)
    inputs = {name: quantise(rng.normal(0.0, 0.3, 9), clip_value=1.0, bits=16) for name in NAMES}
    return LocalRound(SecAggConfig(degree=4), inputs, run_id=run_id, round_index=3, behaviours=behaviours)


def _exact(local: LocalRound, survivors: tuple[str, ...]) -> np.ndarray:
    return np.sum([local.inputs[name] for name in survivors], axis=0) & RING_MASK


@pytest.mark.parametrize(("behaviour", "offence"), [("garbage_shares", "bad_shares"),
                                                    ("wrong_secret", "wrong_secret"),
                                                    ("false_accusation", "false_accusation")])
def test_one_insider_is_named_and_the_round_sums_the_honest_survivors(behaviour: str, offence: str) -> None:
    # Prepare
    local = _round({INSIDER: behaviour}, run_id=behaviour)
    # Execute
    result = local.run()
    # Assert: completed, the insider alone blamed and out of the sum, the others' sum exact
    server = local.server
    assert result is not None, server.failure
    assert server.blamed == {INSIDER: offence}
    assert result.survivors == tuple(n for n in NAMES if n != INSIDER) and INSIDER in result.dropped
    assert np.array_equal(result.ring_sum, _exact(local, result.survivors))
    assert server.counters[f"blamed_{offence}"] == 1
    honest = [local.clients[n] for n in NAMES if n != INSIDER]
    assert all(client.phase is ClientPhase.DONE and not client.aborts for client in honest)


def test_garbage_makes_each_neighbour_accuse_with_its_own_key_only() -> None:
    local = _round({INSIDER: "garbage_shares"})
    local.run()
    accusers = {name for name in NAMES if name != INSIDER
                for m in local.sent[name] if isinstance(m, MaskedInput) and m.accused}
    assert accusers == set(local.server.graph[INSIDER])  # every neighbour it dealt garbage to
    for name in accusers:
        (masked,) = [m for m in local.sent[name] if isinstance(m, MaskedInput)]
        assert masked.accused == (INSIDER,)
        assert masked.cipher_private == local.clients[name].secrets.cipher_key.private_bytes_raw()


def test_a_wrong_secret_takes_one_recovery_round_and_the_culprits_mask_key() -> None:
    local = _round({INSIDER: "wrong_secret"})
    result = local.run()
    assert result is not None
    asked = {name for name in NAMES if any(isinstance(m, UnmaskShares) and not m.self_seed_shares
                                           for m in local.sent[name])}
    assert asked == set(local.server.graph[INSIDER])
    for name in asked:  # only the culprit's mask-key share, on proof
        (recovery,) = [m for m in local.sent[name] if isinstance(m, UnmaskShares) and not m.self_seed_shares]
        assert [entry[0] for entry in recovery.mask_key_shares] == [INSIDER]
        assert local.clients[name].revealed[INSIDER] == "both"


def test_a_client_reveals_nothing_more_on_a_recovery_request_without_proof() -> None:
    # Prepare: a clean round, held at its end: the gateway then claims an honest client dealt wrong
    local = _round({})
    result = local.run()
    assert result is not None
    victim = "c0"
    holder = sorted(local.server.graph[victim])[0]
    client = local.clients[holder]
    index, share, salt = client._held[victim].reveal("self_seed")
    ciphertext, commitment, signature = local.server.bundles[(victim, holder)]
    entry = (victim, holder, index, share, salt, crypto.digest(ciphertext), commitment, signature)
    # Execute: t honest shares rebuild the committed seed: no proof of anything
    shares = [entry]
    for other in sorted(local.server.graph[victim] - {holder}):
        i, s, salt_other = local.clients[other]._held[victim].reveal("self_seed")
        c, com, sig = local.server.bundles[(victim, other)]
        shares.append((victim, other, i, s, salt_other, crypto.digest(c), com, sig))
    replies = client.receive(RecoveryRequest("blame", 3, tuple(shares)), 0.0)
    # Assert
    assert replies == [] and client.aborts == {"false_recovery": 1}


def test_a_holder_revealing_a_share_its_owner_never_dealt_is_blamed() -> None:
    local = _round({})
    held, hold_proofs = holding(ConsistencyProof)
    local.run(tamper=hold_proofs)
    server = local.server
    replies = {d.recipient: local.clients[d.recipient].receive(d.message, local.now_s)[0] for d in held}
    liar = "c4"
    reply = replies[liar]
    assert isinstance(reply, UnmaskShares)
    owner, index, share, salt = reply.self_seed_shares[0]
    replies[liar] = dataclasses.replace(reply, self_seed_shares=(
        (owner, index, bytes(b ^ 1 for b in share), salt), *reply.self_seed_shares[1:]))
    for name, message in sorted(replies.items()):
        assert isinstance(message, UnmaskShares)
        server.receive(name, message, local.now_s)
    server.tick(server.deadline_s)
    assert server.blamed == {liar: "bad_reveal"} and server.refused["bad_reveal"] == 1
    assert server.phase is ServerPhase.DONE and server.result is not None
    assert np.array_equal(server.result.ring_sum, _exact(local, tuple(NAMES)))  # its input stays


def test_an_accusation_with_a_key_that_is_not_the_accusers_blames_the_accuser() -> None:
    # Prepare: the round held at the forwarded shares; c0 then accuses a neighbour with a made-up key
    local = _round({})
    held, hold_shares = holding(ForwardedShares)
    local.run(tamper=hold_shares)
    server = local.server
    accuser = "c0"
    (delivery,) = [d for d in held if d.recipient == accuser]
    (honest,) = local.clients[accuser].receive(delivery.message, local.now_s)
    assert isinstance(honest, MaskedInput) and honest.accused == ()
    accused = sorted(server.graph[accuser])[0]
    forged = dataclasses.replace(honest, accused=(accused,), cipher_private=bytes(range(32)))
    # Execute
    server.receive(accuser, forged, local.now_s)
    # Assert: the accuser, not the accused, is named and out of the round
    assert server.blamed == {accuser: "bad_evidence"} and server.refused["bad_evidence"] == 1
    assert accuser not in server.inputs
    assert server.receive(accuser, honest, local.now_s) == [] and server.refused["unknown_sender"] == 1


def test_share_bundles_their_dealer_did_not_sign_get_it_blamed_and_left_out() -> None:
    # Prepare: c3's ShareKeys reach the gateway with one signature altered
    local = _round({})
    original = local.server.receive

    def receive(sender: str, message: Any, now_s: float) -> list[Deliver]:
        if sender == "c3" and isinstance(message, ShareKeys):
            recipient, ciphertext, commitment, _ = message.ciphertexts[0]
            bad = (recipient, ciphertext, commitment, bytes(64))
            message = dataclasses.replace(message, ciphertexts=(bad, *message.ciphertexts[1:]))
        return original(sender, message, now_s)

    local.server.receive = receive  # type: ignore[method-assign]
    # Execute
    result = local.run()
    # Assert: c3 named and out from the share phase on; the round sums the other five
    assert local.server.blamed == {"c3": "unsigned_shares"}
    assert result is not None and "c3" not in result.survivors
    assert np.array_equal(result.ring_sum, _exact(local, result.survivors))


def test_offences_survive_a_gateway_checkpoint_and_bar_the_offender() -> None:
    names = [f"c{i}" for i in range(7)]
    config = FederationConfig(uplink="identity", min_clients=5, fraction=1.0, round_timeout_s=200.0,
                              secure_aggregation=SecureAggregationConfig(blame_limit=2))
    assert config.secure_aggregation is not None

    def gateway() -> FedAvgServer:
        params = torch.zeros(4)
        secure = SecureServer(config.secure_aggregation, run_id="r", verify=lambda *args: True,  # type: ignore[arg-type]
                              like=params)
        return FedAvgServer(config, name="gw", params=params, clients=names, secure=secure)

    first = gateway()
    assert first.secure is not None
    first.secure.offences.update({"c1": 2, "c4": 1})
    second = gateway()
    second.restore_state(first.export_state())
    assert second.secure is not None and second.secure.offences == {"c1": 2, "c4": 1}
    assert second.secure.barred() == {"c1"}
    second.handle(Start(), 0.0)
    assert "c1" not in second.asked and "c4" in second.asked and len(second.asked) == 6
