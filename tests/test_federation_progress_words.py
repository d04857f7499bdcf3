"""One vocabulary of progress (issue 30, item 4; acceptance d) on a real two-gateway federation.

Two gateways with two edge clients each run 10 FedAvg rounds with two gossip rounds after each
(so their gossip machines count 20); gw0 and its client e000 are stopped (SIGTERM) after gw0's
third round's line and started again. Afterwards every view counts FedAvg rounds: the status
table and text show ``round 10/10`` and no client ``up``, ``--json`` says the same numbers, gw0's
stop and restart lines name the same round, as e000's do, each edge's counters agree, ``export``
names the round, and the last line of each gateway's ``rounds.jsonl`` is ``hivemesh eval`` of its
export (the model after the round's gossip) to 1e-6. The pure views: tests/test_status_federation.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _federation_support import CEILING_S, describe, make_federation, processes, status, wait_until

from peer.cli.main import main

pytestmark = pytest.mark.processes

ROUNDS, GOSSIP_ROUNDS, STOP_AFTER = 10, 2, 3


def rounds_lines(out: Path, gateway: str) -> list[dict[str, object]]:
    path = out / "data" / gateway / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_finished_two_gateway_federation_counts_fedavg_rounds_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    files = make_federation(tmp_path / "fed", gateways=2, edges=4, rounds=ROUNDS, gossip_rounds=GOSSIP_ROUNDS,
                            fraction=1.0, min_clients=2, local_epochs=1, max_samples=200, partition="iid")
    out, gateways, edges = files.network.out, sorted(files.network.configs), sorted(files.edge_configs)
    # Execute: the whole run, gw0 stopped and started again on the way
    with processes(files) as run:
        run.start_all()
        wait_until(f"gw0 wrote {STOP_AFTER} rounds", lambda: len(rounds_lines(out, "gw0")) >= STOP_AFTER,
                   files)
        run.terminate("gw0")
        assert run.wait(60.0, ["gw0"]) and run.exitcodes()["gw0"] == 0, describe(files)
        run.terminate("e000")
        assert run.wait(60.0, ["e000"]) and run.exitcodes()["e000"] == 0, describe(files)
        run.start("gw0")
        run.start("e000")
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    capsys.readouterr()
    assert main(["status", "--net", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    details = {}
    for name in gateways:
        assert main(["status", "--config", str(files.network.configs[name])]) == 0
        details[name] = capsys.readouterr().out
    exported = {}
    for name in gateways:
        model = tmp_path / f"{name}.safetensors"
        assert main(["export", "--config", str(files.network.configs[name]), "--out", str(model)]) == 0
        said = capsys.readouterr().out
        assert main(["eval", "--model", str(model), "--json"]) == 0
        exported[name] = (said, json.loads(capsys.readouterr().out))
    # Assert
    assert codes == {name: 0 for name in codes}, codes
    rows = {row.split()[0]: row.split() for row in table[1:]}
    assert table[0].split()[9] == "round" and set(rows) == {*gateways, *edges}, table
    for name in [*gateways, *edges]:
        assert rows[name][1] == "finished" and rows[name][6] == f"{ROUNDS}/{ROUNDS}", table
        assert "up" not in rows[name], table
    for name in gateways:
        fed = status(files, name)["federation"]
        assert fed["round"] == fed["rounds"] == fed["rounds_closed"] == ROUNDS, fed
        assert status(files, name)["metrics"]["round"] == ROUNDS * GOSSIP_ROUNDS    # its gossip rounds
        assert rows[name][2] == "-"         # a gateway trains nothing: no steps
        assert f"federation (sync): round {ROUNDS}/{ROUNDS} (finished)" in details[name]
        assert f"gossip round {ROUNDS * GOSSIP_ROUNDS};" in details[name]
        clients = [line.split() for line in details[name].splitlines() if line.startswith("    e0")]
        assert clients and all(words[1] == "finished" for words in clients), details[name]
        # the last line of rounds.jsonl is the exported model (after the last round's gossip)
        lines = rounds_lines(out, name)
        assert sorted(line["round"] for line in lines) == list(range(ROUNDS)), lines
        said, evaluated = exported[name]
        assert f"{name} at round {ROUNDS}/{ROUNDS}" in said, said
        assert abs(lines[-1]["accuracy"] - evaluated["accuracy"]) <= 1e-6, (lines[-1], evaluated)
        assert abs(lines[-1]["test_loss"] - evaluated["loss"]) <= 1e-6, (lines[-1], evaluated)
    # gw0's stop and restart name the same FedAvg round, the one its checkpoint holds
    log = (out / "data" / "gw0" / "peer.log").read_text()
    stopped = re.search(r"gw0: SIGTERM: checkpoint written at round (\d+)/10; exiting", log)
    resumed = re.search(r"gw0: resumed from checkpoint at round (\d+)/10 \(epoch 1\)", log)
    assert stopped and resumed and stopped[1] == resumed[1] and int(stopped[1]) >= STOP_AFTER, log
    log = (out / "data" / "e000" / "peer.log").read_text()
    stopped = re.search(r"e000: SIGTERM: checkpoint written after training round (\d+) \((\d+) rounds", log)
    resumed = re.search(r"e000: resumed from checkpoint after training round (\d+) \((\d+) rounds", log)
    assert stopped and resumed and stopped.groups() == resumed.groups(), log
    # each edge's counters agree: no more rounds trained than run, an upload for each training
    for name in edges:
        found = status(files, name)
        client = found["client"]
        assert found["round"] == found["rounds"] == ROUNDS and 1 <= found["rounds_trained"] <= ROUNDS, found
        assert found["rounds_trained"] == client["rounds_trained"]
        assert found["updates_sent"] == client["updates_sent"]
        assert (client["updates_sent"] + client.get("nonfinite_update", 0)
                == client["rounds_trained"] + client.get("rounds_retrained", 0)), client
