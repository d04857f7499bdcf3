"""Issue 32, acceptance (b), in real processes: SecAgg with blame under `hivemesh init`'s federation.

One gateway and six ``hivemesh edge`` clients with the [network] and [federation] tables `hivemesh
init --gateways 1 --edges 6` writes, secure aggregation on (so ``uplink = "identity"``: SecAgg
refuses qsgd's per-client scales; every edge asked each round, since a SecAgg round needs at least
``min_roster = 5`` clients; ``min_registered = 6`` so round 0 waits for all and the simulator's run
of the same files is the clean run). Two insiders, real edges whose ``attack`` hooks
(peer/train/attack.py -> protocols/secagg/insider.py) make them cheat in chosen rounds, with their
own keys and signatures:

- e005 deals garbage share bundles in round 1 and shares of a wrong self-mask seed in round 3;
- e004 accuses an honest neighbour in round 2.

Asserted: each of those rounds closes by SecAgg over the five others, aggregated, and names its
culprit in ``rounds.jsonl`` (e005 ``bad_shares``, e004 ``false_accusation``, e005 ``wrong_secret``);
the wrong-secret round took the recovery phase; the gateway's status counts the offences (e005
twice, e004 once, none barred at init's ``blame_limit = 3``); every process exits 0; the final
accuracy (the mean of the last ``LAST_ROUNDS`` rounds) is within 1 point of the simulator's clean
run of the same files.
"""

from __future__ import annotations

from pathlib import Path

import _federation_support as fed
import pytest

from peer.cli.status import render
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

EDGES = 6
ROUNDS = 10
LAST_ROUNDS = 3
SECURE = {"advertise_timeout_s": 15.0, "share_timeout_s": 15.0, "masked_input_timeout_s": 20.0,
          "consistency_timeout_s": 15.0, "unmask_timeout_s": 15.0}
INSIDERS = {"e005": "secagg:garbage_shares@1,secagg:wrong_secret@3", "e004": "secagg:false_accusation@2"}
BLAMED = {1: {"e005": "bad_shares"}, 2: {"e004": "false_accusation"}, 3: {"e005": "wrong_secret"}}


def test_an_insider_vetoes_no_secure_round_and_is_named(tmp_path: Path) -> None:
    # Prepare: init's tables with secure aggregation on
    files = fed.init_federation(tmp_path / "fed", edges=EDGES, rounds=ROUNDS, fraction=1.0, min_clients=5,
                            uplink="identity", round_timeout_s=90.0, secure_aggregation=SECURE)
    marks = {name: tmp_path / f"insider-{name}" for name in INSIDERS}
    hooks = {name: [Hook(at_step=0, action="attack", spec=spec, mark=str(marks[name]))]
             for name, spec in INSIDERS.items()}
    clean = fed.simulated_accuracy(files, LAST_ROUNDS)
    # Execute
    with fed.processes(files) as run:
        run.start_all(hooks)
        assert run.wait(fed.CEILING_S), fed.describe(files)
        codes = run.exitcodes()
    # Assert: everyone lived; every round closed by SecAgg and aggregated
    assert codes == {name: 0 for name in codes}, f"{codes}\n{fed.describe(files)}"
    assert all(mark.exists() for mark in marks.values())
    rounds = fed.closed_rounds(files)
    assert sorted(rounds) == list(range(ROUNDS)), fed.describe(files)
    everyone = [f"e{i:03d}" for i in range(EDGES)]
    for index, row in rounds.items():
        blamed = BLAMED.get(index, {})
        assert row["closed_by"] == "secagg" and row["aggregated"], row
        assert row["blamed"] == blamed, row
        assert row["taken"] == [name for name in everyone if name not in blamed], row
    phases = [cost["phase"] for cost in rounds[3]["secagg_phases"]]
    assert phases[-1] == "recover" and "recover" not in [c["phase"] for c in rounds[1]["secagg_phases"]]
    secagg = fed.status(files, fed.GATEWAY)["federation"]["secagg"]
    assert secagg["offences"] == {"e004": 1, "e005": 2} and secagg["barred"] == [], secagg
    assert "secagg offences: e004 1, e005 2; barred -" in render(fed.status(files, fed.GATEWAY))
    counters = fed.status(files, fed.GATEWAY)["federation"]["counters"]
    assert counters["secagg_blamed_bad_shares"] == 1 and counters["secagg_blamed_wrong_secret"] == 1
    assert counters["secagg_blamed_false_accusation"] == 1
    accuracy = sum(rounds[i]["accuracy"] for i in sorted(rounds)[-LAST_ROUNDS:]) / LAST_ROUNDS
    print(f"\nSecAgg insiders: final accuracy {accuracy:.4f}, simulated clean {clean:.4f}")
    assert accuracy >= clean - 0.01, f"real attacked {accuracy:.4f} vs simulated clean {clean:.4f}"
