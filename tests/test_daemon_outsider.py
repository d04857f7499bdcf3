"""Acceptance (a) of issue 14 with real peer processes and the default config (CurveZMQ on): a
client with no roster key, however it talks, never reaches the message decoder, costs the peer
little memory, and each of its connections is counted as refused, by reason.

Two peers train a few steps and are held (a test hook) while the outsider opens 50 connections to
one of them: CURVE clients with keys not on the roster and plaintext ZeroMQ clients, each with a
queue of junk multipart messages of many frame counts and sizes; raw TCP clients sending bytes
that are not ZeroMQ's, or nothing; raw clients that greet as ZeroMQ and then announce a handshake
frame of the transport's full frame limit and send it. Then the peers are released and finish.

The last ones are held open at once: libzmq decodes handshake commands with the same decoder as
messages, bounded only by MAXMSGSIZE (16 MiB + 64 KiB), and waits ZMQ_HANDSHAKE_IVL (30 s) for an
incomplete one, so each such connection can pin 16 MiB (10 at once: ~160 MiB, measured without a
bound). The transport keeps at most ``max_handshaking_connections`` (3) mid-handshake and shuts the
oldest down beyond that.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import zmq
from _daemon_support import CEILING_S, hold_at, make_network, peers, status, wait_for_files
from zmq.utils.monitor import recv_monitor_message

from peer.files.statefiles import read_status
from peer.net.contexts import new_context
from peer.runtime.netinit import NetworkFiles, load_roster

pytestmark = pytest.mark.processes

STEPS = 30
HOLD_STEP = 10
CURVE_OUTSIDERS, PLAINTEXT, RAW_JUNK, RAW_SILENT, RAW_HUGE_HANDSHAKE = 15, 10, 10, 5, 10
ATTEMPTED = CURVE_OUTSIDERS + PLAINTEXT + RAW_JUNK + RAW_SILENT + RAW_HUGE_HANDSHAKE
HUGE_FRAME_BYTES = 16 * 1024 * 1024     # the wire's frame limit: a frame that size is within MAXMSGSIZE
RSS_GROWTH_LIMIT_KIB = 64 * 1024
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


def _attack(context: zmq.Context, address: str, server_key: bytes) -> list[socket.socket]:
    """The outsider's 50 connections, one at a time but for the last ones: those are held open at
    once, and returned."""
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
    return held


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
        try:
            held = _attack(context, target.address, target.curve_key.encode())
            peak_after_kib = _kib(pid, "VmHWM")
            for raw in held:
                raw.close()
            after = _counted(files, "p00", before["transport_connections"].get("accepted", 0))
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
    # beyond max_handshaking_connections (3) the oldest handshakes were shut down: 3 frames pinned
    assert after["transport_connections"].get("shed_mid_handshake", 0) >= RAW_HUGE_HANDSHAKE - 3
    assert after["transport_connections"].get("closed_after_handshake", 0) == 0
    # nothing reached the decoder: no message accepted or refused beyond the honest neighbour's
    final = status(files, "p00")
    assert sum((final.get("rejections") or {}).values()) == 0, final["rejections"]
    assert final["step"] == STEPS
    growth_kib = peak_after_kib - peak_before_kib
    assert growth_kib < RSS_GROWTH_LIMIT_KIB, f"peak RSS grew {growth_kib} KiB under the attack"
    # training as without the attack: the same network run clean ends within 1 point of accuracy
    clean = make_network(tmp_path / "clean", peers=2, topology="complete", steps=STEPS)
    with peers(clean) as processes:
        processes.start_all()
        assert processes.wait(CEILING_S), "the clean peers did not finish"
        assert all(code == 0 for code in processes.exitcodes().values())
    for name in files.configs:
        attacked_accuracy, clean_accuracy = status(files, name)["accuracy"], status(clean, name)["accuracy"]
        assert abs(attacked_accuracy - clean_accuracy) <= 0.01, (name, attacked_accuracy, clean_accuracy)
