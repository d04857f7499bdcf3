"""The receiving end of tests/test_transport_cuts.py, in a process of its own (a libzmq assertion
aborts the whole process, exit 134): a Transport that reads its inbox only now and then, so its
connections' receive queues are full most of the time (libzmq stops reading them), while its
senders cut their connections (``abandon``) or it shuts them down itself (``punish``: the
descriptor under a frame, as Transport.punish does; ``ping``: a dialer that pings every
millisecond, its queue full of small messages when it is shut down); or (``edge``) an edge
client's DialTransport that never reads while its gateway queues replies and goes away.

Arguments: the repository root to import peer/ from (a worktree of an older commit reproduces the
crash there), the mode, the seconds to run and the path of a listening socket's descriptor number
(inherited). Prints one JSON line of counts at the end."""

from __future__ import annotations

import json
import random
import sys
import time


def main() -> None:
    root, mode, seconds, fd = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, root)
    import zmq

    from peer.net.transport import Transport, TransportConfig

    # ZMTP heartbeats ten times as often as the default: the old inbox's timer found its broken
    # connections ten times as fast (the mechanism needs one tick after the connection broke)
    config = TransportConfig(zmtp_heartbeat_ms=100, zmtp_heartbeat_timeout_ms=60_000)
    rng = random.Random(0)
    shut = drained = 0
    if mode == "ping":
        pinged(config, sys.argv[5], fd, seconds)
        return
    if mode == "edge":
        edge(config, sys.argv[5], seconds)
        return
    with Transport(listen=sys.argv[5], neighbours={}, config=config, listen_fd=fd) as transport:
        print("ready", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.0, 0.3))      # not reading: every connection's queue fills
            arrivals = transport.poll(0.0)
            drained += len(arrivals)
            if mode == "punish" and arrivals:
                # a connection whose queue is full again soon after: what a flooding member's is
                fds = {int(a.frame.get(zmq.SRCFD)) for a in arrivals}
                for fd_ in fds:
                    transport._shut(fd_, "test")
                shut += len(fds)
        print(json.dumps({"drained": drained, "shut": shut,
                          "closed": dict(transport.connections)}), flush=True)


def pinged(config: object, address: str, fd: int, seconds: float) -> None:
    """An inbox shuts down connections whose queue is full of small messages from a dialer that pings
    every millisecond (pings read ahead of the full queue), then reads: one dialer after another."""
    import zmq

    from peer.net.transport import Transport

    shut = 0
    with Transport(listen=address, neighbours={}, config=config, listen_fd=fd) as transport:  # type: ignore[arg-type]
        print("ready", flush=True)
        context = zmq.Context()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            dialer = context.socket(zmq.DEALER)
            for option, value in ((zmq.LINGER, 0), (zmq.HEARTBEAT_IVL, 1), (zmq.HEARTBEAT_TTL, 60_000),
                                  (zmq.HEARTBEAT_TIMEOUT, 60_000)):
                dialer.setsockopt(option, value)
            dialer.connect(address)
            dialer.send(b"x")
            arrivals = []
            while not arrivals:
                arrivals = transport.poll(1.0)
            flood_end = time.monotonic() + 0.02
            while time.monotonic() < flood_end:
                try:
                    dialer.send(b"h" * 100, zmq.NOBLOCK)
                except zmq.Again:
                    time.sleep(0.001)
            transport._shut(int(arrivals[0].frame.get(zmq.SRCFD)), "test")
            shut += 1
            time.sleep(0.005)
            while transport.poll(0.005):
                pass
            dialer.close(linger=0)
        context.term()
        print(json.dumps({"shut": shut}), flush=True)


def edge(config: object, address: str, seconds: float) -> None:
    """An edge client that never reads (it trains) while its gateway queues replies and goes away,
    again and again: it only says hello, to each gateway that comes up."""
    from peer.net.dial import DialTransport

    with DialTransport(address, config=config) as transport:  # type: ignore[arg-type]
        print("ready", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            transport.send([b"hello"])
            time.sleep(0.05)
        print(json.dumps({"handshakes": transport.handshakes}), flush=True)


if __name__ == "__main__":
    main()
