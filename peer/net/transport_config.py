"""A transport's socket limits and timings (``[transport]`` of a peer's or an edge client's config).

Its own module, below the socket code: the transport (peer/net/transport.py), the handshake
watch (peer/net/handshakes.py), the edge client's dial-out (peer/net/dial.py) and the config
files all read it, and none of them needs another's sockets to do so.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocols.codec import MAX_FRAME_BYTES as WIRE_FRAME_LIMIT_BYTES


@dataclass(frozen=True, kw_only=True)
class TransportConfig:
    """Socket limits and timings; the defaults suit a LAN or loopback."""

    # frames queued per outgoing connection; a 25M-parameter push is 25 frames, so this is ~2.5 pushes
    high_water_mark: int = 64
    # frames libzmq reads ahead per incoming connection before we look at them: with up to
    # max_frame_bytes each, this bounds what one member's connection pins (8 x 4 MiB)
    receive_high_water_mark: int = 8
    # the wire's frame limit plus slack for a header; a larger frame disconnects its sender
    max_frame_bytes: int = WIRE_FRAME_LIMIT_BYTES + 64 * 1024
    # drain at most this many messages per poll so timers and work still run under a flood
    max_messages_per_poll: int = 256
    # first reconnect attempt after this long, doubling up to the maximum (ZeroMQ back-off)
    reconnect_ms: int = 100
    reconnect_max_ms: int = 5000  # the back-off's ceiling
    # a dead TCP connection (a cable cut: the kernel would keep it for minutes) is found by the kernel,
    # never by libzmq's ZMTP heartbeats (link_options says why): an idle connection is probed every
    # keepalive_s, and one that answers no probe, or acknowledges none of our bytes, for dead_link_s
    # is closed (and dialed afresh)
    keepalive_s: int = 1
    # a link that answers no keepalive probe, or acknowledges none of our bytes, this long is closed
    dead_link_s: int = 5
    # how long a zero-copy send may hold a tensor before it is abandoned, however slowly it moves
    send_timeout_s: float = 30.0
    # a neighbour's connection whose kernel acknowledged none of our bytes this long is taken as cut
    # and its sends are abandoned before send_timeout_s (peer/net/progress.py); a slow link that
    # still moves bytes is waited for. The daemon sets it to the round deadline
    stall_timeout_s: float = 10.0
    # a member that sent a multipart message (the wire is single-frame, so it is hostile: libzmq
    # assembled all of it in memory) is disconnected and its handshakes refused this long
    multipart_cooldown_s: float = 60.0
    # connections mid-handshake at once; beyond it the oldest is shut down. libzmq buffers a
    # handshake frame of up to max_frame_bytes per connection, so this bounds what strangers pin
    max_handshaking_connections: int = 3
    # connections one member (one CURVE key) may hold to our inbox; beyond it its oldest are shut down.
    # libzmq reads ahead per connection (a frame being read, receive_high_water_mark queued), so this
    # bounds what one member pins; an honest member holds one, two while it redials
    max_connections_per_member: int = 2

    def __post_init__(self) -> None:
        for name in ("high_water_mark", "receive_high_water_mark", "max_frame_bytes", "max_messages_per_poll",
                     "max_handshaking_connections", "max_connections_per_member", "reconnect_ms",
                     "reconnect_max_ms", "keepalive_s", "dead_link_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.reconnect_max_ms < self.reconnect_ms:
            raise ValueError("reconnect_max_ms must be >= reconnect_ms")
        for name in ("send_timeout_s", "stall_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.multipart_cooldown_s < 0:
            raise ValueError(f"multipart_cooldown_s must be >= 0, got {self.multipart_cooldown_s}")
