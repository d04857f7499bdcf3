"""Secure aggregation in real processes (issue 13, acceptance c): one gateway and ten
``hivemesh edge`` clients on 127.0.0.1 run SecAgg+ (k = 8 < n - 1) inside each FedAvg round, the
``secagg`` messages signed and carried like every other.

The masked federation ends with exactly the global model of the same federation with masking off
(the same clipping and quantisation, summed in the same ring). Three clients SIGKILLed once they
have shared their keys (held before training, so they never send a masked input) leave the round
to the seven others: the gateway rebuilds their masks from the shares, and every round completes.
The helpers are test_daemon_federation.py's (same processes, same waits on files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _federation_support import (
    GATEWAY,
    closed_rounds,
    describe,
    make_federation,
    processes,
    status,
    wait_until,
)

from peer.runtime.export import latest_params
from peer.runtime.netinit import FederationFiles
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import Hook

pytestmark = pytest.mark.processes

CEILING_S = 240.0
EDGES = [f"e{i:03d}" for i in range(10)]
VICTIMS = ["e002", "e005", "e008"]


def secure_federation(folder: Path, *, masking: bool) -> FederationFiles:
    """3 rounds of all 10 clients (no round before all registered, and a client stays registered
    while the run lasts: a killed one is asked and drops out in each round), SecAgg+ k = 8, t = 5:
    any 3 may drop and each client still keeps t live neighbours."""
    secure = {"degree": 8, "clip_value": 0.5, "bits": 16, "masking": masking, "advertise_timeout_s": 15.0,
              "share_timeout_s": 15.0, "masked_input_timeout_s": 20.0, "consistency_timeout_s": 15.0,
              "unmask_timeout_s": 15.0}
    federation: dict[str, Any] = {"rounds": 3, "fraction": 1.0, "min_clients": 10, "min_registered": 10,
                                  "local_epochs": 1, "uplink": "identity", "round_timeout_s": 90.0,
                                  "secure_aggregation": secure}
    return make_federation(folder, gateway_options={"neighbour_timeout_s": 600.0}, **federation)


def run_to_the_end(files: FederationFiles) -> torch.Tensor:
    """Run every process to its end; the gateway's final global model."""
    with processes(files) as run:
        run.start_all()
        assert run.wait(CEILING_S), describe(files)
        assert run.exitcodes() == {name: 0 for name in run.processes}, describe(files)
    return latest_params(load_peer_config(files.network.configs[GATEWAY]))[0]


def test_ten_edges_masked_end_with_the_model_of_the_same_run_unmasked(tmp_path: Path) -> None:
    # Prepare / Execute
    masked_files = secure_federation(tmp_path / "masked", masking=True)
    masked = run_to_the_end(masked_files)
    plain_files = secure_federation(tmp_path / "plain", masking=False)
    plain = run_to_the_end(plain_files)
    # Assert: all 10 in every round, closed by SecAgg (the unmasked run: by its quota), same model
    for files, closed_by in ((masked_files, "secagg"), (plain_files, "quota")):
        rounds = closed_rounds(files)
        assert sorted(rounds) == [0, 1, 2], describe(files)
        for row in rounds.values():
            assert row["closed_by"] == closed_by and row["taken"] == EDGES and row["aggregated"], row
    assert torch.equal(masked, plain)
    counters = status(masked_files, GATEWAY)["federation"]["counters"]
    assert counters["secagg_taken_MaskedInput"] == 30 and counters["secagg_taken_UnmaskShares"] == 30
    assert not any(key.startswith("secagg_refused") for key in counters), counters
    edge = status(masked_files, "e000")
    assert edge["client"]["secagg_sent_MaskedInput"] == 3 and edge["rejections"] == {}
    # each round's record shows the five SecAgg phases' time, messages and bytes at the gateway, and
    # so does the status's last round (the unmasked run: none); the status says the SecAgg round ended
    masked_rounds = closed_rounds(masked_files)
    for row in masked_rounds.values():
        phases = row["secagg_phases"]
        assert [cost["phase"] for cost in phases] == ["advertise", "share", "masked_input", "consistency",
                                                      "unmask"], row
        assert all(cost["messages_received"] == 10 and cost["bytes_received"] > 0 for cost in phases)
        assert [cost["messages_sent"] for cost in phases] == [10, 10, 10, 10, 0]
        assert all(cost["duration_s"] >= 0 for cost in phases)
        assert phases[2]["bytes_received"] >= 10 * 4 * (masked.numel() + 1)  # the masked inputs
    gateway = status(masked_files, GATEWAY)["federation"]
    assert gateway["last_rounds"][-1]["secagg_phases"] == masked_rounds[2]["secagg_phases"]
    assert gateway["secagg"] == {"round": 2, "phase": "none", "phases": masked_rounds[2]["secagg_phases"],
                                 "blamed": {}, "offences": {}, "barred": []}
    assert all(row["secagg_phases"] == [] for row in closed_rounds(plain_files).values())


def shared(files: FederationFiles, edge: str) -> bool:
    """Whether ``edge``'s status shows its key shares sent."""
    return bool(status(files, edge).get("client", {}).get("secagg_sent_ShareKeys", 0) >= 1)


def test_three_edges_killed_after_sharing_keys_leave_every_round_to_the_others(tmp_path: Path) -> None:
    # Prepare: the victims hold before their first training step (messages go on): they advertise
    # and share their keys in round 0, and never have an input to mask
    files = secure_federation(tmp_path / "fed", masking=True)
    gate = tmp_path / "never"
    hooks = {victim: [Hook(at_step=0, action="hold", gate=str(gate))] for victim in VICTIMS}
    with processes(files) as run:
        # Execute: each victim is SIGKILLed once its status shows its shares sent
        run.start_all(hooks)
        for victim in VICTIMS:
            wait_until(f"{victim} shared its keys", lambda v=victim: shared(files, v), files)
            run.kill(victim)
        survivors = [name for name in run.processes if name not in VICTIMS]
        assert run.wait(CEILING_S, survivors), describe(files)
        codes = run.exitcodes()
    # Assert: the survivors ended cleanly; every round closed by SecAgg over the 7 and aggregated
    assert all(codes[name] == 0 for name in survivors), codes
    assert all(codes[victim] == -9 for victim in VICTIMS), codes
    rounds = closed_rounds(files)
    assert sorted(rounds) == [0, 1, 2], describe(files)
    others = [edge for edge in EDGES if edge not in VICTIMS]
    for row in rounds.values():
        assert row["closed_by"] == "secagg" and row["aggregated"] and row["taken"] == others, row
    assert all(row["missing"] == VICTIMS for row in rounds.values())
    counters = status(files, GATEWAY)["federation"]["counters"]
    assert counters["secagg_taken_ShareKeys"] >= 10   # round 0: the victims' shares too
    assert counters["secagg_deadline_masked_input"] >= 1


def test_an_edge_stopped_after_sharing_keys_says_so_and_no_phase_waits_for_it(tmp_path: Path) -> None:
    """SIGTERM on an edge sends its gateway a farewell (a heartbeat saying finished): the masked-input
    phase it will never answer closes as soon as the others' inputs are in, not at its deadline
    (600 s here, past this test's ceiling: a gateway that waited fails it)."""
    # Prepare: 5 clients, one round of all 5; e004 holds before training: it advertises and shares
    # its keys, and never has an input to mask
    long = {f"{phase}_timeout_s": 600.0 for phase in ("advertise", "share", "masked_input", "consistency",
                                                       "unmask")}
    secure = {"clip_value": 0.5, "bits": 16, "min_roster": 4, **long}
    files = make_federation(tmp_path / "fed", edges=5, rounds=1, fraction=1.0, min_clients=4,
                            min_registered=5, local_epochs=1, uplink="identity", round_timeout_s=3000.0,
                            secure_aggregation=secure)
    gate = tmp_path / "never"
    with processes(files) as run:
        # Execute: e004 is stopped (SIGTERM) once its status shows its shares sent
        run.start_all({"e004": [Hook(at_step=0, action="hold", gate=str(gate))]})
        wait_until("e004 shared its keys", lambda: shared(files, "e004"), files)
        run.terminate("e004")
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert: everyone ended cleanly; the round was summed over the 4 with no SecAgg deadline passed;
    # the gateway counts e004's leaving and shows it as left
    assert codes == {name: 0 for name in codes}, codes
    row = closed_rounds(files)[0]
    assert row["closed_by"] == "secagg" and row["aggregated"], row
    assert row["taken"] == ["e000", "e001", "e002", "e003"] and row["missing"] == ["e004"], row
    gateway = status(files, GATEWAY)["federation"]
    assert gateway["counters"]["secagg_left"] == 1, gateway["counters"]
    assert not any(key.startswith("secagg_deadline") for key in gateway["counters"]), gateway["counters"]
    assert gateway["clients"]["e004"]["presence"] == "left"
