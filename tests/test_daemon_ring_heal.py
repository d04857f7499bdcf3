"""Issue 14, acceptance (f), with real peer processes: a ring cut in two for 30 rounds heals.

Six peers on a ring train digits-mlp with D-PSGD. From round 10 the ring is cut into the halves
{p00, p01, p02} | {p03, p04, p05}: they meet at two single edges (p02-p03 and p05-p00), where each
boundary peer keeps one neighbour on its own side and loses the one across. The first half trains
on alone to round 40 (30 rounds cut); the second is held at round 25, so that when the cut heals
it is 15 rounds behind. Each boundary peer has one neighbour across, so no second in-neighbour can
confirm a claim, and by default (protocols/gossip/catchup.py, issue 32 item 5) one neighbour moves
a peer no further than its own pace since: a half held behind would not catch up. This network
trusts one claim (``byzantine_neighbours = 0``), the setting an operator who needs a ring to heal
across a cut chooses; the half behind must then catch up, and every peer trains to the end, meets
the task's bar, and agrees with the others.

The schedule (protocols/node/schedule.py) places the cut, the holds and the heal on rounds, never
on time; the daemon honours it through its test hooks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon_support import (
    CEILING_S,
    consensus_max_relative,
    describe,
    final_params,
    make_network,
    peers,
    status,
)

from peer.runtime.testhooks import schedule_json
from protocols.node.schedule import Cut, Hold, Reached, Schedule

pytestmark = pytest.mark.processes

STEPS = 600
CUT, BEHIND, AHEAD = 10, 25, 40
A, B = frozenset({"p00", "p01", "p02"}), frozenset({"p03", "p04", "p05"})
HEAL = tuple(Reached(n, AHEAD) for n in sorted(A)) + tuple(Reached(n, BEHIND) for n in sorted(B))
SCHEDULE = Schedule((
    Cut(side_a=A, side_b=B, from_round=CUT, heal_when=HEAL),
    *(Hold(member=n, at_round=AHEAD, until=HEAL) for n in sorted(A)),
    *(Hold(member=n, at_round=BEHIND, until=HEAL) for n in sorted(B)),
))
BAR = 0.95   # digits-mlp's bar (peer/train/tasks)


def test_a_ring_cut_in_two_for_30_rounds_heals_and_every_peer_meets_the_bar(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=6, topology="ring", steps=STEPS,
                         gossip={"deadline_s": 60.0, "final_gossip_rounds": 20, "byzantine_neighbours": 0})
    progress = tmp_path / "progress"
    progress.mkdir()
    with peers(files, schedule=schedule_json(SCHEDULE, progress)) as processes:
        processes.start_all()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    assert finished and all(code == 0 for code in codes.values()), f"{codes}\n{describe(files)}"
    found = {name: status(files, name) for name in files.configs}
    for name, peer in found.items():
        assert peer["step"] == STEPS, (name, peer["step"])
        assert peer["accuracy"] >= BAR, (name, peer["accuracy"])
        # nobody's genuine traffic was refused: no replay, sequence or epoch refusal
        refused = {"replay", "seq_jump", "epoch_jump", "old_epoch"} & set(peer["rejections"])
        assert not refused, peer["rejections"]
    # The half behind caught up by jumping. The half ahead usually never has to; should a member of
    # the half behind land short of the others (a claim heard before its neighbour's newest), the
    # two halves settle by short jumps on both sides. Never the cut's whole gap, though.
    skipped = {name: found[name]["metrics"].get("rounds_skipped", 0) for name in files.configs}
    assert any(skipped[n] > 0 for n in B), (skipped, describe(files))
    assert all(skipped[n] < AHEAD - BEHIND for n in A), skipped
    params = final_params(files)
    assert consensus_max_relative(params) < 1e-3, describe(files)
