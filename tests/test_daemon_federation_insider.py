"""Issue 32, acceptance (a), in real processes: `hivemesh init`'s federation, one edge's keys in an
attacker's hands, nothing configured against it.

One gateway and six ``hivemesh edge`` clients with the [network] and [federation] tables `hivemesh
init --gateways 1 --edges 6` writes (3 of 6 edges a round, qsgd:bits=8 uplink, 30 rounds), but
``min_registered = 6``: round 0 waits for every edge, so which edges a round asks does not depend
on start-up timing and the simulator's run of the same files is the clean run. The insider is e005,
a real edge whose ``attack`` hooks (peer/train/attack.py, fired on its own trainer steps) make its
first three uploads (i) its qsgd norms x1e30, (ii) a 10^9 claim with its update sign-flipped x3,
(iii) a 1e38 norm (its first bucket decodes up to 1e38), and then honest ones.

Asserted: the gateway lives and every round closes aggregated with a finite update norm; each
attacked round's report shows its update bounded (norm_median for (i) and (iii), samples_median
for (ii)) and the counters say so; every process, the insider's included, exits 0; the final
accuracy is within 1 point of the simulator's clean run of the same files. "Final" is the mean of
the last ``LAST_ROUNDS`` rounds' global accuracy: digits' test set is 360 samples, and one round's
figure moves by a point (3.6 samples) from round to round in the clean run alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _federation_support import (
    CEILING_S,
    GATEWAY,
    closed_rounds,
    describe,
    init_federation,
    processes,
    simulated_accuracy,
    status,
)

from peer.runtime.edge import edge_trainer
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.netinit import load_roster
from peer.runtime.testhooks import Hook

pytestmark = [pytest.mark.processes, pytest.mark.slow]

EDGES = 6
INSIDER = "e005"
ATTACKS = ("norms:1e30", "signflip:3,claim:1000000000", "value:1e38")
LAST_ROUNDS = 5
EXPECTED = ("norm_median", "samples_median", "norm_median")   # the bound each attack must meet


def test_an_insider_edge_costs_init_defaults_less_than_a_point(tmp_path: Path) -> None:
    # Prepare: init's tables (its CLI defaults), the test's [peer]/[edge] timings, round 0 waits for all
    files = init_federation(tmp_path / "fed", edges=EDGES, rounds=30)
    per_round = edge_trainer(load_edge_config(files.edge_configs[INSIDER]),
                             load_roster(files.network.roster)).steps_per_epoch
    # its k-th trained round starts at step k * per_round: each hook fires before one of them
    marks = [tmp_path / f"attack-{k}" for k in range(len(ATTACKS))]
    hooks = [Hook(at_step=max(0, k * per_round - per_round + 1), action="attack", spec=spec, mark=str(mark))
             for k, (spec, mark) in enumerate(zip(ATTACKS, marks, strict=True))]
    hooks.append(Hook(at_step=len(ATTACKS) * per_round - per_round + 1, action="attack", spec=""))
    clean = simulated_accuracy(files, LAST_ROUNDS)
    # Execute
    with processes(files) as run:
        run.start_all({INSIDER: hooks})
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert
    assert codes == {name: 0 for name in codes}, f"{codes}\n{describe(files)}"
    assert all(mark.exists() for mark in marks), "the insider did not send all three attacks"
    rounds = closed_rounds(files)
    assert sorted(rounds) == list(range(30))
    assert all(r["aggregated"] and r["update_norm"] is not None and math.isfinite(r["update_norm"])
               for r in rounds.values()), rounds
    attacked = [rounds[i] for i in sorted(rounds) if INSIDER in rounds[i]["taken"]][:len(ATTACKS)]
    for report, reason in zip(attacked, EXPECTED, strict=True):
        assert report["bounds"]["bounded"].get(reason, 0) >= 1, report
    counters = status(files, GATEWAY)["federation"]["counters"]
    assert counters["bounded_norm_median"] >= 2 and counters["bounded_samples_median"] >= 1, counters
    accuracy = sum(rounds[i]["accuracy"] for i in sorted(rounds)[-LAST_ROUNDS:]) / LAST_ROUNDS
    print(f"\ninsider {INSIDER}, init's defaults: final accuracy {accuracy:.4f}, simulated clean {clean:.4f}")
    assert accuracy >= clean - 0.01, f"real attacked {accuracy:.4f} vs simulated clean {clean:.4f}"
