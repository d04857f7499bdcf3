"""SecAgg's parts on their own: config errors, the refused federation settings, fixed point and
its overflow bound, the masking graph, Shamir on 32-byte secrets, the wire form of every message,
and forged, replayed, late and malformed messages counted by reason at the gateway and the client.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgpack
import numpy as np
import pytest

from protocols.secagg import (
    REFUSED_COMPRESSORS,
    ClientPhase,
    SecAggConfig,
    SecAggConfigError,
    ServerPhase,
    check_compatible,
    crypto,
    dequantise_sum,
    max_clients_for_bits,
    quantise,
)
from protocols.secagg.fixedpoint import RING_MASK, levels, to_signed
from protocols.secagg.graph import graph_seed, neighbours
from protocols.secagg.local import LocalRound, SeededKeyring, holding
from protocols.secagg.messages import (
    AdvertiseKeys,
    ConsistencyProof,
    ConsistencySignature,
    ForwardedShares,
    KeyRoster,
    Malformed,
    MaskedInput,
    Message,
    RecoveryRequest,
    ShareKeys,
    SurvivorSet,
    UnmaskShares,
    from_wire,
    to_wire,
)
from protocols.secagg.server import Deliver, SecAggServer

NAMES = [f"client{i:02d}" for i in range(6)]

# ------------------------------------------------------------------ config


@pytest.mark.parametrize(("changes", "names"), [
    ({"degree": -1}, "degree"),
    ({"threshold": -2}, "threshold"),
    ({"threshold": 1}, "threshold"),
    ({"clip_value": 0.0}, "clip_value"),
    ({"clip_value": float("inf")}, "clip_value"),
    ({"bits": 1}, "bits"),
    ({"bits": 32}, "bits"),
    ({"max_clients": 1}, "max_clients"),
    ({"bits": 24, "max_clients": 1000}, "overflow"),
    ({"share_timeout_s": 0.0}, "share_timeout_s"),
    ({"unmask_timeout_s": float("nan")}, "unmask_timeout_s"),
])
def test_bad_settings_are_refused_naming_the_key(changes: dict[str, Any], names: str) -> None:
    with pytest.raises(SecAggConfigError, match=names):
        SecAggConfig(**changes)


def test_validate_checks_the_cohort() -> None:
    config = SecAggConfig(degree=4, threshold=5, max_clients=50)
    with pytest.raises(SecAggConfigError, match="threshold = 5 exceeds the 4 neighbours"):
        config.validate(20)
    with pytest.raises(SecAggConfigError, match="max_clients"):
        config.validate(51)
    with pytest.raises(SecAggConfigError, match="at least 3"):
        config.validate(2)
    SecAggConfig(degree=4, threshold=3).validate(20)


def test_degree_and_threshold_defaults() -> None:
    config = SecAggConfig()
    assert config.degree_for(10) == 9 and config.threshold_for(10) == 5  # plain SecAgg at 10
    assert config.degree_for(100) == 20 and config.threshold_for(100) == 11
    assert config.degree_for(1000) == 30
    assert SecAggConfig(degree=5).degree_for(100) == 6  # rounded up to even
    assert SecAggConfig(degree=99).degree_for(10) == 9


@pytest.mark.parametrize("uplink", [*sorted(REFUSED_COMPRESSORS), "qsgd:bits=4,bucket=0",
                                    "topk:fraction=0.1"])
def test_scaled_and_sparse_compressors_are_refused(uplink: str) -> None:
    with pytest.raises(SecAggConfigError, match=r"cannot run with federation\.uplink"):
        check_compatible(mode="sync", uplink=uplink)


def test_fedbuff_is_refused_and_casts_are_accepted() -> None:
    with pytest.raises(SecAggConfigError, match="fedbuff"):
        check_compatible(mode="fedbuff", uplink="identity")
    for uplink in ("identity", "fp16", "bf16"):
        check_compatible(mode="sync", uplink=uplink)
    assert set(REFUSED_COMPRESSORS) == {"qsgd", "sign", "powersgd", "topk", "topk-approx", "randomk"}


# ------------------------------------------------------------------ fixed point


def test_quantise_rounds_within_half_a_step_and_clips() -> None:
    x = np.array([-3.0, -1.0, -0.3, 0.0, 1e-9, 0.7, 1.0, 2.5])
    q = quantise(x, clip_value=1.0, bits=8)
    assert np.all((q >= 0) & (q <= RING_MASK))
    assert list(to_signed(q)) == [-127, -127, -38, 0, 0, 89, 127, 127]
    back = dequantise_sum(q, clip_value=1.0, bits=8)
    assert np.max(np.abs(back - np.clip(x, -1, 1))) <= 0.5 / 127 + 1e-12
    with pytest.raises(ValueError, match="finite"):
        quantise(np.array([np.nan]), clip_value=1.0, bits=8)


@pytest.mark.parametrize("bits", [8, 16, 20])
def test_the_overflow_bound_is_tight(bits: int) -> None:
    n = max_clients_for_bits(bits)
    top = np.array([levels(bits)], dtype=np.int64)
    bottom = quantise(np.array([-1.0]), clip_value=1.0, bits=bits)
    assert int(to_signed((n * top) & RING_MASK)[0]) == n * levels(bits)  # n fits, both signs
    assert int(to_signed((n * bottom) & RING_MASK)[0]) == -n * levels(bits)
    assert int(to_signed(((n + 1) * top) & RING_MASK)[0]) < 0  # one more wraps around


# ------------------------------------------------------------------ graph and Shamir


def test_the_masking_graph_is_symmetric_regular_and_follows_the_keys() -> None:
    names = [f"m{i:03d}" for i in range(50)]
    keys = {name: (hashlib.sha256(name.encode()).digest(), bytes(32)) for name in names}
    seed = graph_seed("run", 1, keys)
    graph = neighbours(seed, names, 8)
    assert all(len(around) == 8 and name not in around for name, around in graph.items())
    assert all(name in graph[peer] for name, around in graph.items() for peer in around)
    assert neighbours(graph_seed("run", 1, dict(keys)), list(reversed(names)), 8) == graph
    other = dict(keys, m000=(bytes(32), bytes(32)))
    assert neighbours(graph_seed("run", 1, other), names, 8) != graph
    assert neighbours(graph_seed("run", 2, keys), names, 8) != graph  # a new round, a new graph


def test_shamir_rebuilds_from_any_threshold_shares_only() -> None:
    secret = hashlib.sha256(b"secret").digest()
    shares = crypto.split_secret(secret, 3, 6)
    assert crypto.combine_secret(shares[3:], 3, 6) == secret
    assert crypto.combine_secret([shares[0], shares[2], shares[5], shares[1]], 3, 6) == secret
    assert crypto.combine_secret(shares[:2], 3, 6) is None
    assert crypto.combine_secret(shares[:2], 2, 6) != secret  # two shares of a 3-threshold say nothing


def test_a_share_opens_only_for_its_recipient_and_context() -> None:
    alice = crypto.RoundSecrets(bytes(32), "run", 1, "alice")
    bob = crypto.RoundSecrets(bytes([1]) * 32, "run", 1, "bob")
    ciphertext = crypto.encrypt_share(alice.cipher_key, bob.cipher_key.public_key(), run_id="run",
                                      round_index=1, sender="alice", recipient="bob", plaintext=b"share")
    opened = crypto.decrypt_share(bob.cipher_key, alice.cipher_key.public_key(), run_id="run",
                                  round_index=1, sender="alice", recipient="bob", ciphertext=ciphertext)
    assert opened == b"share"
    for context in ({"round_index": 2}, {"run_id": "other"}, {"sender": "carol"}):
        args: dict[str, Any] = dict(run_id="run", round_index=1, sender="alice", recipient="bob") | context
        assert crypto.decrypt_share(bob.cipher_key, alice.cipher_key.public_key(),
                                    ciphertext=ciphertext, **args) is None
    # a new round gives new keys, hence new masks
    assert crypto.RoundSecrets(bytes(32), "run", 2, "alice").self_seed != alice.self_seed


# ------------------------------------------------------------------ wire form


SAMPLES: list[Message] = [
    AdvertiseKeys("r", 1, "a", bytes(32), bytes(range(32)), bytes(32), bytes(64)),
    KeyRoster("r", 1, (AdvertiseKeys("r", 1, "a", bytes(32), bytes(32), bytes(32), bytes(64)),)),
    ShareKeys("r", 1, (("b", b"x", bytes(64), bytes(64)), ("c", b"y", bytes(64), bytes(64)))),
    ForwardedShares("r", 1, ()),
    MaskedInput("r", 1, bytes(8)),
    MaskedInput("r", 1, bytes(8), ("b",), bytes(32)),
    SurvivorSet("r", 1, ("a", "b")),
    ConsistencySignature("r", 1, bytes(64)),
    ConsistencyProof("r", 1, (("a", bytes(64)),)),
    UnmaskShares("r", 1, (("a", 1, bytes(32), bytes(16)),), ()),
    RecoveryRequest("r", 1, (("a", "b", 1, bytes(32), bytes(16), bytes(32), bytes(64), bytes(64)),)),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_survives_msgpack(message: Message) -> None:
    raw = msgpack.packb(to_wire(message), use_bin_type=True)
    assert from_wire(msgpack.unpackb(raw, raw=False)) == message


@pytest.mark.parametrize(("obj", "reason"), [
    ([1, 2], "not a map"),
    ({"kind": "Nope"}, "unknown kind"),
    ({"kind": ["unhashable"]}, "unknown kind"),
    ({"kind": "MaskedInput", "run_id": "r", "round_index": 1}, "wrong fields"),
    ({"kind": "MaskedInput", "run_id": "r", "round_index": "1", "masked": b"", "accused": [],
      "cipher_private": b""}, "round_index"),
    ({"kind": "SurvivorSet", "run_id": "r", "round_index": 1, "survivors": [1]}, "bad entry"),
    ({"kind": "UnmaskShares", "run_id": "r", "round_index": 1, "self_seed_shares": [["a", 1]],
      "mask_key_shares": []}, "bad entry"),
    ({"kind": "KeyRoster", "run_id": "r", "round_index": 1, "adverts": [{"kind": "MaskedInput"}]}, "adverts"),
    ({"kind": "KeyRoster", "run_id": "r", "round_index": 1, "adverts": [["a", b"", b""]]}, "adverts"),
    ({"kind": "KeyRoster", "run_id": 5, "round_index": 1, "adverts": []}, "run"),
])
def test_malformed_wire_data_is_data_not_an_exception(obj: object, reason: str) -> None:
    result = from_wire(obj)
    assert isinstance(result, Malformed) and reason in result.reason


# ------------------------------------------------------------------ refusals, counted


def _local(**kwargs: Any) -> LocalRound:
    rng = np.random.default_rng(0)
    inputs = {name: quantise(rng.normal(0.0, 0.3, 20), clip_value=1.0, bits=16) for name in NAMES}
    return LocalRound(SecAggConfig(**kwargs), inputs, run_id="units", round_index=5)


def test_the_gateway_counts_forged_replayed_and_misplaced_messages() -> None:
    local = _local()
    server = local.server
    adverts = {name: local.clients[name].start(0.0)[0] for name in NAMES}
    first = adverts[NAMES[0]]
    assert isinstance(first, AdvertiseKeys)
    forged = dataclasses.replace(first, mask_public=bytes(32))  # keys swapped, signature kept
    assert server.receive(NAMES[0], forged, 0.0) == []
    assert server.receive(NAMES[1], first, 0.0) == []  # someone else's advert
    assert server.receive("stranger", first, 0.0) == []
    assert server.receive(NAMES[0], dataclasses.replace(first, round_index=4), 0.0) == []  # replay
    assert server.receive(NAMES[0], MaskedInput("units", 5, bytes(80)), 0.0) == []  # too soon
    assert server.receive(NAMES[0], SurvivorSet("units", 5, ()), 0.0) == []  # type: ignore[arg-type]
    assert server.receive(NAMES[0], first, 0.0) == []
    assert server.receive(NAMES[0], first, 0.0) == []  # the same again
    assert server.refused == {"bad_signature": 2, "unknown_sender": 1, "wrong_round": 1, "early": 1,
                              "wrong_kind": 1, "duplicate": 1}
    deliveries: list[Deliver] = []
    for name in NAMES[1:]:
        deliveries += server.receive(name, adverts[name], 1.0)
    assert server.phase is ServerPhase.SHARE and len(deliveries) == len(NAMES)
    assert server.receive(NAMES[2], adverts[NAMES[2]], 1.0) == []
    assert server.refused["late"] == 1
    assert server.receive(NAMES[0], ShareKeys("units", 5, (("nobody", b"", b"", b""),)), 1.0) == []
    assert server.refused["bad_shares"] == 1


def test_deadlines_close_rounds_with_whoever_answered() -> None:
    local = _local(advertise_timeout_s=10.0, min_roster=4)  # 4 of 6 advertise in time
    server = local.server
    for name in NAMES[:4]:
        server.receive(name, local.clients[name].start(0.0)[0], 0.0)
    assert server.tick(9.99) == [] and server.phase is ServerPhase.ADVERTISE
    delivered = server.tick(10.0)
    assert server.phase is ServerPhase.SHARE and server.deadline_s == 10.0 + server.config.share_timeout_s
    assert sorted(d.recipient for d in delivered) == NAMES[:4]
    assert server.counters["deadline_advertise"] == 1


def test_a_threshold_above_the_shrunken_degree_fails_the_round() -> None:
    config = SecAggConfig(threshold=5, max_clients=10)  # fine for 10 clients (k = 9), not for 5 (k = 4)
    config.validate(10)
    assert config.runs_with(10) and config.runs_with(6) and not config.runs_with(5)
    rng = np.random.default_rng(0)
    inputs = {f"c{i}": quantise(rng.normal(0.0, 0.3, 5), clip_value=1.0, bits=16) for i in range(10)}
    local = LocalRound(config, inputs)
    assert local.run(drop_before={f"c{i}": 0 for i in range(5)}) is None
    assert local.server.failure == "too_few_advertised"


def test_too_few_advertisers_fail_the_round() -> None:
    local = _local()
    local.server.receive(NAMES[0], local.clients[NAMES[0]].start(0.0)[0], 0.0)
    local.server.tick(1e9)
    assert local.server.phase is ServerPhase.FAILED and local.server.failure == "too_few_advertised"


def test_a_client_aborts_on_a_forged_advert_and_refuses_other_rounds() -> None:
    local = _local()
    adverts = [local.clients[name].start(0.0)[0] for name in NAMES]
    assert all(isinstance(a, AdvertiseKeys) for a in adverts)
    victim = local.clients[NAMES[0]]
    assert victim.receive(KeyRoster("units", 4, ()), 0.0) == []  # replayed from another round
    assert victim.refused == {"wrong_round": 1}
    assert victim.receive(SurvivorSet("units", 5, ()), 0.0) == []
    assert victim.refused["wrong_phase"] == 1
    typed = [a for a in adverts if isinstance(a, AdvertiseKeys)]
    forged = dataclasses.replace(typed[3], cipher_public=typed[4].cipher_public)  # a swapped key
    roster = KeyRoster("units", 5, (*typed[:3], forged, *typed[4:]))
    assert victim.receive(roster, 0.0) == []
    assert victim.phase is ClientPhase.ABORTED and victim.aborts == {"bad_advert": 1}


def test_a_client_aborts_on_a_tampered_share() -> None:
    local = _local()
    tampered: list[str] = []

    def flip_a_bit(deliveries: list[Deliver]) -> list[Deliver]:
        out = []
        for delivery in deliveries:
            message = delivery.message
            if isinstance(message, ForwardedShares) and not tampered:
                sender, ciphertext, commitment, signature = message.ciphertexts[0]
                bad = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]  # the sender's signature fails now
                message = ForwardedShares(message.run_id, message.round_index,
                                          ((sender, bad, commitment, signature), *message.ciphertexts[1:]))
                tampered.append(delivery.recipient)
            out.append(Deliver(delivery.recipient, message))
        return out

    local.run(tamper=flip_a_bit)
    assert local.clients[tampered[0]].aborts == {"bad_share": 1}
    assert not any(isinstance(m, MaskedInput) for m in local.sent[tampered[0]])


def test_roster_signatures_verify_only_under_the_right_name() -> None:
    roster = SeededKeyring(["a", "b"], seed=1)
    signature = roster.signer("a")(b"data")
    assert roster.verify("a", signature, b"data")
    assert not roster.verify("b", signature, b"data")
    assert not roster.verify("c", signature, b"data")
    assert not roster.verify("a", signature, b"other")


def test_server_refuses_a_cohort_that_breaks_the_config() -> None:
    with pytest.raises(SecAggConfigError):
        SecAggServer(SecAggConfig(max_clients=4), run_id="r", round_index=1, cohort=frozenset(NAMES),
                     numel=3, verify=lambda *_: True, now_s=0.0)


def test_the_gateway_refuses_unmask_shares_of_the_wrong_kind() -> None:
    local = _local()
    drop = {NAMES[5]: 2}
    held, hold_proofs = holding(ConsistencyProof)
    local.run(drop_before=drop, tamper=hold_proofs)
    server = local.server
    assert server.phase is ServerPhase.UNMASK
    honest = local.clients[NAMES[0]].receive(held[0].message, local.now_s)
    (reply,) = honest
    assert isinstance(reply, UnmaskShares) and reply.mask_key_shares and reply.self_seed_shares
    owner, index, share, salt = reply.mask_key_shares[0]
    both = dataclasses.replace(reply, self_seed_shares=(*reply.self_seed_shares, (owner, index, share, salt)))
    survivor = reply.self_seed_shares[0]
    key_of_survivor = dataclasses.replace(reply, mask_key_shares=(*reply.mask_key_shares, survivor))
    short = dataclasses.replace(reply, self_seed_shares=((survivor[0], survivor[1], b"short", survivor[3]),))
    for bad in (both, key_of_survivor, short):
        assert server.receive(NAMES[0], bad, local.now_s) == []
    assert server.refused["bad_unmask"] == 3
    assert server.receive(NAMES[0], reply, local.now_s) == [] and NAMES[0] in server.unmasks


def test_a_round_is_repeatable_from_its_seed() -> None:
    first, second = _local(), _local()
    a, b = first.run(drop_before={NAMES[1]: 2}), second.run(drop_before={NAMES[1]: 2})
    assert a is not None and b is not None and np.array_equal(a.ring_sum, b.ring_sum)
    assert first.bytes_up == second.bytes_up and first.bytes_down == second.bytes_down
    masked = [[m for m in run.sent[NAMES[0]] if isinstance(m, MaskedInput)] for run in (first, second)]
    assert masked[0] == masked[1]  # keys and masks come from the injected secrets, not the OS
