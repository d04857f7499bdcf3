"""The simulator's prediction of a multi-host fault test's own schedule (issue 16, item 5): the
ring's kills (tests/test_hosts_kills.py, :func:`predict_kills`), the gateway's
(tests/test_hosts_federation.py, :func:`predict_gateway_kill`), a pulled cable
(tests/test_hosts_ring.py, :func:`predict_cable_out`), and a join, a removal and a
slow host (tests/test_hosts_membership.py, :func:`predict_membership`). The last two
share one mechanism, :func:`replay`: roster versions learnt (a member that never
learns one runs on with the old), cables pulled (a partition of one member that
holds TCP's connections), holds and joins, all placed on the real run's progress
(the members' work points), and a ``tc tbf`` host's NIC at its rate.

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
from sim.network import PartitionSpec
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


# ---------------------------------------------------------------- replays of a schedule placed on progress
# (tests/test_hosts_ring.py's cable cut, tests/test_hosts_membership.py's join, removal and slow host)

RTO_S = 0.2   # Linux's floor on TCP's retransmission timeout, the one a LAN link gets


@dataclass(frozen=True)
class Version:
    """A roster version the running members learn mid-run (an operator's ``roster reload``): once
    every member of ``learnt_when`` has been at a work point of round ``learnt_at_round``, all the
    running members but ``skip`` (whose operator never copied the file) learn it at once; it takes
    effect at ``effective_round`` (protocols/node/membership.py). A member that is not running yet
    starts with the first version that names it."""

    members: tuple[str, ...]       # in roster order: the graph is built over them
    effective_round: int
    learnt_at_round: int
    learnt_when: tuple[str, ...]
    skip: tuple[str, ...] = ()


@dataclass(frozen=True)
class CableOut:
    """``member``'s cable out for ``outage_s`` from the first instant every other member has been at
    a work point of ``at_round``: a partition of the member from the rest that holds TCP's
    connections (sim/network.py ``retransmit_rto_s``, ``reconnect_after_s``) rather than drops."""

    member: str
    at_round: int
    outage_s: float


@dataclass(frozen=True)
class Replayed:
    """What a replay did, per member: ``(simulated s, trainer step)`` at each work point, the time its
    state sync ended (a joiner's), its rejections by reason, and the end."""

    trace: dict[str, list[tuple[float, int]]]
    synced_at_s: dict[str, float]
    cables: tuple[tuple[str, float, float], ...]      # (member, out at s, back at s)
    learnt_at_s: tuple[float, ...]                    # per version, when it was learnt
    rejections: dict[str, dict[str, int]]
    finished: dict[str, bool]
    steps: dict[str, int]
    accuracy: dict[str, float]
    received_from: dict[str, dict[str, list[float]]]  # recipient -> sender -> accepted ParamPush times

    def consensus(self, trainers: Mapping[str, Any], names: Sequence[str]) -> float:
        return max_relative_distance([trainers[n].flat_params.double() for n in names])

    def steps_per_s(self, name: str, from_s: float) -> float:
        """``name``'s steps per simulated second from ``from_s`` to its last work point."""
        points = [(t, s) for t, s in self.trace[name] if t >= from_s]
        (t0, s0), (t1, s1) = points[0], points[-1]
        return (s1 - s0) / (t1 - t0)

    def moving_again_s(self, name: str, back_s: float, steps: int = 2) -> float:
        """Seconds from ``back_s`` until ``name`` is ``steps`` further than it was then (as the real
        test measures it from status.json)."""
        stood = max((s for t, s in self.trace[name] if t <= back_s), default=0)
        return next(t for t, s in self.trace[name] if s >= stood + steps) - back_s


def reconnect_after_s() -> float:
    """How long after a connection's last traffic ZeroMQ dials afresh (the transport's defaults): the
    kernel's probes (half an interval later, on average, than a whole one), the dead-link time, the
    first reconnect. (tests/test_hosts_partition.py computes the same for its split.)"""
    from peer.net.transport import TransportConfig

    transport = TransportConfig()
    return (transport.keepalive_s / 2 + transport.dead_link_s + transport.reconnect_ms / 1000)


class _ReplayRun(GossipRun):
    """A GossipRun that also learns roster versions and pulls cables on progress, and traces steps."""

    def __init__(self, world: Any, *, first: Sequence[str], versions: Sequence[Version],
                 cables: Sequence[CableOut], schedule: Schedule) -> None:
        from collections import defaultdict

        from topology import build

        self.first = tuple(first)
        self.versions, self.cables = tuple(versions), tuple(cables)
        self._build = build
        self._spec = world.scenario.graph.spec
        self.trace: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.synced_at_s: dict[str, float] = {}
        self.at_round: dict[str, int] = {}
        self.learnt_at_s: list[float] = []
        self.pulled: list[tuple[str, float, float]] = []
        self.received_from: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        super().__init__(world, faults=schedule)

    def _roster(self, index: int) -> Any:
        """Version ``index + 1``: 1 is the first members', then ``versions``."""
        from protocols.roster import Roster

        if index == 0:
            return Roster(tuple(self.roster.member(n) for n in self.first))
        version = self.versions[index - 1]
        return dataclasses.replace(Roster(tuple(self.roster.member(n) for n in version.members)),
                                   version=index + 1, effective_round=version.effective_round)

    def _graph(self, names: Sequence[str]) -> Any:
        return self._build(self._spec, tuple(names))

    def _version_of(self, name: str) -> int:
        """The version a member starts with: 1 for the first members, else the first naming it."""
        if name in self.first:
            return 0
        return next(i for i, v in enumerate(self.versions, start=1) if name in v.members)

    def _machine(self, name: str) -> Any:
        machine = super()._machine(name)
        if self.first != self.world.names:
            machine.set_graph(self._graph(self._roster(self._version_of(name)).names))
        return machine

    def _node(self, peer: Any) -> Any:
        if self.first == self.world.names:
            return super()._node(peer)
        roster = self._roster(self._version_of(peer.name))
        graph = self._graph(roster.names)
        peer.neighbour_names = graph.neighbours(peer.name)
        node = super()._node(peer)
        node.set_membership(roster, graph)
        return node

    def _work_point(self, peer: Any, steps: int) -> None:
        now = self.engine.now_s
        self.trace[peer.name].append((now, self.world.trainers[peer.name].step))
        self.at_round[peer.name] = max(self.at_round.get(peer.name, -1), peer.node.machine.position[0])
        super()._work_point(peer, steps)
        self.engine.at(now, self._replay_check)

    def _replay_check(self) -> None:
        """Versions learnt and cables pulled whose condition the last work point met, in order."""
        now = self.engine.now_s
        while len(self.learnt_at_s) < len(self.versions):
            version = self.versions[len(self.learnt_at_s)]
            if not all(self.at_round.get(n, -1) >= version.learnt_at_round for n in version.learnt_when):
                break
            self.learnt_at_s.append(now)
            self.change_roster(self._roster(len(self.learnt_at_s)), self._graph(version.members),
                               skip=version.skip)
        while len(self.pulled) < len(self.cables):
            cable = self.cables[len(self.pulled)]
            if not all(self.at_round.get(n, -1) >= cable.at_round for n in self.first if n != cable.member):
                break
            self.pulled.append((cable.member, now, now + cable.outage_s))
            self.network.partitions = (*self.network.partitions, PartitionSpec(
                start_s=now, end_s=now + cable.outage_s, groups=((cable.member,),),
                retransmit_rto_s=RTO_S, reconnect_after_s=reconnect_after_s()))

    def _synced(self, peer: Any, *, unanswered: bool) -> None:
        self.synced_at_s.setdefault(peer.name, self.engine.now_s)
        super()._synced(peer, unanswered=unanswered)

    def _arrive(self, sender: str, recipient: str, delivery: Any) -> None:
        peer = self.peers[recipient]
        alive, before = peer.alive, peer.all_rejections().total()
        super()._arrive(sender, recipient, delivery)
        if alive and peer.all_rejections().total() == before:
            self.received_from[recipient][sender].append(self.engine.now_s)


def replay(config: Path, *, step_s: float, options: Mapping[str, Any] = OPTIONS, members: Sequence[str] = (),
           first: Sequence[str] = (), versions: Sequence[Version] = (), cables: Sequence[CableOut] = (),
           holds: Sequence[Hold] = (), joins: Sequence[Any] = (), nic_mbit: Mapping[str, float] | None = None,
           latency_ms: float = 0.1) -> tuple[Replayed, Any]:
    """The one mechanism of these replays: the network of peer file ``config`` (``members``: every
    member the run ever had, in roster order, when it changed; ``first``: those of version 1) in the
    simulator, each step taking ``step_s`` (the real run's pre-fault step time), the liveness
    ``options`` the test passes, each member named in ``nic_mbit`` behind a link of that rate both
    ways (a ``tc tbf`` on its cable: its NIC, shared by its links), the roster ``versions`` learnt,
    the ``cables`` pulled, and the schedule's ``holds`` and ``joins`` (protocols/node/schedule.py),
    all on progress. Returns what it did and the world (its trainers hold the final parameters)."""
    nodes: dict[str, Any] = {"step_time_ms": 1000.0 * step_s,
                             **{f.name: options[f.name] for f in dataclasses.fields(NodeConfig)
                                if f.name in options}}
    if nic_mbit:
        nodes["nic"] = {name: {"uplink_mbps": rate, "downlink_mbps": rate} for name, rate in nic_mbit.items()}
    overrides: dict[str, Any] = {}
    if members:
        overrides["graph"] = {"members": list(members)}
    scenario = scenario_from_peer_file(
        config, duration_s=SIM_DURATION_S, eval_every_s=SIM_DURATION_S, nodes=nodes,
        links={"latency_ms": latency_ms, "bandwidth_mbps": 1000.0}, verify_fraction=1.0, **overrides)
    world = build_world(scenario)
    run = _ReplayRun(world, first=first or world.names, versions=versions, cables=cables,
                     schedule=Schedule((*holds, *joins)))
    result = run.run()
    peers = result.peers
    names = world.names
    return Replayed(
        trace={n: list(run.trace[n]) for n in names}, synced_at_s=dict(run.synced_at_s),
        cables=tuple(run.pulled), learnt_at_s=tuple(run.learnt_at_s),
        rejections={n: dict(run.peers[n].all_rejections()) for n in names},
        finished={n: bool(peers[n]["finished"]) for n in names},
        steps={n: int(peers[n]["steps"]) for n in names},
        accuracy={n: float(peers[n]["final_accuracy"] or 0.0) for n in names},
        received_from={r: {s: list(ts) for s, ts in by.items()} for r, by in run.received_from.items()},
    ), world


@dataclass(frozen=True)
class CablePrediction:
    during_steps: int        # steps the cut member made while its cable was out, past the first SETTLE_S
    moving_again_s: float    # cable back -> the cut member 2 steps on
    finished: dict[str, bool]
    accuracy: dict[str, float]
    consensus_max_relative: float
    summary: str


def predict_cable_out(config: Path, *, member: str, at_step: int, outage_s: float, settle_s: float,
                      step_s: float, options: Mapping[str, Any] = OPTIONS) -> CablePrediction:
    """tests/test_hosts_ring.py's fault in the simulator: ``member``'s cable out for ``outage_s`` once
    every other member is at step ``at_step`` (D-PSGD: a round a step), each step ``step_s``. The
    link model holds what crosses the cut in TCP's connections: a connection carries again at its
    sender's next retransmission after the cable is back (the timeout from ``RTO_S``, doubling), or
    when ZeroMQ dialled afresh, whichever is first (sim/network.py)."""
    done, world = replay(config, step_s=step_s, options=options,
                         cables=[CableOut(member=member, at_round=at_step, outage_s=outage_s)])
    ((_, out_s, back_s),) = done.cables
    trace = done.trace[member]
    settled = max((s for t, s in trace if t <= out_s + settle_s), default=0)
    during = max((s for t, s in trace if t <= back_s), default=0) - settled
    moving = done.moving_again_s(member, back_s)
    consensus = done.consensus(world.trainers, world.names)
    summary = (f"simulator at {1000 * step_s:.2f} ms a step: {member}'s cable out "
               f"{out_s:.2f}-{back_s:.2f} s, {during} steps meanwhile, 2 steps on {moving:.2f} s after it "
               f"was back; steps {done.steps}, "
               f"accuracy {[round(a, 3) for a in done.accuracy.values()]}, consensus {consensus:.2e}")
    return CablePrediction(during, moving, done.finished, done.accuracy, consensus, summary)


@dataclass(frozen=True)
class MembershipPrediction:
    joiner_sync_s: float          # the join's condition met -> its state sync over (process start modelled)
    joiner_steps: int
    refused: dict[str, int]       # the leaver's old neighbours: its messages refused, by them
    accepted_after: dict[str, int]  # ... and accepted from it after the removal's round (must be 0)
    slow_steps_per_s: float       # the slow member's, after the removal
    others_steps_per_s: tuple[float, ...]
    finished: dict[str, bool]
    accuracy: dict[str, float]
    consensus_max_relative: float
    summary: str


def predict_membership(config: Path, *, members: Sequence[str], joiner: str, leaver: str, slow: str,
                       rate_mbit: float, local_steps: int, hold_join: int, join_round: int, hold_sync: int,
                       hold_leave: int, leave_round: int, step_s: float,
                       options: Mapping[str, Any] = OPTIONS) -> MembershipPrediction:
    """tests/test_hosts_membership.py's schedule in the simulator (steps as the test gives them,
    rounds of ``local_steps``): version 2 adds ``joiner`` from ``join_round``, learnt by every
    running member at step ``hold_join``; the ring held at ``hold_sync`` until the joiner, started
    then, has synced and is there too; version 3 removes ``leaver`` from ``leave_round``, learnt at
    ``hold_leave`` by all but the leaver, which runs on with version 2. ``slow`` is behind a link of
    ``rate_mbit`` both ways. Each step ``step_s`` (the real run's pre-fault step time: its rounds,
    paced by the slow link as they were, so the link's time is not counted twice: a member's
    messages cross while it trains)."""
    from protocols.node.schedule import Join
    from topology import build

    first = tuple(n for n in members if n != joiner)
    staying = tuple(n for n in members if n != leaver)
    sync_round = hold_sync // local_steps
    versions = [Version(members=tuple(members), effective_round=join_round,
                        learnt_at_round=hold_join // local_steps, learnt_when=first),
                Version(members=staying, effective_round=leave_round,
                        learnt_at_round=hold_leave // local_steps, learnt_when=tuple(members),
                        skip=(leaver,))]
    holds = [Hold(member=n, at_round=sync_round, until=(Reached(joiner, sync_round),)) for n in first]
    joins = [Join(member=joiner, when=tuple(Reached(n, sync_round) for n in first))]
    done, world = replay(config, step_s=step_s, options=options, members=members, first=first,
                         versions=versions, holds=holds, joins=joins, nic_mbit={slow: rate_mbit})
    held_s = max(next(t for t, s in done.trace[n] if s >= hold_sync) for n in first)  # the join's condition
    sync_s = done.synced_at_s[joiner] - held_s
    removed_s = done.learnt_at_s[1]
    # a round of the leaver's arrives after the round began for its neighbours: from the round's start on
    leave_s = max(next(t for t, s in done.trace[n] if s >= leave_round * local_steps) for n in staying)
    old = sorted(build(world.scenario.graph.spec, tuple(members)).neighbours(leaver))  # version 2's
    refused = {n: sum(done.rejections[n].get(r, 0) for r in ("roster_version_mismatch", "unknown_sender",
                                                               "not_neighbour")) for n in old}
    accepted_after = {n: sum(1 for t in done.received_from.get(n, {}).get(leaver, []) if t > leave_s + 1.0)
                      for n in old}
    after_s = removed_s
    slow_rate = done.steps_per_s(slow, after_s)
    others = tuple(done.steps_per_s(n, after_s) for n in staying if n != slow)
    consensus = done.consensus(world.trainers, staying)
    summary = (f"simulator at {1000 * step_s:.2f} ms a step, {slow} at {rate_mbit} Mbit/s: version 2 "
               f"learnt at {done.learnt_at_s[0]:.2f} s, {joiner} synced {sync_s:.2f} s after the ring was "
               f"held for it (at {held_s:.2f} s), steps {done.steps}; version 3 learnt at {removed_s:.2f} s, "
               f"{leaver}'s messages refused {refused}, accepted after the round {accepted_after}; "
               f"{slow} {slow_rate:.2f} steps/s vs {[round(r, 2) for r in others]}; accuracy "
               f"{ {n: round(a, 3) for n, a in done.accuracy.items()} }, consensus {consensus:.2e}")
    return MembershipPrediction(sync_s, done.steps[joiner], refused, accepted_after, slow_rate, others,
                                done.finished, done.accuracy, consensus, summary)
