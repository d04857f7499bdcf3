"""The simulator's prediction of a multi-host fault test's own schedule (issue 16, item 5): the
ring's kills (tests/test_hosts_kills.py, :func:`predict_kills`) and the gateway's
(tests/test_hosts_federation.py, :func:`predict_gateway_kill`).

A hosts test hands over what its real run did (which peer was killed at which
step, what it lost) and the run's own pre-fault step time; the simulator runs
the network made from the peers' own files (sim.from_network) with the same
faults and says what it predicts: the steps each restart loses against the
step reached (the checkpoint interval is the peers' own), the time from the
kill until the restarted member's state sync is over, and whether every member
finishes with the bars the real test holds (accuracy, consensus).

What the simulator does not model, and the prediction therefore leaves out: a
process start (importing torch: seconds, and slower on a loaded machine) is
sim/gossip_driver.py's ``PROCESS_START_S``; a kill inside a checkpoint write
(the simulator's writes are instantaneous: a kill lands before or after one);
the full disk. Small models and four members: a few seconds of CPU.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _hosts_support import OPTIONS

from peer.files.statefiles import read_status
from protocols.consensus import max_relative_distance
from protocols.node.config import NodeConfig
from protocols.node.schedule import Hold, Reached, Schedule
from sim.from_network import scenario_from_peer_file
from sim.gossip_driver import PROCESS_START_S, GossipRun
from sim.world import build_world

RESUMED = re.compile(r"resumed from checkpoint at step (\d+)")
SIM_DURATION_S = 600.0   # simulated seconds at most; the run ends when every member has finished


def pre_fault_step_s(data: Path, names: Sequence[str]) -> float:
    """The real run's seconds per step so far: each peer's training time over its steps (status.json
    ``train_s``: from its first round, the start-up left out), the median over the peers."""
    found = [read_status(data / name) or {} for name in names]
    return statistics.median(float(s["train_s"]) / int(s["step"]) for s in found if int(s.get("step", 0)) > 0)


@dataclass(frozen=True)
class RealKill:
    """One kill of the real run, as the simulator replays it."""

    victim: str
    reached_step: int     # the step the killed process had reached
    lost_steps: int       # reached - the step its restart resumed from
    recovery_s: float     # restart -> synced (the restarted process's log says so)
    gate: int             # the step the ring held at until the victim was back (-1: none)


def in_kill_order(kinds: Sequence[str], lost: Mapping[str, Sequence[int]]) -> list[int]:
    """The steps lost per kill, in the order made, from lists kept per kind of kill (``kinds``: each
    kill's, in order)."""
    taken = dict.fromkeys(lost, 0)
    ordered = []
    for kind in kinds:
        ordered.append(lost[kind][taken[kind]])
        taken[kind] += 1
    return ordered


def real_kills(logs: Path, victims: Sequence[str], lost: Sequence[int], recovery_s: Sequence[float],
               gates: Sequence[int]) -> list[RealKill]:
    """The real kills in the order made: the step each resumed from is in its victim's log
    (``logs/NAME.log``: the k-th ``resumed from checkpoint`` of a peer is its k-th restart), the
    step reached that plus the steps lost."""
    said = {name: [int(m) for m in RESUMED.findall((logs / f"{name}.log").read_text(errors="replace"))]
            for name in sorted(set(victims))}
    kills, seen = [], dict.fromkeys(said, 0)
    for victim, n_lost, back_s, gate in zip(victims, lost, recovery_s, gates, strict=True):
        resumed = said[victim][seen[victim]]
        seen[victim] += 1
        kills.append(RealKill(victim, resumed + n_lost, n_lost, back_s, gate))
    return kills


@dataclass(frozen=True)
class KillPrediction:
    steps_lost: tuple[int, ...]       # per restart, in the order of the kills
    recovery_s: tuple[float, ...]     # kill -> state sync over, the process start modelled
    finished: dict[str, bool]
    steps: dict[str, int]
    accuracy: dict[str, float]
    consensus_max_relative: float
    summary: str


def predict_kills(config: Path, kills: Sequence[RealKill], *, step_s: float, every_steps: int,
                  options: Mapping[str, Any] = OPTIONS, latency_ms: float = 0.1) -> KillPrediction:
    """Run the network of peer file ``config`` in the simulator, each member at ``step_s`` a step
    with a checkpoint every ``every_steps``, the liveness ``options`` of its ``[peer]`` (as the test
    passes them), and ``kills`` replayed: each a crash at the step its victim reached, up again
    after a process start, and the ring held at each kill's gate until its victim is back there
    (protocols/node/schedule.py holds, as the real test's hold hooks)."""
    churn = [{"node": k.victim, "kind": "crash", "at_step": k.reached_step, "down_s": PROCESS_START_S}
             for k in kills]
    scenario = scenario_from_peer_file(
        config, duration_s=SIM_DURATION_S, eval_every_s=SIM_DURATION_S,
        nodes={"step_time_ms": 1000.0 * step_s,
               **{f.name: options[f.name] for f in dataclasses.fields(NodeConfig) if f.name in options}},
        links={"latency_ms": latency_ms, "bandwidth_mbps": 1000.0},
        checkpoint={"every_steps": every_steps}, faults={"churn": churn},
        verify_fraction=0.1)   # honest members only: a tenth of the messages opened keeps it cheap
    world = build_world(scenario)
    gates = sorted({k.gate for k in kills if k.gate >= 0})
    holds = tuple(Hold(member=name, at_round=gate, until=tuple(
        Reached(victim, gate) for victim in sorted({k.victim for k in kills if k.gate == gate})))
        for gate in gates for name in world.names)
    run = GossipRun(world, faults=Schedule(holds))
    result = run.run()
    details = sorted(((d, name) for name, p in result.peers.items() for d in p["restarts_detail"]),
                     key=lambda pair: pair[0]["crashed_at_s"])
    steps_lost = tuple(int(d["steps_lost"]) for d, _ in details)
    recovery = tuple(float(d["synced_at_s"] - d["crashed_at_s"]) for d, _ in details)
    consensus = max_relative_distance([world.trainers[n].flat_params.double() for n in world.names])
    peers = result.peers
    accuracy = {n: float(peers[n]["final_accuracy"] or 0.0) for n in world.names}
    restarts = "; ".join(f"{name} lost {d['steps_lost']} (reached {d['reached_step']}, resumed "
                         f"{d['resumed_step']}), synced {d['synced_at_s'] - d['crashed_at_s']:.2f} s "
                         "after the kill" for d, name in details)
    stranded = {n: peers[n]["stranded"] for n in world.names if peers[n]["stranded"]}
    summary = (f"simulator at {1000 * step_s:.2f} ms a step, checkpoint every {every_steps}: {restarts}; "
               f"steps {[peers[n]['steps'] for n in world.names]}, accuracy "
               f"{[round(a, 3) for a in accuracy.values()]}, consensus {consensus:.2e}, stranded {stranded}")
    return KillPrediction(steps_lost, recovery, {n: bool(peers[n]["finished"]) for n in world.names},
                          {n: int(peers[n]["steps"]) for n in world.names}, accuracy, consensus, summary)


@dataclass(frozen=True)
class GatewayPrediction:
    rounds_lost: int              # reached - resumed, in the gateway's rounds
    rounds_closed_again: int      # rows of rounds closed twice
    closed: tuple[int, ...]       # the rounds closed, each once
    recovery_s: float             # the real restart -> its first round closed again
    accuracy: float               # the global model's, at the end
    summary: str


def predict_gateway_kill(gateway: Path, edges: Sequence[Path], *, reached: int, down_s: float,
                         pre_fault: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
                         latency_ms: float = 0.1) -> GatewayPrediction:
    """Run the federation of gateway config ``gateway`` and edge configs ``edges`` in the simulator,
    the gateway killed once its machine did ``reached`` rounds (as many as it had closed here) and
    started again ``down_s`` later (as here) plus a modelled process start, its checkpoint interval
    its file's. Calibration: a client's step takes the real pre-fault rounds' median length
    (``pre_fault``: rounds.jsonl rows, ``opened_at_s`` to ``closed_at_s``) over a round's local
    steps (local epochs times the clients' median steps per epoch)."""
    from peer.train.build import build_trainers
    from sim.from_network import scenario_from_federation_files
    from sim.run import run_scenario

    nodes = {f.name: options[f.name] for f in dataclasses.fields(NodeConfig) if f.name in options}
    churn = [{"node": "gw0", "kind": "crash", "at_step": reached, "down_s": down_s + PROCESS_START_S}]
    base = scenario_from_federation_files(gateway, edges, nodes=nodes)
    clients = base.federation.client_names()
    _, trainers = build_trainers(base.network(), base.trainer_config(), members=clients)
    round_steps = base.federation_config().local_epochs * statistics.median(
        t.steps_per_epoch for t in trainers.values())
    round_s = statistics.median(float(r["closed_at_s"]) - float(r["opened_at_s"]) for r in pre_fault)
    step_ms = 1000.0 * round_s / round_steps
    scenario = scenario_from_federation_files(
        gateway, edges, duration_s=SIM_DURATION_S, nodes={**nodes, "step_time_ms": step_ms},
        links={"latency_ms": latency_ms, "bandwidth_mbps": 1000.0}, faults={"churn": churn})
    result = run_scenario(scenario)
    (detail,) = result.peers["gw0"]["restarts_detail"]
    rounds = [int(row["round"]) for row in result.rounds]
    recovery_s = float(detail["first_closed_at_s"] - detail["crashed_at_s"]) - down_s
    accuracy = result.trace[-1].mean_accuracy
    summary = (f"simulator: a client step {step_ms:.2f} ms (pre-fault round {round_s:.2f} s over "
               f"{round_steps} steps); gateway killed at round {detail['reached_round']}, resumed "
               f"{detail['resumed_round']}, first round closed again {recovery_s:.2f} s after its restart; "
               f"rounds {rounds}; accuracy {accuracy:.3f}")
    return GatewayPrediction(int(detail["rounds_lost"]), len(rounds) - len(set(rounds)),
                             tuple(sorted(set(rounds))), recovery_s, accuracy, summary)
