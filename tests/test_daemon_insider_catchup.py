"""Issue 32, item 5, acceptance (d), in real processes: an insider's later-round claims buy no skipping.

4 peers on a ring (p00..p03), D-PSGD, run twice: clean, and with an attacker holding p01's keys
(its CurveZMQ pair and signing key: a roster member's valid messages) over its own ZeroMQ
transport while the real p01 runs on (the machinery of tests/test_daemon_insider_rounds.py). The
attacker sends p01's neighbours

(a) once, a claim of the last round, and
(b) for ``STREAM_S`` seconds, claims that advance steadily ahead of the ring, each ``ADVANCE``
    times as far as the ring trains in the time since the stream began (what the rule of issue 14,
    a lone in-neighbour's reach growing at twice our pace, believed claim after claim).

Asserted, bounds a loaded machine cannot reorder: no real peer skips more than ``SKIP_BAR`` of its
steps after (a) alone or after both, every peer finishes its steps, and each one's accuracy is
within 1 point of the clean run's. The claims carry a one-element tensor: were one ever mixed, it
would be refused at the mix and counted.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _daemon_support import CEILING_S, describe, make_network, peers, run_to_end, status, wait_for_step
from test_daemon_insider_rounds import FIRST_SEQ, PATIENT, TARGETS, _deliver, _endpoint

from peer.net.transport import CurveKeys, Transport, listener_address, reserve_listeners
from peer.runtime.assemble import identity_and_roster
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import load_peer_config
from protocols.messages import ParamPush
from protocols.wire import wire_messages

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 300
ONCE_AT = 30         # (a) goes in once p01's neighbours are here
STREAM_AT = 70       # (b) from here: the real p01 has sealed more numbers than the stream's span below 1024
STREAM_S = 10.0
EVERY_S = 0.25       # one claim to each neighbour this often: 80 sequence numbers in 10 s
ADVANCE = 1.8        # how much faster than the ring the claims advance
SKIP_BAR = 0.02      # of a peer's steps
OPTIONS = {"status_interval_s": 0.1}
GOSSIP = {"deadline_s": 60.0}


def _round_of(files: NetworkFiles, names: tuple[str, ...]) -> tuple[int, float]:
    """The highest step (= round: one local step a round) of ``names`` now, and when it was read."""
    return max(int(status(files, n).get("step") or 0) for n in names), time.monotonic()


def _skipped(files: NetworkFiles) -> dict[str, int]:
    return {n: int(status(files, n)["metrics"].get("steps_skipped", 0)) for n in files.configs}


def _claim(attacker: Transport, endpoint: Any, round_index: int) -> None:
    message = ParamPush(round=round_index, tensors={"x": torch.zeros(1)})
    for target in TARGETS:
        _deliver(attacker, target, [bytes(f) for f in wire_messages(endpoint.seal([target], message))])


def _attacked(files: NetworkFiles) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """The ring under (a) then (b): the steps each peer skipped after (a), and the final statuses."""
    config = load_peer_config(files.configs["p01"])
    identity, roster, _ = identity_and_roster(config)
    addresses = {m.name: m.address for m in roster}
    (port,) = reserve_listeners(1)
    curve = CurveKeys(public_key=identity.curve_public_key.encode(),
                      secret_key=identity.curve_secret_key.encode(),
                      server_keys={n: roster.member(n).curve_key.encode() for n in TARGETS})
    attacker = Transport(listen=listener_address(port), listen_fd=port.detach(), curve=curve,
                         neighbours={n: addresses[n] for n in TARGETS}, config=PATIENT)
    last_round = STEPS - 1
    try:
        with peers(files) as processes:
            processes.start_all()
            wait_for_step(files, list(TARGETS), ONCE_AT)
            endpoint = _endpoint(files, config, identity, roster)
            _claim(attacker, endpoint, last_round)                      # (a)
            attacker.wait_sent()
            once_round, once_s = _round_of(files, TARGETS)
            wait_for_step(files, list(files.configs), STREAM_AT)    # (a)'s jump, if any, long done
            after_once = _skipped(files)
            start_round, start_s = _round_of(files, TARGETS)
            rate = (start_round - once_round) / max(start_s - once_s, 1e-3)     # the ring's rounds/s
            while (elapsed := time.monotonic() - start_s) < STREAM_S:            # (b)
                if _round_of(files, TARGETS)[0] >= last_round:
                    break
                ahead = math.ceil(ADVANCE * rate * elapsed)
                _claim(attacker, endpoint, min(last_round, start_round + 2 + ahead))
                time.sleep(EVERY_S)
            attacker.wait_sent()
            finished = processes.wait(CEILING_S)
            codes = processes.exitcodes()
        assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
        assert not attacker.abandoned, attacker.abandoned
        assert endpoint.seq < FIRST_SEQ + 1024
    finally:
        attacker.close()
    return after_once, {name: status(files, name) for name in files.configs}


def test_an_insiders_later_round_claims_once_or_as_a_stream_skip_under_2_percent(tmp_path: Path) -> None:
    clean = run_to_end(make_network(tmp_path / "clean", peers=4, steps=STEPS, gossip=GOSSIP,
                                    peer_options=OPTIONS))
    files = make_network(tmp_path / "net", peers=4, steps=STEPS, gossip=GOSSIP, peer_options=OPTIONS)
    after_once, statuses = _attacked(files)
    report = {n: (after_once[n], s["metrics"].get("steps_skipped", 0), s["accuracy"], clean[n]["accuracy"])
              for n, s in sorted(statuses.items())}
    print(f"(skipped after once, skipped in all, accuracy, clean accuracy): {report}")
    for name, found in sorted(statuses.items()):
        assert found["state"] == "finished" and found["step"] == STEPS, describe(files)
        assert after_once[name] <= SKIP_BAR * STEPS, (name, after_once[name], found["metrics"])
        assert found["metrics"].get("steps_skipped", 0) <= SKIP_BAR * STEPS, (name, found["metrics"])
        assert abs(found["accuracy"] - clean[name]["accuracy"]) <= 0.01, report
