"""An edge client joins a running two-gateway federation on 127.0.0.1 (issue 16, item 3), as an
operator adds one: ``hivemesh roster add e010 --role edge --gateway gw1 --effective-round R``,
e010's config a copy of gw1's client e002's, ``hivemesh edge`` on the device, and the new roster
to the gateways with ``hivemesh roster reload``. Neither gateway's config changes (each lists its
own block of clients, as ``hivemesh init`` writes them): gw1 serves e010 because its roster entry
names it (``Serving``, protocols/node/membership.py); gw0 never does.

The device gets the new roster first, so e010 dials before its gateway has read it: the gateway
refuses the handshake (``not_on_roster``), and libzmq never retries a refused handshake, so
e010 redials on its own after a short backoff (peer/net/dial.py) and is in as soon as the gateway
has read the roster, before its round; it is served from that round on. The same Node rule
in-process: tests/test_gateway_edge_assignment.py; one gateway across hosts:
tests/test_hosts_federation.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from _federation_support import make_federation, status, wait_until

from peer.cli.main import main
from peer.runtime.launch import PeerProcesses
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ROUNDS, EFFECTIVE = 6, 3
JOINER = "e010"


def rounds_of(out: Path, gateway: str) -> dict[int, dict[str, Any]]:
    path = out / "data" / gateway / "rounds.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {row["round"]: row for row in map(json.loads, lines)}


def test_an_edge_client_joins_the_gateway_its_roster_entry_names_while_the_federation_runs(
        tmp_path: Path) -> None:
    # Prepare: gw0 lists e000, e001; gw1 lists e002, e003 (init's blocks); every client asked each round
    files = make_federation(tmp_path / "fed", edges=4, gateways=2, rounds=ROUNDS, fraction=1.0, min_clients=2,
                            local_epochs=1, max_samples=200, partition="iid")
    out = files.network.out
    joiner_in, joiner_registered = tmp_path / "joiner-in", tmp_path / "joiner-registered"
    # both gateways hold before round EFFECTIVE - 1 until e010 has connected (it dials before its
    # round), and before round EFFECTIVE until gw1 registered it (from that round on: the next
    # heartbeat does it, and these rounds are shorter than a heartbeat interval)
    holds = {gateway: [Hook(at_step=EFFECTIVE - 1, action="hold", gate=str(joiner_in)),
                       Hook(at_step=EFFECTIVE, action="hold", gate=str(joiner_registered))]
             for gateway in ("gw0", "gw1")}
    edges = {**files.edge_configs, JOINER: out / f"{JOINER}.toml"}
    with PeerProcesses(files.network.configs, listeners=dict(files.network.listeners), edges=edges) as run:
        for name in [*files.network.configs, *files.edge_configs]:
            run.start(name, holds.get(name, ()))
        wait_until("round 0 closed", lambda: 0 in rounds_of(out, "gw1"), files)
        # Execute: the operator's commands; the device holds the new roster first and starts
        key = out / "keys" / f"{JOINER}.key"
        device_roster = out / "device-roster.toml"
        shutil.copy(files.network.roster, device_roster)
        assert main(["keygen", "--out", str(key)]) == 0
        assert main(["roster", "add", JOINER, "--roster", str(device_roster), "--key", str(key),
                     "--role", "edge", "--gateway", "gw1", "--effective-round", str(EFFECTIVE)]) == 0
        config = files.edge_configs["e002"].read_text().replace("e002", JOINER)
        (out / f"{JOINER}.toml").write_text(config.replace('"roster.toml"', f'"{device_roster.name}"'))
        run.start(JOINER)
        wait_until(f"gw1 refused {JOINER}'s handshake",
                   lambda: status(files, JOINER).get("handshake_refused", {}).get("auth", 0) >= 1, files)
        # ... then the gateways' host gets it too (whole: a rename), and they re-read it
        shutil.copy(device_roster, out / "roster.toml.new")
        os.replace(out / "roster.toml.new", files.network.roster)
        for gateway in ("gw0", "gw1"):
            assert main(["roster", "reload", "--config", str(files.network.configs[gateway])]) == 0
        wait_until(f"{JOINER} redialled and connected",
                   lambda: status(files, JOINER).get("handshakes", 0) >= 1, files)
        assert status(files, JOINER)["redialed"] >= 1
        wait_until(f"gw1 heard {JOINER} before its round",
                   lambda: status(files, "gw1").get("rejections", {}).get("client_not_served_yet", 0) >= 1,
                   files)
        closed_before = len(rounds_of(out, "gw1"))
        joiner_in.touch()
        wait_until(f"gw1 registered {JOINER} at round {EFFECTIVE}",
                   lambda: JOINER in status(files, "gw1").get("federation", {}).get("registered", []), files)
        assert len(rounds_of(out, "gw1")) == EFFECTIVE     # (held before it: none of its rounds closed yet)
        joiner_registered.touch()
        assert run.wait(timeout_s=240.0), run.alive()
        codes = run.exitcodes()
    # Assert
    assert codes == dict.fromkeys(edges.keys() | files.network.configs.keys(), 0), codes
    assert closed_before < EFFECTIVE
    gw0, gw1 = rounds_of(out, "gw0"), rounds_of(out, "gw1")
    assert sorted(gw0) == sorted(gw1) == list(range(ROUNDS))
    joined = [r for r, row in gw1.items() if JOINER in row["taken"]]
    assert joined == list(range(EFFECTIVE, ROUNDS)), gw1      # every client is asked in every round
    assert all(set(row["taken"]) <= {"e000", "e001"} for row in gw0.values()), gw0
    assert all(set(row["taken"]) <= {"e002", "e003", JOINER} for row in gw1.values()), gw1
