"""Shared test set-up: one torch thread per process, `gpu` tests only where CUDA is, no `hosts` test
skipped, and a guard that fails any test leaving a ZeroMQ context of ours unterminated
(peer/net/contexts.py says why an unterminated one could hang a later, unrelated test)."""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import torch
from threadpoolctl import threadpool_limits

if TYPE_CHECKING:
    from peer.net.contexts import Made

# Many small products on a shared 2-core machine: extra BLAS threads only contend.
torch.set_num_threads(1)
threadpool_limits(1)

CONTEXTS = "peer.net.contexts"   # looked up, not imported: tests that never touch zmq stay zmq-free


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


@pytest.fixture(autouse=True)
def _operator_text_is_words(request: pytest.FixtureRequest,
                            tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After a ``processes`` test: no Python repr in what its peers said (their logs) or in the status
    text of what they wrote (issue 30, acceptance b; tests/_operator_text.py). Each file is read
    once per change, a module's shared federation included."""
    yield
    if request.node.get_closest_marker("processes") is None:
        return
    from _operator_text import CHECKED, repr_leaks, run_texts

    changed = CHECKED.changed(tmp_path_factory.getbasetemp())
    leaks = [f"{where}:\n  " + "\n  ".join(found[:10])
             for where, text in run_texts(changed).items() if (found := repr_leaks(text))]
    if leaks:
        pytest.fail("a Python repr where an operator reads words:\n" + "\n".join(leaks), pytrace=False)


@pytest.fixture(autouse=True)
def _zmq_contexts_terminated() -> Iterator[None]:
    """Every ZeroMQ context made during the test (and its function-scoped fixtures: this fixture is
    set up before them and torn down after them) is terminated by its end. A module-scoped
    fixture's contexts are made before this runs and are checked at the session's end.
    Costs a dictionary look-up per test, and a scan of the (few) live contexts where zmq is loaded."""
    contexts = sys.modules.get(CONTEXTS)
    since = contexts.next_serial() if contexts is not None else 0
    yield
    contexts = sys.modules.get(CONTEXTS)
    if contexts is None:
        return
    leaks = _describe(contexts.open_contexts(since), contexts.dropped_unterminated(since))
    if leaks:
        pytest.fail(f"ZeroMQ context(s) left unterminated by this test (close every transport; "
                    f"terminate every context you make):\n{leaks}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The multi-host fault suite's table (tests/_fault_report.py), when any of it ran."""
    report = sys.modules.get("_fault_report")
    if report is not None and report.REPORT.rows:
        terminalreporter.section("multi-host fault report (issue 16)")
        terminalreporter.write_line(report.table(report.REPORT.rows))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    contexts = sys.modules.get(CONTEXTS)
    if contexts is None:
        return
    leaks = _describe(contexts.open_contexts(), [])
    if leaks:
        sys.stderr.write(f"\nZeroMQ context(s) still open at the end of the session:\n{leaks}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _describe(still_open: list[Made], dropped: list[Made]) -> str:
    return "\n".join([f"  open:    made at {made.site}" for made in still_open]
                     + [f"  dropped: made at {made.site} (collected unterminated)" for made in dropped])
