"""Shared test set-up: one torch thread per process, `gpu` tests only where CUDA is, and no `hosts` test
skipped."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A skipped ``hosts`` test is a failed one (issue 16): CI runs the multi-host suite as root, and a
    suite that quietly skips there proves nothing."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("hosts") is not None and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"a 'hosts' test may not be skipped (issue 16): {report.longrepr}"
