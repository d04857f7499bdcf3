"""Byte accounting against the real codec: every operator's message, sealed through an Endpoint."""

from __future__ import annotations

import pytest
import torch

from protocols.compress import RngKey, from_spec, pack, unpack
from protocols.compress.accounting import endpoint_message_bytes, message_bytes
from protocols.identity import Identity
from protocols.messages import ParamPush
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint, Opened, Policy, wire_size

SPECS = [
    "identity", "fp16", "bf16", "qsgd:bits=8", "qsgd:bits=8,bucket=0", "qsgd:bits=4", "qsgd:bits=2",
    "topk:fraction=0.01",
    "topk-approx:fraction=0.01", "randomk:fraction=0.01", "randomk:fraction=0.01,unbiased=true",
    "sign", "powersgd:rank=4",
]
SHAPES = [(64, 32), (64,), (10, 64), (10,), (3, 3, 5, 5)]  # 2,048 + 64 + 640 + 10 + 225 = 2,987


@pytest.fixture(scope="module")
def endpoints() -> tuple[Endpoint, Endpoint]:
    identities = {name: Identity.generate() for name in ("a", "b")}
    roster = Roster.from_dict({"member": [
        {"name": name, "public_id": ident.public_id, "role": "peer", "address": f"tcp://127.0.0.1:{7100 + i}"}
        for i, (name, ident) in enumerate(identities.items())
    ]})
    rid = run_id({"roster": roster, "compression": "all"})
    return Endpoint(identities["a"], roster, rid, 1), Endpoint(identities["b"], roster, rid, 1)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("numel", [0, 2987, 40_000])
def test_bytes_on_wire_equal_the_sealed_frames(
    spec: str, numel: int, endpoints: tuple[Endpoint, Endpoint]
) -> None:
    sender, receiver = endpoints
    shapes = SHAPES if numel == 2987 else None
    op = from_spec(spec, shapes=shapes)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    c = op.compress(x, RngKey(3, "a", 9))
    tensors, meta = pack(c, "params")
    message = ParamPush(round=9, tensors=tensors, meta={**meta, "lr": 0.1})

    predicted = endpoint_message_bytes(sender, ["b"], message)
    frames = sender.seal(["b"], message)

    assert predicted == wire_size(frames) == sum(len(memoryview(frame).cast("B")) for frame in frames)
    assert wire_size(frames[1:-1]) == c.payload_bytes
    opened = receiver.open(frames)
    assert isinstance(opened, Opened), opened
    assert isinstance(opened.message, ParamPush)
    back = unpack(opened.message.tensors, opened.message.meta, "params", numel=numel)
    assert torch.equal(op.decompress(back), op.decompress(c))


def test_bytes_on_wire_with_many_frames(endpoints: tuple[Endpoint, Endpoint]) -> None:
    _, receiver = endpoints
    sender = Endpoint(endpoints[0].identity, endpoints[0].roster, endpoints[0].run_id, 2,
                      Policy(max_frame_bytes=1000))
    for spec in ("identity", "topk:fraction=0.1", "qsgd:bits=4"):
        c = from_spec(spec).compress(torch.randn(30_000), RngKey(1, "a", 1))
        tensors, meta = pack(c, "x")
        message = ParamPush(round=1, tensors=tensors, meta=meta)
        predicted = endpoint_message_bytes(sender, ["b"], message)
        frames = sender.seal(["b"], message)
        assert len(frames) > 10
        assert predicted == wire_size(frames)
        assert isinstance(receiver.open(frames), Opened)


def test_message_bytes_tracks_sequence_width_and_recipients(endpoints: tuple[Endpoint, Endpoint]) -> None:
    message = ParamPush(round=1, tensors={"w": torch.zeros(10)})
    small = message_bytes(message, seq=5)
    assert message_bytes(message, seq=500) == small + 2  # msgpack uint16 instead of a fixint
    assert message_bytes(message, recipients=3) == small + 2 * (32 + 2)  # bin8 of 32 bytes each
