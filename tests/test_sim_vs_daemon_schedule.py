"""The differential test (issue 11, acceptance a): one fault schedule, real processes and the
simulator, the same Node decisions.

5 peers on a ring (p00..p04), synchronous D-PSGD, float32, one thread per process. The schedule
(protocols/node/schedule.py) places every fault on rounds, and both drivers honour it: the daemon
through its test hooks (files between the processes), the simulator in its driver. It is built so
that what each machine is fed does not depend on timing (see the notes in ``SCHEDULE``): whoever a
member syncs from, or mixes with, is held where it is until the member has done so. Deadlines never
fire (``deadline_s``, ``neighbour_timeout_s`` and the sync timeout are ceilings); a neighbour goes
down and up only by the schedule's cut. In order:

1. p04 joins late: p00 and p03 are held at round 3; p04 syncs from both (a tie at round 3: p00's
   state, the lowest name), having held the round they resend it (messages before Start);
2. p02 stops cleanly (SIGTERM: a checkpoint) at round 12 and restarts once p01 and p03 wait for it
   in round 13: it syncs from both (a tie: p01's) and holds what they resend (each was up all
   along for them: its answered request tells them it restarted);
3. p02 floods p01 with 5 state-sync requests at round 16: within the answer interval of the answer
   p01 gave it at round 13, every one is refused (p02 is told so, five times, and counts the
   refusals nobody waits for; none makes p01 resend its round);
4. a partition {p00, p01} | {p02, p03, p04} from round 18; the halves go on alone and are held at
   rounds 20 and 27; it heals there: the half behind jumps to round 27 (rounds and steps skipped,
   the trainer's step set), the half ahead drops the round the others resend as stale. Each member
   behind has one neighbour across, so the network trusts one claim (``byzantine_neighbours = 0``:
   by default one neighbour's word moves nobody beyond its own pace, protocols/gossip/catchup.py).

One assumption is left to timing, and made safe by the schedule rather than guaranteed: a machine
that jumps ahead (catching up) closes its current round at once with what it has (protocols/gossip/
rounds.py), so p00 and p01 must each have the other's round-20 message when the heal reaches them.
Both are sent before either is held at round 20, and the half ahead only then plays its last three
rounds before the heal; a message on loopback taking longer than that would make the daemon differ
(seen once in 30 runs before that hold was added, as missed_deadline 2 instead of 1).

For each member both runs must agree exactly: the final parameters bit for bit, the trainer's
step after each catch-up (each ``SetTrainerStep``), state sync's counters (answers sent and
refused, outcomes), messages held before Start and dropped, and the machine's counters (rounds,
rounds and steps skipped, duplicates, stale messages, resends). The daemon's counts for the
restarted p02 are those of both its lives.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from _daemon_support import CEILING_S, describe, final_params, make_network, peers

from peer.files.statefiles import read_status
from peer.runtime.netinit import NetworkFiles
from peer.runtime.testhooks import read_round, schedule_json
from protocols.node.schedule import Cut, Flood, Hold, Join, Reached, Schedule, Stop
from sim.from_network import scenario_from_peer_file
from sim.gossip_driver import GossipRun
from sim.world import ScenarioResult, build_world

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 36
JOIN, STOP, FLOOD, CUT, BEHIND, AHEAD = 3, 12, 16, 18, 20, 27
A, B = frozenset({"p00", "p01"}), frozenset({"p02", "p03", "p04"})
BEHIND_HELD = tuple(Reached(n, BEHIND) for n in sorted(A))
HEAL = BEHIND_HELD + tuple(Reached(n, AHEAD) for n in sorted(B))

SCHEDULE = Schedule((
    # 1. held where p04 syncs from, until it has started its round there
    Hold(member="p00", at_round=JOIN, until=(Reached("p04", JOIN),)),
    Hold(member="p03", at_round=JOIN, until=(Reached("p04", JOIN),)),
    Join(member="p04", when=(Reached("p00", JOIN), Reached("p03", JOIN))),
    # 2. p01 and p03 cannot pass round 13 without p02: they are there when it asks, held before
    # their steps (what they answer is the same in both drivers: no step of round 13 in it)
    Stop(member="p02", at_round=STOP, restart_when=(Reached("p01", STOP + 1), Reached("p03", STOP + 1))),
    Hold(member="p01", at_round=STOP + 1, until=(Reached("p02", STOP + 1),)),
    Hold(member="p03", at_round=STOP + 1, until=(Reached("p02", STOP + 1),)),
    # 3. p01 answered p02's sync at round 13: within the answer interval, every request is refused
    Flood(member="p02", at_round=FLOOD, to="p01", requests=5),
    # 4. both halves held where the cut heals; the half ahead waits at round 24 for the half behind
    # to be held, so that what the two behind sent each other for round 20 has long arrived when
    # the heal makes them jump (a jump mixes what its round has: see the module docstring)
    Cut(side_a=A, side_b=B, from_round=CUT, heal_when=HEAL),
    *(Hold(member=n, at_round=BEHIND, until=HEAL) for n in sorted(A)),
    *(Hold(member=n, at_round=AHEAD - 3, until=BEHIND_HELD) for n in sorted(B)),
    *(Hold(member=n, at_round=AHEAD, until=HEAL) for n in sorted(B)),
))

# every refusal state sync and the messages before Start count (the Node's, not the wire's)
NODE_REASONS = ("sync_", "early_")
# the machine's running totals that are a driver's business, not a decision
DRIVER_METRICS = {"bytes_sent", "payload_bytes_sent", "wire_bytes_sent"}


def run_daemons(files: NetworkFiles, progress: Path) -> dict[str, list[dict[str, Any]]]:
    """Every peer's status at the end of each of its lives; p04 joins and p02 restarts when the
    schedule says (the test starts their processes; the schedule's files say when)."""
    lives: dict[str, list[dict[str, Any]]] = {name: [] for name in files.configs}
    later = SCHEDULE.joins_later()
    joins = {j.member: j.when for j in SCHEDULE.joins()}
    stops = {s.member: s for s in SCHEDULE.stops()}
    restarted: set[str] = set()

    def reached(condition: tuple[Reached, ...]) -> bool:
        return all(read_round(progress, c.member) >= c.round for c in condition)

    with peers(files, schedule=schedule_json(SCHEDULE, progress)) as processes:
        for name in files.configs:
            if name not in later:
                processes.start(name)
        deadline = time.monotonic() + CEILING_S
        while time.monotonic() < deadline:
            for name, when in joins.items():
                if name not in processes.processes and reached(when):
                    processes.start(name)
            for name, stop in stops.items():
                process = processes.processes[name]
                if name not in restarted and not process.is_alive() and reached(stop.restart_when):
                    assert process.exitcode == 0, describe(files)
                    lives[name].append(status_of(files, name))    # the life the stop ended
                    restarted.add(name)
                    processes.start(name)
            if (len(processes.processes) == len(files.configs) and restarted == set(stops)
                    and not processes.alive()):
                break
            time.sleep(0.05)
        codes = processes.exitcodes()
    assert all(code == 0 for code in codes.values()) and len(codes) == len(files.configs), \
        f"{codes}\n{describe(files)}"
    for name in files.configs:
        lives[name].append(status_of(files, name))
    return lives


def status_of(files: NetworkFiles, name: str) -> dict[str, Any]:
    found = read_status(files.out / "data" / name)
    assert found is not None, f"{name} wrote no status"
    return found


def node_counts(rejections: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in rejections.items() if k.startswith(NODE_REASONS)}


def daemon_decisions(lives: list[dict[str, Any]]) -> dict[str, Any]:
    """What the simulator must match, summed over the lives of one member (its machine's counters
    come back with its checkpoint: the last life's are the totals)."""
    node: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for life in lives:
        node.update(node_counts(life["rejections"]))
        outcomes.update(life["state_sync"])
    return {
        "trainer_steps_set": [step for life in lives for step in life["trainer_steps_set"]],
        "sync_answers_sent": sum(life["sync_answers_sent"] for life in lives),
        # held before Start by a life that began with a sync (see the note in sim_decisions)
        "early_held_synced": sum(life["early_held"] for life in lives if life["state_sync"]),
        "node_rejections": dict(sorted(node.items())),
        "state_sync": dict(sorted(outcomes.items())),
        "metrics": {k: float(v) for k, v in sorted(lives[-1]["metrics"].items()) if k not in DRIVER_METRICS},
        "step": lives[-1]["step"],
    }


def sim_decisions(result: ScenarioResult, name: str) -> dict[str, Any]:
    peer = result.peers[name]
    return {
        "trainer_steps_set": peer["trainer_steps_set"],
        "sync_answers_sent": peer["sync_answers_sent"],
        # What a member started with the others holds before its Start depends on which process
        # started first (a neighbour's round-0 message arrives before or after it; the machine gets
        # the same messages in the same order either way); the simulator starts them at one
        # instant, holding nothing. What a joiner or a restarted member holds is the schedule's.
        "early_held_synced": peer["early_held"],
        "node_rejections": node_counts(peer["rejections"]),
        "state_sync": peer["state_sync"],
        "metrics": {k: float(v) for k, v in sorted(peer["metrics"].items()) if k not in DRIVER_METRICS},
        "step": peer["steps"],
    }


def test_one_schedule_the_same_decisions_in_the_daemon_and_the_simulator(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=5, topology="ring", steps=STEPS,
                         gossip={"deadline_s": 600.0, "byzantine_neighbours": 0},
                         trainer={"optimizer": "sgd", "lr": 0.1, "dtype": "float32"},
                         peer_options={"neighbour_timeout_s": 600.0, "sync_timeout_s": 600.0,
                                       "sync_answer_interval_s": 600.0})
    progress = tmp_path / "progress"
    progress.mkdir()
    lives = run_daemons(files, progress)
    real = final_params(files)

    scenario = scenario_from_peer_file(files.configs["p00"], duration_s=3600.0, eval_every_s=3600.0,
                                       nodes={"step_time_ms": 10.0}, links={"latency_ms": 1.0})
    world = build_world(scenario)
    result = GossipRun(world, faults=SCHEDULE).run()

    assert sorted(real) == list(world.names)
    decisions = {name: daemon_decisions(lives[name]) for name in world.names}
    simulated = {name: sim_decisions(result, name) for name in world.names}
    print(json.dumps(decisions, indent=1, sort_keys=True))
    for name in world.names:
        assert simulated[name] == decisions[name], (
            f"{name}:\nsim    {json.dumps(simulated[name], sort_keys=True)}\n"
            f"daemon {json.dumps(decisions[name], sort_keys=True)}\n{describe(files)}")
        mine = world.trainers[name].flat_params.to(torch.float64)
        gap = float((mine - real[name]).abs().max())
        assert torch.equal(mine, real[name]), f"{name}: max |diff| {gap:.3e}"

    # The schedule happened as written (so the agreement above is about something):
    assert [len(lives[n]) for n in world.names] == [1, 1, 2, 1, 1]          # p02 restarted once
    assert decisions["p04"]["trainer_steps_set"] == [JOIN]                  # joined at p00's round 3
    assert decisions["p02"]["trainer_steps_set"][0] == STOP + 1              # synced at p01's round 13
    for name in A:                                                          # the half behind jumped
        assert decisions[name]["trainer_steps_set"] == [AHEAD]
        assert decisions[name]["metrics"]["rounds_skipped"] == AHEAD - BEHIND - 1
    assert decisions["p01"]["node_rejections"] == {"sync_request_too_often": 5}    # the flood
    assert decisions["p02"]["node_rejections"] == {"sync_answer_late": 5}
    assert [decisions[n]["sync_answers_sent"] for n in world.names] == [1, 1, 0, 2, 0]
    assert decisions["p04"]["early_held_synced"] == 2 == decisions["p02"]["early_held_synced"]
    assert decisions["p02"]["state_sync"] == {"adopted": 1} == decisions["p04"]["state_sync"]
    for name in world.names:
        assert decisions[name]["step"] == STEPS
    assert not torch.equal(real["p00"], real["p02"])     # the members really differ from one another
