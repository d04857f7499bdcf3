"""Acceptance (f), keys and versions, with real processes: a running ring rotates one member's key,
revokes another, and carries a member one protocol version behind.

``hivemesh roster rotate``'s and ``revoke``'s roster (version 2, in force from round 20) is written
while the ring is held at step 8. p01 finds its new key file beside its configured one and signs
with it from round 20; p03's key is refused at once. p04 speaks
protocol version 3 only (a member not yet upgraded). Held again after the change, p00 is sent
heartbeats signed with p01's old key and with p03's: each is refused and counted as
``revoked_key``. p03 leaves the run as soon as it reads that its key was revoked. Faults sit on
progress (test hooks), never on the clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _daemon_support import (
    CEILING_S,
    consensus_max_relative,
    describe,
    final_params,
    hold_at,
    make_network,
    peers,
    status,
    wait_for_files,
    wait_for_log,
)

from peer.files import roster_file
from peer.files.keyfile import load_identity, save_identity
from peer.net.transport import CurveKeys, Transport, listener_address, reserve_listeners
from peer.runtime.netinit import NetworkFiles
from protocols.identity import Identity
from protocols.messages import MIN_PROTOCOL_VERSION, Heartbeat
from protocols.wire import Endpoint, wire_messages

pytestmark = [pytest.mark.processes]

RING = ("p00", "p01", "p02", "p03", "p04")
HONEST = ("p00", "p01", "p02", "p04")      # version 2: p03 revoked
EFFECTIVE_ROUND = 20
FORGED = 5       # heartbeats sent to p00 with each refused key


def test_a_rotated_and_a_revoked_key_are_refused_while_a_member_one_version_behind_trains_on(
        tmp_path: Path) -> None:
    # Prepare: a ring of five; a new key for p01 beside its key file; p04 not yet upgraded
    steps, hold_step, attack_step = 60, 8, 30
    files = make_network(tmp_path / "net", peers=5, steps=steps,
                         gossip={"deadline_s": 1.0, "final_gossip_rounds": 10})
    version_1 = roster_file.read(files.roster)
    old = {name: load_identity(files.keys[name]) for name in ("p01", "p03")}
    new_p01 = Identity.generate()
    save_identity(new_p01, files.keys["p01"].with_name("p01-rotated.key"))
    signature = old["p01"].sign_rotation("p01", new_p01, EFFECTIVE_ROUND)
    version_2 = version_1.rotate("p01", public_id=new_p01.public_id, curve_key=new_p01.curve_public_key,
                                 at_round=EFFECTIVE_ROUND, signature=signature).revoke("p03")
    version_2 = version_2.revised(EFFECTIVE_ROUND)
    marks = tmp_path / "marks"
    marks.mkdir()
    release, attacked = tmp_path / "gate-release", tmp_path / "gate-attacked"
    (attacker_port,) = reserve_listeners(1)
    # the forged messages come over an admitted member's connection (p02's CurveZMQ keys): the codec
    # refuses them by their signing key; a handshake with p01's old CurveZMQ key is refused by ZAP
    p02 = load_identity(files.keys["p02"])
    server_key = version_1.member("p00").curve_key.encode()
    attacker = Transport(listen=listener_address(attacker_port), listen_fd=attacker_port.detach(),
                         neighbours={"p00": version_1.member("p00").address},
                         curve=CurveKeys(public_key=p02.curve_public_key.encode(),
                                         secret_key=p02.curve_secret_key.encode(),
                                         server_keys={"p00": server_key}))
    try:
        with peers(files) as processes:
            for name in RING:
                hooks = [hold_at(hold_step, release, marks, name)]
                if name in HONEST:
                    hooks.append(hold_at(attack_step, attacked, marks, name))
                processes.start(name, hooks, protocol_version=MIN_PROTOCOL_VERSION if name == "p04" else None)
            wait_for_files(marks / f"{name}-held-{hold_step}" for name in RING)
            # Execute: version 2 (p01 rotated, p03 revoked, from round 20) while the ring is held
            roster_file.write(files.roster, version_2)
            for name in RING:
                wait_for_log(files, name, f"takes effect at round {EFFECTIVE_ROUND}")
            release.touch()
            wait_for_files(marks / f"{name}-held-{attack_step}" for name in HONEST)
            # p04 has heard from (and trained with) every neighbour it has now: whatever a newer
            # member sent it before that has been read, and counted
            held_p04 = held_status(files, "p04", attack_step)
            unsupported_held = held_p04["rejections"].get("version_unsupported", 0)
            # ... past the change: heartbeats signed with the rotated-away and the revoked key
            for key in old.values():
                outsider = Endpoint(key, version_1, run_id=b"\0" * 32, epoch=1 << 40)
                for step in range(FORGED):
                    frames = [bytes(f) for f in wire_messages(outsider.seal(["p00"], Heartbeat(step=step)))]
                    deliver(attacker, "p00", frames)
            attacker.wait_sent(10)
            counted = wait_for_count(files, "p00", "revoked_key", 2 * FORGED)
            (old_port,) = reserve_listeners(1)
            with Transport(listen=listener_address(old_port), listen_fd=old_port.detach(),
                           neighbours={"p00": version_1.member("p00").address},
                           curve=CurveKeys(public_key=old["p01"].curve_public_key.encode(),
                                           secret_key=old["p01"].curve_secret_key.encode(),
                                           server_keys={"p00": server_key})) as old_p01:
                old_p01.send("p00", [b"hello"])
                wait_for_count(files, "p00", "not_on_roster", 1, field="transport_refused")
            attacked.touch()
            finished = processes.wait(CEILING_S, list(HONEST))
            codes = processes.exitcodes()
    finally:
        attacker.close()
    assert finished and all(codes[name] == 0 for name in HONEST), f"{codes}\n{describe(files)}"
    logs = {name: (files.out / "data" / name / "peer.log").read_text() for name in RING}
    # Assert: p01 found its new key and the ring took it from round 20 (it trained on with p01)
    assert "holds its rotated key" in logs["p01"], logs["p01"]
    assert "serves and dials with its rotated CurveZMQ key" in logs["p01"], logs["p01"]
    for name in HONEST:
        assert f"roster version 2 in effect from round {EFFECTIVE_ROUND}" in logs[name], describe(files)
        assert status(files, name)["epoch"] == 0, name                          # never restarted
    assert "our key was revoked at roster version 2: leaving the run" in logs["p03"], logs["p03"]
    # Assert: every forged heartbeat refused as revoked_key at p00 (p01's own last messages under its
    # old key may add to them, if they arrive after p00 reached the round), none accepted: p00
    # heard nothing from p03, whose key it never took
    assert counted >= 2 * FORGED
    assert "p03" not in status(files, "p00")["bytes_received_from"]
    # Assert: p04, a version behind, trained with its neighbours to the end: only the messages sent
    # to it before it was first heard were refused (version_unsupported: none once every neighbour
    # had heard it, however many a slow start let in before), and the four agree
    p04 = status(files, "p04")
    assert {"p00", "p02"} <= set(p04["bytes_received_from"])
    assert {"p04"} <= set(status(files, "p00")["bytes_received_from"])
    for name in HONEST:
        rejections = status(files, name)["rejections"]
        assert rejections.get("roster_version_mismatch", 0) == 0 and rejections.get("config_mismatch", 0) == 0
    assert p04["rejections"].get("version_unsupported", 0) == unsupported_held, p04["rejections"]
    params = final_params(files)
    assert consensus_max_relative({name: params[name] for name in HONEST}) < 1e-3, describe(files)


def deliver(sender: Transport, name: str, frames: list[bytes]) -> None:
    for _ in range(200):
        if sender.send(name, frames):
            return
        time.sleep(0.02)
    raise AssertionError(f"could not reach {name}")


def held_status(files: NetworkFiles, name: str, step: int) -> dict[str, Any]:
    """``name``'s status once it says it is held at ``step`` (written after the hold began, so
    everything it had read before holding is counted in it)."""
    deadline = time.monotonic() + CEILING_S
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = status(files, name)
        if found.get("state") == "held by a test hook" and found.get("step") == step:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{name} never said it was held at step {step}: {found.get('state')}, "
                         f"step {found.get('step')}")


def wait_for_count(files: NetworkFiles, name: str, reason: str, at_least: int,
                   field: str = "rejections") -> int:
    """Wait until ``name``'s status counts ``at_least`` refusals for ``reason`` in ``field``; the count."""
    deadline = time.monotonic() + CEILING_S
    found = 0
    while time.monotonic() < deadline:
        found = (status(files, name).get(field) or {}).get(reason, 0)
        if found >= at_least:
            return int(found)
        time.sleep(0.1)
    raise AssertionError(f"{name} counted {found} {reason}, not {at_least}")
