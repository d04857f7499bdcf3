"""protocols/finite.py: the chunked finiteness check agrees with torch.isfinite wherever the bad value is."""

from __future__ import annotations

import math

import pytest
import torch

from protocols.finite import CHUNK_ELEMENTS, all_finite


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("at", [0, CHUNK_ELEMENTS - 1, CHUNK_ELEMENTS, 2 * CHUNK_ELEMENTS + 6])
def test_a_bad_value_anywhere_is_found(bad: float, at: int) -> None:
    x = torch.ones(2 * CHUNK_ELEMENTS + 7)
    assert all_finite(x)
    x[at] = bad
    assert not all_finite(x)


def test_shapes_dtypes_and_the_empty_tensor() -> None:
    assert all_finite(torch.empty(0))
    grid = torch.zeros(3, 5, dtype=torch.float64)
    assert all_finite(grid) and all_finite(grid.t())      # not contiguous
    grid[2, 4] = math.nan
    assert not all_finite(grid) and not all_finite(grid.t())
