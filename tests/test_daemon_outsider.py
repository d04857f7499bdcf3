"""Acceptance (a) of issue 14 with real peer processes and the default config (CurveZMQ on): a
client with no roster key, however it talks, never reaches the message decoder, costs the peer
little memory, and each of its connections is counted as refused, by reason.

Two peers train a few steps and are held (a test hook) while the outsider opens 50 connections to
one of them: CURVE clients with keys not on the roster and plaintext ZeroMQ clients, each with a
queue of junk multipart messages of many frame counts and sizes; raw TCP clients sending bytes
that are not ZeroMQ's, or nothing; raw clients that greet as ZeroMQ and then announce a handshake
frame of the transport's full frame limit and send it. Then the peers are released and finish.

The last ones are held open at once: libzmq decodes handshake commands with the same decoder as
messages, bounded only by MAXMSGSIZE (the wire's frame limit, 4 MiB, + 64 KiB), and waits
ZMQ_HANDSHAKE_IVL (30 s) for an incomplete one, so each such connection can pin a frame (10 at
once: ~160 MiB, measured without a bound when frames were 16 MiB). The transport keeps at most
``max_handshaking_connections`` (3) mid-handshake and sheds the rest.

Acceptance (e) of issue 32, in the same run: before those, a burst of 200 connections with a
member's key (p01's) that complete their handshake and say nothing (they once counted as
mid-handshake, so members were shed and 12 half-sent handshakes kept), and after them 4 connections
of that member sending frames of the wire's limit (libzmq reads ahead per connection). The
attacked peer's peak RSS may rise at most 64 MiB above that of the same network run clean.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
from _daemon_support import CEILING_S, hold_at, make_network, peers, status, wait_for_files
from zmq.utils.monitor import recv_monitor_message

from peer.files.keyfile import load_identity
from peer.files.statefiles import read_status
from peer.net.contexts import new_context
from peer.runtime.netinit import NetworkFiles, load_roster
from protocols.codec import MAX_FRAME_BYTES
from protocols.identity import Identity

pytestmark = pytest.mark.processes

STEPS = 30
HOLD_STEP = 10
CURVE_OUTSIDERS, PLAINTEXT, RAW_JUNK, RAW_SILENT, RAW_HUGE_HANDSHAKE = 15, 10, 10, 5, 20
ATTEMPTED = CURVE_OUTSIDERS + PLAINTEXT + RAW_JUNK + RAW_SILENT + RAW_HUGE_HANDSHAKE
HUGE_FRAME_BYTES = MAX_FRAME_BYTES     # the wire's frame limit: a frame that size is within MAXMSGSIZE
RSS_GROWTH_LIMIT_KIB = 64 * 1024
MEMBER_BURST = 200          # connections with a member's key that say nothing
MEMBER_STREAMS, FRAMES_PER_STREAM = 4, 4    # connections of that member sending frames of the limit
MEMBER_DIAL_AT_ONCE = 2     # the burst dials this many at a time (past the cap it would be shed, and redial)
ENDED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
         | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_DISCONNECTED)   # a client's connection ended
CONNECTING = zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED  # traced only
SLOW_OUTSIDER_S = 5.0   # an outsider's connection that takes longer to end is reported (_until_ended)


def _not_zmtp(size: int) -> bytes:
    """Random bytes that are not ZeroMQ's: a first byte of 0xff (1 in 256 of random ones) would start
    a ZMTP greeting, and the rest could then read as a mechanism libzmq refuses by another name."""
    junk = os.urandom(size)
    return bytes([junk[0] % 0xFF]) + junk[1:]


def _kib(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (``VmRSS``, ``VmHWM``: the peak), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def _zmtp_greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting (64 bytes) as a client proposing ``mechanism``."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)


def _junk_messages() -> list[list[bytes]]:
    """Multipart messages of 1 to 64 frames and 0 bytes to 1 MiB per frame."""
    return [[os.urandom(64)] * count for count in (1, 2, 8, 64)] + [[bytes(size)] * 4 for size in
                                                                    (0, 1, 4096, 1 << 20)]


def _member(context: zmq.Context, address: str, server_key: bytes, member: Identity) -> zmq.Socket:
    """A connection with ``member``'s transport key; IMMEDIATE: writable once its handshake is done."""
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.IMMEDIATE, 1)
    dealer.setsockopt(zmq.SNDHWM, FRAMES_PER_STREAM + 1)
    dealer.curve_publickey = member.curve_public_key.encode()
    dealer.curve_secretkey = member.curve_secret_key.encode()
    dealer.curve_serverkey = server_key
    dealer.connect(address)
    return dealer


def _member_burst(context: zmq.Context, address: str, server_key: bytes, member: Identity,
                  count: int = MEMBER_BURST) -> list[zmq.Socket]:
    """``count`` connections of ``member`` that completed their handshake (and said nothing yet)."""
    burst: list[zmq.Socket] = []
    deadline = time.monotonic() + CEILING_S
    while len(burst) < count:
        wave = [_member(context, address, server_key, member) for _ in range(MEMBER_DIAL_AT_ONCE)]
        for dealer in wave:
            while not dealer.poll(100, zmq.POLLOUT):
                assert time.monotonic() < deadline, f"member connection {len(burst)} never completed"
            burst.append(dealer)
    return burst


def _member_streams(context: zmq.Context, address: str, server_key: bytes, member: Identity) -> None:
    """``member``'s 4 connections each send frames of the wire's limit (not messages: each is
    dropped unread as a header too long); returns once each connection's frames went out or the
    peer closed it (it keeps ``max_connections_per_member`` of them)."""
    body = bytes(HUGE_FRAME_BYTES)
    streams = _member_burst(context, address, server_key, member, MEMBER_STREAMS)
    monitors = [stream.get_monitor_socket(zmq.EVENT_DISCONNECTED) for stream in streams]
    try:
        trackers = [[stream.send(body, copy=False, track=True) for _ in range(FRAMES_PER_STREAM)]
                    for stream in streams]
        deadline = time.monotonic() + CEILING_S
        waiting = list(range(MEMBER_STREAMS))
        while waiting:
            assert time.monotonic() < deadline, f"member streams {waiting} neither sent nor closed"
            waiting = [i for i in waiting if not all(t.done for t in trackers[i]) and not monitors[i].poll(0)]
            time.sleep(0.05)
    finally:
        for stream, monitor in zip(streams, monitors, strict=True):
            stream.disable_monitor()        # before its reader closes (peer/net/handshakes.py says why)
            monitor.close(linger=0)
            stream.close(linger=0)


def _attack(context: zmq.Context, address: str, server_key: bytes,
            member: Identity) -> tuple[list[socket.socket], list[zmq.Socket]]:
    """The outsider's 60 connections, one at a time but for the last ones, after a burst of a
    member's silent connections. The held ones are returned (raw, member)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    for index in range(CURVE_OUTSIDERS + PLAINTEXT):
        client = context.socket(zmq.DEALER)
        client.linger = 0
        client.setsockopt(zmq.RECONNECT_IVL, 600_000)     # one connection each within the test
        if index < CURVE_OUTSIDERS:
            client.curve_publickey, client.curve_secretkey = zmq.curve_keypair()
            client.curve_serverkey = server_key
        events = client.get_monitor_socket(ENDED | CONNECTING)
        started_s = time.monotonic()
        client.connect(address)
        for message in _junk_messages():
            with contextlib.suppress(zmq.Again):     # (once refused it has no connection to queue on)
                client.send_multipart(message, flags=zmq.NOBLOCK)
        # (kept open: a client that hangs up first would be counted as a handshake cut short)
        _until_ended(events, index, port, started_s)
        # its monitor is no longer read: stopped, or once its queue filled libzmq's I/O thread,
        # which all these clients share, would block on it for good (seen: every later outsider
        # then waited out the ceiling, its refusal unread in the kernel, CLOSE-WAIT)
        client.disable_monitor()
        events.close(linger=0)
    for index in range(RAW_JUNK + RAW_SILENT):
        with socket.create_connection((host, int(port))) as raw:
            if index < RAW_JUNK:
                raw.sendall(b"GET / HTTP/1.1\r\nHost: peer\r\n\r\n" if index % 2 else _not_zmtp(64 * 1024))
                _until_hung_up(raw)
    burst = _member_burst(context, address, server_key, member)
    # at once: each announces a handshake command frame (flags 0x06: command, 8-byte size) of the
    # full frame limit and sends all of it but the last byte, which libzmq would wait for
    held = [socket.create_connection((host, int(port))) for _ in range(RAW_HUGE_HANDSHAKE)]
    body = bytes(HUGE_FRAME_BYTES - 1)

    def send(raw: socket.socket) -> None:
        with contextlib.suppress(OSError):      # (shut down before all of it arrived)
            raw.sendall(_zmtp_greeting(b"CURVE") + b"\x06" + HUGE_FRAME_BYTES.to_bytes(8, "big"))
            raw.sendall(body)

    senders = [threading.Thread(target=send, args=(raw,)) for raw in held]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    return held, burst


def _until_ended(events: zmq.Socket, index: int, port: str, start: float) -> None:
    """Wait, up to the process tests' ceiling, until outsider ``index``'s connection (dialled at
    monotonic time ``start``) ended.

    On a loaded machine the peer's answer to one outsider has been seen to come tens of seconds
    (up to about 100 s) late, not yet explained. A wait beyond ``SLOW_OUTSIDER_S`` is therefore
    reported (a warning, not a failure: this is no timing bet) with what would tell where the time
    went: the client's connection events (``CONNECTED`` says TCP was up) and the peer's accept
    queue at that moment (connections its libzmq had not accepted yet)."""
    seen: list[str] = []
    queued = ""
    while True:
        waited_s = time.monotonic() - start
        if not queued and waited_s > SLOW_OUTSIDER_S:
            queued = _accept_queue(int(port))
        assert waited_s < CEILING_S, (f"the peer neither refused nor dropped outsider {index}; its "
                                      f"connection's events: {seen}; accept queue: {queued}")
        if not events.poll(1000):
            continue
        event = recv_monitor_message(events)
        seen.append(f"{time.monotonic() - start:.2f} s {zmq.Event(event['event']).name}")
        if event["event"] & ENDED:
            break
    if time.monotonic() - start > SLOW_OUTSIDER_S:
        warnings.warn(f"outsider {index} ended only after {time.monotonic() - start:.1f} s: "
                      f"events {seen}; the peer's accept queue after {SLOW_OUTSIDER_S} s: {queued}",
                      stacklevel=2)


def _accept_queue(port: int) -> str:
    """Connections waiting in the accept queue of the listening socket on ``port`` (/proc/net/tcp:
    a listener's rx_queue is its accept backlog)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":      # 0A: LISTEN
            return str(int(fields[4].split(":")[1], 16))
    return "no listener found"


def _until_hung_up(raw: socket.socket) -> None:
    try:
        while raw.recv(65536):
            pass
    except OSError:
        pass


def _connections(found: dict[str, Any]) -> dict[str, int]:
    return found.get("transport_connections") or {}


def _seen(files: NetworkFiles, name: str, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``name``'s status once it meets ``condition`` (status.json is refreshed each second)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        found = read_status(files.out / "data" / name)
        if found is not None and condition(found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"never seen: {read_status(files.out / 'data' / name)}")


def _counted(files: NetworkFiles, name: str, accepted_before: int) -> dict[str, Any]:
    """p00's status once every attempted connection has been counted (status.json, refreshed each second)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        found = read_status(files.out / "data" / name)
        if found is not None:
            refused = sum((found.get("transport_refused") or {}).values())
            accepted = (found.get("transport_connections") or {}).get("accepted", 0)
            if refused >= ATTEMPTED and accepted >= accepted_before + ATTEMPTED:
                return found
        time.sleep(0.1)
    raise AssertionError(f"not all counted: {read_status(files.out / 'data' / name)}")


def test_an_outsider_never_reaches_the_decoder_and_every_connection_is_counted(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=2, topology="complete", steps=STEPS)
    roster = load_roster(files.roster)
    target = roster.member("p00")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    with peers(files) as processes:
        processes.start_all({name: [hold_at(HOLD_STEP, gate, marks, name)] for name in files.configs})
        wait_for_files(marks / f"{name}-held-{HOLD_STEP}" for name in files.configs)
        pid = processes.processes["p00"].pid
        assert pid is not None
        before = status(files, "p00")
        assert before["curve"] is True and not before.get("transport_refused")
        peak_before_kib = _kib(pid, "VmHWM")
        context = new_context()
        member = load_identity(files.keys["p01"])
        try:
            held, burst = _attack(context, target.address, target.curve_key.encode(), member)
            peaks_kib = {"handshakes": _kib(pid, "VmHWM")}
            during = _seen(files, "p00", lambda found: _connections(found).get("shed_mid_handshake", 0)
                           >= RAW_HUGE_HANDSHAKE - 3)
            for raw in held:
                raw.close()
            after = _counted(files, "p00", before["transport_connections"].get("accepted", 0))
            # then (the half-sent handshakes ended: they pin 3 frames while held) the member's streams
            _member_streams(context, target.address, target.curve_key.encode(), member)
            peaks_kib["member streams"] = _kib(pid, "VmHWM")
            # it kept max_connections_per_member (2) of its connections: of its 4 streams and its own
            _seen(files, "p00",
                  lambda found: _connections(found).get("closed_surplus_connection", 0) >= MEMBER_STREAMS - 2)
            for dealer in burst:
                dealer.close(linger=0)
        finally:
            context.destroy(linger=0)
        gate.touch()
        assert processes.wait(CEILING_S), "the peers did not finish"
        codes = processes.exitcodes()
    assert all(code == 0 for code in codes.values()), codes
    refused = after["transport_refused"]
    # every connection counted once, by reason
    assert sum(refused.values()) == ATTEMPTED, refused
    assert refused["not_on_roster"] == CURVE_OUTSIDERS, refused
    # a plaintext client that reads the peer's greeting first hangs up before its own mechanism is
    # read: then the peer can only say the handshake was cut short (libzmq decides the race, so
    # the two reasons are checked together)
    assert (refused["handshake_zmtp_mechanism_mismatch"] + refused["handshake_no_detail"]
            == PLAINTEXT + RAW_SILENT + RAW_HUGE_HANDSHAKE), refused
    assert refused["closed_before_handshake"] == RAW_JUNK, refused
    # beyond max_handshaking_connections (3) the half-sent handshakes were shut down: 3 frames
    # pinned; and none of the member's silent connections (each was past its handshake)
    connections = _connections(during)
    assert connections.get("closed_after_handshake", 0) <= connections.get("closed_surplus_connection", 0)
    # nothing reached the decoder: no message accepted or refused beyond the honest neighbour's
    final = status(files, "p00")
    assert sum((final.get("rejections") or {}).values()) == 0, final["rejections"]
    assert final["step"] == STEPS
    growth_kib = {phase: peak - peak_before_kib for phase, peak in peaks_kib.items()}
    print(f"p00 peak RSS growth over its own before the attack, KiB: {growth_kib}")
    # the strangers' part, as issue 14 had it: the 3 half-sent handshakes kept pin 48 MiB
    assert growth_kib["handshakes"] < RSS_GROWTH_LIMIT_KIB, f"peak RSS grew {growth_kib} KiB"
    # training as without the attack: the same network run clean ends within 1 point of accuracy
    clean = make_network(tmp_path / "clean", peers=2, topology="complete", steps=STEPS)
    with peers(clean) as processes:
        processes.start_all()
        assert processes.wait(CEILING_S), "the clean peers did not finish"
        assert all(code == 0 for code in processes.exitcodes().values())
    # and its peak memory within 64 MiB of the clean run's (issue 32, acceptance e)
    attacked_mib, clean_mib = final["memory_peak_mib"], status(clean, "p00")["memory_peak_mib"]
    print(f"p00 peak RSS: attacked {attacked_mib:.0f} MiB, clean {clean_mib:.0f} MiB")
    for name in files.configs:
        attacked_accuracy, clean_accuracy = status(files, name)["accuracy"], status(clean, name)["accuracy"]
        assert abs(attacked_accuracy - clean_accuracy) <= 0.01, (name, attacked_accuracy, clean_accuracy)
    # the memory verdict last, so every other check has run when it fails
    assert attacked_mib - clean_mib <= RSS_GROWTH_LIMIT_KIB / 1024, (attacked_mib, clean_mib)
