"""Issue 14, acceptance (b), in real processes: one member's key, everything it can sign.

4 peers on a ring (p00..p03), D-PSGD, run twice: clean, and with an attacker holding p01's key (a
roster member: its signatures are valid, its CurveZMQ key admitted) over its own ZeroMQ
transport, while the real p01 runs on. Both runs hold every peer once at ``ATTACK_AT``.

* Held: non-finite and huge models for the next three rounds (buffered, refused at the mix:
  ``rejected_nonfinite`` / the insider filter; the real p01's messages for those rounds are then
  duplicates, or stale where the round closed first), and a model-sized message whose payload
  does not match its digest, sent ``DIGEST_REPEATS`` times (``digest_mismatch`` each time: the
  replay window moves only for a complete message).
* Training (not while held: a neighbour silent for seconds could have trained that long, and a
  claim within that reach is followed, protocols/gossip/catchup.py): rounds -1, 0, the last
  round, 2^31, 2^63 - 1 and 2^64 - 1, sequence numbers and epochs far ahead. The attacker's
  sequence numbers are placed above any the real p01 seals in this run, within the replay window's
  bitmap (as any reordering), so its genuine traffic is still accepted.

Asserted, what the defence promises and nothing a loaded machine can reorder: every message the
attacker sent is refused, counted under a reason the attack can produce, and the counts add up to
what was sent (exactly, by reason, where the header alone decides it; a bad digest may be counted
``incomplete`` instead, when its connection went quiet owing a frame); the real p01's messages for
the forged rounds are dropped, never mixed twice, and every other message dropped as stale or a
duplicate is one of a round its receiver closed or skipped without it, or a resend (the clean run
holds to the same account); nothing honest is refused; the forged last round moves nobody even
halfway to it; every peer's accuracy is within 1 point of the clean run's, and its peak memory
(``memory_peak_mib``) within 64 MiB of it.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _daemon_support import (
    CEILING_S,
    describe,
    hold_at,
    make_network,
    peers,
    status,
    wait_for_files,
    wait_for_step,
)

from peer.net.transport import CurveKeys, Transport, TransportConfig, listener_address, reserve_listeners
from peer.runtime.assemble import identity_and_roster, make_trainer
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import load_peer_config
from protocols.messages import ParamPush
from protocols.roster import run_id
from protocols.wire import Endpoint, wire_messages

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 300
ATTACK_AT = 20       # every peer is held here while the value battery and the bad digests go in
ROUNDS_AT = 40       # the round battery goes in while everyone trains, from here
FIRST_SEQ = 1000   # above anything the real p01 seals in this run, and within the 1024-message bitmap
INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1
DIGEST_REPEATS = 100
RSS_GROWTH_LIMIT_MIB = 64
TARGETS = ("p00", "p02")    # the attacker's (p01's) neighbours on the ring
RING = ("p00", "p01", "p02", "p03")
IN_NEIGHBOURS = {name: (RING[i - 1], RING[(i + 1) % len(RING)]) for i, name in enumerate(RING)}
# what the machine counts under one of two names, by timing alone
COMBINED = {"catch_up": ("catch_up_refused", "catch_up_bounded", "catch_up_unconfirmed"),
            "stale_or_duplicate": ("stale_message", "duplicate_message"),
            # a bad digest is found at its last frame; one whose connection went quiet owing a
            # frame (a sender starved of CPU for the idle timeout) is released as incomplete
            "bad_digest": ("digest_mismatch", "incomplete")}
# the attacker waits as long as any wait of the test rather than give a send up: on a loaded
# machine a peer may read nothing for seconds, and an abandoned send would never reach it
PATIENT = TransportConfig(send_timeout_s=CEILING_S, stall_timeout_s=CEILING_S)


def _deliver(sender: Transport, name: str, frames: Sequence[bytes]) -> None:
    """Queue one message (its first frame is retried while the queue is full: nothing of it was sent)."""
    deadline = time.monotonic() + CEILING_S
    while time.monotonic() < deadline:
        if sender.send(name, list(frames)):
            return
        time.sleep(0.02)
    raise AssertionError(f"attacker could not reach {name} in {CEILING_S} s")


def _describe_sender(sender: Transport) -> str:
    """The attacker's side of its sends, for a failure's message."""
    return (f"attacker: sent {dict(sender.messages_sent)} ({dict(sender.bytes_sent_to)} bytes), "
            f"pending {sender.pending_sends()}, dropped {dict(sender.dropped)}, abandoned "
            f"{dict(sender.abandoned)}, redialed {dict(sender.redialed)}, "
            f"handshakes {dict(sender.handshakes)}")


def _counted(found: dict[str, Any], reasons: Sequence[str]) -> int:
    """How many messages ``found`` (a status) counted under ``reasons``, refused or dropped."""
    return int(sum(found["rejections"].get(r, 0) + found["metrics"].get(r, 0) for r in reasons))


def _unmixed_bound(statuses: Statuses, name: str) -> int:
    """How many honest messages ``name`` may drop as stale or duplicate: one per (in-neighbour,
    round) it closed without that neighbour's message (``missed_deadline``, at a deadline or a
    jump) or skipped (``rounds_skipped``, each in-neighbour's), and each message resent to it."""
    metrics = statuses[name]["metrics"]
    neighbours = IN_NEIGHBOURS[name]
    resent = sum(statuses[n]["metrics"].get("resent_on_neighbour_up", 0) for n in neighbours)
    skipped = len(neighbours) * metrics.get("rounds_skipped", 0)
    return int(metrics.get("missed_deadline", 0) + skipped + resent)


def _bad_digest(endpoint: Endpoint, target: str, numel: int) -> list[bytes]:
    """A genuine header of p01 for a model-sized message whose payload does not match its digest."""
    sealed = [bytes(f) for f in wire_messages(endpoint.seal([target], ParamPush(
        round=ATTACK_AT + 1, tensors={"x": torch.zeros(numel)})))]
    sealed[-1] = b"\xff" + sealed[-1][1:]      # the last payload frame altered
    return sealed


Statuses = dict[str, dict[str, Any]]


def _run(files: NetworkFiles, tmp: Path, attack: bool) -> tuple[Statuses, dict[str, Counter[str]]]:
    """One run of the ring, every peer held once at ``ATTACK_AT``; with ``attack``, p01's key sends
    the batteries. The peers' final statuses and what was sent to each target, by the reason the
    target must count it under."""
    config = load_peer_config(files.configs["p01"])
    identity, roster, _ = identity_and_roster(config)
    addresses = {m.name: m.address for m in roster}
    (port,) = reserve_listeners(1)
    # the attacker holds p01's keys, its CurveZMQ pair included: its connections are admitted as p01's
    curve = CurveKeys(public_key=identity.curve_public_key.encode(),
                      secret_key=identity.curve_secret_key.encode(),
                      server_keys={n: roster.member(n).curve_key.encode() for n in TARGETS})
    attacker = Transport(listen=listener_address(port), listen_fd=port.detach(), curve=curve,
                         neighbours={n: addresses[n] for n in TARGETS}, config=PATIENT)
    expected: dict[str, Counter[str]] = {n: Counter() for n in TARGETS}
    gate, marks = tmp / "gate", tmp / "marks"
    marks.mkdir(parents=True)
    try:
        with peers(files) as processes:
            processes.start_all({n: [hold_at(ATTACK_AT, gate, marks, n)] for n in files.configs})
            wait_for_files(marks / f"{n}-held-{ATTACK_AT}" for n in files.configs)
            if attack:
                _attack_held(files, config, identity, roster, attacker, expected)
            gate.touch()
            if attack:
                wait_for_step(files, list(TARGETS), ROUNDS_AT)
                _attack_rounds(files, config, identity, roster, attacker, expected)
                attacker.wait_sent()
            finished = processes.wait(CEILING_S)
            codes = processes.exitcodes()
        assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
        # every message of the attack was handed to the kernel: what the targets count is all it sent
        assert not attacker.abandoned, attacker.abandoned
    finally:
        attacker.close()
    return {name: status(files, name) for name in files.configs}, expected


def _endpoint(files: NetworkFiles, config: Any, identity: Any, roster: Any) -> Endpoint:
    epoch = int((files.out / "data" / "p01" / "epoch").read_text())   # the real p01's
    endpoint = Endpoint(identity, roster, run_id(config.shared()), epoch=epoch)
    endpoint.seq = FIRST_SEQ
    return endpoint


def _attack_held(files: NetworkFiles, config: Any, identity: Any, roster: Any, attacker: Transport,
                 expected: dict[str, Counter[str]]) -> None:
    """While every peer is held at round ``ATTACK_AT`` (the real p01 has sent nothing later):
    non-finite and huge models for the next three rounds, which the targets buffer and refuse at
    the mix (the real p01's messages for those rounds are then duplicates: the key's first word for
    a round is its word), and one model-sized message with a bad digest, ``DIGEST_REPEATS`` times
    (refused before the replay window moves, so every copy is refused the same way)."""
    numel = make_trainer(config).flat_params.numel()
    endpoint = _endpoint(files, config, identity, roster)
    # (the value, the reason; every one also counts in the total, rejected_update: the huge one, a
    # thousand million times the others' norms, is refused by the insider filter's screen)
    values = [(torch.full((numel,), math.nan), "rejected_nonfinite"),
              (torch.full((numel,), math.inf), "rejected_nonfinite"),
              (torch.full((numel,), 1e30), "")]
    for target in TARGETS:
        for offset, (tensor, reason) in enumerate(values, start=1):
            message = ParamPush(round=ATTACK_AT + offset, tensors={"x": tensor})
            _deliver(attacker, target, [bytes(f) for f in wire_messages(endpoint.seal([target], message))])
            expected[target]["rejected_update"] += 1
            if reason:
                expected[target][reason] += 1
            # the real p01's message for that round: a duplicate, or stale if the round closed
            # first (the forged one stood for p01 in it)
            expected[target]["stale_or_duplicate"] += 1
        bad = _bad_digest(endpoint, target, numel)
        for _ in range(DIGEST_REPEATS):
            _deliver(attacker, target, bad)
            expected[target]["bad_digest"] += 1
    attacker.wait_sent()
    # counted before the peers go on: what arrives while a peer is held is still taken in
    deadline = time.monotonic() + CEILING_S
    while time.monotonic() < deadline and not all(
            _counted(status(files, t), COMBINED["bad_digest"]) >= DIGEST_REPEATS for t in TARGETS):
        time.sleep(0.05)
    assert all(_counted(status(files, t), COMBINED["bad_digest"]) >= DIGEST_REPEATS for t in TARGETS), \
        f"{_describe_sender(attacker)}\n{describe(files)}"


def _attack_rounds(files: NetworkFiles, config: Any, identity: Any, roster: Any, attacker: Transport,
                   expected: dict[str, Counter[str]]) -> None:
    """While everyone trains: rounds, sequence numbers and epochs out of any range."""
    endpoint = _endpoint(files, config, identity, roster)
    # just above the held battery's numbers: the real p01's numbers stay within the window below them
    endpoint.seq = FIRST_SEQ + 10
    epoch = endpoint.epoch
    last_round = STEPS - 1
    # (round, epoch, seq or None: the next one, the reason counted)
    battery: list[tuple[int, int, int | None, str]] = [
        (-1, epoch, None, "bad_round"),
        (0, epoch, None, "stale_or_duplicate"),
        (last_round, epoch, None, "catch_up"),
        (2**31, epoch, None, "bad_round"),
        (INT64_MAX, epoch, None, "bad_round"),
        (U64_MAX, epoch, None, "bad_round"),
        (last_round, epoch, 2**62, "seq_jump"),
        (last_round, epoch, U64_MAX, "malformed_header"),
        (last_round, epoch + 2**40, None, "epoch_jump"),
        (last_round, U64_MAX, None, "malformed_header"),
    ]
    next_seq = endpoint.seq
    for round_index, forged_epoch, seq, reason in battery:
        message = ParamPush(round=round_index, tensors={"x": torch.zeros(1)})
        endpoint.epoch = forged_epoch
        for target in TARGETS:
            endpoint.seq = next_seq if seq is None else seq
            next_seq += 1
            sealed = wire_messages(endpoint.seal([target], message))
            _deliver(attacker, target, [bytes(f) for f in sealed])
            expected[target][reason] += 1


def test_one_members_key_moves_no_real_peer_and_costs_no_accuracy_or_memory(tmp_path: Path) -> None:
    clean, _ = _run(make_network(tmp_path / "clean", peers=4, steps=STEPS, gossip={"deadline_s": 60.0}),
                    tmp_path / "clean-hooks", attack=False)
    files = make_network(tmp_path / "net", peers=4, steps=STEPS, gossip={"deadline_s": 60.0})
    statuses, expected = _run(files, tmp_path / "hooks", attack=True)
    for name, found in sorted(statuses.items()):
        assert found["state"] == "finished" and found["step"] == STEPS, describe(files)
        # Before issue 14 the attacker's neighbours jumped to the last round and the ring followed.
        # Now a claim moves a peer only as far as p01 could have trained since it was last heard, at
        # twice the peer's pace: usually a few rounds, but a stall of the real p01 just before the
        # forged claim lends it that stall (seen: 63 rounds after a loaded stretch). Never the claim.
        assert found["metrics"].get("rounds_skipped", 0) < (STEPS - ROUNDS_AT) // 2, (name, found["metrics"])
        assert abs(found["accuracy"] - clean[name]["accuracy"]) <= 0.01, (
            name, found["accuracy"], clean[name]["accuracy"])
        growth_mib = found["memory_peak_mib"] - clean[name]["memory_peak_mib"]
        assert growth_mib < RSS_GROWTH_LIMIT_MIB, (name, found["memory_peak_mib"],
                                                   clean[name]["memory_peak_mib"])
    for name, reasons in expected.items():
        found = statuses[name]
        counted = Counter({reason: _counted(found, [reason]) for reason in reasons if reason not in COMBINED})
        for combined, parts in COMBINED.items():
            counted[combined] = _counted(found, parts)
        # The real p01's messages for the three forged rounds are dropped (the forgery stood for
        # p01 there) and so is the forged round 0; the honest ones beyond those are each a message
        # of a round this peer closed or skipped without it (a deadline, a jump), or a resend.
        forced = reasons.pop("stale_or_duplicate")
        dropped = counted.pop("stale_or_duplicate")
        assert forced <= dropped <= forced + _unmixed_bound(statuses, name), (
            name, dropped, forced, found["metrics"])
        # every refused message is one the attack sent, under the reason it must have (by timing
        # alone, one of the pair named in COMBINED), and nothing else was refused
        assert counted == reasons, (name, counted, found["rejections"], found["metrics"])
        allowed = {r for r in reasons if r not in COMBINED} | {p for c in COMBINED.values() for p in c}
        assert set(found["rejections"]) <= allowed, (name, found["rejections"])
        # the real p01's genuine traffic, and everyone else's, was never refused
        assert not {"replay", "old_epoch"} & set(found["rejections"]), found["rejections"]
    for name in ("p01", "p03"):
        assert statuses[name]["rejections"] == {}, (name, statuses[name]["rejections"])
    for name in clean:     # the clean run refused nothing: what the attacked one counted is the attack's
        assert clean[name]["rejections"] == {}, (name, clean[name]["rejections"])
        # and dropped no message but one of a round closed without it, or a resend (none on an idle machine)
        old_messages = _counted(clean[name], COMBINED["stale_or_duplicate"])
        assert old_messages <= _unmixed_bound(clean, name), (name, clean[name]["metrics"])
