"""Catching up in the simulator (issue 14): one insider's round claims are bounded, and a ring cut
in two still heals.

The insider is a roster member: its messages are sealed by its own Endpoint (a valid signature,
any round, sequence number and epoch it likes) and cross the simulator's link model like any other
(``GossipRun._send``), so they follow the wire wherever it goes. The machines decide what to do
with them (protocols/gossip/catchup.py), the same code the daemon runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from protocols.events import Send
from protocols.messages import ParamPush
from protocols.node.schedule import Cut, Reached, Schedule
from protocols.wire import wire_size
from sim.gossip_driver import GossipRun, SimPeer
from sim.scenario import scenario_from_dict
from sim.world import ScenarioResult, build_world

STEPS = 200
STEP_MS = 20.0
ATTACKER = "p01"
ACCURACY_BAR = 0.85  # digits-mlp, as the other simulator tests


def _scenario(spec: str, *, steps: int = STEPS, speed: dict[str, float] | None = None,
              algorithm: str = "dpsgd", byzantine: int = -1) -> Any:
    return scenario_from_dict({
        "seed": 1, "duration_s": 600.0, "eval_every_s": 100.0, "target_accuracy": ACCURACY_BAR,
        "graph": {"spec": spec}, "links": {"latency_ms": 5.0, "bandwidth_mbps": 1000.0},
        "nodes": {"step_time_ms": STEP_MS, "speed": speed or {}},
        "algorithm": {"algorithm": algorithm, "deadline_s": 0.5, "byzantine_neighbours": byzantine},
        "task": {"name": "digits-mlp"}, "trainer": {"lr": 0.1}, "steps": steps})


Attack = Callable[[GossipRun], None]


def _run(spec: str, attack: Attack | None = None, *, faults: Schedule | None = None,
         speed: dict[str, float] | None = None, algorithm: str = "dpsgd",
         byzantine: int = -1) -> tuple[ScenarioResult, GossipRun]:
    world = build_world(_scenario(spec, speed=speed, algorithm=algorithm, byzantine=byzantine))
    run = GossipRun(world, faults=faults)
    run.begin()
    if attack is not None:
        attack(run)
    run.engine.run(until_s=world.scenario.duration_s)
    return run.end(), run


def _forge(run: GossipRun, at_s: float, round_index: int | Callable[[], int], *,
           to: tuple[str, ...] = ("p00", "p02"),
           epoch: int | None = None, seq: int | None = None,
           values: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """At ``at_s`` the attacker sends its current round's message (valid, signed by its own key),
    with ``round_index`` as the round (a function: asked then), optionally its own choice of epoch,
    sequence number and parameter values. Its own counters carry on as before afterwards (its
    genuine traffic)."""
    def fire() -> None:
        peer: SimPeer = run.peers[ATTACKER]
        machine: Any = peer.node.machine
        genuine = next(a.message for a in machine.last_sends if isinstance(a.message, ParamPush))
        tensors = dict(genuine.tensors)
        if values is not None:
            tensors = {k: values(v) for k, v in tensors.items()}
        claimed = round_index() if callable(round_index) else round_index
        forged = dataclasses.replace(genuine, round=claimed, tensors=tensors)
        endpoint = peer.endpoint
        kept = endpoint.epoch, endpoint.seq
        endpoint.epoch = kept[0] if epoch is None else epoch
        endpoint.seq = kept[1] if seq is None else seq
        try:
            frames = [bytes(f) for f in endpoint.seal(to, forged)]
        finally:
            endpoint.epoch, endpoint.seq = kept[0], kept[1] + 1
        for recipient in to:  # over the simulator's link model, as any message
            transfer = run.network.transmit(ATTACKER, recipient, wire_size(frames), run.engine.now_s)
            assert transfer.arrival_s is not None
            arrive = functools.partial(run._arrive, ATTACKER, recipient, list(frames))
            run.engine.at(transfer.arrival_s, arrive)
    run.engine.at(at_s, fire)


def _skipped(result: ScenarioResult) -> dict[str, float]:
    return {n: p["metrics"].get("rounds_skipped", 0.0) for n, p in sorted(result.peers.items())}


def _accuracy(result: ScenarioResult) -> dict[str, float]:
    return {n: float(p["final_accuracy"]) for n, p in sorted(result.peers.items())}


# ------------------------------------------------------------ one message, a ring of 4


def test_one_valid_message_for_the_last_round_no_longer_stops_a_ring() -> None:
    # Issue 14's reproduction: before, every peer of the ring skipped 192-193 of its 200 rounds
    # (the attacker's neighbours jumped to the last round, then theirs followed them).
    clean, _ = _run("ring:4")
    last = 0

    def attack(run: GossipRun) -> None:
        nonlocal last
        last = run.peers[ATTACKER].node.machine.last_round
        _forge(run, 0.1, last)

    attacked, _ = _run("ring:4", attack)
    assert last == STEPS - 1
    assert _skipped(attacked) == dict.fromkeys(attacked.peers, 0.0)
    for name in ("p00", "p02"):  # each neighbour followed nothing (p03 did not confirm it), and counted it
        assert attacked.peers[name]["metrics"]["catch_up_unconfirmed"] == 1.0
        assert attacked.peers[name]["steps"] == STEPS
    assert _accuracy(attacked) == _accuracy(clean)  # nothing else changed


# ------------------------------------------------------------ acceptance (b): the round parts


INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1


def _battery(last_round: int) -> list[tuple[str, dict[str, Any], str]]:
    """(label, _forge options, the reason each recipient counts it by)."""
    huge = float(torch.finfo(torch.float32).max)
    return [
        ("round -1", {"round_index": -1}, "bad_round"),
        ("round 0, long past", {"round_index": 0}, "stale_message"),
        ("the last round", {"round_index": last_round}, "catch_up_unconfirmed"),
        ("round 2^31", {"round_index": 2**31}, "bad_round"),
        ("round 2^63 - 1", {"round_index": INT64_MAX}, "bad_round"),
        ("round 2^63", {"round_index": 2**63}, "bad_round"),
        ("round 2^64 - 1", {"round_index": U64_MAX}, "bad_round"),
        ("seq 2^62", {"round_index": last_round, "seq": 2**62}, "seq_jump"),
        ("seq 2^63 - 1", {"round_index": last_round, "seq": INT64_MAX}, "seq_jump"),
        ("seq 2^64 - 1", {"round_index": last_round, "seq": U64_MAX}, "malformed_header"),
        ("epoch 2^40", {"round_index": last_round, "epoch": 2**40}, "epoch_jump"),
        ("epoch 2^63 - 1", {"round_index": last_round, "epoch": INT64_MAX}, "epoch_jump"),
        ("epoch 2^64 - 1", {"round_index": last_round, "epoch": U64_MAX}, "malformed_header"),
        ("NaN values, far round", {"round_index": last_round,
                                   "values": lambda v: torch.full_like(v, math.nan)}, "catch_up_unconfirmed"),
        ("huge values, far round", {"round_index": last_round,
                                    "values": lambda v: torch.full_like(v, huge)}, "catch_up_unconfirmed"),
    ]


def test_an_insiders_rounds_sequence_numbers_and_epochs_move_nobody() -> None:
    clean, _ = _run("ring:4")
    sent: list[str] = []

    def attack(run: GossipRun) -> None:
        last = run.peers[ATTACKER].node.machine.last_round
        battery = _battery(last)
        # each crafted message, three times over the run, at times between the attacker's rounds
        for at_s in (0.31, 1.52, 2.73):
            for i, (label, options, _) in enumerate(battery):
                _forge(run, at_s + 0.001 * i, **options)
                sent.append(label)

    attacked, _ = _run("ring:4", attack)
    battery = {label: reason for label, _, reason in _battery(STEPS - 1)}
    assert len(sent) == 3 * len(battery)
    honest = [n for n in attacked.peers if n != ATTACKER]
    # No honest peer skipped a round on the insider's word (it was heard in step all along: it
    # could not have trained further than the rounds the peers were in), and none lost training.
    assert _skipped(attacked) == dict.fromkeys(attacked.peers, 0.0)
    for name in honest:
        assert attacked.peers[name]["steps"] == STEPS
    # Every crafted message is counted by each of its two recipients, by reason.
    expected: dict[str, int] = {}
    for label in sent:
        expected[battery[label]] = expected.get(battery[label], 0) + 2
    counted: dict[str, float] = {}
    for name in ("p00", "p02"):
        peer = attacked.peers[name]
        for reason in expected:
            counted[reason] = (counted.get(reason, 0.0) + peer["rejections"].get(reason, 0)
                               + peer["metrics"].get(reason, 0.0))
    assert counted == {k: float(v) for k, v in expected.items()}, (counted, expected)
    # No honest peer's genuine traffic was refused afterwards: the windows never moved (no replay,
    # no jump refused but the forged ones), and nothing but the attack was refused anywhere.
    assert attacked.rejections.get("replay", 0) == 0 and attacked.rejections.get("old_epoch", 0) == 0
    for name in ("p03",):  # not a neighbour of the attacker: it saw a clean run
        assert attacked.peers[name]["rejections"] == clean.peers[name]["rejections"]
    for name in honest:
        assert abs(_accuracy(attacked)[name] - _accuracy(clean)[name]) <= 0.01


def test_an_insider_silent_for_a_while_moves_its_neighbours_no_further_than_it_could_have_trained(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The attacker's own messages are lost from 0.5 s to 1.5 s (it trains on, hearing the others),
    # then it claims the last round. Its neighbours last believed it at 0.5 s: at twice their own
    # pace (a round is a 20 ms step and the exchange) it can have gained under 2 x 1.0 s / 20 ms =
    # 100 rounds on that.
    silent_from_s, silent_until_s = 0.5, 1.5

    def attack(run: GossipRun) -> None:
        send = run._send

        def lossy(peer: SimPeer, action: Send) -> None:
            if not (peer.name == ATTACKER and silent_from_s <= run.engine.now_s < silent_until_s):
                send(peer, action)

        monkeypatch.setattr(run, "_send", lossy)
        _forge(run, silent_until_s, run.peers[ATTACKER].node.machine.last_round)

    attacked, _ = _run("ring:4", attack)
    reach_rounds = 2 * (silent_until_s - silent_from_s) / (STEP_MS / 1000)
    skipped = _skipped(attacked)
    for name in ("p00", "p02"):
        assert attacked.peers[name]["metrics"]["catch_up_bounded"] == 1.0
        assert 0 < skipped[name] <= reach_rounds, skipped
    # (the ring then follows its members ahead, each at the bounded rate: 72-74 rounds skipped each,
    # where one message once made them skip 193 of 200 without any silence)
    for name in attacked.peers:
        assert skipped[name] <= reach_rounds, skipped
        assert attacked.peers[name]["finished"], name
        assert _accuracy(attacked)[name] >= ACCURACY_BAR


# ------------------------------------------------------------ acceptance (f): a ring cut in two


CUT_FROM = 10
CUT_ROUNDS = 30


@pytest.mark.parametrize("byzantine", [0, -1])
def test_a_ring_of_8_cut_in_two_for_30_rounds_finishes_and_heals_where_one_claim_is_trusted(
        byzantine: int) -> None:
    # The halves {p00..p03} and {p04..p07} meet at single edges (p00-p07, p03-p04): each boundary
    # peer has one neighbour across, so no catch-up can be confirmed by a second in-neighbour. The
    # second half steps 0.6x as fast: 30 rounds of the first half apart, it is 12 behind, far more
    # than max_rounds_ahead (4). With byzantine_neighbours = 0 (one claim trusted) the half behind
    # jumps to the other and the ring converges again (11-12 rounds skipped each). With the default
    # (f = 1) a lone neighbour moves a boundary peer no further than its own pace since: it regains
    # only the time it waited out deadlines, lands short, falls behind again, and the halves mix
    # only now and then (measured: 55-89 rounds skipped each, a spread of 0.077): the cost of that
    # rule on a ring (docs/design/gossip-rounds.md). Every peer still finishes and meets the bar.
    slow = {f"p{i:02d}": 0.6 for i in range(4, 8)}
    a, b = frozenset(f"p{i:02d}" for i in range(4)), frozenset(slow)
    cut = Schedule((Cut(side_a=a, side_b=b, from_round=CUT_FROM,
                        heal_when=(Reached("p00", CUT_FROM + CUT_ROUNDS),)),))
    result, run = _run("ring:8", faults=cut, speed=slow, byzantine=byzantine)
    skipped = _skipped(result)
    # the half behind caught up by jumps (the boundary first, its inner peers after it)
    assert all(skipped[n] > 0 for n in b), skipped
    assert all(skipped[n] == 0 for n in a), skipped
    for name, peer in sorted(result.peers.items()):
        assert peer["finished"] and peer["steps"] == STEPS, (name, peer["steps"])
        assert peer["final_accuracy"] >= ACCURACY_BAR, (name, peer["final_accuracy"])
    if byzantine == 0:  # ...and the ring converged again: the members end close together
        assert all(skipped[n] <= CUT_ROUNDS for n in b), skipped
        finals = [run.world.trainers[n].flat_params for n in run.world.names]
        mean = torch.stack(finals).mean(0)
        norm = torch.linalg.vector_norm
        spread = max(float(norm(x - mean) / norm(mean)) for x in finals)
        assert spread < 0.05, spread


# ------------------------------------------------------------ issue 32 item 5: a lone in-neighbour's claims


def _stream(run: GossipRun, *, to: tuple[str, ...], from_s: float, until_s: float, every_s: float) -> None:
    """From ``from_s`` to ``until_s``, every ``every_s``: the attacker claims a round beyond its
    neighbours' buffer window, as far again ahead of its round at ``from_s`` as it has come since
    (claims that advance at twice the ring's pace)."""
    machine: Any = run.peers[ATTACKER].node.machine
    start: list[int] = []

    def claimed() -> int:
        now = machine.round
        if not start:
            start.append(now)
        return min(machine.last_round, 2 * now - start[0] + machine.config.max_rounds_ahead + 1)

    at_s = from_s
    while at_s < until_s:
        _forge(run, at_s, claimed, to=to)
        at_s += every_s


@pytest.mark.parametrize(("spec", "algorithm"), [("directed-ring:4", "pushsum"), ("ring:4", "dpsgd")])
def test_a_lone_in_neighbours_claims_once_or_as_a_stream_skip_no_step(spec: str, algorithm: str) -> None:
    # On a directed ring the attacker is its out-neighbour p02's only in-neighbour: no second one can
    # ever confirm a claim, so only p02's own pace bounds what the attacker's word does. On the ring
    # (two in-neighbours: p01 and p03, which is in step) the same must hold. Issue 32 measured 10%
    # of steps skipped after one claim and 11-14% after a 10 s stream on real processes; the bar is 2%.
    to = ("p02",) if spec.startswith("directed") else ("p00", "p02")
    clean, _ = _run(spec, algorithm=algorithm)

    def attack(run: GossipRun) -> None:
        _forge(run, 0.3, run.peers[ATTACKER].node.machine.last_round, to=to)  # once
        _stream(run, to=to, from_s=0.5, until_s=10.5, every_s=0.05)           # a 10 s stream

    attacked, _ = _run(spec, attack, algorithm=algorithm)
    assert _skipped(attacked) == dict.fromkeys(attacked.peers, 0.0)
    for name in to:   # every claim was heard, none followed
        metrics = attacked.peers[name]["metrics"]
        assert metrics.get("catch_up_bounded", 0) == 0, metrics
        assert metrics.get("catch_up_refused", 0) + metrics.get("catch_up_unconfirmed", 0) >= 50, metrics
    for name in attacked.peers:
        assert attacked.peers[name]["steps"] == STEPS and attacked.peers[name]["finished"], name
        assert abs(_accuracy(attacked)[name] - _accuracy(clean)[name]) <= 0.01, (name, _accuracy(attacked))
