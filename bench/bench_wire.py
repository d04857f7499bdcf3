"""Wire cost of a 25M-parameter float32 model (100 MB): encode+sign and verify+decode.

Printed beside baselines measured in the same run on the same bytes: a plain
copy (into a touched buffer, and into a fresh one) and one digest pass with
SHA-256 and with BLAKE3. The 100 MB tensor crosses the wire as 4 MiB frames,
so the receiver gathers it into one tensor: into fresh memory by default (page
faults: see the clone row), or into a buffer the driver reuses. Goal: each
side costs at most 2x one pass of the digest the codec uses (BLAKE3, chosen
because it ran 2-3x faster than SHA-256 here). The last two rows use the
daemon's digest threads (peer/net/digests.py): they gain only where a core is free; the
very last receives the header-first wire (protocols/assembly.py) one frame at a time, as the daemon does.
Run: ``.venv/bin/python bench/bench_wire.py [--numel N] [--repeat R] [--quick]``
(``--quick``: 100,000 parameters, one repetition: a smoke run for CI, not a measurement).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable

import torch
from blake3 import blake3

from peer.net.digests import ThreadDigester
from protocols.identity import Identity
from protocols.messages import ParamPush
from protocols.roster import Roster, run_id
from protocols.wire import Endpoint, Opened, wire_messages, wire_size


def measure(repeat: int, work: Callable[[], object]) -> float:
    """Median seconds of ``repeat`` runs after one warm-up run."""
    work()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000, help="float32 parameters")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repeat = 100_000, 1
    torch.set_num_threads(1)

    alice, bob = Identity.generate(), Identity.generate()
    roster = Roster.from_dict({"member": [
        {"name": "alice", "public_id": alice.public_id, "address": "tcp://127.0.0.1:7001"},
        {"name": "bob", "public_id": bob.public_id, "address": "tcp://127.0.0.1:7002"}]})
    run = run_id({"roster": roster, "topology": "ring", "algorithm": "dpsgd", "task": "bench"})
    sender = Endpoint(alice, roster, run, 1)
    params = torch.randn(args.numel, generator=torch.Generator().manual_seed(0))
    view = memoryview(params.numpy()).cast("B")  # type: ignore[arg-type]
    nbytes = view.nbytes
    touched = torch.empty_like(params)
    touched.copy_(params)

    frames = sender.seal(["bob"], ParamPush(round=0, tensors={"w": params}))
    arrived = [bytes(frame) for frame in frames]  # what a receiver holds: fresh bytes per frame
    receivers = iter([Endpoint(bob, roster, run, 1) for _ in range(args.repeat + 1)])
    check = Endpoint(bob, roster, run, 1).open(arrived)
    assert isinstance(check, Opened) and isinstance(check.message, ParamPush)
    assert torch.equal(check.message.tensors["w"], params)

    def open_once() -> None:
        result = next(receivers).open(arrived)
        assert isinstance(result, Opened)

    reused = torch.empty_like(params)  # a driver's receive buffer, reused message after message
    reusing = iter([Endpoint(bob, roster, run, 1, allocate=lambda dtype, numel: reused)
                    for _ in range(args.repeat + 1)])

    def open_reusing() -> None:
        result = next(reusing).open(arrived)
        assert isinstance(result, Opened)

    digester = ThreadDigester()
    threaded_sender = Endpoint(alice, roster, run, 1, digest=digester)
    threaded = iter([Endpoint(bob, roster, run, 1, allocate=lambda dtype, numel: reused, digest=digester)
                     for _ in range(args.repeat + 1)])

    def open_threaded() -> None:
        result = next(threaded).open(arrived)
        assert isinstance(result, Opened)

    # the header-first wire: the same bytes as single-frame messages, received one at a time
    wire = [bytes(frame) for frame in wire_messages(frames)]
    streamed = iter([Endpoint(bob, roster, run, 1, allocate=lambda dtype, numel: reused, digest=digester)
                     for _ in range(args.repeat + 1)])

    def receive_threaded() -> None:
        receiver = next(streamed)
        results = [receiver.receive(b"c", frame, now_s=0.0) for frame in wire]
        assert isinstance(results[-1], Opened)

    rows = [
        ("copy into a touched buffer", measure(args.repeat, lambda: touched.copy_(params))),
        ("copy into a fresh buffer (clone)", measure(args.repeat, params.clone)),
        ("SHA-256, one pass", measure(args.repeat, lambda: hashlib.sha256(view).digest())),
        ("BLAKE3, one pass (1 thread)", measure(args.repeat, lambda: blake3(view).digest())),
        ("encode + sign (seal)", measure(args.repeat, lambda: sender.seal(["bob"], ParamPush(
            round=0, tensors={"w": params})))),
        ("verify + decode (open)", measure(args.repeat, open_once)),
        ("verify + decode, reused buffer", measure(args.repeat, open_reusing)),
        ("encode + sign, digest threads", measure(args.repeat, lambda: threaded_sender.seal(
            ["bob"], ParamPush(round=0, tensors={"w": params})))),
        ("verify + decode, threads + reused", measure(args.repeat, open_threaded)),
        ("receive frame by frame, threads + reused", measure(args.repeat, receive_threaded)),
    ]
    digester.close()
    sha, b3 = rows[2][1], rows[3][1]
    print(f"wire bench: {args.numel:,} float32 = {nbytes / 1e6:.0f} MB, {len(frames) - 2} payload frames, "
          f"{wire_size(frames) - nbytes} bytes of header+signature; median of {args.repeat}")
    print(f"{'operation':42} {'ms':>8} {'GB/s':>7} {'x SHA-256':>10} {'x BLAKE3':>9}")
    for name, seconds in rows:
        print(f"{name:42} {seconds * 1e3:8.1f} {nbytes / seconds / 1e9:7.2f} {seconds / sha:10.2f} "
              f"{seconds / b3:9.2f}")
    for name, seconds in rows[4:]:
        verdict = "meets" if seconds <= 2 * b3 else "MISSES"
        print(f"goal: {name} <= 2x one BLAKE3 pass: {seconds / b3:.2f}x, {verdict}")
    print(f"digest choice: BLAKE3 is {sha / b3:.2f}x faster than SHA-256 here")


if __name__ == "__main__":
    main()
