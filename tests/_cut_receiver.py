"""The receiving end of tests/test_transport_cuts.py, in a process of its own (a libzmq assertion
aborts the whole process, exit 134): a Transport that reads its inbox only now and then, so its
connections' receive queues are full most of the time (libzmq stops reading them), while its
senders cut their connections (``abandon``) or it shuts them down itself (``punish``: the
descriptor under a frame, as Transport.punish does); or (``edge``) an edge
client's DialTransport that reads only between rounds while its gateway queues replies and goes away.

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
    import dataclasses

    import zmq

    from peer.net.transport import Transport, TransportConfig

    # an older commit's transport (root) sent ZMTP heartbeats: ten times as often as its default, its
    # inbox's timer found its broken connections ten times as fast (the mechanism needs one tick)
    old = {f.name for f in dataclasses.fields(TransportConfig)} >= {"zmtp_heartbeat_ms"}
    faster = {"zmtp_heartbeat_ms": 100, "zmtp_heartbeat_timeout_ms": 60_000}
    config = TransportConfig(**(faster if old else {}))
    rng = random.Random(0)
    shut = drained = 0
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


def edge(config: object, address: str, seconds: float) -> None:
    """An edge client that reads only between its rounds of training (0.1-0.4 s each here) while its
    gateway queues replies past the client's queue and goes away, again and again: it says hello,
    to each gateway that comes up. Before, its heartbeat timer aborted it at the first restart;
    now the broken connection is torn down when the client reads next, and it dials afresh."""
    from peer.net.dial import DialTransport

    rng = random.Random(0)
    drained = 0
    with DialTransport(address, config=config) as transport:  # type: ignore[arg-type]
        print("ready", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            transport.send([b"hello"])
            time.sleep(rng.uniform(0.1, 0.4))       # a round of training: nothing is read
            drained += len(transport.poll(0.0))
        print(json.dumps({"handshakes": transport.handshakes, "drained": drained}), flush=True)


if __name__ == "__main__":
    main()
