"""tests/conftest.py fails a skipped `hosts` test (issue 16: `.ci/run` fails if a multi-host test is
skipped), whether it skips itself or is marked skip, and leaves other skips alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = '''
import pytest

@pytest.mark.hosts
def test_skips_itself() -> None:
    pytest.skip("no root here")

@pytest.mark.hosts
@pytest.mark.skip(reason="marked")
def test_marked_skip() -> None:
    pass

@pytest.mark.skip(reason="not a hosts test")
def test_other_skip() -> None:
    pass

@pytest.mark.hosts
def test_runs() -> None:
    pass
'''


def test_a_skipped_hosts_test_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    tests = Path(__file__).resolve().parent
    # tests/conftest.py as a plugin of a run of its own on the probe (which registers no markers)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rA", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(tests), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED test_probe.py::test_skips_itself - a 'hosts' test may not be skipped" in done.stdout
    assert "ERROR test_probe.py::test_marked_skip - a 'hosts' test may not be skipped" in done.stdout
    assert "SKIPPED [1] test_probe.py" in done.stdout and ": not a hosts test" in done.stdout
    assert "PASSED test_probe.py::test_runs" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("1 failed, 1 passed, 1 skipped, 1 error in")
