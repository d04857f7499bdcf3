"""Whether a neighbour's connection still moves bytes: the kernel's count of our bytes it acked.

Why: a send still queued after the round deadline means either a cut neighbour (a pulled cable,
a split: nothing is acknowledged any more) or a slow but healthy link (a model larger than what
the link carries in a deadline: the kernel acknowledges a steady stream). Only the first may be
abandoned; the second would otherwise lose its message every round. ZeroMQ's trackers cannot tell
them apart (a frame is released only once all of it is in the kernel's buffer, which on a slow
link can take longer than a deadline), but TCP can: ``tcpi_bytes_acked`` of the connection grows
while the link carries data and stands still across a cut, or while the receiver stopped reading
(its window is zero).

The connection's descriptor belongs to libzmq's I/O thread; the outbox's monitor names it
(peer/net/handshakes.py ``HandshakeWatch.fd``: libzmq allows one monitor per socket) and we only
read TCP_INFO from a duplicate of it. libzmq may close the descriptor and the number may be reused
(by another neighbour's connection, whose bytes keep moving) before the monitor says so: the
reading is taken only from a TCP connection to the neighbour's own address. Linux only; elsewhere
(or before a connection is up) the probe answers None and the caller falls back to its deadline.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

# struct tcp_info (linux/tcp.h): tcpi_bytes_acked is the u64 at byte 120 (since Linux 4.1)
TCP_INFO_BYTES = 232
BYTES_ACKED_OFFSET = 120


def peer_of(address: str) -> tuple[str | None, int] | None:
    """``tcp://host:port`` as (host, port), the host None when it is a name (only the port is then
    compared); None for any other address (no TCP to read)."""
    if not address.startswith("tcp://"):
        return None
    host, _, port = address[len("tcp://"):].rpartition(":")
    try:
        literal: str | None = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        literal = None
    try:
        return literal, int(port)
    except ValueError:
        return None


def acked_bytes(fd: int | None, peer: tuple[str | None, int] | None) -> int | None:
    """The bytes the kernel acknowledged on TCP connection ``fd``, if it is one to ``peer``; None
    when there is none, it is not (the number was reused), or the platform has no TCP_INFO."""
    if fd is None or peer is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        with socket.socket(fileno=os.dup(fd)) as dup:
            if dup.type != socket.SOCK_STREAM or not _is(dup.getpeername(), peer):
                return None
            info = dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return None
    if len(info) < BYTES_ACKED_OFFSET + 8:
        return None
    return int(struct.unpack_from("=Q", info, BYTES_ACKED_OFFSET)[0])


def _is(name: tuple[str, int] | tuple[str, int, int, int], peer: tuple[str | None, int]) -> bool:
    host, port = peer
    return name[1] == port and (host is None or str(ipaddress.ip_address(name[0])) == host)
