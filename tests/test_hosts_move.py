"""A peer moves to another host while the network runs (issue 16, item 1): the operator stops it,
`hivemesh roster set-address` writes its new address as the roster's next version, and the peer
starts on the new host; its running neighbours read the roster file and dial it where it now listens.

4 peers on a ring on hosts 0-3, host 4 empty; at step 100 p02 is stopped (SIGTERM:
it checkpoints), moved to host 4 from a round none has reached, and started there:
it resumes from its checkpoint. Every peer finishes with the loopback bar
(accuracy >= 0.90, consensus distance < 1e-2), and p01 and p03 said they dialled
p02 at its new address (before, a running peer dialled only neighbours it had not
known, so a moved one was never heard from again).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _daemon_support import consensus_max_relative
from _hosts_support import (
    PORT,
    describe,
    final_params,
    init_network,
    start_peer,
    steps,
    wait_for_exit,
    wait_for_step,
)
from _netns import Hosts

from peer.cli.main import main
from peer.files import roster_file
from peer.files.statefiles import read_status

pytestmark = [pytest.mark.hosts, pytest.mark.processes, pytest.mark.slow]

PEERS, STEPS, MOVE_STEP, AHEAD_ROUNDS = 4, 300, 100, 20
MOVED, NEW_HOST = 2, 4


def test_a_peer_moved_to_another_host_is_dialled_there(tmp_path: Path) -> None:
    out = tmp_path / "net"
    with Hosts(PEERS + 1) as hosts:
        names = init_network(hosts, out, steps=STEPS, peers=PEERS)
        processes = {name: start_peer(hosts, index, out, name) for index, name in enumerate(names)}
        wait_for_step(out, names, MOVE_STEP, processes)

        moved = names[MOVED]
        processes[moved].send_signal(signal.SIGTERM)
        assert processes[moved].wait(timeout=60) == 0, describe(out, names)
        effective = max(steps(out, names).values()) + AHEAD_ROUNDS
        assert main(["roster", "set-address", "--roster", str(out / "roster.toml"), moved,
                     f"{hosts.addresses[NEW_HOST]}:{PORT}", "--effective-round", str(effective)]) == 0
        processes[moved] = start_peer(hosts, NEW_HOST, out, moved)

        codes = wait_for_exit(processes)
        report = describe(out, names)

    new_address = f"tcp://{hosts.addresses[NEW_HOST]}:{PORT}"
    assert roster_file.read(out / "roster.toml").member(moved).address == new_address
    assert codes == dict.fromkeys(names, 0), f"{codes}\n{report}"
    for neighbour in (names[MOVED - 1], names[MOVED + 1]):
        log = (out / "data" / neighbour / "peer.log").read_text()
        assert f"dials {moved} at its new address {new_address}" in log, report
    for name in names:
        found = read_status(out / "data" / name)
        assert found is not None and found["step"] == STEPS, report
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}\n{report}"
    assert consensus_max_relative(final_params(out, names)) < 1e-2, report
