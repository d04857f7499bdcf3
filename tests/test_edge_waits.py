"""Issue 30 item 3: an edge client says what it waits for, in words (peer/runtime/edgewait.py), with
the reason for a missing connection read from its socket's monitor (peer/net/reach.py).

The pure tests drive :class:`Reach` with the event sequences libzmq 4.3.5 emits (seen on its
monitor: a closed port gives DELAYED, CLOSED, RETRIED within a millisecond) and
:class:`GatewayWait` with made-up outages; the process test starts one edge client whose gateway
address refuses, and reads the timing from the edge's own log timestamps."""

from __future__ import annotations

import socket
from datetime import datetime
from pathlib import Path

import pytest
import zmq
from _federation_support import CEILING_S, describe, make_federation, processes, status, wait_until
from _operator_text import assert_operator_text

from peer.files.statefiles import peer_reading
from peer.net.reach import SLOW_S, Reach
from peer.runtime.edgewait import REPEAT_MAX_S, GatewayWait
from protocols.federation.config import FederationConfig

ADDRESS = "tcp://127.0.0.1:7001"


def reach_after(events: list[tuple[float, int]]) -> Reach:
    reach = Reach(0.0)
    for at_s, event in events:
        reach.event(event, at_s)
    return reach


def test_reach_names_a_refused_dial_a_failed_connect_and_a_silent_address() -> None:
    # Prepare / Execute: a reset within a millisecond; connect() failing at once; an attempt unanswered
    refused = reach_after([(0.001, zmq.EVENT_CONNECT_DELAYED), (0.002, zmq.EVENT_CLOSED),
                           (0.002, zmq.EVENT_CONNECT_RETRIED)])
    no_route = reach_after([(0.001, zmq.EVENT_CONNECT_RETRIED)])
    slow_failure = reach_after([(0.0, zmq.EVENT_CONNECT_DELAYED), (3.0, zmq.EVENT_CONNECT_RETRIED)])
    silent = reach_after([(0.0, zmq.EVENT_CONNECT_DELAYED)])
    # Assert
    assert refused.reason(0.1) == "refused" and not refused.up
    assert no_route.reason(0.1) == "no route" and slow_failure.reason(3.1) == "no route"
    assert silent.reason(SLOW_S / 2) == "dialing" and silent.reason(SLOW_S) == "no answer"
    assert silent.down_for_s(5.0) == 5.0


def test_reach_follows_handshakes_and_a_lost_connection() -> None:
    # Prepare: TCP up, nothing answers the handshake; then a refusal by the listener's admission
    mute = reach_after([(0.0, zmq.EVENT_CONNECT_DELAYED), (0.001, zmq.EVENT_CONNECTED)])
    refused = reach_after([(0.0, zmq.EVENT_CONNECT_DELAYED), (0.001, zmq.EVENT_CONNECTED),
                           (0.002, zmq.EVENT_HANDSHAKE_FAILED_AUTH), (0.002, zmq.EVENT_DISCONNECTED),
                           (0.003, zmq.EVENT_CONNECT_RETRIED)])
    # Execute: a connection 4 s after the dial, lost at 10 s
    lost = reach_after([(0.0, zmq.EVENT_CONNECT_DELAYED), (4.0, zmq.EVENT_CONNECTED),
                        (4.0, zmq.EVENT_HANDSHAKE_SUCCEEDED)])
    up_then = (lost.up, lost.reason(5.0), lost.down_for_s(5.0), lost.last_outage_s)
    lost.event(zmq.EVENT_DISCONNECTED, 10.0)
    # Assert
    assert mute.reason(2 * SLOW_S) == "no answer to the handshake"
    assert refused.reason(1.0) == "handshake refused (our key is not admitted there)"
    assert up_then == (True, "", 0.0, 4.0)
    assert not lost.up and lost.reason(10.5) == "connection lost" and lost.down_for_s(12.0) == 2.0


def wait(mode: str = "sync") -> GatewayWait:
    return GatewayWait(gateway="gw0", address=ADDRESS, heartbeat_interval_s=1.0,
                       federation=FederationConfig(mode=mode, fraction=0.2, concurrency=3))


def test_an_outage_is_said_after_one_heartbeat_then_as_it_doubles_and_its_end_once() -> None:
    # Prepare
    gateway = wait()
    # Execute: the loop asks every 0.25 s for 80 s, then the connection comes
    lines = {}
    for tick in range(321):
        line = gateway.outage_line(up=False, down_for_s=tick / 4, reason="refused")
        if line is not None:
            lines[tick / 4] = line
    back = gateway.outage_line(up=True, down_for_s=80.3, reason="")
    # Assert: at 1 heartbeat, then doubling, at least every REPEAT_MAX_S
    assert list(lines) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 32.0 + REPEAT_MAX_S]
    assert lines[1.0] == f"no connection to gw0 at {ADDRESS} for 1.0 s (refused)"
    assert lines[32.0] == f"no connection to gw0 at {ADDRESS} for 32 s (refused)"
    assert back == f"connected to gw0 at {ADDRESS} after 80 s without"
    assert gateway.outage_line(up=True, down_for_s=80.3, reason="") is None


def test_the_note_says_which_wait_it_is() -> None:
    # Prepare
    gateway, fedbuff = wait(), wait("fedbuff")
    # Execute / Assert: before the first line, after it, connected, registered

    def note(up: bool, heard: bool, last_round: int = -1, reason: str = "") -> str:
        return gateway.note(up=up, reason=reason, heard=heard, last_round=last_round)

    assert note(False, False, reason="refused") == f"connecting to gw0 at {ADDRESS}"
    gateway.outage_line(up=False, down_for_s=2.5, reason="refused")
    assert note(False, False, reason="no route") == f"no connection to gw0 at {ADDRESS} for 2.5 s (no route)"
    gateway.outage_line(up=True, down_for_s=3.0, reason="")
    assert note(True, False) == "connected to gw0; waiting for its answer"
    assert note(True, True) == "registered; not sampled yet (fraction 0.2)"
    assert note(True, True, 12) == "registered; not sampled since round 12 (fraction 0.2)"
    assert (fedbuff.note(up=True, reason="", heard=True, last_round=4)
            == "registered; not asked since model version 4 (concurrency 3)")


def log_time(line: str) -> datetime:
    return datetime.fromisoformat(line.split(" ", 1)[0])


@pytest.mark.processes
def test_an_edge_names_its_refusing_gateway_within_two_heartbeats(tmp_path: Path) -> None:
    """Issue 30 acceptance (a): nothing listens at the gateway's address (a socket bound there
    and never listening, so no other process takes the port: every dial is reset). The edge says
    so, with the address and "refused", within 2 heartbeat intervals of its dial by its own log
    clock, and its status says what it waits for in the same words."""
    # Prepare: 1 s heartbeats; it never gives up (the test ends it)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed_port:
        closed_port.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{closed_port.getsockname()[1]}"
        files = make_federation(tmp_path / "fed", edges=1, rounds=1, min_clients=1,
                                edge_options={"gateway_address": address, "heartbeat_interval_s": 1.0,
                                              "gateway_timeout_s": 0.0})
        with processes(files) as run:
            # Execute: until its status names the outage, then SIGTERM
            run.start("e000")
            wait_until("the edge's status names the outage",
                       lambda: status(files, "e000").get("waiting_for", "").startswith(
                           f"no connection to gw0 at {address} for "), files)
            waiting_for = status(files, "e000")["waiting_for"]
            run.terminate("e000")
            assert run.wait(CEILING_S, ["e000"]), describe(files)
            code = run.exitcodes()["e000"]
    # Assert: the dial, then the outage within 2 heartbeats of it, by the edge's own timestamps
    log = (files.network.out / "data" / "e000" / "peer.log").read_text()
    lines = log.splitlines()
    dialed = next(line for line in lines if f"e000: dials its gateway gw0 at {address}" in line)
    outage = next(line for line in lines if f"e000: no connection to gw0 at {address} for" in line)
    assert outage.endswith(" s (refused)") and waiting_for.endswith(" s (refused)"), (log, waiting_for)
    assert (log_time(outage) - log_time(dialed)).total_seconds() <= 2 * 1.0, log
    assert code == 0
    assert_operator_text(log, where="e000's log")


@pytest.mark.processes
def test_an_edge_registered_but_not_asked_says_so_while_its_gateway_waits_for_more(tmp_path: Path) -> None:
    """Issue 30 item 3: a client the gateway has registered and not asked into a round hears its
    gateway's heartbeats, so it says "registered; not sampled yet", not "waiting for its answer"
    (a gateway that beat only to its gossip neighbours left it there for the whole run)."""
    # Prepare: rounds open with 2 registered clients; only e000 of 2 runs, so none opens
    files = make_federation(tmp_path / "fed", edges=2, rounds=1, min_clients=1, min_registered=2,
                            fraction=0.5)
    with processes(files) as run:
        # Execute: the gateway and one edge, until the gateway has registered it and its status says so
        run.start("gw0")
        run.start("e000")
        wait_until("the gateway registers e000",
                   lambda: status(files, "gw0").get("federation", {}).get("registered") == ["e000"], files)
        wait_until("e000 says it is registered",
                   lambda: status(files, "e000").get("waiting_for", "").startswith("registered"), files)
        waiting_for = status(files, "e000")["waiting_for"]
        run.terminate("e000")
        run.terminate("gw0")
        assert run.wait(CEILING_S, ["e000", "gw0"]), describe(files)
    # Assert: the words of the wait it is in
    assert waiting_for == "registered; not sampled yet (fraction 0.5)"


def test_an_edges_console_line_shows_its_wait() -> None:
    # Prepare: an edge's status between rounds (as peer/runtime/edge.py writes it)
    status = {"name": "e000", "role": "edge", "state": "waiting for a round", "step": 40,
              "waiting_for": "registered; not sampled since round 12 (fraction 0.2)", "rejections": {}}
    # Execute
    reading = peer_reading(status)
    # Assert
    assert reading.note == "registered; not sampled since round 12 (fraction 0.2)"
