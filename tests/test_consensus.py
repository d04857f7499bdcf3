"""The two consensus distances (protocols/consensus.py), the estimate a peer's status gives, and how
`hivemesh status` prints it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from peer.cli.main import main
from peer.files.statefiles import write_json_atomic
from peer.runtime.daemon_parts import NeighbourInfo
from peer.runtime.daemon_status import consensus_estimate
from protocols.consensus import max_relative_distance, rms_distance

# mean (1, 1), |mean| = sqrt 2; distances to it sqrt 2, sqrt 2 and 2. Each plausible slip gives another
# number, so the case below tells the two measures and their slips apart.
THREE = [torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0]), torch.tensor([1.0, 3.0])]
MAX_RELATIVE = 2.0 / math.sqrt(2.0)
RMS = math.sqrt((2 + 2 + 4) / 3)
# slips of the relative measure, then of the absolute one
RELATIVE_SLIPS = {"mean distance": (2 * math.sqrt(2) + 2) / 3 / math.sqrt(2), "rms": RMS / math.sqrt(2),
                  "squared norms": 4 / 2, "own distance only": 1.0, "not relative": 2.0}
ABSOLUTE_SLIPS = {"mean distance": (2 * math.sqrt(2) + 2) / 3, "mean squared": (2 + 2 + 4) / 3,
                  "max": 2.0, "relative": RMS / math.sqrt(2), "own distance only": math.sqrt(2.0)}
LINE = ("  distance to consensus {} "
        "(max ||x_i - mean|| / ||mean|| over this peer and its neighbours' last parameters)")


def test_max_relative_is_the_largest_distance_to_the_mean_over_the_mean() -> None:
    assert max_relative_distance([torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])]) == pytest.approx(0.5)
    found = max_relative_distance(THREE)
    assert found == pytest.approx(MAX_RELATIVE, rel=1e-12)
    for slip, value in RELATIVE_SLIPS.items():
        assert found != pytest.approx(value, rel=1e-3), slip


def test_rms_is_the_root_mean_square_distance_to_the_mean_in_parameter_units() -> None:
    found = rms_distance(THREE)
    assert found == pytest.approx(RMS, rel=1e-12)
    for slip, value in ABSOLUTE_SLIPS.items():
        assert found != pytest.approx(value, rel=1e-3), slip
    # absolute: scaling the parameters scales it; the relative one does not move
    assert rms_distance([10 * v for v in THREE]) == pytest.approx(10 * RMS)
    assert max_relative_distance([10 * v for v in THREE]) == pytest.approx(MAX_RELATIVE)


def test_edge_cases() -> None:
    for measure in (rms_distance, max_relative_distance):
        assert measure([torch.ones(3)]) == 0.0      # a consensus of one
        assert measure([torch.ones(3), torch.ones(3)]) == 0.0
        with pytest.raises(ValueError, match="at least one"):
            measure([])
    # a zero mean: the absolute distance rather than a division by zero
    assert max_relative_distance([torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.0])]) == 1.0
    # float32 inputs are reduced in float64: 1 apart at 1e4 is still seen
    near = [torch.full((1000,), value, dtype=torch.float32) for value in (1e4, 1e4 + 1.0)]
    assert max_relative_distance(near) == pytest.approx(0.5 / (1e4 + 0.5), rel=1e-9)
    assert rms_distance(near) == pytest.approx(0.5 * math.sqrt(1000), rel=1e-9)


def test_the_daemon_uses_its_own_parameters_and_only_neighbours_it_has_heard() -> None:
    own, heard, other = THREE
    neighbours = [NeighbourInfo(params=heard), NeighbourInfo(params=other),
                  NeighbourInfo()]     # the last: no full parameters heard yet
    assert consensus_estimate(own, neighbours) == pytest.approx(MAX_RELATIVE)
    assert math.isnan(consensus_estimate(own, [NeighbourInfo()]))  # unknown, not 0


def _status_folder(tmp_path: Path, estimate: float) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    write_json_atomic(folder / "status.json", {"name": "p00", "state": "training", "step": 7, "pid": -1,
                                               "updated_at": 0.0, "consensus_max_relative": estimate})
    return folder


def test_status_prints_the_estimate_with_what_it_measures(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    folder = _status_folder(tmp_path, max_relative_distance(THREE))
    assert main(["status", "--data-dir", str(folder)]) == 0
    assert LINE.format("1.41e+00") + "\n" in capsys.readouterr().out
    assert main(["status", "--data-dir", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["consensus_max_relative"] == pytest.approx(MAX_RELATIVE)


def test_status_prints_an_unknown_estimate_as_a_dash(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = _status_folder(tmp_path, math.nan)     # status.json stores it as null
    assert main(["status", "--data-dir", str(folder)]) == 0
    assert LINE.format("-") + "\n" in capsys.readouterr().out
