"""Fuzz decode: 100,000 hostile messages, none raises, none is an internal_error, memory stays small.

Each case also goes over the header-first path (protocols/assembly.py): the
same frames as single-frame wire messages, fed one at a time to an Assembler,
which must accept exactly the messages ``decode`` accepts, never give an
internal_error, and hold nothing once the connection's timeout has passed.
Some of the unsigned cases mutate the wire messages themselves instead
(a frame nobody announced, a header cut short, frames out of order).

More than half the cases are headers mutated *and re-signed with a roster
key*, so they pass the signature check and reach the run id, replay, limit,
manifest, digest and field checks; the rest mutate frames (bit flips,
truncation, reordering, garbage) without re-signing. Seeded: a failure
prints the case number and the mutation, and replays exactly.

Memory: every other batch of cases is decoded under tracemalloc (tracing
doubles the cost of a decode, and the suite has a time budget); the traced
peak over those 50,000 decodes must stay under 64 MiB.
"""

from __future__ import annotations

import copy
import os
import random
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import torch
from wire_helpers import make_network

from protocols import codec
from protocols.assembly import FRAME_DROPS, Assembler, AssemblyConfig
from protocols.codec import (
    REASONS,
    SIGNING_DOMAIN,
    Decoded,
    Frame,
    Policy,
    Rejection,
    ReplayWindows,
    Verifier,
)
from protocols.identity import SIGNATURE_BYTES
from protocols.messages import ClientUpdate, ErrorReply, Heartbeat, ParamPull, ParamPush, StateSyncResponse

CASES = int(os.environ.get('FUZZ_CASES', 100_000))
SEED = 20261129
BATCH = 2000  # cases forged untraced, then decoded (every other batch under tracemalloc)

NASTY: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), 1.5, float("nan"), float("inf"),
    "", "x", "float32", "bfloat16", "param_push", "é" * 10, b"", b"\x00" * 32, b"\xff" * 64,
    [], [0], [-1], [10**12], [10**6, 10**6], [2**64 - 1, 0], [0] * 40, [[]], {}, {"a": 1}, {"": None},
    ["w", "float32", [3], 12, 1], list(range(50)),
]


def nasty(rng: random.Random) -> Any:
    value = rng.choice(NASTY)
    return copy.deepcopy(value) if isinstance(value, list | dict) else value


def mutate_header(header: dict[str, Any], rng: random.Random, names: list[bytes], run_id: bytes) -> str:
    """Change ``header`` in place in one of many ways; returns what was done."""
    choice = rng.randrange(14)
    keys = ["v", "k", "s", "r", "run", "e", "q", "f", "m", "t", "d"]
    if choice == 0:
        key = rng.choice(keys)
        header[key] = nasty(rng)
        return f"set {key}"
    if choice == 1:
        key = rng.choice(keys)
        header.pop(key, None)
        return f"drop {key}"
    if choice == 2:
        header[rng.choice(["extra", "zz", ""])] = nasty(rng)
        return "extra key"
    manifest, digests = header.get("t"), header.get("d")
    entries = [entry for entry in manifest if isinstance(entry, list) and entry] if isinstance(
        manifest, list) else []
    if choice in (3, 4, 5) and entries:
        entry = rng.choice(entries)
        position = rng.randrange(len(entry))
        entry[position] = nasty(rng) if rng.random() < 0.5 else _near(entry[position], rng)
        return f"manifest[{position}]"
    if choice == 6 and isinstance(manifest, list):
        manifest.append([rng.choice(["w", "n", "big"]), rng.choice(["float32", "int8", "bool"]),
                         [rng.choice([0, 1, 3, 10**6, 10**12])], rng.choice([0, 3, 12, 4 * 10**6]),
                         rng.choice([0, 1, 2, 300])])
        return "manifest append"
    if choice == 7 and isinstance(digests, list) and digests:
        action = rng.randrange(4)
        if action == 0:
            digests.pop()
        elif action == 1:
            digests.append(bytes(32))
        elif action == 2:
            digests[rng.randrange(len(digests))] = nasty(rng)
        else:
            digests[rng.randrange(len(digests))] = rng.randbytes(32)
        return f"digests {action}"
    if choice == 8 and isinstance(header.get("f"), dict):
        fields = header["f"]
        if fields and rng.random() < 0.5:
            key = rng.choice(sorted(fields))
            fields[key] = nasty(rng)
            return f"field {key}"
        fields[rng.choice(["round", "step", "x", "tensors", "meta"])] = nasty(rng)
        return "field added"
    if choice == 9:
        header["m"] = rng.choice([{"k": nasty(rng)}, {"k": [1]}, {"k": {"a": 1}}, nasty(rng)])
        return "meta"
    if choice == 10:
        header["k"] = rng.choice(["param_push", "param_pull", "heartbeat", "client_update", "round_start",
                                  "round_result", "error", "state_sync_response", "nope"])
        return f"kind {header['k']}"
    if choice == 11:
        header["r"] = rng.choice([[], [bytes(32)], names[:1], names, names * 30, [nasty(rng)]])
        return "recipients"
    if choice == 12:
        key = rng.choice(["e", "q"])
        header[key] = rng.choice([0, 1, 2**63, -5, 10**30 % 2**64])
        return f"counter {key}"
    header["run"] = rng.choice([run_id, run_id[:-1], bytes(32), b""])
    return "run id"


def _near(value: Any, rng: random.Random) -> Any:
    """A plausible neighbour of a manifest value: off by one, doubled, huge."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(2**64 - 1, max(0, value + rng.choice([-1, 1, value, 10**9, 4 * 10**12])))
    if isinstance(value, list):
        return [*value, rng.choice([0, 1, 2, 10**6])] if rng.random() < 0.5 else value[:-1]
    if isinstance(value, str):
        return rng.choice(["float16", "float64", "int64", "bool", "complex64", value + "x"])
    return value


def mutate_frames(frames: list[bytes], rng: random.Random) -> tuple[list[Any], str]:
    """Unsigned changes to the frames themselves."""
    frames = list(frames)
    choice = rng.randrange(9)
    if choice <= 2:
        index = rng.randrange(len(frames))
        if frames[index]:
            data = bytearray(frames[index])
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            frames[index] = bytes(data)
        return frames, f"flip frame {index}"
    if choice == 3:
        index = rng.randrange(len(frames))
        frames[index] = frames[index][:rng.randrange(len(frames[index]) + 1)]
        return frames, f"truncate frame {index}"
    if choice == 4:
        del frames[rng.randrange(len(frames))]
        return frames, "drop frame"
    if choice == 5:
        junk = rng.randbytes(rng.randrange(40))
        frames.insert(rng.randrange(len(frames) + 1), junk)
        return frames, "insert frame"
    if choice == 6:
        rng.shuffle(frames)
        return frames, "shuffle"
    if choice == 7:
        return frames[:rng.randrange(len(frames))], "cut"
    garbage = msgpack.packb(nasty(rng), use_bin_type=True)
    return [garbage, *frames[1:]], "garbage header"


def test_fuzz_decode_never_raises_and_stays_small() -> None:
    torch.set_num_threads(1)
    net = make_network()
    policy = Policy(max_frame_bytes=8, max_frames=64, max_tensors=16, max_elements=10**6,
                    max_message_bytes=10**6, max_header_bytes=4096)
    bob = net.identities["bob"]
    verifier = Verifier(net.roster, bob.public_key, net.run_id, policy)
    windows = ReplayWindows(64)
    names = [net.identities[n].public_key for n in ("alice", "bob", "gate", "phone")]
    signers = {net.identities[n].public_key: net.identities[n] for n in ("alice", "bob", "gate", "phone")}
    bases = _base_messages(net, policy)

    assembler, assembly_windows = Assembler(AssemblyConfig(idle_timeout_s=1.0)), ReplayWindows(64)
    wire_reasons: Counter[str] = Counter()
    mangled_reasons: Counter[str] = Counter()   # of the wire-level mutations
    extra_accepted = 0      # messages the wire accepted with frames after them that decode refused
    rng = random.Random(SEED)
    reasons: Counter[str] = Counter()
    resigned = peak = traced_cases = 0
    for first in range(0, CASES, BATCH):
        # Forge a batch untraced, then trace only the decoding of it.
        batch: list[tuple[list[Any], str, bool]] = []
        for case in range(first, min(first + BATCH, CASES)):
            sender, frames = rng.choice(bases)
            if rng.random() < 0.55:
                header = msgpack.unpackb(frames[0], raw=False)
                header["q"] = case  # fresh: reach the checks past the replay window
                count = rng.randint(1, 3)
                what = " + ".join(mutate_header(header, rng, names, net.run_id) for _ in range(count))
                raw = msgpack.packb(header, use_bin_type=True)
                signer = signers.get(header.get("s") if isinstance(header.get("s"), bytes) else b"", sender)
                batch.append(([raw, *frames[1:-1], signer.sign(SIGNING_DOMAIN + raw)], what, True))
                resigned += 1
            else:
                batch.append((*mutate_frames(frames, rng), False))
        outcomes: list[str] = [""] * len(batch)
        traced = first // BATCH % 2 == 0
        if traced:
            tracemalloc.start()
            traced_cases += len(batch)
        try:
            for index, (mutated, what, fresh) in enumerate(batch):
                # Unsigned frame mutations reuse the base (epoch, seq): without a window they
                # reach the manifest and digest checks instead of stopping at `replay`.
                case = first + index
                now_s = 10.0 * case     # the clock both paths are given (it bounds counter jumps)
                result = _decode(mutated, verifier, windows if fresh else None, case, what, now_s)
                outcomes[index] = "accepted" if isinstance(result, Decoded) else result.reason
                assembled = _assemble(_wire(mutated), assembler, verifier,
                                      assembly_windows if fresh else None, case, what, now_s)
                # the same verdict, except that frames after a complete message are the next
                # message's on the wire: decode refuses the whole list, the wire accepts the message
                # the announced frames make and refuses the rest on its own
                accepted = assembled.count("accepted")
                assert accepted == (outcomes[index] == "accepted") or (
                    accepted == 1 and outcomes[index] in ("manifest_mismatch", "too_many_frames")
                    and assembled[-1] != "accepted"), \
                    f"case {case} ({what}): decode {outcomes[index]}, assembled {assembled}"
                extra_accepted += accepted - (outcomes[index] == "accepted")
                if rng.random() < 0.25 and not fresh:
                    wire_what = f"{what}, then on the wire: {rng.choice(WIRE_MUTATIONS)}"
                    mangled = _mutate_wire(_wire(mutated), rng, wire_what)
                    mangled_reasons.update(
                        _assemble(mangled, assembler, verifier, None, case, wire_what, now_s))
                wire_reasons.update(assembled)
                if isinstance(result, Decoded) and result.epoch != 1:
                    windows = ReplayWindows(64)  # a forged epoch jump would shut out the rest
                    assembly_windows = ReplayWindows(64)
                assert outcomes[index] != "internal_error", f"case {case} ({what}): {result}"
            if traced:
                peak = max(peak, tracemalloc.get_traced_memory()[1])
        finally:
            if traced:
                tracemalloc.stop()
        reasons.update(outcomes)

    assert resigned >= CASES // 2 and traced_cases >= CASES // 2
    assert sum(reasons.values()) == CASES
    assert set(reasons) <= {*REASONS, "accepted"} and reasons["internal_error"] == 0
    assert peak < 64 << 20, f"traced peak {peak / 2**20:.1f} MiB"
    assert set(wire_reasons + mangled_reasons) <= {*REASONS, "accepted"}
    assert wire_reasons["internal_error"] == mangled_reasons["internal_error"] == 0
    assert wire_reasons["accepted"] == reasons["accepted"] + extra_accepted > 0
    for dropped in FRAME_DROPS:
        assert assembler.frames_dropped[dropped] > 0, f"no frame was dropped as {dropped}"
    assert mangled_reasons["incomplete"] > 0 and mangled_reasons["digest_mismatch"] > 0
    # The re-signed mutations reach the deep checks, not only the signature check.
    for deep in ("too_many_elements", "manifest_mismatch", "digest_mismatch", "bad_field", "bad_dtype",
                 "config_mismatch", "frame_too_large", "too_many_frames", "malformed_header",
                 "bad_signature", "replay", "old_epoch", "not_a_recipient", "wrong_role", "unknown_sender",
                 "version_unsupported", "unknown_kind", "accepted"):
        assert reasons[deep] > 0, f"no case reached {deep}: {dict(reasons)}"


WIRE_MUTATIONS = ("drop", "duplicate", "swap", "junk", "oversize", "truncate")


def _wire(frames: list[Any]) -> list[bytes]:
    """The frames as the header-first wire carries them (the last one taken for the signature,
    whatever its length: a short one shifts the header, as a forger's would)."""
    if len(frames) < 2 or not all(isinstance(f, bytes) for f in frames):
        return [f for f in frames if isinstance(f, bytes)]
    return [frames[-1] + frames[0], *frames[1:-1]]


def _mutate_wire(wire: list[bytes], rng: random.Random, what: str) -> list[bytes]:
    wire = list(wire)
    kind = what.rsplit(": ", 1)[1]
    index = rng.randrange(len(wire)) if wire else 0
    if kind == "drop" and wire:
        del wire[index]
    elif kind == "duplicate" and wire:
        wire.insert(index, wire[index])
    elif kind == "swap" and len(wire) > 1:
        wire[index], wire[-1] = wire[-1], wire[index]
    elif kind == "junk":
        wire.insert(index, rng.randbytes(rng.randrange(100)))
    elif kind == "oversize":
        wire.insert(index, bytes(4096 + SIGNATURE_BYTES + 1))
    elif wire:
        wire[index] = wire[index][:rng.randrange(len(wire[index]) + 1)]
    return wire


def _assemble(wire: list[bytes], assembler: Assembler, verifier: Verifier, windows: ReplayWindows | None,
              case: int, what: str, now_s: float) -> list[str]:
    """Feed ``wire`` off a fresh connection, then let its timeout pass: every outcome's reason."""
    outcomes: list[Decoded | Rejection | None] = []
    try:
        outcomes += [assembler.receive(case, frame, now_s, verifier, windows) for frame in wire]
        outcomes += assembler.expire(now_s + assembler.config.idle_timeout_s)
    except BaseException as error:  # pragma: no cover - the test's point is that this never happens
        raise AssertionError(f"case {case} ({what}) raised {error!r} on the wire") from error
    assert assembler.pending == 0 and not assembler.in_flight, f"case {case} ({what}): still held"
    return ["accepted" if isinstance(o, Decoded) else o.reason for o in outcomes if o is not None]


def _decode(frames: list[Frame], verifier: Verifier, windows: ReplayWindows | None, case: int,
            what: str, now_s: float) -> Decoded | Rejection:
    try:
        return codec.decode(frames, verifier, windows, now_s)
    except BaseException as error:  # pragma: no cover - the test's point is that this never happens
        raise AssertionError(f"case {case} ({what}) raised {error!r}") from error


def _base_messages(net: Any, policy: Policy) -> list[tuple[Any, list[bytes]]]:
    generator = torch.Generator().manual_seed(SEED)
    plans: list[tuple[str, list[str], Callable[[], Any]]] = [
        ("alice", ["bob"], lambda: ParamPush(round=3, tensors={
            "w": torch.randn(6, generator=generator), "b": torch.tensor([True, False, True])},
            meta={"compressor": "topk", "fraction": 0.5})),
        ("alice", ["bob", "gate"], lambda: ParamPush(round=1, tensors={
            "h": torch.randn(3, 2, generator=generator).bfloat16(), "e": torch.empty(0, 4)})),
        ("gate", ["bob"], lambda: StateSyncResponse(round=9, tensors={
            "x": torch.arange(5, dtype=torch.int16)})),
        ("phone", ["bob"], lambda: ClientUpdate(round=2, num_samples=40, tensors={"u": torch.ones(4)})),
        ("alice", ["bob"], lambda: Heartbeat(step=5, loss=0.25)),
        ("alice", ["bob"], lambda: ParamPull(round=4)),
        ("gate", ["bob"], lambda: ErrorReply(code="config_mismatch", detail="x")),
    ]
    bases = []
    for name, recipients, make in plans:
        endpoint = net.endpoint(name, policy=policy)
        frames = [bytes(f) for f in endpoint.seal(recipients, make())]
        bases.append((net.identities[name], frames))
    return bases
