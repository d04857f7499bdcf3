"""The consensus estimate of `hivemesh status`: max_i ||x_i - mean|| / ||mean|| over a peer and the
last parameters it heard from its neighbours; computed by the daemon, printed by the status command."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from peer.cli import main
from peer.daemon import NeighbourInfo, PeerDaemon, consensus_estimate
from peer.statefiles import write_json_atomic

# mean (1, 1), |mean| = sqrt 2; distances to it sqrt 2, sqrt 2 and 2: the estimate is 2 / sqrt 2.
# Each plausible slip gives another number: the mean distance 1.138, the RMS 1.155, squared norms 2,
# the distance of the first vector only 1, no division by |mean| 2.
THREE = [torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0]), torch.tensor([1.0, 3.0])]
THREE_ESTIMATE = math.sqrt(2.0)
THREE_WRONG = {"mean distance": (2 * math.sqrt(2) + 2) / 3 / math.sqrt(2),
               "rms distance": math.sqrt((2 + 2 + 4) / 3) / math.sqrt(2),
               "squared norms": 4 / 2, "own distance only": 1.0, "not relative": 2.0}
LINE = "  consensus distance (estimated from neighbours' last parameters)"


def test_the_estimate_is_the_largest_distance_to_the_mean_relative_to_the_mean() -> None:
    assert consensus_estimate([torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])]) == pytest.approx(0.5)
    found = consensus_estimate(THREE)
    assert found == pytest.approx(THREE_ESTIMATE, rel=1e-12)
    for slip, value in THREE_WRONG.items():     # the case above tells each of them apart
        assert found != pytest.approx(value, rel=1e-3), slip


def test_the_estimate_in_edge_cases() -> None:
    assert math.isnan(consensus_estimate([torch.ones(3)]))     # nobody heard yet: unknown, not 0
    assert consensus_estimate([torch.ones(3), torch.ones(3)]) == 0.0
    # a zero mean: the absolute distance rather than a division by zero
    assert consensus_estimate([torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.0])]) == 1.0
    # float32 inputs are reduced in float64: 1e-4 apart at 1e4 is still seen
    near = [torch.full((1000,), value, dtype=torch.float32) for value in (1e4, 1e4 + 1.0)]
    assert consensus_estimate(near) == pytest.approx(0.5 / (1e4 + 0.5), rel=1e-9)


def test_the_daemon_uses_its_own_parameters_and_only_neighbours_it_has_heard() -> None:
    own, heard, other = THREE
    fake = SimpleNamespace(trainer=SimpleNamespace(flat_params=own),
                           neighbours={"a": NeighbourInfo(params=heard), "b": NeighbourInfo(params=other),
                                       "c": NeighbourInfo()})     # c: no full parameters heard yet
    assert PeerDaemon._consensus_estimate(fake) == pytest.approx(THREE_ESTIMATE)  # type: ignore[arg-type]
    fake.neighbours = {"c": NeighbourInfo()}
    assert math.isnan(PeerDaemon._consensus_estimate(fake))  # type: ignore[arg-type]


def _status_folder(tmp_path: Path, estimate: float) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    write_json_atomic(folder / "status.json", {"name": "p00", "state": "training", "step": 7, "pid": -1,
                                               "updated_at": 0.0, "consensus_estimate": estimate})
    return folder


def test_status_prints_the_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _status_folder(tmp_path, consensus_estimate(THREE))
    assert main(["status", "--data-dir", str(folder)]) == 0
    assert f"{LINE} 1.41e+00\n" in capsys.readouterr().out
    assert main(["status", "--data-dir", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["consensus_estimate"] == pytest.approx(THREE_ESTIMATE)


def test_status_prints_an_unknown_estimate_as_a_dash(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = _status_folder(tmp_path, math.nan)     # status.json stores it as null
    assert main(["status", "--data-dir", str(folder)]) == 0
    assert f"{LINE} -\n" in capsys.readouterr().out
