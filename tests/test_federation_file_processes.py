"""Issue 30, acceptance (c): `hivemesh init --gateways 2 --edges 4`, one edit of federation.toml, and
all six members start as real processes on 127.0.0.1 and agree on it; the same key changed in one
member's own file is refused at that member's start, naming the key.

The edit is ``rounds``: what every member acts on and shows (the gateways close exactly that many
rounds in rounds.jsonl, each with its two clients' updates taken, which a client of another run id
could never give; each client trains every round, min_clients being 2 of the 2 a gateway serves)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from _federation_support import init_federation, status, wait_until

from peer.cli.main import main
from peer.files.statefiles import read_status
from peer.runtime.launch import PeerProcesses

pytestmark = [pytest.mark.processes, pytest.mark.slow]

GATEWAYS, EDGES = ("gw0", "gw1"), ("e000", "e001", "e002", "e003")
ROUNDS = 2          # the edit: init writes 30
CEILING_S = 300.0   # a healthy run of 2 rounds takes seconds; this only ends a hung one


def log_time(line: str) -> datetime:
    return datetime.fromisoformat(line.split(" ", 1)[0])


def closed_rounds(out: Path, gateway: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "data" / gateway / "rounds.jsonl").read_text().splitlines()]


def test_one_edit_of_federation_toml_is_what_all_six_members_run(tmp_path: Path) -> None:
    # Prepare: init's files, one edit of the shared file
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "4", "--out", str(out)]) == 0
    shared = out / "federation.toml"
    assert "rounds = 30\n" in shared.read_text()
    shared.write_text(shared.read_text().replace("rounds = 30\n", f"rounds = {ROUNDS}\n"))
    configs = {name: out / f"{name}.toml" for name in GATEWAYS}
    edges = {name: out / f"{name}.toml" for name in EDGES}
    # Execute: all six, as real processes, until each has finished
    with PeerProcesses(configs, edges=edges) as run:
        run.start_all()
        assert run.wait(CEILING_S), f"still running: {run.alive()}"
        codes = run.exitcodes()
    # Assert: every member finished cleanly, on the edited number of rounds
    assert codes == dict.fromkeys((*GATEWAYS, *EDGES), 0), codes
    gateway_of = {"e000": "gw0", "e001": "gw0", "e002": "gw1", "e003": "gw1"}
    for gateway in GATEWAYS:
        rows = closed_rounds(out, gateway)
        assert [row["round"] for row in rows] == list(range(ROUNDS)), rows
        mine = sorted(edge for edge, theirs in gateway_of.items() if theirs == gateway)
        assert all(sorted(row["taken"]) == mine for row in rows), rows    # type: ignore[call-overload]
    for edge in EDGES:
        found = read_status(out / "data" / edge) or {}
        assert (found.get("state"), found.get("rounds_trained")) == ("finished", ROUNDS), (edge, found)


@pytest.mark.parametrize("member", ["gw1", "e001"])
def test_the_key_changed_in_one_members_own_file_is_refused_at_its_start(tmp_path: Path, member: str) -> None:
    # Prepare
    out = tmp_path / "fed"
    assert main(["init", "--gateways", "2", "--edges", "4", "--out", str(out)]) == 0
    own = out / f"{member}.toml"
    own.write_text(own.read_text() + f"\n[federation]\nrounds = {ROUNDS}\n")
    command = "peer" if member.startswith("gw") else "edge"
    # Execute: the member's start, as an operator runs it
    done = subprocess.run([sys.executable, "-m", "peer", command, "--config", str(own)],
                          capture_output=True, text=True, timeout=CEILING_S, check=False)
    # Assert: exit 2, one line naming the file, the key and the shared file it belongs to
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"{member}.toml: key 'federation.rounds'" in lines[0] and "federation.toml" in lines[0]
    assert not (out / "data" / member / "status.json").exists()      # it never started


def test_an_edge_whose_federation_table_differs_names_the_key_the_gateway_refuses(tmp_path: Path) -> None:
    # Prepare: e000's device holds an older copy of the shared file (fraction 0.3, the gateway's 0.5)
    files = init_federation(tmp_path / "fed", edges=2, rounds=30)
    out = files.network.out
    (out / "device.toml").write_text(files.shared.read_text().replace("fraction = 0.5\n", "fraction = 0.3\n"))
    e000 = files.edge_configs["e000"]
    e000.write_text(e000.read_text().replace('include = "federation.toml"', 'include = "device.toml"'))
    refused = "e000: gw0 refuses us: [federation] differs (fraction 0.5 at gw0 != 0.3 here)"
    logs = {name: out / "data" / name / "peer.log" for name in ("gw0", "e000")}

    def logged(name: str, text: str) -> bool:
        return logs[name].exists() and text in logs[name].read_text()

    # Execute: the gateway, then (once it serves) that edge, as real processes, until the edge names
    # what differs
    with PeerProcesses(files.network.configs, listeners=dict(files.network.listeners),
                       edges={"e000": e000}) as run:
        run.start("gw0")
        wait_until("gw0 serves", lambda: bool(status(files, "gw0").get("state")), files)
        run.start("e000")
        wait_until("e000 names the key", lambda: logged("e000", refused), files)
        wait_until("gw0 names the refusal", lambda: logged("gw0", "gw0 refused messages from e000"), files)
        wait_until("e000's status holds it", lambda: bool(status(files, "e000").get("settings_refused")),
                   files)
        found = status(files, "e000")
    # Assert: the edge says it once, in words, within 2 heartbeat intervals (init's 1 s) of its dial by
    # its own log clock; the gateway names the refusal; the edge's status holds it
    lines = logs["e000"].read_text().splitlines()
    dialed = next(line for line in lines if "e000: dials its gateway gw0" in line)
    said = next(line for line in lines if refused in line)
    assert (log_time(said) - log_time(dialed)).total_seconds() <= 2 * 1.0, lines
    assert logs["e000"].read_text().count("refuses us") == 1
    assert "config_mismatch" in logs["gw0"].read_text()
    assert found["settings_refused"] == refused.removeprefix("e000: ")
