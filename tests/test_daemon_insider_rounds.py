"""Issue 14, acceptance (b), the round parts, in real processes: one member's key, forged rounds.

4 peers on a ring (p00..p03), D-PSGD. Once p00 and p02 have trained ``ATTACK_AT`` steps, the
attacker, holding p01's key (a roster member: its signatures are valid), sends them ``ParamPush``
messages for rounds -1, 0, the last round, 2^31, 2^63 - 1 and 2^64 - 1, and with sequence
numbers and epochs far ahead, over its own ZeroMQ transport, while everyone trains on. The real
p01 runs on, so the attacker's sequence numbers are placed above any the real one seals in this
run (within the replay window's bitmap, as any reordering), and its genuine traffic is still
accepted.

Not while the peers are held: a neighbour silent for seconds could have trained that long, and a
claim within that reach is followed (protocols/gossip/catchup.py). Training, p01 is heard every
round, and the last round is far beyond what it can have reached since.

The codec counts the window jumps (``seq_jump``, ``epoch_jump``) and the out-of-range counters
(``malformed_header``); the machines count the rounds (``bad_round``, ``stale_message``, and the
last round, beyond what p01 could have trained, ``catch_up_refused``, or ``catch_up_bounded`` where
a loaded machine made p01's last message a few rounds old). Nobody skips more than a few rounds.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from _daemon_support import CEILING_S, describe, make_network, peers, status, wait_for_step

from peer.net.transport import CurveKeys, Transport, listener_address, reserve_listeners
from peer.runtime.assemble import identity_and_roster, make_trainer
from peer.runtime.peerconfig import load_peer_config
from protocols.messages import ParamPush
from protocols.roster import run_id
from protocols.wire import Endpoint, wire_messages

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 300
ATTACK_AT = 20
FIRST_SEQ = 1000   # above anything the real p01 seals in this run, and within the 1024-message bitmap
INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1


def _deliver(sender: Transport, name: str, frames: list[bytes]) -> None:
    for _ in range(200):
        if sender.send(name, frames):
            return
        time.sleep(0.02)
    raise AssertionError(f"attacker could not reach {name}")


def test_one_members_forged_rounds_sequence_numbers_and_epochs_move_no_real_peer(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=4, steps=STEPS, gossip={"deadline_s": 60.0})
    config = load_peer_config(files.configs["p01"])
    identity, roster, _ = identity_and_roster(config)
    last_round = STEPS - 1
    addresses = {m.name: m.address for m in roster}
    (port,) = reserve_listeners(1)
    # the attacker holds p01's keys, its CurveZMQ pair included: its connections are admitted as p01's
    curve = CurveKeys(public_key=identity.curve_public_key.encode(),
                      secret_key=identity.curve_secret_key.encode(),
                      server_keys={n: roster.member(n).curve_key.encode() for n in ("p00", "p02")})
    attacker = Transport(listen=listener_address(port), listen_fd=port.detach(), curve=curve,
                         neighbours={n: addresses[n] for n in ("p00", "p02")})
    expected: dict[str, Counter[str]] = {n: Counter() for n in ("p00", "p02")}
    try:
        with peers(files) as processes:
            processes.start_all()
            numel = make_trainer(config).flat_params.numel()
            wait_for_step(files, ["p00", "p02"], ATTACK_AT)
            epoch = int((files.out / "data" / "p01" / "epoch").read_text())   # the real p01's
            endpoint = Endpoint(identity, roster, run_id(config.shared()), epoch=epoch)
            # (round, epoch, seq or None: the next one, the reason counted)
            battery: list[tuple[int, int, int | None, str]] = [
                (-1, epoch, None, "bad_round"),
                (0, epoch, None, "stale_message"),
                (last_round, epoch, None, "catch_up"),
                (2**31, epoch, None, "bad_round"),
                (INT64_MAX, epoch, None, "bad_round"),
                (U64_MAX, epoch, None, "bad_round"),
                (last_round, epoch, 2**62, "seq_jump"),
                (last_round, epoch, U64_MAX, "malformed_header"),
                (last_round, epoch + 2**40, None, "epoch_jump"),
                (last_round, U64_MAX, None, "malformed_header"),
            ]
            next_seq = FIRST_SEQ
            for round_index, forged_epoch, seq, reason in battery:
                message = ParamPush(round=round_index, tensors={"x": torch.zeros(numel)})
                endpoint.epoch = forged_epoch
                for target in ("p00", "p02"):
                    endpoint.seq = next_seq if seq is None else seq
                    next_seq += 1
                    sealed = wire_messages(endpoint.seal([target], message))
                    _deliver(attacker, target, [bytes(f) for f in sealed])
                    expected[target][reason] += 1
            attacker.wait_sent(10)
            finished = processes.wait(CEILING_S)
            codes = processes.exitcodes()
        assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    finally:
        attacker.close()
    statuses = {name: status(files, name) for name in files.configs}
    for name, found in sorted(statuses.items()):
        assert found["state"] == "finished" and found["step"] == STEPS, describe(files)
        # (before issue 14: the attacker's neighbours jumped to the last round, and the ring followed)
        assert found["metrics"].get("rounds_skipped", 0) <= 4, (name, found["metrics"])
        assert found["accuracy"] >= 0.85, (name, found["accuracy"])
    for name, reasons in expected.items():
        found = statuses[name]
        metrics = found["metrics"]
        counted = Counter({reason: int(found["rejections"].get(reason, 0) + metrics.get(reason, 0))
                           for reason in reasons if reason != "catch_up"})
        counted["catch_up"] = int(metrics.get("catch_up_refused", 0) + metrics.get("catch_up_bounded", 0))
        assert counted == reasons, (name, counted, found["rejections"], found["metrics"])
        # the real p01's genuine traffic, and everyone else's, was never refused
        assert not {"replay", "old_epoch"} & set(found["rejections"]), found["rejections"]
    for name in ("p01", "p03"):
        assert statuses[name]["rejections"] == {}, (name, statuses[name]["rejections"])
