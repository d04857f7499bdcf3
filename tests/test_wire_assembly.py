"""Header-first assembly (protocols/assembly.py), pure: frames pushed by hand, no sockets.

The property that matters most: a message fed one frame at a time through
``Endpoint.receive`` is accepted or refused exactly as ``Endpoint.open``
decides on the whole frame list (the simulator's path), and what a refused
message held is released at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from wire_helpers import Network, flip, make_network, resign

from protocols.assembly import AssemblyConfig, header_message, model_message_bytes, wire_messages
from protocols.codec import REASONS, Frame, Policy, frame_digest
from protocols.identity import SIGNATURE_BYTES
from protocols.messages import Heartbeat, ParamPush
from protocols.wire import Endpoint, Opened, Rejection

SMALL_FRAMES = Policy(max_frame_bytes=1024)


@pytest.fixture(scope="module")
def net() -> Network:
    return make_network()


def push(numel: int = 1000, round_: int = 7) -> ParamPush:
    generator = torch.Generator().manual_seed(numel)
    return ParamPush(round=round_, tensors={"w": torch.randn(numel, generator=generator),
                                           "b": torch.arange(6, dtype=torch.int64).reshape(2, 3)},
                     meta={"compressor": "identity"})


def feed(receiver: Endpoint, frames: Sequence[Frame], connection: bytes = b"c1", now_s: float = 0.0,
         ) -> list[Opened | Rejection]:
    """Every outcome of feeding ``frames`` (single-frame wire messages) off one connection."""
    out = []
    for frame in frames:
        result = receiver.receive(connection, frame, now_s=now_s)
        if result is not None:
            out.append(result)
    return out


def test_wire_messages_put_the_signature_before_the_header(net: Network) -> None:
    sealed = net.endpoint("alice", policy=SMALL_FRAMES).seal(["bob"], push())
    wire = wire_messages(sealed)
    assert len(wire) == len(sealed) - 1
    assert bytes(wire[0]) == bytes(sealed[-1]) + bytes(sealed[0])
    assert all(a is b for a, b in zip(wire[1:], sealed[1:-1], strict=True))     # zero-copy payload
    with pytest.raises(ValueError):
        header_message(sealed[0], b"short")


def test_a_message_fed_frame_by_frame_equals_open(net: Network) -> None:
    alice = net.endpoint("alice", policy=SMALL_FRAMES)
    bob, bob_too = net.endpoint("bob", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    message = push(3000)
    sealed = alice.seal(["bob"], message)
    assert len(sealed) > 5          # a tensor over several frames, one in a single frame
    outcomes = feed(bob, wire_messages(sealed))
    opened = bob_too.open(sealed)
    assert len(outcomes) == 1 and isinstance(outcomes[0], Opened) and isinstance(opened, Opened)
    got = outcomes[0].message
    assert isinstance(got, ParamPush)
    assert isinstance(opened.message, ParamPush)
    for name, tensor in message.tensors.items():
        assert torch.equal(got.tensors[name], tensor) and torch.equal(opened.message.tensors[name], tensor)
    assert got.round == 7 and got.meta == message.meta
    assert bob.accepted == 1 and bob.assembler.pending == 0 and not bob.assembler.in_flight
    assert bob.bytes_received == sum(len(bytes(f)) for f in sealed)
    assert outcomes[0].wire_bytes == opened.wire_bytes == bob.bytes_received


def test_messages_without_payload_complete_on_their_header(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    sealed = alice.seal(["bob"], Heartbeat(step=3, loss=0.25, sent_at_s=1.5))
    wire = wire_messages(sealed)
    assert len(wire) == 1
    [opened] = feed(bob, wire)
    assert isinstance(opened, Opened) and opened.message == Heartbeat(step=3, loss=0.25, sent_at_s=1.5)


def test_connections_assemble_independently(net: Network) -> None:
    alice, gate = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("gate", policy=SMALL_FRAMES)
    bob = net.endpoint("bob", policy=SMALL_FRAMES)
    one, two = wire_messages(alice.seal(["bob"], push(600))), wire_messages(gate.seal(["bob"], push(700)))
    results: list[Any] = []
    for index in range(max(len(one), len(two))):      # interleaved, frame by frame
        if index < len(one):
            results.append(bob.receive(b"alice", one[index], now_s=0.0))
        if index < len(two):
            results.append(bob.receive(b"gate", two[index], now_s=0.0))
    done = [r for r in results if r is not None]
    assert sorted(o.sender for o in done if isinstance(o, Opened)) == ["alice", "gate"]


def _reasons(bob: Endpoint, outcomes: list[Opened | Rejection]) -> list[str]:
    assert bob.rejections["internal_error"] == 0
    return [o.reason if isinstance(o, Rejection) else "accepted" for o in outcomes]


def test_a_bad_digest_is_refused_at_its_frame_and_the_rest_is_skipped(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    wire = wire_messages(alice.seal(["bob"], push(3000)))
    bad = [*wire[:2], flip(wire[2], 5), *wire[3:]]
    assert _reasons(bob, feed(bob, bad)) == ["digest_mismatch"]
    assert bob.assembler.frames_dropped["after_rejection"] == len(wire) - 3   # unread
    assert bob.assembler.pending == 0 and not bob.assembler.in_flight
    # the window did not move: the genuine message is accepted afterwards, on the same connection
    assert _reasons(bob, feed(bob, wire)) == ["accepted"]


def test_a_refused_header_costs_one_count_and_its_frames_are_skipped(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    sealed = alice.seal(["bob"], push(3000))
    forged = [*sealed[:-1], flip(sealed[-1], 0)]
    assert _reasons(bob, feed(bob, wire_messages(forged))) == ["bad_signature"]
    assert bob.rejections == {"bad_signature": 1}
    assert bob.assembler.frames_dropped["after_rejection"] == len(sealed) - 2
    assert _reasons(bob, feed(bob, wire_messages(sealed))) == ["accepted"]
    assert _reasons(bob, feed(bob, wire_messages(sealed))) == ["replay"]    # and its frames skipped
    assert bob.assembler.frames_dropped["after_rejection"] == 2 * (len(sealed) - 2)


def test_unannounced_frames_are_dropped_unread(net: Network) -> None:
    bob = net.endpoint("bob", policy=Policy(max_header_bytes=4096))
    big = bytes(SIGNATURE_BYTES + 4097)         # nobody announced it, and it is too long for a header
    assert feed(bob, [big, big]) == []
    assert bob.assembler.frames_dropped["unannounced"] == 2 and not bob.rejections
    # a short one is read as a header, and refused as one
    assert _reasons(bob, feed(bob, [b"x" * 10, bytes(SIGNATURE_BYTES + 10)])) == ["malformed_header"] * 2


def test_more_frames_than_announced_are_read_as_headers(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    wire = wire_messages(alice.seal(["bob"], push(3000)))
    extra = bytes(2048)     # over the header limit? no: treated as a header attempt and refused
    outcomes = feed(bob, [*wire, wire[1], extra])
    assert _reasons(bob, outcomes)[0] == "accepted"
    assert all(r != "accepted" for r in _reasons(bob, outcomes)[1:])
    assert bob.assembler.pending == 0


@pytest.mark.parametrize(("cut", "reason"), [
    ("longer", "frame_too_large"), ("last_short", "manifest_mismatch"), ("recut", "accepted")])
def test_frame_sizes_are_checked_as_they_arrive(net: Network, cut: str, reason: str) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    sealed = alice.seal(["bob"], push(3000))
    payload = [bytes(f) for f in sealed[1:-1]]
    last = len(payload) - 2                     # the first tensor's last frame (736 of 12,000 bytes)
    if cut == "longer":
        payload[0] = payload[0] + b"\x00"        # over max_frame_bytes
    elif cut == "last_short":
        payload[last] = payload[last][:-1]
    else:                                       # 8 bytes moved from the first frame to the last one
        payload[0], payload[last] = payload[0][:-8], payload[0][-8:] + payload[last]
    forged = resign([sealed[0], *payload, sealed[-1]], net.identities["alice"],
                    lambda h: h.update(d=[frame_digest(p) for p in payload]))
    outcomes = feed(bob, wire_messages(forged))
    assert _reasons(bob, outcomes) == [reason]
    assert bob.assembler.frames_dropped["size_mismatch"] == (reason != "accepted")
    assert bob.assembler.pending == 0 and not bob.assembler.in_flight
    # the whole-list path decides the same
    whole = net.endpoint("bob", policy=SMALL_FRAMES).open(forged)
    assert (whole.reason if isinstance(whole, Rejection) else "accepted") == reason


def test_a_silent_connection_releases_its_buffers(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    bob.use(assembly=AssemblyConfig(idle_timeout_s=5.0))
    wire = wire_messages(alice.seal(["bob"], push(3000)))
    assert feed(bob, wire[:3], now_s=10.0) == []
    assert bob.assembler.pending == 1 and sum(bob.assembler.in_flight.values()) > 0
    assert bob.expire(14.9) == []                       # not silent long enough
    [released] = bob.expire(15.0)
    assert released.reason == "incomplete" and released.sender == "alice"
    assert bob.rejections == {"incomplete": 1}
    assert bob.assembler.pending == 0 and not bob.assembler.in_flight
    # the rest of that message, arriving late, is read as headers and refused; nothing is accepted
    late = feed(bob, wire[3:], now_s=16.0)
    assert all(isinstance(o, Rejection) for o in late)


def test_a_sender_may_not_announce_more_than_its_bound(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    wire_one = wire_messages(alice.seal(["bob"], push(3000)))
    wire_two = wire_messages(alice.seal(["bob"], push(3001)))
    total = 3000 * 4 + 6 * 8
    bob.use(assembly=AssemblyConfig(max_in_flight_bytes=total + 100))
    assert feed(bob, wire_one[:2], connection=b"first") == []      # in flight on one connection
    # the same sender on a second connection: its bytes in flight would pass the bound
    assert _reasons(bob, feed(bob, wire_two, connection=b"second")) == ["in_flight_exceeded"]
    assert _reasons(bob, feed(bob, wire_one[2:], connection=b"first")) == ["accepted"]
    assert not bob.assembler.in_flight


def test_a_closed_connection_releases_what_it_was_assembling_at_once(net: Network) -> None:
    """A connection that closes half way through a message (its sender cut, or punished) frees its
    sender's bytes in flight when the transport reports the close, not at the idle timeout: the same
    sender's next message, on a new connection, fits the bound again."""
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    wire_one = wire_messages(alice.seal(["bob"], push(3000)))
    wire_two = wire_messages(alice.seal(["bob"], push(3001)))
    bob.use(assembly=AssemblyConfig(max_in_flight_bytes=3000 * 4 + 6 * 8 + 100))
    assert feed(bob, wire_one[:2], connection=b"first", now_s=1.0) == []
    assert bob.forget(b"other") is None                 # a connection that held nothing: nothing to say
    released = bob.forget(b"first")
    assert released is not None and released.reason == "incomplete" and released.sender == "alice"
    assert bob.rejections == {"incomplete": 1} and not bob.assembler.in_flight
    assert bob.assembler.pending == 0 and bob.expire(100.0) == []    # nothing left to time out
    assert _reasons(bob, feed(bob, wire_two, connection=b"second", now_s=2.0)) == ["accepted"]


def test_the_message_limit_follows_the_model() -> None:
    assert model_message_bytes(1000, header_bytes=1 << 20) == 16_000 + (1 << 20)
    alice_push = push(3000)
    net = make_network()
    limit = model_message_bytes(100, header_bytes=0)
    bob = net.endpoint("bob", policy=Policy(max_message_bytes=limit))
    sealed = net.endpoint("alice").seal(["bob"], alice_push)
    assert _reasons(bob, feed(bob, wire_messages(sealed))) == ["message_too_large"]
    assert bob.assembler.frames_dropped["after_rejection"] == len(sealed) - 2


MUTATIONS = [
    lambda h: h.update(v=2), lambda h: h.update(k="nope"), lambda h: h["f"].update(round="x"),
    lambda h: h["t"][0].__setitem__(4, 2), lambda h: h["t"][0].__setitem__(2, [2999]),
    lambda h: h["d"].__setitem__(0, b"\x00" * 32), lambda h: h["d"].__setitem__(1, b"short"),
    lambda h: h.update(r=[]), lambda h: h.update(run=b"other"), lambda h: h["t"].pop(0),
]


@pytest.mark.parametrize("index", range(len(MUTATIONS)))
def test_assembly_and_open_refuse_for_the_same_reason(net: Network, index: int) -> None:
    alice = net.endpoint("alice", policy=SMALL_FRAMES)
    sealed = alice.seal(["bob"], push(3000))
    forged = resign(sealed, net.identities["alice"], MUTATIONS[index])
    whole = net.endpoint("bob", policy=SMALL_FRAMES).open(forged)
    bob = net.endpoint("bob", policy=SMALL_FRAMES)
    outcomes = feed(bob, wire_messages(forged))
    assert isinstance(whole, Rejection)
    assert _reasons(bob, outcomes)[0] == whole.reason
    assert all(reason in REASONS for reason in bob.rejections)
    assert bob.assembler.pending == 0 and not bob.assembler.in_flight


def test_a_rejected_message_pins_no_buffer(net: Network) -> None:
    """The same bad-digest bytes a hundred times: every gathered buffer is let go at once."""
    alice = net.endpoint("alice", policy=SMALL_FRAMES)
    handed_out: list[weakref.ref[torch.Tensor]] = []

    def allocate(dtype: torch.dtype, numel: int) -> torch.Tensor:
        buffer = torch.empty(numel, dtype=dtype)
        handed_out.append(weakref.ref(buffer))
        return buffer

    bob = net.endpoint("bob", policy=SMALL_FRAMES)
    bob.use(allocate=allocate)
    wire = wire_messages(alice.seal(["bob"], push(3000)))
    bad = [*wire[:-2], flip(wire[-2], 3), wire[-1]]     # the first tensor's last frame is wrong
    for _ in range(100):
        assert _reasons(bob, feed(bob, bad)) == ["digest_mismatch"]
    assert len(handed_out) == 100
    assert all(ref() is None for ref in handed_out)     # nobody holds any of them


def test_frames_out_of_order_are_refused_at_the_first_misplaced_one(net: Network) -> None:
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    wire = wire_messages(alice.seal(["bob"], push(3000)))
    swapped = [wire[0], wire[2], wire[1], *wire[3:]]        # two full 1 KiB frames of one tensor
    assert _reasons(bob, feed(bob, swapped)) == ["digest_mismatch"]
    assert bob.rejections["digest_mismatch"] == 1 and bob.assembler.pending == 0
    assert bob.assembler.frames_dropped["after_rejection"] == len(wire) - 2
    # a payload frame first, with nothing announced: read as a header and refused as one
    assert _reasons(bob, feed(bob, wire[1:2], connection=b"c2")) == ["malformed_header"]
