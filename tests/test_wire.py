"""Endpoint seal/open: every refusal has its own reason, and nothing raises."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
import torch
from blake3 import blake3
from wire_helpers import Network, flip, make_network, resign

from protocols.codec import MAX_FRAME_BYTES, REASONS, Policy, encode
from protocols.messages import PROTOCOL_VERSION, ClientUpdate, Heartbeat, ParamPull, ParamPush, RoundStart
from protocols.wire import Endpoint, Opened, Rejection, wire_size


@pytest.fixture(scope="module")
def net() -> Network:
    return make_network()


def push(numel: int = 1000) -> ParamPush:
    generator = torch.Generator().manual_seed(numel)
    return ParamPush(round=7, tensors={"w": torch.randn(numel, generator=generator),
                                       "b": torch.arange(6, dtype=torch.int64).reshape(2, 3)},
                     meta={"compressor": "identity", "scale": 0.5})


def reason_of(receiver: Endpoint, frames: Any) -> str:
    result = receiver.open(frames)
    assert isinstance(result, Rejection), "expected a rejection"
    assert receiver.rejections["internal_error"] == 0
    assert result.reason in REASONS
    return result.reason


def test_seal_open_round_trip_counts_bytes(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    message = push()
    frames = alice.seal(["bob"], message)
    opened = bob.open(frames)
    assert isinstance(opened, Opened)
    assert (opened.sender, opened.epoch, opened.seq) == ("alice", 1, 0)
    assert opened.message.round == 7 and opened.message.meta == message.meta
    for name, tensor in message.tensors.items():
        assert torch.equal(opened.message.tensors[name], tensor)
    assert alice.bytes_sent == wire_size(frames) > 4000
    assert bob.bytes_received == wire_size(frames)
    assert bob.accepted == 1 and not bob.rejections


def test_payload_frames_share_the_tensor_memory(net: Network) -> None:
    tensor = torch.randn(1000)
    frames = net.endpoint("alice").seal(["bob"], ParamPush(round=0, tensors={"w": tensor}))
    assert isinstance(frames[1], memoryview)
    tensor[0] = 123.0  # a zero-copy frame sees the change
    assert torch.frombuffer(bytearray(frames[1]), dtype=torch.float32)[0] == 123.0


def test_sequence_numbers_grow(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    seqs = []
    for _ in range(3):
        opened = bob.open(alice.seal(["bob"], Heartbeat(step=1)))
        assert isinstance(opened, Opened)
        seqs.append(opened.seq)
    assert seqs == [0, 1, 2]


def test_multi_frame_tensor_is_split_and_rebuilt(net: Network) -> None:
    policy = Policy(max_frame_bytes=1024)
    alice, bob = net.endpoint("alice", policy=policy), net.endpoint("bob", policy=policy)
    message = push(numel=1000)  # 4000 bytes -> 4 frames
    frames = alice.seal(["bob"], message)
    assert len(frames) == 2 + 4 + 1
    assert max(wire_size([f]) for f in frames[1:-1]) <= 1024
    opened = bob.open(frames)
    assert isinstance(opened, Opened)
    assert torch.equal(opened.message.tensors["w"], message.tensors["w"])


def test_flipped_payload_byte_is_exactly_digest_mismatch(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    frames = list(alice.seal(["bob"], push()))
    frames[1] = flip(frames[1], 17)
    assert reason_of(bob, frames) == "digest_mismatch"


def test_flipped_signature_byte_is_exactly_bad_signature(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    frames = list(alice.seal(["bob"], push()))
    for index in (0, 31, 63):
        broken = [*frames[:-1], flip(frames[-1], index)]
        assert reason_of(bob, broken) == "bad_signature"
    assert isinstance(bob.open(frames), Opened)  # the window did not move on the forgeries


def test_no_flipped_header_byte_is_ever_accepted(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    frames = list(alice.seal(["bob"], push(numel=10)))
    header = frames[0]
    assert isinstance(header, bytes)
    for index in range(len(header)):
        for mask in (0x01, 0x80):
            assert not isinstance(bob.open([flip(header, index, mask), *frames[1:]]), Opened)
    assert bob.rejections["internal_error"] == 0
    assert isinstance(bob.open(frames), Opened)


def test_replay_is_refused_and_window_tolerates_reordering(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob", policy=Policy(replay_window=8))
    sealed = [alice.seal(["bob"], Heartbeat(step=i)) for i in range(12)]
    assert isinstance(bob.open(sealed[5]), Opened)
    assert isinstance(bob.open(sealed[3]), Opened)  # late but new
    assert reason_of(bob, sealed[3]) == "replay"
    assert reason_of(bob, sealed[5]) == "replay"
    assert isinstance(bob.open(sealed[11]), Opened)
    assert reason_of(bob, sealed[2]) == "replay"  # fell out of the 8-wide window
    assert isinstance(bob.open(sealed[4]), Opened)  # still inside it


def test_new_epoch_resets_and_old_epoch_is_refused(net: Network) -> None:
    bob = net.endpoint("bob")
    old_boot, new_boot = net.endpoint("alice", epoch=4), net.endpoint("alice", epoch=5)
    stale = old_boot.seal(["bob"], Heartbeat(step=1))
    assert isinstance(bob.open(new_boot.seal(["bob"], Heartbeat(step=1))), Opened)
    assert reason_of(bob, stale) == "old_epoch"


def test_not_a_recipient_so_no_replay_to_another_peer(net: Network) -> None:
    alice, bob, gate = net.endpoint("alice"), net.endpoint("bob"), net.endpoint("gate")
    frames = alice.seal(["gate"], push())
    assert reason_of(bob, frames) == "not_a_recipient"
    assert isinstance(gate.open(frames), Opened)
    both = alice.seal(["gate", "bob"], Heartbeat(step=1))
    assert isinstance(gate.open(both), Opened) and isinstance(bob.open(both), Opened)


def test_wrong_run_is_config_mismatch(net: Network) -> None:
    other = Endpoint(net.identities["alice"], net.roster, b"\x01" * 32, 1)
    assert reason_of(net.endpoint("bob"), other.seal(["bob"], Heartbeat(step=1))) == "config_mismatch"


def test_unknown_sender(net: Network) -> None:
    frames = encode(Heartbeat(step=1), identity=net.identities["mallory"],
                    recipients=[net.identities["bob"].public_key], run_id=net.run_id, epoch=0, seq=0)
    assert reason_of(net.endpoint("bob"), frames) == "unknown_sender"


def test_wrong_role(net: Network) -> None:
    phone, gate, bob = net.endpoint("phone"), net.endpoint("gate"), net.endpoint("bob")
    assert reason_of(gate, phone.seal(["gate"], push())) == "wrong_role"  # edge may not gossip
    assert reason_of(gate, bob.seal(["gate"], RoundStart(round=1))) == "wrong_role"  # peers don't run rounds
    update = ClientUpdate(round=1, num_samples=10, tensors={"w": torch.ones(3)})
    assert isinstance(gate.open(phone.seal(["gate"], update)), Opened)


def test_truncated_and_extra_frames(net: Network) -> None:
    policy = Policy(max_frame_bytes=1024)
    alice, bob = net.endpoint("alice", policy=policy), net.endpoint("bob", policy=policy)
    frames = list(alice.seal(["bob"], push()))
    assert reason_of(bob, [*frames[:2], *frames[3:]]) == "manifest_mismatch"  # a payload frame lost
    assert reason_of(bob, [*frames[:-1], b"extra", frames[-1]]) == "manifest_mismatch"
    assert reason_of(bob, frames[:1]) == "malformed_header"  # no signature frame at all
    assert reason_of(bob, []) == "malformed_header"
    assert reason_of(bob, [frames[0], *frames[1:-1], frames[-1][:10]]) == "bad_signature"


def test_too_many_actual_frames(net: Network) -> None:
    bob = net.endpoint("bob", policy=Policy(max_frames=4))
    frames = net.endpoint("alice").seal(["bob"], Heartbeat(step=1))
    assert reason_of(bob, [frames[0], *[b"x"] * 5, frames[-1]]) == "too_many_frames"


def _set_manifest(index: int, position: int, value: Any) -> Any:
    def mutate(header: dict[str, Any]) -> None:
        header["t"][index][position] = value
    return mutate


@pytest.mark.parametrize(("mutate", "policy", "reason"), [
    (lambda h: h.update(v=PROTOCOL_VERSION + 1), Policy(), "version_unsupported"),
    (lambda h: h.update(v=float(PROTOCOL_VERSION)), Policy(), "version_unsupported"),   # 1.0 == 1, not an int
    (lambda h: h.update(v=True), Policy(), "version_unsupported"),
    (lambda h: h.update(k="no_such_kind"), Policy(), "unknown_kind"),
    (lambda h: h.update(e="one"), Policy(), "malformed_header"),
    (lambda h: h.update(t="not a list"), Policy(), "malformed_header"),
    (lambda h: h["f"].update(round="seven"), Policy(), "bad_field"),
    (lambda h: h["f"].update(extra=1), Policy(), "bad_field"),
    (lambda h: h["f"].pop("round"), Policy(), "bad_field"),
    (lambda h: h["m"].update(nested=1), Policy(), "internal_error-never"),  # plain scalar: accepted
    (_set_manifest(0, 1, "complex128"), Policy(), "bad_dtype"),
    (_set_manifest(0, 1, "float16"), Policy(allowed_dtypes=frozenset({"float32", "int64"})), "bad_dtype"),
    (_set_manifest(0, 2, [10**6, 10**6]), Policy(), "too_many_elements"),
    (_set_manifest(0, 2, [100_000, 1000]), Policy(), "manifest_mismatch"),  # bytes disagree with shape
    (_set_manifest(0, 2, [2000]), Policy(), "manifest_mismatch"),
    (_set_manifest(0, 4, 2), Policy(), "manifest_mismatch"),  # frames declared vs arrived
    (_set_manifest(0, 4, 5000), Policy(max_frames=100), "too_many_frames"),
    (lambda h: h["t"].append(["big", "float32", [10**8], 4 * 10**8, 24]), Policy(max_message_bytes=10**8),
     "message_too_large"),
    (lambda h: h["t"].append(["big", "float32", [10**8], 4 * 10**8, 1]), Policy(), "frame_too_large"),
    (lambda h: h["t"].append(["dup", "int8", [0], 0, 0]) or h["t"].append(["dup", "int8", [0], 0, 0]),
     Policy(), "manifest_mismatch"),
    (lambda h: h["t"].extend([[f"e{i}", "int8", [0], 0, 0] for i in range(20)]), Policy(max_tensors=16),
     "too_many_tensors"),
    (lambda h: h["d"].__setitem__(0, b"\x00" * 32), Policy(), "digest_mismatch"),
    (lambda h: h["d"].__setitem__(0, b"short"), Policy(), "malformed_header"),
])
def test_resigned_header_mutations_each_get_their_reason(net: Network, mutate: Any, policy: Policy,
                                                         reason: str) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob", policy=policy)
    forged = resign(list(alice.seal(["bob"], push())), net.identities["alice"], mutate)
    if reason == "internal_error-never":
        assert isinstance(bob.open(forged), Opened)
    else:
        assert reason_of(bob, forged) == reason


def test_actual_frame_over_the_limit(net: Network) -> None:
    sender = net.endpoint("alice", policy=Policy(max_frame_bytes=4096))
    bob = net.endpoint("bob", policy=Policy(max_frame_bytes=1024))
    assert reason_of(bob, sender.seal(["bob"], push())) == "frame_too_large"


def test_trillion_elements_refused_before_allocation(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob", policy=Policy(max_elements=10**13,
                                                                          max_message_bytes=10**14))
    huge = ["huge", "float32", [10**6, 10**6], 4 * 10**12, 4 * 10**12 // MAX_FRAME_BYTES + 1]
    forged = resign(list(alice.seal(["bob"], ParamPush(round=1))), net.identities["alice"],
                    lambda h: h["t"].append(huge))
    tracemalloc.start()
    try:
        result = bob.open(forged)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(result, Rejection) and result.reason in ("too_many_frames", "manifest_mismatch")
    assert peak < 1 << 20
    strict = net.endpoint("bob")  # with the default limits, the element count alone refuses it
    forged = resign(list(alice.seal(["bob"], ParamPush(round=1))), net.identities["alice"],
                    lambda h: h["t"].append(huge))
    assert reason_of(strict, forged) == "too_many_elements"


def test_messages_without_tensors_carry_none(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    forged = resign(list(alice.seal(["bob"], ParamPull(round=1))), net.identities["alice"],
                    lambda h: h["m"].update(x=1))
    assert reason_of(bob, forged) == "bad_field"


def test_bool_tensor_with_bytes_other_than_0_and_1(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    flags = torch.tensor([True, False, True])
    frames = list(alice.seal(["bob"], ParamPush(round=1, tensors={"f": flags})))
    payload = bytes([0, 7, 1])
    digest = blake3(payload).digest()
    forged = resign(frames, net.identities["alice"], lambda h: h["d"].__setitem__(0, digest))
    forged[1] = payload
    assert reason_of(bob, forged) == "bad_field"


def test_seal_refuses_unknown_recipient_and_endpoint_needs_roster_key(net: Network) -> None:
    from protocols.errors import HivemeshError
    with pytest.raises(HivemeshError, match="no member"):
        net.endpoint("alice").seal(["nobody"], Heartbeat(step=1))
    with pytest.raises(HivemeshError, match="not on the roster"):
        Endpoint(net.identities["mallory"], net.roster, net.run_id, 1)


def test_odd_frame_objects_never_raise(net: Network) -> None:
    bob = net.endpoint("bob")
    for frames in ([None, None], [1, 2, 3], "abc", [b"", b""], [bytearray(b"\x81"), memoryview(b"x")]):
        result = bob.open(frames)  # type: ignore[arg-type]
        assert isinstance(result, Rejection)
    assert set(bob.rejections) == {"malformed_header"}


def test_restored_windows_still_refuse_replays(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    frames = alice.seal(["bob"], Heartbeat(step=1))
    assert isinstance(bob.open(frames), Opened)
    restarted = net.endpoint("bob", epoch=2)
    restarted.restore_state(bob.export_state())
    assert reason_of(restarted, frames) == "replay"


def test_removed_member_becomes_unknown_sender(net: Network) -> None:
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    bob.set_roster(net.roster.remove("alice"))
    assert reason_of(bob, alice.seal(["bob"], Heartbeat(step=1))) == "unknown_sender"


def test_remembered_signatures_never_excuse_a_different_one(net: Network,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import protocols.codec as codec

    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    frames = list(alice.seal(["bob"], Heartbeat(step=1)))
    assert isinstance(bob.open(frames), Opened)
    calls = []
    real = codec.verify_signature
    monkeypatch.setattr(codec, "verify_signature", lambda *args: calls.append(1) or real(*args))
    assert reason_of(bob, frames) == "replay"  # the same bytes: no second Ed25519 verification
    assert calls == []
    assert reason_of(bob, [*frames[:-1], flip(frames[-1], 5)]) == "bad_signature"
    assert calls == [1]


def test_one_message_with_a_far_sequence_number_cannot_silence_its_sender(net: Network) -> None:
    # Prepare: alice is heard at 0 s; then a message of hers sealed with sequence number 2**62
    # (an insider's forgery, or a corrupted counter) arrives at 1 s.
    alice, bob = net.endpoint("alice"), net.endpoint("bob")
    assert isinstance(bob.open(alice.seal(["bob"], Heartbeat(step=0)), now_s=0.0), Opened)
    genuine = alice.seal(["bob"], Heartbeat(step=1))
    alice.seq = 1 << 62
    far = alice.seal(["bob"], Heartbeat(step=2))
    # Execute / Assert: refused and counted, and her real traffic is still heard afterwards.
    assert reason_of_at(bob, far, 1.0) == "seq_jump" and bob.rejections["seq_jump"] == 1
    assert isinstance(bob.open(genuine, now_s=1.0), Opened)
    # A legitimate gap (a partition: one counter serves all her recipients) grows with her silence.
    alice.seq = 2 + bob.windows.seq_slack + 50 * 100_000
    assert reason_of_at(bob, alice.seal(["bob"], Heartbeat(step=3)), 2.0) == "seq_jump"
    alice.seq = 2 + bob.windows.seq_slack + 50 * 100_000
    assert isinstance(bob.open(alice.seal(["bob"], Heartbeat(step=3)), now_s=60.0), Opened)


def test_a_far_epoch_is_refused_and_the_next_real_restart_is_heard(net: Network) -> None:
    bob = net.endpoint("bob")
    assert isinstance(bob.open(net.endpoint("alice", epoch=3).seal(["bob"], Heartbeat(step=0)), now_s=0.0),
                      Opened)
    forged = net.endpoint("alice", epoch=(1 << 63) - 1).seal(["bob"], Heartbeat(step=0))
    assert reason_of_at(bob, forged, 1.0) == "epoch_jump"
    assert isinstance(bob.open(net.endpoint("alice", epoch=4).seal(["bob"], Heartbeat(step=0)), now_s=2.0),
                      Opened)                       # her next restart: epoch + 1
    # a restored window has no time yet: its first message is not bounded (we were down too)
    restarted = net.endpoint("bob", epoch=2)
    restarted.restore_state(bob.export_state())
    assert isinstance(restarted.open(net.endpoint("alice", epoch=40).seal(["bob"], Heartbeat(step=0)),
                                     now_s=0.0), Opened)


def reason_of_at(receiver: Endpoint, frames: Any, now_s: float) -> str:
    result = receiver.open(frames, now_s=now_s)
    assert isinstance(result, Rejection), "expected a rejection"
    return result.reason
