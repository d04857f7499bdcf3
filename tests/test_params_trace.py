"""The params trace test hook (peer/runtime/testhooks.py ``HIVEMESH_TEST_PARAMS_TRACE``): what a
peer writes, when, and what a test reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peer.runtime.testhooks import (
    PARAMS_VARIABLE,
    ParamsTrace,
    params_trace_json,
    params_writer_from_environment,
    read_params_trace,
)
from protocols.errors import HivemeshError


def test_a_peer_writes_its_parameters_every_n_steps_once_each(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARAMS_VARIABLE, params_trace_json(ParamsTrace(folder=str(tmp_path), every_steps=5)))
    writer = params_writer_from_environment("p01")
    assert writer is not None
    params = torch.zeros(3, dtype=torch.float64)
    for step in (0, 3, 5, 5, 7, 10):
        params += 1.0
        writer.at_work_point(step, params)
    params += 100.0     # written copies, not views of the live tensor
    found = read_params_trace(tmp_path, "p01")
    assert sorted(found) == [0, 5, 10]
    assert torch.equal(found[5][1], torch.full((3,), 3.0))       # the first visit of step 5
    assert found[0][0] <= found[5][0] <= found[10][0]
    assert found[10][1].dtype == torch.float32
    assert read_params_trace(tmp_path, "p02") == {}


def test_no_variable_no_writer_and_a_bad_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARAMS_VARIABLE, raising=False)
    assert params_writer_from_environment("p00") is None
    monkeypatch.setenv(PARAMS_VARIABLE, '{"folder": "x", "every_steps": 0}')
    with pytest.raises(HivemeshError, match="every_steps"):
        params_writer_from_environment("p00")
