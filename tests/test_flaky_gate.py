"""bench/flaky.py reports a test that fails in some runs and exits non-zero; a steady suite passes.

Negative control for the gate itself: a test that fails on every other run
(it counts its runs in a file beside it) must show up as 1 failure in 2 runs,
and the gate must exit 1. The temporary suite has its own pytest.ini, so it
is collected on its own, with the ``processes`` marker the gate selects by.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "bench" / "flaky.py"
CEILING_S = 120.0   # two runs of a three-test pytest session; seconds when healthy

SUITE = '''
from pathlib import Path

import pytest

RUNS = Path(__file__).with_name("runs.txt")


@pytest.mark.processes
def test_fails_every_other_run() -> None:
    done = int(RUNS.read_text()) if RUNS.exists() else 0
    RUNS.write_text(str(done + 1))
    assert done % 2 == 0, "fails on the second run"


@pytest.mark.processes
@pytest.mark.parametrize("case", ["a", "b"])
def test_steady(case: str) -> None:
    assert case in "ab"


def test_not_selected_without_the_marker() -> None:
    assert False, "the gate runs only the marked tests"
'''


def run_gate(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Arguments after -- reach pytest: here they leave out Hypothesis' plugin, which the
    # temporary suite does not use and which takes seconds to import on a loaded machine.
    return subprocess.run([sys.executable, str(GATE), *args, str(folder), "--", "-p", "no:hypothesispytest"],
                          capture_output=True, text=True, timeout=CEILING_S, cwd=ROOT)


def rows(output: str) -> dict[str, tuple[int, int]]:
    """test id -> (runs, failures) from the gate's table."""
    found = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) == 4 and "::" in cells[0] and all(c.isdigit() for c in cells[1:]):
            found[cells[0].rsplit("::", 1)[1]] = (int(cells[1]), int(cells[2]))
    return found


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    processes: real processes\n")
    (tmp_path / "test_sometimes.py").write_text(SUITE)
    return tmp_path


@pytest.mark.processes
def test_the_gate_reports_a_test_that_fails_one_run_in_two(suite: Path) -> None:
    done = run_gate(suite, "--runs", "2")

    assert done.returncode == 1, done.stdout + done.stderr
    assert rows(done.stdout) == {"test_fails_every_other_run": (2, 1),
                                 "test_steady[a]": (2, 0), "test_steady[b]": (2, 0)}
    assert "1 of 3 tests failed at least once in 2 runs" in done.stdout
    assert (suite / "runs.txt").read_text() == "2"   # both runs were made
    # what the failure said, with its run: the cause of a flaky failure is found from it
    assert "run 2, test_sometimes.py::test_fails_every_other_run: AssertionError: fails on the second run" \
        in done.stdout


@pytest.mark.processes
def test_the_gate_passes_a_steady_selection(suite: Path) -> None:
    done = run_gate(suite, "--runs", "2", "-k", "steady")

    assert done.returncode == 0, done.stdout + done.stderr
    assert rows(done.stdout) == {"test_steady[a]": (2, 0), "test_steady[b]": (2, 0)}
    assert not (suite / "runs.txt").exists()   # -k reached pytest



def burners(tag: str) -> int:
    """The load processes of the gate run started with ``tag`` in its environment (they inherit it),
    now running: their last argument names them. Another gate's burners on a shared machine, started
    or stopped meanwhile, are not counted."""
    found = 0
    for entry in Path("/proc").iterdir():
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found += b"hivemesh-flaky-load" in arguments and f"GATE_TAG={tag}".encode() in environment
    return found


# the test the gate runs under load: it counts the burners from inside the run
LOAD_SUITE = f'''
import os
from pathlib import Path

import pytest

{inspect.getsource(burners)}

@pytest.mark.processes
def test_sees_the_load() -> None:
    assert burners(os.environ["GATE_TAG"]) == int(os.environ["EXPECTED_LOAD"])
'''


@pytest.mark.processes
@pytest.mark.parametrize("load", [0, 2])
def test_the_gate_runs_its_load_beside_every_run_and_stops_it(tmp_path: Path, load: int) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    processes: real processes\n")
    (tmp_path / "test_load.py").write_text(LOAD_SUITE)
    tag = str(tmp_path)     # this run's gate and its burners carry it (their environment): unique

    done = subprocess.run([sys.executable, str(GATE), "--runs", "2", "--load", str(load), str(tmp_path),
                           "--", "-p", "no:hypothesispytest"],
                          capture_output=True, text=True, timeout=CEILING_S, cwd=ROOT,
                          env={**os.environ, "EXPECTED_LOAD": str(load), "GATE_TAG": tag})

    assert done.returncode == 0, done.stdout + done.stderr
    assert rows(done.stdout) == {"test_sees_the_load": (2, 0)}
    assert f"load: {load} CPU-bound processes" in done.stdout
    assert burners(tag) == 0     # every burner stopped with the gate
