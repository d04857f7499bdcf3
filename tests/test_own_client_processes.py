"""Issue 29 item 2, first slice: edge clients whose training is the user's ``fit``
(examples/own_client.py, ``[edge] fit``). One gateway and three ``hivemesh edge`` processes from
init's federation files (5 rounds, digits, iid shards): every round closes with its updates aggregated, the
global model ends within a few points of the simulator's run of the same files with the built-in
trainer, and rounds.jsonl carries the clients' fit metrics, weighted by their samples."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _federation_support import closed_rounds, describe, init_federation, processes, simulated_accuracy

pytestmark = [pytest.mark.processes, pytest.mark.slow]

EDGES, ROUNDS = 3, 5
FIT = Path(__file__).resolve().parents[1] / "examples" / "own_client.py"
CEILING_S = 300.0   # a healthy run of 5 rounds takes seconds; this only ends a hung one
POINTS = 0.05       # both iid, but the own fit's shards (a fixed shuffle) and batches are not the task's


def test_edges_on_the_users_fit_close_every_round_and_report_its_metrics(tmp_path: Path) -> None:
    # Prepare: init's federation, every edge on the example's fit
    files = init_federation(tmp_path / "fed", edges=EDGES, rounds=ROUNDS, partition="iid",
                            edge_options={"fit": f"{FIT}:fit"})
    # Execute: the gateway and the three edges as real processes, until all have finished
    with processes(files) as run:
        run.start_all()
        assert run.wait(CEILING_S), f"still running: {run.alive()}\n{describe(files)}"
        codes = run.exitcodes()
    rows = closed_rounds(files)
    built_in = simulated_accuracy(files, 1)
    # Assert: clean exits; every round aggregated with the fit's metrics; accuracy near the built-in's
    assert set(codes.values()) == {0}, (codes, describe(files))
    assert sorted(rows) == list(range(ROUNDS)), rows
    for row in rows.values():
        assert row["aggregated"] and row["taken"], row
        metrics = row["client_metrics"]
        assert sorted(metrics) == ["loss", "train_accuracy"], row
        assert 0.0 <= metrics["train_accuracy"] <= 1.0 and math.isfinite(metrics["loss"]), row
    assert rows[ROUNDS - 1]["client_metrics"]["loss"] < rows[0]["client_metrics"]["loss"], rows
    final = rows[ROUNDS - 1]["accuracy"]
    assert abs(final - built_in) <= POINTS, (final, built_in)
