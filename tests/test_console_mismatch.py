"""Acceptance (17a, third case) with real processes: a peer configured differently from its neighbour
is named on the console, with the reason and what differs, within a heartbeat interval; each answers
the other with its settings, so both name the first differing key (issue 30).

Before, the console said nothing: the refusals (``config_mismatch``) were only counted in status.json.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from _daemon_support import CEILING_S, make_network, peers, wait_for_log

from peer.files.statefiles import read_status
from peer.runtime.netinit import NetworkFiles

pytestmark = [pytest.mark.processes]

HEARTBEAT_INTERVAL_S = 1.0


def _wait_for_refusals(files: NetworkFiles, name: str, count: int) -> int:
    """Wait until ``name``'s status counts ``count`` config_mismatch refusals (a ceiling never reached)."""
    deadline = time.monotonic() + CEILING_S
    while time.monotonic() < deadline:
        found = read_status(files.out / "data" / name)
        refused = (found or {}).get("rejections", {}).get("config_mismatch", 0)
        if refused >= count:
            return int(refused)
        time.sleep(0.1)
    raise AssertionError(f"{name} did not refuse {count} messages in {CEILING_S} s")


def _stamp(log: str, text: str) -> datetime:
    line = next(x for x in log.splitlines() if text in x)
    return datetime.fromisoformat(line.split(" ", 1)[0])


def test_a_config_mismatch_is_said_once_naming_the_sender_within_a_heartbeat(tmp_path: Path) -> None:
    # Prepare: a ring of three; p01's [network] table differs from p00's (its learning rate), so its
    # run id differs and each refuses the other. p02 is not started.
    files = make_network(tmp_path / "net", peers=3, steps=50,
                         peer_options={"heartbeat_interval_s": HEARTBEAT_INTERVAL_S})
    p01 = files.configs["p01"]
    p01.write_text(p01.read_text().replace("lr = 0.1\n", "lr = 0.05\n"))
    with peers(files, ["p00", "p01"]) as processes:
        processes.start("p00")
        processes.start("p01")
        # Execute: wait for each to name the other, then for a few more refusals
        logs = {name: wait_for_log(files, name, f"{name} refused messages from {other}: config_mismatch")
                for name, other in (("p00", "p01"), ("p01", "p00"))}
        refused = {name: _wait_for_refusals(files, name, 3) for name in logs}
        # each answers the other with its settings (a SettingsRefusal), and each names the first
        # key where they part, theirs first (issue 30: the refusal names the key on both sides)
        said = {"p00": "p00: p01 refuses us: [network] differs (trainer.lr 0.05 at p01 != 0.1 here)",
                "p01": "p01: p00 refuses us: [network] differs (trainer.lr 0.1 at p00 != 0.05 here)"}
        for name, line in said.items():
            wait_for_log(files, name, line)
        logs = {name: (files.out / "data" / name / "peer.log").read_text() for name in logs}
    # Assert: the line names the sender, the reason and both run ids, and says what they digest
    for name, other in (("p00", "p01"), ("p01", "p00")):
        line = next(x for x in logs[name].splitlines() if "refused messages" in x)
        expected = (rf"{name} refused messages from {other}: config_mismatch \(their run id [0-9a-f]{{12}}"
                    rf" != ours [0-9a-f]{{12}}: the shared settings \(\[network\], \[federation\]\) differ\)")
        assert re.search(expected, line), line
        assert logs[name].count("refused messages") == 1, logs[name]     # once, however many refusals
        assert logs[name].count("refuses us") == 1, logs[name]           # once, however many answers
    # Assert: said within a heartbeat interval of the first message that could reach it: both peers
    # heartbeat first and then say whom they wait for, so the later of those lines marks the moment
    # both were up; the other's next heartbeat comes at most one interval later.
    up = max(_stamp(logs[name], f"{name}: waiting for") for name in logs)
    for name in logs:
        said_s = (_stamp(logs[name], "refused messages") - up).total_seconds()
        assert said_s <= 2 * HEARTBEAT_INTERVAL_S, (name, said_s, logs[name])
    assert all(count >= 3 for count in refused.values()), refused
