"""A member's bad-digest messages over real sockets never pin memory (issue 14, class 2).

One roster key signs 100 messages whose headers are genuine and whose last
payload frame does not match its digest, each announcing a tensor of another
size (an attacker's way to fill a pool that kept any size), sent over the
ZeroMQ transport on 127.0.0.1 to a receiver that runs the daemon's receive
path: Transport.poll, Endpoint.receive, a BufferPool bounded as the daemon
bounds it. Every message must be refused as digest_mismatch, nothing may stay
in assembly, the pool must keep only the model's size, and the receiver's RSS
after 100 messages must not have grown past what the first 10 cost.
"""

from __future__ import annotations

import time

import pytest
import torch
from wire_helpers import make_network, resign

from peer.net.digests import BufferPool
from peer.net.transport import Transport, listener_address, reserve_listeners
from protocols.assembly import wire_messages
from protocols.codec import Policy, frame_digest
from protocols.messages import ParamPush
from protocols.wire import Endpoint, Rejection

pytestmark = pytest.mark.processes

MODEL_NUMEL = 2 << 20               # 8 MiB of float32: the model the receiver's pool is sized for
FRAME_BYTES = 1 << 20               # 8 frames per message, so every tensor is gathered into a buffer
MESSAGES = 100


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _bad_digest_message(alice: Endpoint, numel: int) -> list[bytes | memoryview]:
    """A genuine header for a tensor of ``numel`` whose last frame arrives altered."""
    sealed = alice.seal(["bob"], ParamPush(round=1, tensors={"params": torch.ones(numel)}))
    payload = [bytes(frame) for frame in sealed[1:-1]]
    digests = [frame_digest(frame) for frame in payload]
    payload[-1] = b"\xff" + payload[-1][1:]
    forged = resign([sealed[0], *payload, sealed[-1]], alice.identity, lambda h: h.update(d=digests))
    return wire_messages(forged)


def test_a_hundred_bad_digest_messages_pin_no_memory() -> None:
    net = make_network()
    policy = Policy(max_frame_bytes=FRAME_BYTES)
    alice, bob = net.endpoint("alice", policy=policy), net.endpoint("bob", policy=policy)
    pool = BufferPool(4, max_bytes=4 * MODEL_NUMEL * 4, sizes=frozenset({(torch.float32, MODEL_NUMEL)}))
    bob.use(allocate=pool.allocate)
    # the sizes vary around the model's: a pool that kept any size would fill with them
    sizes = [MODEL_NUMEL - 1024 * (index % 50) for index in range(MESSAGES)]
    la, lb = reserve_listeners(2)
    a_address, b_address = listener_address(la), listener_address(lb)
    sender = Transport(listen=a_address, neighbours={"bob": b_address}, listen_fd=la.detach())
    receiver = Transport(listen=b_address, neighbours={}, listen_fd=lb.detach())
    outcomes: list[Rejection] = []
    rss_after_10 = 0
    try:
        for index, numel in enumerate(sizes):
            frames = _bad_digest_message(alice, numel)
            deadline = time.monotonic() + 10.0
            while not sender.send("bob", frames):
                assert time.monotonic() < deadline, "never connected"
                time.sleep(0.02)
            # the receiver drains while the sender's queue empties, as the daemon's loop does
            while len(outcomes) <= index and time.monotonic() < deadline:
                for arrival in receiver.poll(0.05):
                    result = bob.receive(arrival.connection, arrival.frame.buffer, now_s=0.0)
                    if result is not None:
                        assert isinstance(result, Rejection)
                        outcomes.append(result)
            sender.wait_sent(10.0)
            del frames
            if index == 9:
                rss_after_10 = _rss_bytes()
        rss_after_100 = _rss_bytes()
    finally:
        sender.close()
        receiver.close()
    assert [o.reason for o in outcomes] == ["digest_mismatch"] * MESSAGES
    assert bob.rejections == {"digest_mismatch": MESSAGES} and bob.accepted == 0
    assert bob.assembler.pending == 0 and not bob.assembler.in_flight
    assert len(pool) <= 1 and pool.held == 0     # only the model's size is ever kept
    assert pool.bytes <= MODEL_NUMEL * 4
    growth = rss_after_100 - rss_after_10
    assert growth < 64 << 20, f"RSS grew {growth / 2**20:.0f} MiB over 90 refused messages"
