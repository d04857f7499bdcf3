"""Shared test set-up: one torch thread per process, and `gpu` tests only where CUDA is."""

from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_limits

# Many small products on a shared 2-core machine: extra BLAS threads only contend.
torch.set_num_threads(1)
threadpool_limits(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; run on a GPU machine (see bench/gpu_two_peers.py)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
