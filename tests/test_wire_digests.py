"""The wire's driver hooks: digests on threads (same bytes, same checks) and the reused receive buffers."""

from __future__ import annotations

import torch

from peer.net.digests import BufferPool, ThreadDigester
from protocols.codec import Policy, frame_digest, serial_digests
from protocols.messages import Message, ParamPush
from protocols.wire import Opened, Rejection
from tests.wire_helpers import make_network

SMALL_FRAMES = Policy(max_frame_bytes=4096)     # so a small tensor spreads over many frames


def tensor_of(message: Message, name: str) -> torch.Tensor:
    assert isinstance(message, ParamPush)
    return message.tensors[name]


def test_threaded_digests_equal_the_serial_ones() -> None:
    frames = [bytes([i]) * (1000 + i) for i in range(9)] + [memoryview(b"x" * (2 << 20))]
    digester = ThreadDigester(2)
    try:
        assert digester(frames)() == serial_digests(frames)() == [frame_digest(f) for f in frames]
        assert digester([b"tiny"])() == [frame_digest(b"tiny")]
    finally:
        digester.close()


def test_threaded_endpoints_interoperate_and_still_catch_a_flipped_byte() -> None:
    net = make_network()
    digester = ThreadDigester(2)
    try:
        alice = net.endpoint("alice", policy=SMALL_FRAMES)
        alice.use(digest=digester)
        serial_bob = net.endpoint("bob", policy=SMALL_FRAMES)
        threaded_bob = net.endpoint("bob", policy=SMALL_FRAMES)
        threaded_bob.use(digest=digester)
        x = torch.arange(10_000, dtype=torch.float32)
        frames = [bytes(f) for f in alice.seal(["bob"], ParamPush(round=3, tensors={"x": x}))]
        assert len(frames) == 2 + 10
        for bob in (serial_bob, threaded_bob):
            opened = bob.open(frames)
            assert isinstance(opened, Opened) and torch.equal(tensor_of(opened.message, "x"), x)
        torn = list(frames)
        torn[5] = torn[5][:100] + bytes([torn[5][100] ^ 1]) + torn[5][101:]
        fresh_bob = net.endpoint("bob", policy=SMALL_FRAMES)
        fresh_bob.use(digest=digester)
        rejected = fresh_bob.open(torn)
        assert isinstance(rejected, Rejection) and rejected.reason == "digest_mismatch"
        assert fresh_bob.rejections == {"digest_mismatch": 1}
    finally:
        digester.close()


def test_bool_tensor_with_a_torn_frame_is_a_digest_mismatch_not_a_bad_field() -> None:
    net = make_network()
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    flags = torch.zeros(10_000, dtype=torch.bool)
    frames = [bytes(f) for f in alice.seal(["bob"], ParamPush(round=0, tensors={"b": flags}))]
    frames[2] = b"\xfe" + frames[2][1:]        # not a bool byte, and not what was signed
    rejected = bob.open(frames)
    assert isinstance(rejected, Rejection) and rejected.reason == "digest_mismatch"


def test_pool_reuses_a_buffer_only_once_nothing_holds_it() -> None:
    pool = BufferPool(max_buffers=2)
    first = pool.allocate(torch.float32, 100)
    kept = first.view(10, 10)[2:]        # a machine keeps a view for a later round
    del first
    second = pool.allocate(torch.float32, 100)
    assert second.data_ptr() != kept.data_ptr() - 20 * 4 and pool.fresh == 2 and pool.reused == 0
    held_ptr = second.data_ptr()
    del second
    third = pool.allocate(torch.float32, 100)
    assert pool.reused == 1 and third.data_ptr() == held_ptr
    third.fill_(7.0)
    assert not bool((kept == 7.0).any())            # the held buffer was never handed out again
    as_numpy = memoryview(third.numpy())  # type: ignore[arg-type]  # a frame in flight holds it too
    del third
    assert pool.held == 2
    fourth = pool.allocate(torch.float32, 100)      # both held: a fresh one, not kept (pool full)
    assert pool.fresh == 3 and len(pool) == 2 and fourth.data_ptr() != held_ptr
    del as_numpy, kept, fourth
    assert pool.held == 0
    assert pool.allocate(torch.float32, 100) is not None and pool.reused == 2


def test_pool_gathers_received_tensors_and_a_machine_holding_them_blocks_reuse() -> None:
    net = make_network()
    pool = BufferPool(max_buffers=4)
    alice, bob = net.endpoint("alice", policy=SMALL_FRAMES), net.endpoint("bob", policy=SMALL_FRAMES)
    bob.use(allocate=pool.allocate)
    held = []
    for round_index in range(3):
        x = torch.full((5000,), float(round_index))
        opened = bob.open(alice.seal(["bob"], ParamPush(round=round_index, tensors={"x": x})))
        assert isinstance(opened, Opened)
        held.append(tensor_of(opened.message, "x"))       # buffered for a future round
    assert pool.fresh == 3 and pool.reused == 0
    assert [float(t[0]) for t in held] == [0.0, 1.0, 2.0]   # nothing overwritten
    held.clear()
    opened = bob.open(alice.seal(["bob"], ParamPush(round=9, tensors={"x": torch.ones(5000)})))
    assert isinstance(opened, Opened) and pool.reused == 1
    assert bool((tensor_of(opened.message, "x") == 1).all())
