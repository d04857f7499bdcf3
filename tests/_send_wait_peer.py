"""One end of tests/test_hosts_send_wait.py, run on a host: ``recv`` counts the bytes it is sent
and writes the count once it has them all; ``send`` queues a model-sized message in 1 MiB frames,
says so in a file, waits for its sends as the daemon does (its transport config, for a small round
deadline), writes what the wait did and stays up until told to stop (a ``.stop`` file)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from peer.net.transport import Transport, TransportConfig
from peer.runtime.links import transport_config

FRAME_BYTES = 1 << 20


def publish(path: Path, text: str) -> None:
    """Write ``text`` whole before ``path`` exists: the test waits on the path, then reads it."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def receive(listen: str, out: Path, expect_bytes: int) -> None:
    with Transport(listen=listen, neighbours={}) as transport:
        got = 0
        while got < expect_bytes:
            got += sum(len(arrival.frame) for arrival in transport.poll(0.5))
        publish(out, str(got))


def send(listen: str, to: str, out: Path, frames: int, deadline_s: float) -> None:
    config = transport_config(TransportConfig(), deadline_s=deadline_s)
    with Transport(listen=listen, neighbours={"b": to}, config=config) as transport:
        while not transport.send("b", [b"hello"]):     # until connected (IMMEDIATE refuses before)
            time.sleep(0.05)
        payload = bytearray(FRAME_BYTES)
        assert transport.send("b", [payload] * frames)
        out.with_suffix(".queued").write_text("queued")
        began = time.monotonic()
        transport.wait_sent()
        publish(out, json.dumps({"waited_s": time.monotonic() - began,
                                 "abandoned": sum(transport.abandoned.values()),
                                 "send_timeout_s": config.send_timeout_s}))
        # a peer lives on: what the kernel and ZeroMQ still hold goes out (closing would drop it)
        stop = out.with_suffix(".stop")
        while not stop.exists():
            time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        receive(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
    else:
        send(sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
