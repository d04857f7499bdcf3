"""Round trips through seal/open over every message kind, dtype and shape (Hypothesis)."""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_helpers import Network, make_network

from protocols.codec import DTYPES, MAX_FRAME_BYTES, Policy
from protocols.messages import MESSAGE_TYPES, Message, ParamPush
from protocols.wire import Opened, Rejection

NET = make_network()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any allowed dtype and shape (empty and 0-d included), any bit pattern (NaN, inf, ...)."""
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    numel = 1
    for dim in shape:
        numel *= dim
    if dtype == torch.bool:
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=numel, max_size=numel)))
    else:
        raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape) if raw else \
        torch.empty(shape, dtype=dtype)
    if draw(st.booleans()) and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)  # not contiguous: seal copies it once
    return tensor


SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False),
    "str": st.text(max_size=30),
    "bool": st.booleans(),
}
META_VALUES = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=10),
                        st.booleans())


@st.composite
def messages(draw: st.DrawFn) -> Message:
    cls = draw(st.sampled_from(MESSAGE_TYPES))
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        if item.name == "tensors":
            kwargs["tensors"] = draw(st.dictionaries(st.text(max_size=12), tensors(), max_size=4))
        elif item.name == "meta":
            kwargs["meta"] = draw(st.dictionaries(st.text(max_size=12), META_VALUES, max_size=4))
        else:
            kwargs[item.name] = draw(SCALARS[hints[item.name].__name__])
    return cls(**kwargs)  # type: ignore[no-any-return]


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(received: Message, sent: Message) -> None:
    assert type(received) is type(sent)
    for item in dataclasses.fields(sent):
        got, want = getattr(received, item.name), getattr(sent, item.name)
        if item.name == "tensors":
            assert list(got) == list(want)
            for name in want:
                assert got[name].dtype == want[name].dtype
                assert got[name].shape == want[name].shape
                assert as_bytes(got[name]) == as_bytes(want[name])
        else:
            assert got == want and type(got) is type(want)


@SETTINGS
@given(message=messages(), frame_bytes=st.sampled_from([3, 64, MAX_FRAME_BYTES]),
       recipients=st.lists(st.sampled_from(["alice", "bob", "gate"]), min_size=1, max_size=3, unique=True))
def test_every_message_round_trips(message: Message, frame_bytes: int, recipients: list[str]) -> None:
    policy = Policy(max_frame_bytes=frame_bytes, max_frames=1 << 16)
    sender = NET.endpoint("gate", policy=policy)  # a gateway may send every kind
    frames = sender.seal(recipients, message)
    assert all(len(memoryview(f).cast("B")) <= max(frame_bytes, len(frames[0])) for f in frames[:-1])
    for name in ("alice", "bob", "gate"):
        receiver = NET.endpoint(name, policy=policy)
        result = receiver.open([bytes(f) for f in frames])  # as a socket would deliver them
        if name in recipients:
            assert isinstance(result, Opened), result
            assert (result.sender, result.seq) == ("gate", 0)
            assert_same(result.message, message)
        else:
            assert isinstance(result, Rejection) and result.reason == "not_a_recipient"
        assert receiver.rejections["internal_error"] == 0


@SETTINGS
@given(tensor=tensors())
def test_frames_shared_or_copied_tensors_equal(tensor: torch.Tensor) -> None:
    sender, receiver = NET.endpoint("alice"), NET.endpoint("bob")
    message = ParamPush(round=1, tensors={"t": tensor})
    result = receiver.open(sender.seal(["bob"], message))  # memoryview frames, zero-copy both ways
    assert isinstance(result, Opened)
    assert_same(result.message, message)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_multi_frame_tensor_of_each_dtype(net_dtype: Network, dtype: str) -> None:
    policy = Policy(max_frame_bytes=1000)
    sender, receiver = net_dtype.endpoint("alice", policy=policy), net_dtype.endpoint("bob", policy=policy)
    generator = torch.Generator().manual_seed(1)
    tensor = torch.randint(0, 2, (33, 41), generator=generator).to(DTYPES[dtype])
    if dtype not in ("bool", "uint8"):
        tensor = torch.randn(33, 41, generator=generator).mul(50).to(DTYPES[dtype])
    frames = sender.seal(["bob"], ParamPush(round=1, tensors={"t": tensor}))
    assert len(frames) - 2 == -(-tensor.numel() * tensor.element_size() // 1000)
    result = receiver.open([bytes(f) for f in frames])
    assert isinstance(result, Opened)
    assert torch.equal(result.message.tensors["t"], tensor)


def test_reused_receive_buffer(net_dtype: Network) -> None:
    policy = Policy(max_frame_bytes=1024)
    buffer = torch.empty(1000)
    receiver = net_dtype.endpoint("bob", policy=policy)
    receiver = type(receiver)(net_dtype.identities["bob"], net_dtype.roster, net_dtype.run_id, 1, policy,
                              allocate=lambda dtype, numel: buffer)
    tensor = torch.randn(1000)
    result = receiver.open(net_dtype.endpoint("alice", policy=policy).seal(
        ["bob"], ParamPush(round=1, tensors={"t": tensor})))
    assert isinstance(result, Opened)
    assert result.message.tensors["t"].data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer, tensor)


@pytest.fixture(scope="module")
def net_dtype() -> Network:
    return NET
