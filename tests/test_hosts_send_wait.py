"""A peer's wait for its own sends tells a slow link from a cut one (issue 16), on two hosts.

Over a rate-limited cable a model message needs longer than the round deadline to cross: the
kernel keeps acknowledging its bytes, so it is waited for and arrives whole, not abandoned every
round (as when the wait was the round deadline). Pull the cable out while such a message is
queued: nothing is acknowledged any more, so it is abandoned after about the deadline, not after
``send_timeout_s`` (30 s). peer/net/progress.py says how; tests/_send_wait_peer.py is each end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fault_report import record
from _hosts_support import ENVIRONMENT, PORT, REPO, wait_until
from _netns import Hosts

pytestmark = [pytest.mark.hosts, pytest.mark.processes, pytest.mark.slow]

SCRIPT = str(REPO / "tests" / "_send_wait_peer.py")
DEADLINE_S = 1.0
FRAMES = 8              # 8 MiB: about 8.4 s over 8 Mbit/s, eight round deadlines
RATE_MBIT = 8.0


def logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(out.glob("*.log")))


def run_pair(hosts: Hosts, out: Path, tag: str) -> tuple[dict[str, subprocess.Popen[bytes]], Path, Path]:
    """Receiver on host 1, sender on host 0; returns them, the receiver's and the sender's result file."""
    received, sent = out / f"{tag}-received", out / f"{tag}-sent.json"
    b_addr = f"tcp://{hosts.addresses[1]}:{PORT}"
    processes = {
        "b": hosts.popen(1, [sys.executable, SCRIPT, "recv", b_addr, str(received), str(FRAMES << 20)],
                         log=out / f"{tag}-b.log", env=ENVIRONMENT, cwd=REPO),
        "a": hosts.popen(0, [sys.executable, SCRIPT, "send", f"tcp://{hosts.addresses[0]}:{PORT}", b_addr,
                             str(sent), str(FRAMES), str(DEADLINE_S)],
                         log=out / f"{tag}-a.log", env=ENVIRONMENT, cwd=REPO),
    }
    return processes, received, sent


def test_a_slow_link_gets_its_message_and_a_cut_one_does_not_hold_the_sender(tmp_path: Path) -> None:
    with Hosts(2, rate_mbit=RATE_MBIT) as hosts:
        # Execute (slow): 8 MiB queued over 8 Mbit/s, the wait's deadline 1 s
        processes, received, sent = run_pair(hosts, tmp_path, "slow")
        wait_until("the slow message's wait ends", sent.exists, {"a": processes["a"]}, lambda: logs(tmp_path))
        slow = json.loads(sent.read_text())
        # Assert: waited past the round deadline, nothing abandoned, every byte delivered
        assert slow["abandoned"] == 0, (slow, logs(tmp_path))
        wait_until("the slow message arrives", received.exists, {}, lambda: logs(tmp_path))
        assert slow["waited_s"] > DEADLINE_S and int(received.read_text()) >= FRAMES << 20
        sent.with_suffix(".stop").write_text("stop")
        for process in processes.values():
            process.wait()
        # Execute (cut): the same message queued, then the receiver's cable is pulled out
        processes, received, sent = run_pair(hosts, tmp_path, "cut")
        wait_until("the message is queued", sent.with_suffix(".queued").exists, processes,
                   lambda: logs(tmp_path))
        hosts.link_down(1)
        cut_at = time.monotonic()
        wait_until("the cut message's wait ends", sent.exists, {"a": processes["a"]}, lambda: logs(tmp_path))
        recovery_s = time.monotonic() - cut_at
        cut = json.loads(sent.read_text())
        # Assert: abandoned (counted), after about the deadline rather than the send timeout
        assert cut["abandoned"] > 0 and not received.exists(), (cut, logs(tmp_path))
        assert cut["waited_s"] < cut["send_timeout_s"] / 2, cut
        sent.with_suffix(".stop").write_text("stop")
    record("send queued over a slow link, then across a pulled cable", injected=2, survived=2,
           recovery_s=recovery_s,
           note=f"slow: {slow['waited_s']:.1f} s wait, delivered, 0 abandoned; cut: {cut['abandoned']} "
                f"frames abandoned after {cut['waited_s']:.1f} s (deadline {DEADLINE_S} s)")
