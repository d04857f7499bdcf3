"""``hivemesh status --net`` on a federation's folder: its gateway's row, then one per edge client
(their configs have an [edge] table), from status.json files written here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from peer.cli.init import default_network
from peer.cli.main import main
from peer.files.statefiles import write_json_atomic
from peer.runtime.netinit import create_federation

GONE_PID = -1     # no process has it: not running


def _edge(name: str, state: str, *, round_index: int, gateway_up: bool) -> dict[str, Any]:
    """What an edge client's status.json says (peer/runtime/edge.py's snapshot keys)."""
    return {"name": name, "role": "edge", "state": state, "epoch": 0, "pid": GONE_PID,
            "updated_at": time.time() - 5.0, "gateway": "gw0", "gateway_address": "tcp://127.0.0.1:1",
            "gateway_up": gateway_up, "round": round_index, "rounds": 5, "rounds_trained": 3,
            "updates_sent": 3,
            "unsent": {}, "step": 15, "loss": 0.4321, "num_samples": 140, "bytes_sent": 30_000,
            "bytes_received": 60_000, "listening": [], "rejections": {"replay": 1}, "client": {}}


def test_a_federation_folder_lists_its_gateway_then_its_edge_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a gateway and three edge clients; e000 finished (the final model came: all 5 rounds),
    # e001 gave up, e002 never started
    network = default_network(topology="ring", task="digits-mlp", algorithm="dpsgd", compression="identity",
                              steps=300, seed=0)
    files = create_federation(tmp_path / "fed", gateways=1, edges=3, network=network,
                              federation={"rounds": 5, "min_clients": 1})
    data = files.network.out / "data"
    for name, status in (("e000", _edge("e000", "finished", round_index=5, gateway_up=True)),
                         ("e001", _edge("e001", "gave up", round_index=-1, gateway_up=False))):
        (data / name).mkdir(parents=True)
        write_json_atomic(data / name / "status.json", status)
    # Execute
    assert main(["status", "--net", str(files.network.out)]) == 0
    # Assert
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows[1:]] == ["gw0", "e000", "e001", "e002"]
    assert "no status yet" in rows[1] and "no status yet" in rows[4]
    e000 = rows[2].split()
    assert e000[1:8] == ["finished", "15", "0.4321", "-", "-", "5/5", "-"]
    assert "gateway gw0 finished" in rows[2] and rows[2].split()[-4] == "1"        # rejected
    assert "gave up" in rows[3] and "(gone)" not in rows[3] and "gateway gw0 not heard" in rows[3]


def _gateway(*, gossip_round: int, clients: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A finished gateway's last status.json (peer/runtime/gateway.py's ``federation`` keys): 10 FedAvg
    rounds with two gossip rounds after each, so its gossip machine counted 20."""
    return {"name": "gw0", "state": "finished", "epoch": 0, "pid": GONE_PID,
            "updated_at": time.time() - 1500.0,
            "step": 0, "steps_done": gossip_round, "loss": None, "accuracy": 0.9111, "test_loss": 0.52,
            "eval_step": 10, "consensus_max_relative": 3e-4, "bytes_sent": 1000, "bytes_received": 1000,
            "rejections": {}, "metrics": {"round": float(gossip_round)}, "neighbours": {},
            "federation": {"mode": "sync", "phase": "finished", "round": 10, "rounds": 10,
                           "rounds_closed": 10,
                           "asked": ["e000", "e001"], "taken": [], "registered": ["e000", "e001"],
                           "counters": {}, "last_rounds": [], "clients": clients}}


def test_a_finished_gateway_counts_fedavg_rounds_and_shows_no_client_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: e000 was sent the final model; e001 was still heard when the gateway stopped writing
    clients = {"e000": {"up": True, "presence": "finished", "last_contact_s": 1.0},
               "e001": {"up": True, "presence": "up", "last_contact_s": 1.0}}
    write_json_atomic(tmp_path / "status.json", _gateway(gossip_round=20, clients=clients))
    # Execute
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    detail = capsys.readouterr().out
    assert main(["status", "--data-dir", str(tmp_path), "--data-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    # Assert: rounds are FedAvg rounds (gossip rounds named so), and no client of a stopped gateway is "up"
    assert "  round 10/10  test loss 0.5200  test accuracy 0.9111 (at round 10)" in detail
    assert "federation (sync): round 10/10 (finished)" in detail and "open round" not in detail
    assert "gossip round 20;" in detail and "round 20" not in detail.replace("gossip round 20", "")
    shown = {line.split()[0]: line.split()[1:3] for line in detail.splitlines() if line.startswith("    e0")}
    assert shown == {"e000": ["finished", "last"], "e001": ["up", "at"]}, detail
    row = table[1].split()
    assert row[:3] == ["gw0", "finished", "-"] and row[6] == "10/10", table
