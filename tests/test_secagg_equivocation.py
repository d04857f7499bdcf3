"""Acceptance d: a gateway that tells half the clients that u dropped and the other half that u
survived gets no share from anyone: every honest client aborts the round, counted by reason.

Ten clients run rounds 0-2 honestly (LocalRound); then the gateway equivocates: u and half the
others get the true survivor set, the rest get it without u. Each client signs what it was told.
In the unmask round the gateway either forwards every signature (each client then finds
signatures over another set: ``survivor_sets_disagree``) or only the signatures over each half's
own set (too few for the threshold, a strict majority of each client's neighbours:
``too_few_signatures``). Either way no client sends an UnmaskShares.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.secagg import ClientPhase, SecAggConfig, quantise
from protocols.secagg.local import LocalRound
from protocols.secagg.messages import (
    ClientMessage,
    ConsistencyProof,
    ConsistencySignature,
    SurvivorSet,
    UnmaskShares,
)
from protocols.secagg.server import Deliver

NAMES = [f"client{i:02d}" for i in range(10)]
DROPPED_OR_NOT = "client04"  # u


def _equivocate(config: SecAggConfig, forward: str) -> tuple[LocalRound, dict[str, list[ClientMessage]]]:
    rng = np.random.default_rng(0)
    inputs = {name: quantise(rng.normal(0.0, 0.3, 50), clip_value=1.0, bits=16) for name in NAMES}
    local = LocalRound(config, inputs, run_id="equivocation", round_index=2)
    announced: list[SurvivorSet] = []

    def stop_at_survivors(deliveries: list[Deliver]) -> list[Deliver]:
        held = [d.message for d in deliveries if isinstance(d.message, SurvivorSet)]
        announced.extend(held)
        return [] if held else deliveries

    assert local.run(tamper=stop_at_survivors) is None
    true_set = announced[0].survivors
    assert DROPPED_OR_NOT in true_set and len(true_set) == len(NAMES)
    told_survived = [DROPPED_OR_NOT, *[n for n in NAMES if n != DROPPED_OR_NOT][:4]]
    told_dropped = [n for n in NAMES if n not in told_survived]
    without_u = tuple(n for n in true_set if n != DROPPED_OR_NOT)

    emitted: dict[str, list[ClientMessage]] = {name: [] for name in NAMES}
    signatures: dict[str, bytes] = {}
    for group, survivors in ((told_survived, true_set), (told_dropped, without_u)):
        for name in group:
            replies = local.clients[name].receive(SurvivorSet("equivocation", 2, survivors), local.now_s)
            emitted[name] += replies
            (reply,) = replies
            assert isinstance(reply, ConsistencySignature)
            signatures[name] = reply.signature
    for group in (told_survived, told_dropped):
        shown = NAMES if forward == "all" else group
        proof = ConsistencyProof("equivocation", 2, tuple((n, signatures[n]) for n in sorted(shown)))
        for name in group:
            emitted[name] += local.clients[name].receive(proof, local.now_s)
    return local, emitted


@pytest.mark.parametrize(("degree", "forward", "reason"), [
    (0, "all", "survivor_sets_disagree"),  # plain SecAgg at n = 10
    (0, "own half", "too_few_signatures"),
    (8, "all", "survivor_sets_disagree"),  # SecAgg+ (t = 5 of 8 neighbours)
    (8, "own half", "too_few_signatures"),
])
def test_every_honest_client_aborts_and_reveals_nothing(degree: int, forward: str, reason: str) -> None:
    local, emitted = _equivocate(SecAggConfig(degree=degree), forward)
    for name in NAMES:
        client = local.clients[name]
        assert client.phase is ClientPhase.ABORTED, name
        assert client.aborts == {reason: 1}, name
        assert client.revealed == {}, name
        assert not any(isinstance(m, UnmaskShares) for m in emitted[name]), name
        assert not any(isinstance(m, UnmaskShares) for m in local.sent[name]), name
    # an aborted client stays silent, and says so in its refusals
    again = local.clients[NAMES[0]].receive(ConsistencyProof("equivocation", 2, ()), local.now_s)
    assert again == [] and local.clients[NAMES[0]].refused["after_abort"] == 1


def test_the_honest_gateway_control_gets_every_share() -> None:
    rng = np.random.default_rng(0)
    inputs = {name: quantise(rng.normal(0.0, 0.3, 50), clip_value=1.0, bits=16) for name in NAMES}
    local = LocalRound(SecAggConfig(), inputs, run_id="equivocation", round_index=2)
    assert local.run() is not None
    for name in NAMES:
        assert local.clients[name].phase is ClientPhase.DONE and not local.clients[name].aborts
        assert sum(isinstance(m, UnmaskShares) for m in local.sent[name]) == 1
