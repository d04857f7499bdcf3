"""``hivemesh status`` on status.json files written here (issue 17, item 2): a finished run reads as
finished, plain words, test loss beside test accuracy, several peers as one table, --watch."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from peer.cli.init import default_network
from peer.cli.main import main
from peer.files.statefiles import write_json_atomic
from peer.runtime.netinit import NetworkFiles, create_network

GONE_PID = -1     # no process has it: the peer is not running


def _finished(name: str, neighbour: str, *, step: int = 300) -> dict[str, Any]:
    """What a peer's last status.json says after its run (the daemon's snapshot keys)."""
    return {"name": name, "state": "finished", "epoch": 0, "pid": GONE_PID, "updated_at": time.time() - 30.0,
            "step": step, "steps_done": step, "loss": 0.1234, "accuracy": 0.9456, "test_loss": 0.2345,
            "eval_step": step, "consensus_max_relative": 1.5e-3, "bytes_sent": 2_000_000,
            "bytes_received": 1_900_000, "payload_bytes_sent": 1_500_000, "rejections": {},
            "metrics": {"round": float(step), "stale_message": 2.0},
            # its neighbour said it had finished, and was still heard in the finish grace
            "neighbours": {neighbour: {"up": True, "presence": "up", "finished": True, "last_seen_s": 1.0,
                                       "latency_ms": 0.4, "step": step}}}


def _write(folder: Path, status: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "status.json", status)


def _network(folder: Path) -> NetworkFiles:
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=300, seed=0)
    return create_network(folder, peers=3, network=network)


def test_a_finished_run_reads_finished_in_plain_words_with_test_loss(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json_atomic(tmp_path / "status.json", _finished("p00", "p01"))
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("peer p00: finished, 3")
    assert "not running" in shown
    neighbour = next(line for line in shown.splitlines() if line.strip().startswith("p01"))
    assert neighbour.split()[1] == "finished", neighbour
    heard_s = float(neighbour.split("last heard ")[1].split()[0])
    assert 31.0 <= heard_s < 60.0, neighbour     # 1 s before the file was written, 30 s ago: not "1.0 s"
    assert "test loss 0.2345  test accuracy 0.9456 (at step 300)" in shown
    assert "gossip round 300; protocol events: stale message 2" in shown
    assert "machine:" not in shown and "epoch" not in shown


def test_a_stopped_peer_shows_a_live_neighbour_as_up_at_exit_and_a_crash_as_not_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stopped = _finished("p00", "p01") | {"state": "stopped"}
    stopped["neighbours"]["p01"]["finished"] = False
    write_json_atomic(tmp_path / "status.json", stopped)
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    assert " p01          up at exit " in capsys.readouterr().out
    write_json_atomic(tmp_path / "status.json", stopped | {"state": "training"})    # and then it was killed
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("peer p00: training, not running (last update 3")


def test_a_peer_waiting_at_start_says_whom_it_waits_for(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    waiting = {"name": "p00", "state": "waiting for neighbours", "pid": os.getpid(),
               "updated_at": time.time(), "step": 0, "waiting_for": "waiting for p01 (0/1 up)",
               "neighbours": {"p01": {"up": False, "presence": "never heard", "finished": False}}}
    _write(tmp_path, waiting)
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("peer p00: waiting for p01 (0/1 up), updated 0.")
    assert "p01          never heard last heard never" in shown


def test_a_running_peer_says_why_its_socket_to_a_neighbour_has_no_connection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = _finished("p00", "p01") | {"state": "training", "pid": os.getpid(), "updated_at": time.time()}
    running["neighbours"]["p01"] |= {"up": False, "presence": "down", "finished": False,
                                     "dial_down_s": 12.3, "dial_reason": "no answer"}
    _write(tmp_path, running)
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    neighbour = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("p01"))
    assert neighbour.endswith("no connection from us for 12.3 s (no answer)"), neighbour
    running["neighbours"]["p01"] |= {"dial_down_s": 0.0, "dial_reason": ""}     # connected again
    _write(tmp_path, running)
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    assert "no connection" not in capsys.readouterr().out


def test_a_network_shows_as_one_table_a_row_per_peer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _network(tmp_path / "net")
    data = tmp_path / "net" / "data"
    _write(data / "p00", _finished("p00", "p01"))
    _write(data / "p01", _finished("p01", "p00", step=299))
    # p02 has not been started: a row that says so, not an error
    assert main(["status", "--net", str(files.out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["peer", "state", "step", "train"]
    assert [row.split()[0] for row in table[1:]] == ["p00", "p01", "p02"]
    assert table[1].split()[1:9] == ["finished", "300", "0.1234", "0.2345", "0.9456", "300", "1.50e-03", "1"]
    assert "1 finished" in table[1] and "299" in table[2]
    assert "no status yet" in table[3]
    # the same table from the configs themselves (a shell's DIR/*.toml)
    assert main(["status", *(str(path) for path in files.configs.values())]) == 0
    ages = re.compile(r"[0-9.]+ s ago$")     # the clock moved on between the two
    again = capsys.readouterr().out.splitlines()
    assert [ages.sub("", row) for row in again] == [ages.sub("", row) for row in table]


def test_watch_redraws_the_table_until_its_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _network(tmp_path / "net")
    _write(tmp_path / "net" / "data" / "p00", _finished("p00", "p01"))
    assert main(["status", "--net", str(files.out), "--watch", "0.01", "--count", "3"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("peer  state") == 3      # three redraws of the header
    assert "\033[2J" not in shown               # no screen clearing into a pipe


def test_status_without_peers_or_with_a_folder_of_no_peers_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 2
    (tmp_path / "roster.toml").write_text("[[members]]\nname = 'p00'\n")
    assert main(["status", "--net", str(tmp_path)]) == 2
    assert "no peer config" in capsys.readouterr().err


def test_status_warns_when_curvezmq_is_off_and_shows_refused_connections(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on = {**_finished("p00", "p01"), "curve": True,
          "transport_refused": {"not_on_roster": 3, "closed_before_handshake": 2}}
    write_json_atomic(tmp_path / "status.json", on)
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "CurveZMQ is off" not in shown
    assert "connections refused: closed_before_handshake 2, not_on_roster 3" in shown
    write_json_atomic(tmp_path / "status.json", {**on, "curve": False})
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    assert "warning: CurveZMQ is off ([peer] curve = false)" in capsys.readouterr().out
