"""``hivemesh roster reload`` and SIGHUP (issue 16, item 3): a running peer re-reads its roster now.

The CLI finds the running peer by the PID in its data directory's *held* lock
(peer/runtime/datalock.py ``holder``) and sends it SIGHUP; the daemon's next
periodic pass reads the file whatever its modification time says
(``RosterWatch.poll(force=True)``). A free lock, or no lock file, is a clear
error: nothing is signalled. The process test at the end writes a new roster
version whose modification time does not change (what the peers' own look
cannot see), reloads two running peers, and reads what they said and applied.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon_support import hold_at, make_network, peers, status, wait_for_files, wait_for_locks, wait_for_log

from peer.cli.main import main
from peer.files import roster_file
from peer.runtime.datalock import LOCK_FILE, DataDirLock, holder
from peer.runtime.rosterwatch import NewVersion, RosterWatch
from protocols.identity import Identity
from protocols.roster import Member, Roster


def _roster(*names: str) -> Roster:
    return Roster(tuple(Member(name=name, public_id=Identity.generate().public_id,
                               address=f"tcp://127.0.0.1:{9000 + i}") for i, name in enumerate(names)))


def test_a_forced_poll_reads_the_file_even_when_its_time_says_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "roster.toml"
    v1 = _roster("p00", "p01", "p02")
    roster_file.write(path, v1)
    os.utime(path, ns=(5, 5))
    watch = RosterWatch(path, v1, every_s=10.0)
    assert watch.poll(0.0) is None           # the first poll reads the file: the same roster
    roster_file.write(path, v1.remove("p02").revised(7))
    os.utime(path, ns=(5, 5))                # a coarse file system: the same time after the edit
    assert watch.poll(20.0) is None          # the time says unchanged: not read
    found = watch.poll(20.5, force=True)     # SIGHUP: read anyway, before every_s is up
    assert isinstance(found, NewVersion) and found.roster.version == 2 and found.roster.effective_round == 7
    assert watch.poll(21.0, force=True) is None     # read again: nothing newer


def test_the_first_poll_sees_an_edit_made_before_the_watch_began(tmp_path: Path) -> None:
    path = tmp_path / "roster.toml"
    v1 = _roster("p00", "p01")
    roster_file.write(path, v1.add(_roster("p02").member("p02")).revised(3))   # edited while starting
    found = RosterWatch(path, v1).poll(0.0)
    assert isinstance(found, NewVersion) and found.roster.version == 2


def test_the_holder_of_a_data_directory_is_the_process_holding_its_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert holder(data) is None                       # no lock file
    lock = DataDirLock(data)
    assert holder(data) == os.getpid()
    lock.release()
    assert (data / LOCK_FILE).read_text().strip() == str(os.getpid())   # the PID is still written...
    assert holder(data) is None                                         # ...but nobody holds it


def test_reload_without_a_running_peer_is_an_error_and_signals_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    DataDirLock(data).release()       # a peer ran here and stopped: its PID (ours) is still in the file
    assert main(["roster", "reload", "--data-dir", str(data)]) == 2      # and we were not SIGHUPed
    assert "no peer is running on data directory" in capsys.readouterr().err


_CHILD = """
import signal, sys, time
from pathlib import Path
from peer.runtime.datalock import DataDirLock
got = Path(sys.argv[2])
signal.signal(signal.SIGHUP, lambda *_: got.touch())
held = DataDirLock(Path(sys.argv[1]))
Path(sys.argv[1], "ready").touch()
while not got.exists():
    time.sleep(0.01)
"""


def test_reload_sends_sighup_to_the_process_holding_the_data_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, got = tmp_path / "data", tmp_path / "got-sighup"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(data), str(got)],
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        wait_for_files([data / "ready"])
        assert main(["roster", "reload", "--data-dir", str(data)]) == 0
        assert f"sent SIGHUP to the peer (pid {child.pid})" in capsys.readouterr().out
        assert child.wait(timeout=30) == 0 and got.exists()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()


def test_reload_refuses_an_edge_clients_folder_and_signals_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, got = tmp_path / "data", tmp_path / "got-sighup"
    data.mkdir()
    (data / "status.json").write_text('{"name": "e000", "role": "edge"}')
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(data), str(got)],
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        wait_for_files([data / "ready"])
        assert main(["roster", "reload", "--data-dir", str(data)]) == 2
        assert "is edge client e000's" in capsys.readouterr().err
        assert child.poll() is None and not got.exists()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


_STARTING_EDGE = """
import sys
from pathlib import Path
import peer.runtime.edge as edge
from peer.cli.main import main
from peer.runtime.datalock import DataDirLock
data = Path(sys.argv[1])

class Starting:
    # an edge client holds its folder first, then builds its model (seconds) before any status says
    # "edge": an operator's reload meanwhile finds only a held lock
    def __init__(self, config, **options):
        self.lock = DataDirLock(data)
        main(["roster", "reload", "--data-dir", str(data)])

    def run(self):
        return 0

edge.load_edge_config = lambda path: None
edge.EdgeClient = Starting
sys.exit(edge.run_edge("edge.toml"))
"""


def test_an_edge_client_still_starting_survives_a_reload_of_its_folder(tmp_path: Path) -> None:
    # Execute: SIGHUP reaches the edge client before its first status names it an edge
    child = subprocess.run([sys.executable, "-c", _STARTING_EDGE, str(tmp_path / "data")],
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                           capture_output=True, text=True, timeout=120)
    # Assert: ignored (its default action would end the client), the client ran to its end
    assert child.returncode == 0, (child.returncode, child.stderr)


def test_a_version_the_node_refused_is_not_reported_held_and_a_corrected_one_is_taken(tmp_path: Path) -> None:
    # Prepare: a real daemon's pieces (its transport a recorder); version 2 gives p01 another key without
    # the rotation its old key must sign, so the Node refuses it
    from peer.runtime.daemon import PeerDaemon
    from peer.runtime.peerconfig import load_peer_config
    from tests.test_daemon_limits import RecordingTransport

    files = make_network(tmp_path / "net", peers=4, steps=20)
    peer = PeerDaemon(load_peer_config(files.configs["p00"]))
    peer.transport = RecordingTransport()  # type: ignore[assignment]
    peer._connect = lambda connect: None  # type: ignore[method-assign]  # (no sockets to dial or drop)
    try:
        peer.launch(resumed=False)
        v1 = roster_file.read(files.roster)
        stolen = dataclasses.replace(v1.member("p01"), public_id=Identity.generate().public_id)
        roster_file.write(files.roster, dataclasses.replace(
            v1, members=tuple(stolen if m.name == "p01" else m for m in v1.members)).revised(50))
        # Execute
        peer._reload_asked = True
        peer._follow_roster()
        # Assert: still version 1, and the status says so
        assert peer.node.membership.current.version == 1
        assert peer.node.all_rejections()["roster_key_change_unsigned"] == 1
        assert peer._snapshot()["roster_version"] == 1
        # Execute: the operator corrects version 2 in place (p03 removed from round 50), and reloads
        roster_file.write(files.roster, v1.remove("p03").revised(50))
        peer._reload_asked = True
        peer._follow_roster()
        # Assert: taken
        assert peer.node.membership.current.version == 2 and peer._snapshot()["roster_version"] == 2
    finally:
        peer.parts.lock.release()


@pytest.mark.processes
def test_running_peers_read_an_edit_their_clock_missed_on_reload_and_say_what_they_found(
        tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=2, steps=40)
    marks = tmp_path / "marks"
    marks.mkdir()
    release = tmp_path / "release"
    names = ["p00", "p01"]
    with peers(files) as processes:
        for name in names:
            processes.start(name, [hold_at(10, release, marks, name)])
        wait_for_locks(files, processes, names)
        wait_for_files(marks / f"{name}-held-10" for name in names)
        # the next version, written so that its modification time does not change (a coarse file
        # system): the peers' own look at the file cannot see it, only a reload can
        before = files.roster.stat()
        roster_file.write(files.roster, roster_file.read(files.roster).revised(30))
        os.utime(files.roster, ns=(before.st_atime_ns, before.st_mtime_ns))
        for name in names:
            assert main(["roster", "reload", "--config", str(files.configs[name])]) == 0
        for name in names:
            wait_for_log(files, name, "SIGHUP: roster")
        assert main(["roster", "reload", "--data-dir", str(files.out / "data" / "p00")]) == 0
        wait_for_log(files, "p00", "re-read: nothing new (version 2)")
        release.touch()
        assert processes.wait(120)
        codes = processes.exitcodes()
    assert codes == {"p00": 0, "p01": 0}
    for name in names:
        log = (files.out / "data" / name / "peer.log").read_text()
        assert f"SIGHUP: roster {files.roster} re-read: version 2 (effective from round 30)" in log, log
        assert "roster version 2 in effect from round 30" in log, log
        assert status(files, name)["roster_version"] == 2
        assert status(files, name)["rejections"].get("roster_version_mismatch", 0) == 0
    assert status(files, "p00")["roster_reloads"] == 2 and status(files, "p01")["roster_reloads"] == 1
