"""A peer moves to another host while the network runs (issue 16, item 1): the operator stops it,
`hivemesh roster set-address` writes its new address as the roster's next version, and the peer
starts on the new host; its running neighbours read the roster file and dial it where it now listens.

4 peers on a ring on hosts 0-3, host 4 empty. At step 100 p02 stops (SIGTERM, by a
test hook: it checkpoints and exits 0) and the others are held there (a hook), since
a ring whose member is gone trains on without it and would finish before a slow
restart; p02 is moved to host 4 from a round none has reached, started there (it
resumes from its checkpoint) and held at step 100 too; then all are released. Every
peer finishes with the loopback bar (accuracy >= 0.90, consensus distance < 1e-2),
and p01 and p03 said they dialled p02 at its new address. Before, a running peer
dialled only neighbours new to it: a moved one was never heard again, and exited
stranded (status 3).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon_support import consensus_max_relative, hold_at, wait_for_files
from _hosts_support import PORT, describe, final_params, init_network, start_peer, wait_for_exit
from _netns import Hosts

from peer.cli.main import main
from peer.files import roster_file
from peer.files.statefiles import read_status
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.hosts, pytest.mark.processes, pytest.mark.slow]

PEERS, STEPS, MOVE_STEP, AHEAD_ROUNDS = 4, 300, 100, 20
MOVED, NEW_HOST = 2, 4


def test_a_peer_moved_to_another_host_is_dialled_there(tmp_path: Path) -> None:
    out, marks, moved_gate = tmp_path / "net", tmp_path / "marks", tmp_path / "gate-moved"
    marks.mkdir()
    with Hosts(PEERS + 1) as hosts:
        names = init_network(hosts, out, steps=STEPS, peers=PEERS)
        moved = names[MOVED]
        new_address = f"tcp://{hosts.addresses[NEW_HOST]}:{PORT}"
        hooks = {name: [hold_at(MOVE_STEP, moved_gate, marks, name)] for name in names}
        hooks[moved] = [Hook(at_step=MOVE_STEP, action="stop", mark=str(marks / f"{moved}-stopped"))]
        processes = {name: start_peer(hosts, index, out, name, hooks[name])
                     for index, name in enumerate(names)}
        assert processes[moved].wait(timeout=240) == 0, describe(out, names)
        wait_for_files(marks / f"{name}-held-{MOVE_STEP}" for name in names if name != moved)

        assert main(["roster", "set-address", "--roster", str(out / "roster.toml"), moved, new_address,
                     "--effective-round", str(MOVE_STEP + AHEAD_ROUNDS)]) == 0
        processes[moved] = start_peer(hosts, NEW_HOST, out, moved,
                                      [hold_at(MOVE_STEP, moved_gate, marks, moved)])
        wait_for_files([marks / f"{moved}-held-{MOVE_STEP}"])
        moved_gate.touch()
        codes = wait_for_exit(processes)
        report = describe(out, names)

    assert roster_file.read(out / "roster.toml").member(moved).address == new_address
    assert codes == dict.fromkeys(names, 0), f"{codes}\n{report}"
    for neighbour in (names[MOVED - 1], names[MOVED + 1]):
        log = (out / "data" / neighbour / "peer.log").read_text()
        assert f"dials {moved} at its new address {new_address}" in log, report
    assert f"resumed from checkpoint at step {MOVE_STEP}" in (out / "data" / moved / "peer.log").read_text()
    for name in names:
        found = read_status(out / "data" / name)
        assert found is not None and found["step"] == STEPS, report
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}\n{report}"
    assert consensus_max_relative(final_params(out, names)) < 1e-2, report
