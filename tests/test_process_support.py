"""The process tests' own support (tests/_daemon_support.py): what it retries, and what it never does."""

from __future__ import annotations

from pathlib import Path

from _daemon_support import PORT_TAKEN, HandRun, retry_if_port_taken


def test_a_run_is_retried_only_when_a_peer_lost_its_port_and_at_most_tries_times(tmp_path: Path) -> None:
    taken = f"hivemesh: error: peer p00: cannot listen on tcp://127.0.0.1:5: {PORT_TAKEN}\n"
    outcomes = [HandRun(tmp_path / "0", [2, 0], [taken, ""]), HandRun(tmp_path / "1", [0, 0], ["", ""])]
    attempts: list[int] = []

    def attempt(index: int) -> HandRun:
        attempts.append(index)
        return outcomes[index]

    assert retry_if_port_taken(attempt).out == tmp_path / "1" and attempts == [0, 1]
    # any other failure is the code's: returned as it is, never retried
    failed = HandRun(tmp_path / "x", [1, 0], ["Traceback ...", ""])
    assert retry_if_port_taken(lambda index: failed) is failed
    # a port lost every time: gives up after `tries`, with the last run
    attempts.clear()
    always = HandRun(tmp_path / "y", [2, 0], [taken, ""])
    assert retry_if_port_taken(lambda index: attempts.append(index) or always, tries=3) is always
    assert attempts == [0, 1, 2]
