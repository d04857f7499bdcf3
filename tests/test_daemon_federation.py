"""A federation in real processes on 127.0.0.1: one gateway (``hivemesh peer`` with ``[federation]``)
and edge clients (``hivemesh edge``), issue 12's acceptance (a), (b), (c), (e) and (h), and a
gateway restart.

Each test writes its federation with ``make_federation`` (tests/_federation_support.py: the
gateway's port reserved and handed to it), starts every process through ``PeerProcesses`` and
waits on the files they write (status, hook marks), never on the clock; its ceilings are ones a
healthy run never reaches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from _federation_support import (
    CEILING_S,
    GATEWAY,
    closed_rounds,
    describe,
    make_federation,
    processes,
    status,
    wait_until,
)

from peer.files.keyfile import load_identity
from peer.net.dial import DialTransport
from peer.runtime.edgeconfig import load_edge_config
from peer.runtime.export import latest_params
from peer.runtime.netinit import FederationFiles, load_roster
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import Hook
from protocols.assembly import SIGNATURE_BYTES, wire_messages
from protocols.codec import encode
from protocols.consensus import max_relative_distance
from protocols.identity import Identity
from protocols.messages import ClientUpdate, Heartbeat, Message
from protocols.roster import run_id
from protocols.wire import Endpoint

pytestmark = pytest.mark.processes

def listening_inodes() -> set[str]:
    """Socket inodes of every listening TCP socket of this host (``/proc/net/tcp*``, state 0A)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as handle:
            for row in handle.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A":
                    inodes.add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    return found


def test_ten_edge_clients_reach_the_bar_and_none_listens(tmp_path: Path) -> None:
    """(a) 1 gateway + 10 edge clients, 30 rounds of 5: the global model reaches 0.90; (h) while
    they train, no edge client's process holds a listening TCP socket."""
    # Prepare
    files = make_federation(tmp_path / "fed")
    edges = list(files.edge_configs)
    with processes(files) as run:
        # Execute
        run.start_all()
        gateway_pid = run.processes[GATEWAY].pid
        assert gateway_pid is not None
        wait_until("every client trained a round",
                   lambda: all(status(files, e).get("rounds_trained", 0) >= 1
                               or status(files, e).get("state") == "finished" for e in edges), files)
        listening = listening_inodes()
        held = {e: socket_inodes(run.processes[e].pid or 0) & listening for e in edges if e in run.alive()}
        gateway_listens = bool(socket_inodes(gateway_pid) & listening)
        assert run.wait(CEILING_S), describe(files)
        # Assert
        assert gateway_listens, "the check sees the gateway's listening socket"
        assert held and all(not inodes for inodes in held.values()), held
        assert run.exitcodes() == {name: 0 for name in run.processes}, describe(files)
    gateway = status(files, GATEWAY)
    fed = gateway["federation"]
    assert fed["rounds_closed"] == 30 and fed["phase"] == "finished"
    assert gateway["accuracy"] >= 0.90, describe(files)
    assert fed["counters"]["updates_taken"] == 30 * 5
    assert gateway["rejections"] == {}
    for edge in edges:
        found = status(files, edge)
        assert found["state"] == "finished" and found["listening"] == []
        assert found["rejections"] == {}
        contact = fed["clients"][edge]
        assert contact["bytes_sent"] > 0 and contact["bytes_received"] > 0
        assert found["updates_sent"] == found["rounds_trained"] >= 1


def test_killed_clients_miss_their_round_and_rejoin_later(tmp_path: Path) -> None:
    """(b) two sampled clients die mid-round (a hook kills each before it trains its second sampled
    round): that round closes at its deadline with the rest, nothing crashes, and both, restarted,
    are taken in later rounds. The gateway is held before each round opens until every client
    killed so far is back (its restart is a process start: seconds on a loaded machine, against
    rounds of a second), so whether a victim is asked again is the draw's, not the race's."""
    # Prepare: short rounds, so that the deadline is the test's only wait on the clock
    rounds = 12
    files = make_federation(tmp_path / "fed", rounds=rounds, round_timeout_s=4.0, local_epochs=1)
    marks, gates = tmp_path / "marks", tmp_path / "gates"
    marks.mkdir()
    gates.mkdir()
    victims = ["e001", "e006"]
    hooks = {v: [Hook(at_step=1, action="kill", mark=str(marks / v))] for v in victims}
    hooks[GATEWAY] = [Hook(at_step=r, action="hold", gate=str(gates / str(r)),
                           mark=str(marks / f"{GATEWAY}-{r}")) for r in range(1, rounds)]
    heard_before: dict[str, int] = {}      # what the gateway had received from each victim's first life
    with processes(files) as run:
        # Execute
        run.start_all(hooks)
        for next_round in range(1, rounds):
            wait_until(f"the gateway held before round {next_round}",
                       (marks / f"{GATEWAY}-{next_round}").exists, files)
            for victim in (v for v in victims if v not in heard_before and (marks / v).exists()):
                assert run.wait(30.0, [victim]) and run.exitcodes()[victim] == -9
                heard_before[victim] = _received_from(files, victim)
                run.start(victim)      # restarted: resumes from its checkpoint, registers again
            for victim, before in heard_before.items():
                wait_until(f"the gateway heard {victim}'s second life", _heard_since(files, victim, before),
                           files)
            (gates / str(next_round)).touch()
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert
    assert sorted(heard_before) == victims, f"killed: {sorted(heard_before)}"
    assert all(code == 0 for name, code in codes.items()), codes
    assert status(files, GATEWAY)["federation"]["rounds_closed"] == rounds
    closed = closed_rounds(files)
    assert sorted(closed) == list(range(rounds))
    for victim in victims:
        killed_in = min(i for i, r in closed.items() if victim in r["missing"])
        # the round it died in closed at its deadline, with the updates of the others
        assert closed[killed_in]["closed_by"] == "deadline" and closed[killed_in]["aggregated"]
        assert closed[killed_in]["taken"], closed[killed_in]
        later = [i for i, r in closed.items() if i > killed_in and victim in r["taken"]]
        assert later, f"{victim} never taken after round {killed_in}: {describe(files)}"
        assert status(files, victim)["state"] == "finished"
        log = (files.network.out / "data" / victim / "peer.log").read_text()
        assert "resumed from checkpoint" in log, log    # its error feedback and trainer came back


def _received_from(files: FederationFiles, client: str) -> int:
    """The bytes the gateway has received from ``client`` (its status); a dead client sends none."""
    return int(status(files, GATEWAY)["federation"]["clients"].get(client, {}).get("bytes_received", 0))


def _heard_since(files: FederationFiles, client: str, received: int) -> Callable[[], bool]:
    """Whether the gateway has received more than ``received`` bytes from ``client``: it heard a
    message of its new life, and knows the connection it came on."""
    return lambda: _received_from(files, client) > received


def _attacker_frames(files: FederationFiles, name: str, message: Message, *,
                     recipient: str = GATEWAY, epoch: int = 0) -> list[bytes]:
    """``message`` sealed by roster member ``name`` (its key, the federation's run id) for ``recipient``,
    as the wire's single-frame messages."""
    config = load_edge_config(files.edge_configs[name])
    roster = load_roster(files.network.roster)
    endpoint = Endpoint(load_identity(config.key_path), roster, run_id(config.shared()), epoch)
    return [bytes(f) for f in wire_messages(endpoint.seal((recipient,), message))]


def _resigned(frames: list[bytes], *, signature: bytes | None = None, **header: Any) -> list[bytes]:
    """``frames`` with header fields replaced (``s``: the sender's key) and/or another signature."""
    first = frames[0]
    old_signature, packed = first[:SIGNATURE_BYTES], first[SIGNATURE_BYTES:]
    fields = msgpack.unpackb(packed, raw=False)
    fields.update(header)
    signed = signature if signature is not None else old_signature
    return [signed + msgpack.packb(fields, use_bin_type=True), *frames[1:]]


def test_hostile_updates_are_counted_and_none_is_taken(tmp_path: Path) -> None:
    """(c) While round 0 is open (one sampled client held), a roster member that was not sampled
    sends an unsigned, a forged (another client's name), a replayed, a wrong-round and a
    wrong-recipient update, and a key not on the roster tries to register: each is refused and
    counted by reason, none is taken, and the round then closes with the honest clients only.
    The replay, sent on a second connection, does not move the member's replies there."""
    # Prepare: 3 honest clients, all asked; e003's key is the attacker's (on the roster, never started)
    files = make_federation(tmp_path / "fed", edges=4, rounds=1, fraction=1.0, min_clients=3,
                            min_registered=3, round_timeout_s=120.0)
    honest = ["e000", "e001", "e002"]
    gate, mark = tmp_path / "gate", tmp_path / "e002-held"
    hooks = {"e002": [Hook(at_step=0, action="hold", gate=str(gate), mark=str(mark))]}
    config = load_edge_config(files.edge_configs["e003"])
    gateway_key = load_roster(files.network.roster).member(GATEWAY).public_key
    with processes(files) as run:
        for name in [GATEWAY, *honest]:
            run.start(name, hooks.get(name, ()))
        wait_until("e002 sampled in round 0 and held", mark.exists, files)
        # Execute: the attacker dials in as an edge client would
        update = ClientUpdate(round=0, num_samples=100, tensors={"delta": torch.ones(4)})
        sent = {
            "unsigned": _resigned(_attacker_frames(files, "e003", update), signature=bytes(SIGNATURE_BYTES)),
            "forged": _resigned(_attacker_frames(files, "e003", update),
                                s=load_roster(files.network.roster).member("e001").public_key),
            "wrong_recipient": _attacker_frames(files, "e003", update, recipient="e000"),
        }
        wrong_round = _attacker_frames(files, "e003", ClientUpdate(round=7, num_samples=100), epoch=1)
        not_sampled = _attacker_frames(files, "e003", update, epoch=2)
        outsider = Identity.generate()
        beat = encode(Heartbeat(step=0, loss=0.0, sent_at_s=0.0), identity=outsider, recipients=[gateway_key],
                      run_id=run_id(config.shared()), epoch=0, seq=0)
        address = _gateway_address(files)
        # two connections: the replay comes on the second, and must not take e003's replies there
        # e003's own keys, its CurveZMQ pair included: its connections are admitted as e003's
        e003 = load_identity(config.key_path)
        curve = (e003.curve_public_key.encode(), e003.curve_secret_key.encode(),
                 load_roster(files.network.roster).member(GATEWAY).curve_key.encode())
        with DialTransport(address, curve=curve) as attacker, DialTransport(address, curve=curve) as replayer:
            hostile = [*sent.values(), wrong_round, not_sampled, [bytes(f) for f in wire_messages(beat)]]
            for frames in hostile:
                _send(attacker, frames)
            wait_until("the gateway refused the two accepted updates",
                       lambda: status(files, GATEWAY)["federation"]["counters"].get("refused_update") == 2,
                       files, timeout_s=60.0)
            _send(replayer, not_sampled)   # (after the original: connections do not keep order between them)
            expected_wire = {"bad_signature": 2, "not_a_recipient": 1, "replay": 1, "unknown_sender": 1}
            wait_until("the gateway counted every hostile message",
                       lambda: status(files, GATEWAY).get("rejections") == expected_wire
                       and status(files, GATEWAY)["federation"]["counters"].get("refused_update") == 2,
                       files, timeout_s=60.0)
            during = status(files, GATEWAY)["federation"]
            gate.touch()
            # e003 was heard, so the federation's final model goes to it: on the connection of its
            # last accepted message, not on the one the replay came on (read while the gateway is
            # up: a connection's unread frames go when its peer closes it)
            to_attacker = _until_frames(attacker)
            assert run.wait(CEILING_S, [GATEWAY, *honest]), describe(files)
            to_replayer = replayer.poll(0.0)
            codes = {name: run.exitcodes()[name] for name in [GATEWAY, *honest]}
    # Assert
    assert codes == {name: 0 for name in codes}
    counters = during["counters"]
    assert counters["refused_not_sampled"] == 1 and counters["refused_wrong_round"] == 1
    assert "e003" not in during["asked"] and outsider.public_id not in during["registered"]
    [round_0] = closed_rounds(files).values()
    assert sorted(round_0["taken"]) == honest and round_0["closed_by"] == "quota"
    assert to_attacker and not to_replayer
    final = status(files, GATEWAY)["federation"]["counters"]
    assert final["updates_taken"] == 3 and final["refused_update"] == 2


def _send(transport: DialTransport, frames: list[bytes]) -> None:
    deadline = time.monotonic() + 10.0
    while not transport.send(frames):
        assert time.monotonic() < deadline, "the attacker never connected"
        transport.poll(0.05)


def _until_frames(transport: DialTransport, timeout_s: float = 30.0) -> list[Any]:
    """What arrives on ``transport`` first (waiting up to ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = transport.poll(0.1)
        if got:
            return got
    return []


def _gateway_address(files: FederationFiles) -> str:
    return load_roster(files.network.roster).member(GATEWAY).address


def test_clients_reconnect_to_a_restarted_gateway_and_the_rounds_go_on(tmp_path: Path) -> None:
    """A gateway stopped (SIGTERM: checkpoint) after three rounds and started again: it resumes
    at the round it was in, its clients' connections are learnt again from their next heartbeats
    (ZeroMQ redials), and every round up to the last closes with updates taken."""
    # Prepare
    # (min_registered: no round opens before every client is back, so that each of them takes part
    # in a round after the restart whatever the machine's load; with 3 of 4 a slow one missed all)
    files = make_federation(tmp_path / "fed", edges=4, rounds=8, fraction=1.0, min_clients=3,
                            min_registered=4, round_timeout_s=20.0, local_epochs=1)
    edges = list(files.edge_configs)
    with processes(files) as run:
        run.start_all()
        wait_until("three rounds closed", lambda: len(closed_rounds_or_none(files)) >= 3, files)
        # Execute
        run.terminate(GATEWAY)
        assert run.wait(60.0, [GATEWAY]) and run.exitcodes()[GATEWAY] == 0, describe(files)
        before = set(closed_rounds_or_none(files))
        run.start(GATEWAY)
        assert run.wait(120.0), describe(files)
        codes = run.exitcodes()
    # Assert
    assert codes == {name: 0 for name in codes}, codes
    log = (files.network.out / "data" / GATEWAY / "peer.log").read_text()
    assert "resumed from checkpoint" in log
    rounds = closed_rounds(files)
    assert sorted(rounds) == list(range(8)), sorted(rounds)
    after = [rounds[i] for i in sorted(set(rounds) - before)]
    assert after and all(r["aggregated"] for r in after)
    assert {name for r in after for name in r["taken"]} == set(edges)    # every client came back
    assert all(status(files, e)["state"] == "finished" for e in edges)


def closed_rounds_or_none(files: FederationFiles) -> dict[int, dict[str, Any]]:
    path = files.network.out / "data" / GATEWAY / "rounds.jsonl"
    return closed_rounds(files) if path.exists() else {}


def test_two_gateways_gossip_between_rounds_and_agree(tmp_path: Path) -> None:
    """(e) Two gateways with five clients each, one gossip exchange after every FedAvg round: both
    global models reach (a)'s bar and agree to 1e-3 relative after the final exchange."""
    # Prepare: every client of a gateway takes part in each of its rounds
    files = make_federation(tmp_path / "fed", gateways=2, fraction=1.0, gossip_rounds=1)
    gateways = sorted(files.network.configs)
    # Execute
    with processes(files) as run:
        run.start_all()
        assert run.wait(CEILING_S), describe(files)
        codes = run.exitcodes()
    # Assert
    assert codes == {name: 0 for name in codes}, codes
    finals = {}
    for gateway in gateways:
        found = status(files, gateway)
        assert found["federation"]["rounds_closed"] == 30 and found["accuracy"] >= 0.90, found["accuracy"]
        own = sorted(edge for edge, theirs in files.gateway_of.items() if theirs == gateway)
        assert found["federation"]["registered"] == own == sorted(found["federation"]["clients"])
        finals[gateway] = latest_params(load_peer_config(files.network.configs[gateway]))[0].double()
    assert max_relative_distance(list(finals.values())) <= 1e-3
