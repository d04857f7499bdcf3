"""The console (issue 17, item 1): the progress display, the ``hivemesh`` logger, mismatch notices.

Pure tests: the display is driven with a fake clock into a string buffer; a terminal is forced.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from wire_helpers import make_network

from peer.cli.main import main
from peer.files.console import LOGGER, MismatchNotices, Progress, Reading, configure_logging
from peer.files.statefiles import StatusWriter
from protocols.codec import Rejection
from protocols.messages import Heartbeat
from protocols.wire import Endpoint

ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d ")
WAITING = "waiting for p01, p03 (1/3 up)"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def reading(step: int, note: str = "", accuracy: float | None = 0.5) -> Reading:
    return Reading(done=step, accuracy=accuracy, bytes_sent=step * 1000, bytes_received=step * 900,
                   rejected=0, members="neighbours 3/3", note=note)


def test_off_a_terminal_the_display_writes_timestamped_lines_on_change_and_at_a_modest_rate() -> None:
    # Prepare: a peer that waits, trains at 10 steps/s for 30 s, stalls 60 s, and finishes.
    out, clock = io.StringIO(), FakeClock()
    display = Progress("p00", 400, stream=out, interactive=False, interval_s=10.0, clock=clock)
    # Execute
    display.update(reading(0, WAITING, None))
    for second in range(1, 31):
        clock.now_s = second
        display.update(reading(10 * second))
    for second in range(31, 91):     # a stall: nothing shown changes
        clock.now_s = second
        display.update(reading(300))
    clock.now_s = 100
    display.update(reading(400, "finished", 0.9))
    display.update(reading(400, "finished", 0.9))     # the daemon writes its final status twice
    display.close()
    lines = out.getvalue().splitlines()
    # Assert: every line starts with an ISO time; the waiting line names whom; a line at most every 10 s
    # (plus changes of the note); the stall is not repeated; the final line is there once.
    assert all(ISO_LINE.match(line) for line in lines), lines
    assert WAITING in lines[0] and "0/400 steps" in lines[0], lines[0]
    assert len(lines) == 6, lines     # waiting, steps 10, 110, 210, the stall's 300 once, finished
    assert sum("300/400 steps" in line for line in lines) == 1, lines
    assert "10.0 steps/s" in lines[2] and "ETA 0:00:29" in lines[2], lines[2]
    assert sum("finished" in line for line in lines) == 1 and "400/400 steps" in lines[-1], lines
    assert "acc 0.900" in lines[-1] and "sent 400.0 kB" in lines[-1], lines[-1]


def test_close_says_the_last_state_once_when_no_line_showed_it_yet() -> None:
    out, clock = io.StringIO(), FakeClock()
    display = Progress("p00", 100, stream=out, interactive=False, interval_s=10.0, clock=clock)
    display.update(reading(10))
    clock.now_s = 1.0
    display.update(reading(20))     # within the interval: not said yet
    display.close()
    display.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "20/100 steps" in lines[1], lines


def test_on_a_terminal_the_bar_shows_the_waiting_line_and_ends_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out, clock = io.StringIO(), FakeClock()
    display = Progress("p00", 100, stream=out, interactive=True, clock=clock)
    display.update(reading(0, WAITING, None))
    clock.now_s = 1.0
    display.update(reading(50))
    display.close()
    text = out.getvalue()
    assert WAITING in text and "50/100 steps" in text, text
    assert "━" in text and "\r" in text, text     # drawn in place, a bar
    assert not ISO_LINE.search(text.splitlines()[0]), text     # no plain lines on a terminal
    assert text.count("\n") == 1, repr(text)     # the final state stays on screen as one line


def test_a_peer_s_final_status_is_shown_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a peer's status at the end, written twice as the daemon does (at its finish, after its grace)
    writer = StatusWriter(tmp_path, name="p00", progress=True, total_steps=300)
    waiting = {"name": "p00", "state": WAITING, "step": 0, "neighbours": {"p01": {"up": False}}}
    final = {"name": "p00", "state": "finished", "step": 300, "accuracy": 0.93, "bytes_sent": 10_000,
             "bytes_received": 9_000, "rejections": {"config_mismatch": 2},
             "neighbours": {"p01": {"up": True}}}
    # Execute
    writer.write(waiting, now=0.0, interval_s=1.0)
    writer.write(final, now=1.0, interval_s=1.0)
    # its finish grace's heartbeats add a few bytes, too few to show
    writer.write(dict(final, bytes_sent=10_030, bytes_received=9_030), now=2.0, interval_s=1.0)
    writer.close()
    lines = capsys.readouterr().out.splitlines()
    # Assert (before: "p00: finished step 300 ..." twice, and no total, rate, ETA or timestamp)
    assert len(lines) == 2 and all(ISO_LINE.match(line) for line in lines), lines
    assert WAITING in lines[0], lines[0]
    assert "300/300 steps  finished" in lines[1] and "rejected 2" in lines[1], lines[1]


@pytest.mark.parametrize(("status", "shown"), [
    # a gateway trains nothing (step 0): it counts FedAvg rounds, not its gossip machine's 12
    ({"name": "gw0", "state": "training", "step": 0, "metrics": {"round": 12.0},
      "federation": {"round": 6, "rounds": 10}}, "gw0 6/10 rounds"),
    # an edge client: the federation's round as it last heard it, not its own 240 steps
    ({"name": "e000", "role": "edge", "state": "waiting for a round", "step": 240, "round": 6, "rounds": 10},
     "e000 6/10 rounds"),
])
def test_a_gateway_s_and_an_edge_s_bar_count_fedavg_rounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], status: dict[str, object], shown: str) -> None:
    writer = StatusWriter(tmp_path, name=str(status["name"]), progress=True, total_steps=10, unit="rounds")
    writer.write(status, now=0.0, interval_s=1.0)
    writer.close()
    line = capsys.readouterr().out.splitlines()[0]
    assert shown in line and "steps" not in line, line


def test_a_mismatch_is_said_once_per_reason_and_sender_and_only_for_mismatches() -> None:
    notices = MismatchNotices("p02", per_reason=2)
    first = notices.first("config_mismatch", "p05", "their run id aa != ours bb")
    assert first == "p02 refused messages from p05: config_mismatch (their run id aa != ours bb)"
    assert notices.first("config_mismatch", "p05", "their run id aa != ours bb") is None
    assert notices.first("wrong_role", "p05", "a edge may not send param_push") is not None
    assert notices.first("replay", "p05", "") is None and notices.first("bad_signature", "p06", "") is None
    # senders off the roster can be invented: after per_reason named, one line says no more are named
    said = [notices.first("unknown_sender", f"key{i}", "") for i in range(10)]
    assert [s is not None for s in said] == [True, True, True] + [False] * 7, said
    assert said[2] is not None and "more than 2 senders" in said[2], said[2]


def test_a_config_mismatch_names_the_sender_and_both_run_ids() -> None:
    # Prepare: bob's run id differs from alice's (another roster or [network] table); mallory is no member
    net = make_network()
    alice = net.endpoint("alice")
    bob = Endpoint(net.identities["bob"], net.roster, b"\x01" * 32, 1)
    # Execute
    refused = alice.open(bob.seal(["alice"], Heartbeat(step=0, loss=0.0, sent_at_s=0.0)))
    # Assert
    assert isinstance(refused, Rejection) and refused.reason == "config_mismatch", refused
    assert refused.sender == "bob", refused
    assert f"their run id {'01' * 6} != ours {net.run_id.hex()[:12]}" in refused.detail, refused.detail
    mallory = net.identities["mallory"]
    forged = Endpoint(mallory, net.roster.__class__.from_dict({"member": [
        {"name": "mallory", "public_id": mallory.public_id, "role": "peer", "address": "127.0.0.1:1"},
        {"name": "alice", "public_id": net.identities["alice"].public_id, "role": "peer",
         "address": "127.0.0.1:2"}]}), net.run_id, 1)
    unknown = alice.open(forged.seal(["alice"], Heartbeat(step=0, loss=0.0, sent_at_s=0.0)))
    assert isinstance(unknown, Rejection) and unknown.reason == "unknown_sender", unknown
    assert unknown.sender == mallory.public_id and mallory.public_id in unknown.detail, unknown


def test_log_level_and_log_file_are_global_options(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    log_file = tmp_path / "hivemesh.log"
    try:
        # Execute: a command run with the options; then the logger is used as the daemon uses it
        assert main(["--log-level", "warning", "--log-file", str(log_file), "topology", "show",
                     "ring:4"]) == 0
        LOGGER.info("p00: not shown at WARNING")
        LOGGER.warning("p00: warning: shown")
        err = capsys.readouterr().err
    finally:
        configure_logging()     # back to the default for the other tests
    # Assert: stderr has the time and the message; the file also has the level and the logger's name
    assert "not shown" not in err and ISO_LINE.match(err), err
    assert err.rstrip().endswith("p00: warning: shown"), err
    written = log_file.read_text()
    assert ISO_LINE.match(written) and " WARNING hivemesh p00: warning: shown" in written, written
    assert main(["--log-file", str(tmp_path / "no" / "such" / "dir.log"), "topology", "show",
                 "ring:4"]) == 2
    assert "--log-file" in capsys.readouterr().err
    assert logging.getLogger("hivemesh").level == logging.INFO


def test_the_rate_counts_only_time_spent_progressing_not_waiting() -> None:
    # Prepare: a minute waiting for neighbours, then 10 steps/s for 3 s
    out, clock = io.StringIO(), FakeClock()
    display = Progress("p00", 100, stream=out, interactive=False, clock=clock)
    for second in range(61):
        clock.now_s = second
        display.update(reading(0, WAITING, None))
    rates = []
    for second in range(1, 4):
        clock.now_s = 60 + second
        display.update(reading(10 * second))
        rates.append(display.text(reading(10 * second)))
    # Assert: from the first second of training on (a rate over the wait too would say 0.5 steps/s
    # and an ETA of minutes)
    assert "10.0 steps/s  ETA 0:00:09" in rates[0], rates[0]
    assert "10.0 steps/s  ETA 0:00:07" in rates[2], rates[2]
