"""One gossip push-pull exchange of a 25M-parameter float32 model (100 MB) between two peers on loopback.

Two processes each hold a vector (values 1 and 3); one exchange = both send
theirs, both receive the other's and mix (average in place), so both end
holding 2. Timed from a shared start to the end of the mix, median of
``--repeat`` exchanges after a warm-up, beside baselines measured in the same
run on the same bytes:

- raw pyzmq: DEALER/ROUTER, the bytes as 4 MiB frames, no header, no mix;
- ours unsigned: our framing (msgpack header + 4 MiB zero-copy frames, each
  a single-frame ZeroMQ message as on the wire, tracked sends, gather into a
  reused buffer, mix) with the digests and the Ed25519 signature left out;
- ours signed, serial digests: Endpoint.seal (BLAKE3 per frame + Ed25519 over
  the header) -> the header-first wire (protocols/assembly.py) over
  peer.net.transport -> Endpoint.receive frame by frame (the header verified
  first, each frame hashed as it arrives and copied into a reused buffer) -> mix;
- ours signed: the same as the daemon runs it: each frame hashed on the daemon's
  digest thread(s) while the caller copies it (peer/net/digests.py ThreadDigester)
  into its receive-buffer pool (BufferPool), as it arrives;
- ours signed + CurveZMQ: the same over CurveZMQ-encrypted connections (the
  daemon's default), to show what transport encryption costs;
- raw pyzmq + CurveZMQ: the raw row over CurveZMQ, to show where that cost lies
  (libzmq's encryption on its one I/O thread, or our path around it);
- torch.distributed gloo all_reduce of the same tensor between two processes
  (+ the division that makes it an average);
- hivemind's DecentralizedAverager, when it installs: run from its own venv
  (``--hivemind-python``, default /tmp/hmvenv/bin/python) so that the project's
  environment is untouched; skipped with a note otherwise.

Loopback figures drift 30-50 % between runs here; only the same-run ratios count.
Run: ``.venv/bin/python bench/bench_exchange.py [--numel N] [--repeat R] [--quick]``
(``--quick``: 100,000 parameters in 64 KiB frames, one exchange after the warm-up, no hivemind:
a smoke run for CI, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import msgpack
import torch
import zmq

from peer.net.digests import DEFAULT_WORKERS, BufferPool, ThreadDigester
from peer.net.transport import Arrival, CurveKeys, Transport, listener_address, reserve_listeners
from peer.runtime.launch import context
from protocols.codec import MAX_FRAME_BYTES

RAW_FRAME_BYTES = 4 << 20
WIRE_FRAME_BYTES = MAX_FRAME_BYTES
DIGEST_THREADS = DEFAULT_WORKERS     # as peer/runtime/daemon.py
HERE = Path(__file__).resolve().parent
PAIR_TIMEOUT_S = 900.0   # a generous ceiling for 6 exchanges of 100 MB on a loaded machine
SIGNED = f"ours signed (caller + {DIGEST_THREADS} digest thread(s), buffer pool; as the daemon)"
CURVE = "ours signed + CurveZMQ (the daemon's default)"
RAW_CURVE = "raw pyzmq + CurveZMQ (libzmq's encryption alone)"


# ------------------------------------------------------------------ helpers shared by both sides


def _byte_frames(x: torch.Tensor, frame_bytes: int) -> list[memoryview]:
    view = x.numpy().data.cast("B")
    return [view[i:i + frame_bytes] for i in range(0, len(view), frame_bytes)]


def _gather(frames: list[Any], into: torch.Tensor) -> None:
    target = into.view(torch.uint8)
    offset = 0
    for frame in frames:
        chunk = torch.frombuffer(frame, dtype=torch.uint8)
        target[offset:offset + len(chunk)].copy_(chunk)
        offset += len(chunk)


def _check(x: torch.Tensor) -> None:
    sample = x[:: max(1, x.numel() // 1000)]
    if not bool((sample == 2.0).all()):
        raise AssertionError(f"mixed vector is not the average: {sample[:4].tolist()}")


# ------------------------------------------------------------------ the two sides


def adopt(index: int, listeners: list[socket.socket]) -> tuple[list[str], int]:
    """Both sides' addresses, and this side's listening socket (reserved by the parent) to serve."""
    return [listener_address(listener) for listener in listeners], listeners[index].detach()


def _raw_side(index: int, listeners: list[socket.socket], numel: int, repeat: int, curve: bool,
              results: Queue) -> None:
    """Plain pyzmq DEALER -> ROUTER both ways, 4 MiB frames: the floor for moving the bytes; with
    ``curve``, over libzmq's CurveZMQ alone (what its encryption costs, without anything of ours)."""
    torch.set_num_threads(1)
    addresses, listen_fd = adopt(index, listeners)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.ROUTER)
    outbox = ctx.socket(zmq.DEALER)
    if curve:
        keys = _curve_keys(index)
        inbox.curve_server = True
        inbox.curve_publickey, inbox.curve_secretkey = keys.public_key, keys.secret_key
        (outbox.curve_serverkey,) = keys.server_keys.values()
        outbox.curve_publickey, outbox.curve_secretkey = keys.public_key, keys.secret_key
    inbox.setsockopt(zmq.USE_FD, listen_fd)
    inbox.bind(addresses[index])
    outbox.connect(addresses[1 - index])
    x = torch.full((numel,), float(1 + 2 * index))
    frames = _byte_frames(x, RAW_FRAME_BYTES)
    times = []
    for round_index in range(repeat + 1):
        _barrier_raw(inbox, outbox, round_index)
        start = time.perf_counter()
        trackers = [outbox.send(frame, zmq.SNDMORE if i < len(frames) - 1 else 0, copy=False, track=True)
                    for i, frame in enumerate(frames)]
        received = inbox.recv_multipart(copy=False)[1:]
        for tracker in trackers:
            if tracker is not None:
                tracker.wait()
        times.append(time.perf_counter() - start)
        assert sum(len(f) for f in received) == numel * 4
    _barrier_raw(inbox, outbox, -1)     # both have everything: closing cannot cut the other's data
    results.put((index, times[1:]))
    inbox.close(linger=0)
    outbox.close(linger=0)
    ctx.term()


def _barrier_raw(inbox: zmq.Socket, outbox: zmq.Socket, round_index: int) -> None:
    outbox.send(b"ready %d" % round_index)
    while True:
        message = inbox.recv_multipart()
        if message[-1] == b"ready %d" % round_index:
            return


def _wire_side(index: int, listeners: list[socket.socket], numel: int, repeat: int, mode: str,
               frame_bytes: int, results: Queue) -> None:
    """Our exchange through peer.net.transport: mode "unsigned" (our framing alone), "serial" (Endpoint,
    default digests), "threads" (Endpoint with the daemon's digest threads and buffer pool) or "curve"
    (the same over CurveZMQ, as a daemon runs by default)."""
    torch.set_num_threads(1)
    names = ["alice", "bob"]
    me, other = names[index], names[1 - index]
    x = torch.full((numel,), float(1 + 2 * index))
    buffer = torch.empty(numel)                    # the receive buffer, reused every exchange
    seal: Callable[[int], list[Any]]
    open_: Callable[[Mailbox], torch.Tensor]
    digester = None
    if mode == "unsigned":
        seal, open_ = _unsigned_codec(buffer, x, frame_bytes)
    elif mode == "serial":
        seal, open_ = _signed_codec(me, other, names, lambda dtype, numel: buffer, x, frame_bytes)
    else:
        digester = ThreadDigester(DIGEST_THREADS)
        pool = BufferPool(max_buffers=4, sizes=frozenset({(torch.float32, numel)}))
        seal, open_ = _signed_codec(me, other, names, pool.allocate, x, frame_bytes, digester)
    addresses, listen_fd = adopt(index, listeners)
    curve = _curve_keys(index) if mode == "curve" else None
    with Transport(listen=addresses[index], listen_fd=listen_fd, curve=curve,
                   neighbours={other: addresses[1 - index]}) as transport:
        mailbox = Mailbox(transport, other)
        times = []
        for round_index in range(repeat + 1):
            mailbox.barrier(round_index)
            start = time.perf_counter()
            mailbox.send(seal(round_index))
            y = open_(mailbox)
            transport.wait_sent()              # x may be mixed only once ZeroMQ has let go of it
            x.lerp_(y, 0.5)
            times.append(time.perf_counter() - start)
            _check(x)
            x.fill_(float(1 + 2 * index))
        mailbox.barrier(-1)
        results.put((index, times[1:]))
    if digester is not None:
        digester.close()


class Mailbox:
    """The other side's frames over a Transport: barrier tokens, and the single-frame wire messages
    of the data (a header, then the frames it announced).

    One poll can return a token together with the data sent right behind it, so both are kept:
    a barrier that dropped data it was not waiting for hung the exchange (often at small sizes).
    """

    def __init__(self, transport: Transport, other: str) -> None:
        self.transport, self.other = transport, other
        self.tokens: set[bytes] = set()
        self.data: deque[Arrival] = deque()

    def send(self, frames: list[Any]) -> None:
        # A dropped message would leave the other side waiting for it forever: fail instead.
        if not self.transport.send(self.other, frames):
            raise AssertionError(f"send to {self.other} dropped (unreachable or queue full)")

    def barrier(self, round_index: int) -> None:
        """Return once both sides have reached ``round_index``."""
        token = b"ready %d" % round_index
        while not self.transport.send(self.other, [token]):
            time.sleep(0.01)    # not connected yet: IMMEDIATE refuses, and ZeroMQ reconnects
        while token not in self.tokens:
            self._poll()

    def next_frame(self) -> Arrival:
        while not self.data:
            self._poll()
        return self.data.popleft()

    def _poll(self) -> None:
        for arrival in self.transport.poll(1.0):
            if len(arrival.frame) <= 16 and arrival.frame.bytes.startswith(b"ready "):
                self.tokens.add(arrival.frame.bytes)
            else:
                self.data.append(arrival)


def _unsigned_codec(buffer: torch.Tensor, x: torch.Tensor, frame_bytes: int = WIRE_FRAME_BYTES) -> tuple[
        Callable[[int], list[Any]], Callable[[Mailbox], torch.Tensor]]:
    def seal(round_index: int) -> list[Any]:
        frames = _byte_frames(x, frame_bytes)
        header = msgpack.packb({"round": round_index, "numel": x.numel(), "dtype": "float32",
                                "frames": len(frames)})
        return [header, *frames]

    def open_(mailbox: Mailbox) -> torch.Tensor:
        header = msgpack.unpackb(mailbox.next_frame().frame.bytes)
        frames = [mailbox.next_frame().frame.buffer for _ in range(header["frames"])]
        if header["numel"] * 4 != sum(len(f) for f in frames):
            raise AssertionError("size mismatch")
        _gather(frames, buffer)
        return buffer

    return seal, open_


def _signed_codec(me: str, other: str, names: list[str], allocate: Callable[[torch.dtype, int], torch.Tensor],
                  x: torch.Tensor, frame_bytes: int = WIRE_FRAME_BYTES, digest: Any = None,
                  ) -> tuple[Callable[[int], list[Any]], Callable[[Mailbox], torch.Tensor]]:
    from peer.files.keyfile import parse_identity
    from protocols.messages import ParamPush
    from protocols.roster import Member, Roster, run_id
    from protocols.wire import Endpoint, Opened, Policy, wire_messages

    # both sides derive the same two identities from fixed seeds (a bench, not a deployment)
    identities = [parse_identity(_key_text(i).encode()) for i in range(2)]
    roster = Roster(tuple(Member(name=n, public_id=identities[i].public_id, address="tcp://127.0.0.1:9")
                          for i, n in enumerate(names)))
    endpoint = Endpoint(identities[names.index(me)], roster, run_id({"bench": "exchange"}), epoch=0,
                        policy=Policy(max_frame_bytes=frame_bytes), allocate=allocate, digest=digest)

    def seal(round_index: int) -> list[Any]:
        return wire_messages(endpoint.seal([other], ParamPush(round=round_index, tensors={"x": x})))

    def open_(mailbox: Mailbox) -> torch.Tensor:
        opened = None
        while opened is None:    # each frame hashed (and copied) as it arrives, the header first
            arrival = mailbox.next_frame()
            opened = endpoint.receive(arrival.connection, arrival.frame.buffer, now_s=0.0)
        if not isinstance(opened, Opened):
            raise AssertionError(f"rejected: {opened}")
        tensor = opened.message.tensors["x"]        # type: ignore[union-attr]
        return tensor

    return seal, open_


def _curve_keys(index: int) -> CurveKeys:
    """CurveZMQ between the two sides (as a daemon runs by default): each admits only the other."""
    from peer.files.keyfile import parse_identity

    own, other = (parse_identity(_key_text(i).encode()) for i in (index, 1 - index))
    other_key = other.curve_public_key.encode()
    return CurveKeys(public_key=own.curve_public_key.encode(), secret_key=own.curve_secret_key.encode(),
                     server_keys={["alice", "bob"][1 - index]: other_key},
                     allowed_client_keys=frozenset({other_key}))


def _key_text(index: int) -> str:
    import base64

    seed = base64.b64encode(bytes([index + 1]) * 32).decode()
    from peer.files.keyfile import KEY_FILE_MAGIC
    from protocols.identity import z85_encode

    return f"{KEY_FILE_MAGIC}\ned25519-seed {seed}\ncurve-secret {z85_encode(bytes([index + 7]) * 32)}\n"


def _gloo_side(index: int, init_method: str, numel: int, repeat: int, results: Queue) -> None:
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=index, world_size=2)
    x = torch.full((numel,), float(1 + 2 * index))
    times = []
    for _ in range(repeat + 1):
        x.fill_(float(1 + 2 * index))
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        x.div_(2)
        times.append(time.perf_counter() - start)
        _check(x)
    results.put((index, times[1:]))
    dist.destroy_process_group()


# ------------------------------------------------------------------ running a pair


def run_pair(target: Callable[..., None], *args: Any, timeout_s: float = PAIR_TIMEOUT_S) -> float:
    """Run ``target(index, *args, results)`` in two processes; the median of the slower side's times.

    Raises if a side fails or both have not reported within ``timeout_s`` (a hang is a failure).
    """
    ctx = context()
    results: Queue = ctx.Queue()
    processes = [ctx.Process(target=target, args=(i, *args, results)) for i in range(2)]
    for process in processes:
        process.start()
    collected: dict[int, list[float]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < 2:
            try:
                index, times = results.get(timeout=1.0)
                collected[index] = times
            except queue.Empty:
                failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"{target.__name__} failed (exit codes {failed})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{target.__name__}: no result within {timeout_s:.0f} s") from None
    finally:
        for process in processes:
            process.join(30 if len(collected) == 2 else 0)   # a side that failed or hung is not waited for
            if process.is_alive():
                process.kill()
                process.join()
    slower = [max(a, b) for a, b in zip(collected[0], collected[1], strict=True)]
    return statistics.median(slower)


def run_hivemind(python: str, numel: int, repeat: int) -> tuple[float | None, str]:
    if not python:
        return None, "not asked for (--hivemind-python '')"
    if not Path(python).exists():
        return None, f"no hivemind venv at {python} (python3 -m venv DIR && DIR/bin/pip install hivemind)"
    try:
        done = subprocess.run([python, str(HERE / "_hivemind_average.py"), str(numel), str(repeat)],
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, "hivemind run timed out"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return None, f"hivemind run failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    report = json.loads(lines[-1])
    return float(report["median_s"]), f"hivemind {report['version']}, steps {report['times_s']}"


# ------------------------------------------------------------------ table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--numel", type=int, default=25_000_000, help="float32 parameters (default 25M)")
    parser.add_argument("--repeat", type=int, default=5, help="timed exchanges per row (default 5)")
    parser.add_argument("--hivemind-python", default="/tmp/hmvenv/bin/python",
                        help="python of a separate venv with hivemind installed ('' to skip)")
    parser.add_argument("--frame-mib", type=int, default=MAX_FRAME_BYTES >> 20,
                        help="payload frame size of our exchanges in MiB (default: the wire's limit)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one exchange, no hivemind (a smoke run)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="skip gloo and hivemind (for a before/after comparison of our rows)")
    args = parser.parse_args()
    # quick: small frames too, so that the tiny vector still crosses as several (gathered) frames
    frame_bytes = 64 << 10 if args.quick else args.frame_mib << 20
    if args.quick:
        args.numel, args.repeat, args.hivemind_python = 100_000, 1, ""
    torch.set_num_threads(1)
    numel, repeat = args.numel, args.repeat
    print(f"one push-pull exchange of {numel:,} float32 ({numel * 4 / 1e6:.0f} MB each way) between two "
          f"processes on 127.0.0.1; median of {repeat} after a warm-up", flush=True)
    rows: dict[str, float | None] = {}
    rows["raw pyzmq DEALER/ROUTER, 4 MiB frames"] = run_pair(_raw_side, reserve_listeners(2), numel, repeat,
                                                             False)
    rows[RAW_CURVE] = run_pair(_raw_side, reserve_listeners(2), numel, repeat, True)
    rows["ours unsigned (framing, tracked send, gather, mix)"] = run_pair(
        _wire_side, reserve_listeners(2), numel, repeat, "unsigned", frame_bytes)
    rows["ours signed, serial digests"] = run_pair(
        _wire_side, reserve_listeners(2), numel, repeat, "serial", frame_bytes)
    rows[SIGNED] = run_pair(_wire_side, reserve_listeners(2), numel, repeat, "threads", frame_bytes)
    rows[CURVE] = run_pair(_wire_side, reserve_listeners(2), numel, repeat, "curve", frame_bytes)
    rendezvous = f"file://{tempfile.mkdtemp(prefix='hivemesh-gloo-')}/rendezvous"    # no port to pick
    rows["torch.distributed gloo all_reduce + /2"] = (
        None if args.no_baselines else run_pair(_gloo_side, rendezvous, numel, repeat))
    hivemind_s, note = run_hivemind("" if args.no_baselines else args.hivemind_python, numel,
                                    max(3, repeat // 2))
    rows["hivemind DecentralizedAverager step"] = hivemind_s

    raw = rows["raw pyzmq DEALER/ROUTER, 4 MiB frames"]
    unsigned = rows["ours unsigned (framing, tracked send, gather, mix)"]
    signed = rows[SIGNED]
    gloo = rows["torch.distributed gloo all_reduce + /2"]
    assert raw and unsigned and signed
    width = max(len(k) for k in rows)
    print(f"\n{'exchange':<{width}}  {'time':>9}  {'GB/s each way':>13}  {'/ signed':>8}")
    for name, seconds in rows.items():
        if seconds is None:
            print(f"{name:<{width}}  {'skipped':>9}")
            continue
        print(f"{name:<{width}}  {seconds * 1000:7.0f} ms  {numel * 4 / seconds / 1e9:13.2f}  "
              f"{seconds / signed:8.2f}")
    print(f"\n{'goal':<48} {'ratio':>7}  {'target':>8}  met")
    goals = [("unsigned / raw pyzmq", unsigned / raw, "<= 1.3", unsigned / raw <= 1.3),
             ("signed / unsigned (what signing adds)", signed / unsigned, "<= 1.15",
              signed / unsigned <= 1.15)]
    curve = rows[CURVE]
    assert curve
    goals.append(("CurveZMQ on / off (what transport encryption adds)", curve / signed, "(report)", True))
    raw_curve = rows[RAW_CURVE]
    assert raw_curve
    # where the encryption's time goes: libzmq's CurveZMQ on bare sockets against the same without it,
    # and what our exchange adds on top of it
    goals.append(("raw CurveZMQ / raw pyzmq (libzmq's own cost)", raw_curve / raw, "(report)", True))
    goals.append(("ours + CurveZMQ / raw CurveZMQ", curve / raw_curve, "(report)", True))
    if gloo is not None:
        goals.append(("signed / gloo all_reduce", signed / gloo, "<= 2.5", signed / gloo <= 2.5))
    if hivemind_s is not None:
        goals.append(("hivemind / signed", hivemind_s / signed, ">= 8", hivemind_s / signed >= 8))
    for name, ratio, target, met in goals:
        print(f"{name:<48} {ratio:7.2f}  {target:>8}  {'yes' if met else 'NO'}")
    if hivemind_s is None:
        print(f"\nhivemind skipped: {note}")
    else:
        print(f"\n({note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
