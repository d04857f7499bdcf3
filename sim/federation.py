"""The simulator's driver of a federation: gateways and edge clients, each on the per-member Node.

A scenario with ``[federation] gateways > 0`` runs here instead of gossip (sim/run.py).
The roles are the daemon's: a gateway is a :class:`Node` whose machine gossips over
the gateways' graph with the FedAvg (or FedBuff) server as its ``fedavg`` role, both
on one flat vector; an edge client is a Node whose machine is its
:class:`FedAvgClient`, its gateway its one neighbour (registration by heartbeats).

On the engine's virtual clock it models: messages over the link model
(sim/network.py), sized as their tensor bytes plus :data:`HEADER_BYTES`; local work
as real SGD steps whose ``WorkDone`` comes ``sim.node.work_seconds`` later;
availability (sim/availability.py: an off client's messages are dropped,
``client_offline``); attackers (peer/train/attack.py); gateways' gossip rounds
interleaved with FedAvg rounds as in the daemon; a gateway's crash as a ``kill -9``
restarted from its last checkpoint (``restarts_detail``); roster versions through
:meth:`FederationRun.change_roster`, each gateway serving the edge members the
``Serving`` table gives it from the version's round on.

The run ends when every gateway is done and its final models have reached their
clients. The result: a trace point per closed FedAvg round, and ``rounds`` (per
gateway and round: asked, answered, late, refused; ``epsilon`` and ``clip_norm``
with DP; ``secagg_phases`` with SecAgg, whose bytes are in ``metrics``). What
each of these models, in full: docs/design/simulator.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from peer.files.config import ConfigError
from peer.files.statefiles import json_safe
from peer.train.attack import Attack, forge, parse_attack, sign_flip
from peer.train.build import build_trainers
from peer.train.federated import train_round
from peer.train.trainer import Trainer
from protocols.events import (
    CancelTimer,
    Event,
    Finished,
    ProtocolState,
    Send,
    SetTimer,
    StartWork,
    TimerFired,
    WorkDone,
)
from protocols.federation import (
    SERVER_ROLE,
    FedAvgClient,
    FedAvgServer,
    FedBuffServer,
    FederationConfig,
    SecureClient,
    SecureServer,
    make_server,
)
from protocols.federation.edge_machine import EdgeMachine
from protocols.federation.interleave import GatewayWork, GossipedRounds, gossip_total_rounds
from protocols.federation.secure import unwrap
from protocols.gossip import make_machine
from protocols.messages import Message, RoundResult, SecAggMessage
from protocols.node import Neighbour, Node
from protocols.node.checkpoints import CheckpointSchedule
from protocols.node.host import TimerTable
from protocols.node.membership import Serving
from protocols.node.node import NodeAction
from protocols.rng import derive_seed
from protocols.roster import Member as RosterMember
from protocols.roster import Roster
from protocols.secagg.local import SeededKeyring
from sim.availability import Availability
from sim.engine import Engine
from sim.network import Network, NicSpec
from sim.node import sim_identity, work_seconds
from sim.scenario import ChurnEvent, ScenarioConfig
from sim.world import Progress, ScenarioResult, TracePoint
from topology import build

HEADER_BYTES = 256  # a frame's header, names and signature, beside its tensors


def message_bytes(message: Message) -> int:
    """What ``message`` weighs on a link (the model of this driver)."""
    tensors = getattr(message, "tensors", {}) or {}
    return HEADER_BYTES + sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class GatewayRestart:
    """One crash and restart of a gateway: its rounds counted as its checkpoints count them."""

    crashed_at_s: float
    reached_round: int                  # the rounds its machine had done when it crashed
    restarted_at_s: float = math.nan
    resumed_round: int = -1             # its checkpoint's
    first_closed_at_s: float = math.nan  # its first FedAvg round closed after the restart

    def as_dict(self) -> dict[str, float | int]:
        return {"crashed_at_s": self.crashed_at_s, "reached_round": self.reached_round,
                "restarted_at_s": self.restarted_at_s, "resumed_round": self.resumed_round,
                "rounds_lost": self.reached_round - self.resumed_round if self.resumed_round >= 0 else -1,
                "first_closed_at_s": self.first_closed_at_s,
                "recovery_s": self.first_closed_at_s - self.restarted_at_s}


@dataclass
class Member:
    """A gateway or an edge client: its Node, and what the driver tracks about it."""

    name: str
    node: Node[Neighbour]
    gateway: str = ""                        # a client's gateway ("" for a gateway)
    client: FedAvgClient | None = None
    server: FedAvgServer | FedBuffServer | None = None
    trainer: Trainer | None = None
    availability: Availability = field(default_factory=lambda: Availability("always"))
    attack: Attack = field(default_factory=Attack)  # honest unless the scenario's attack names it
    on: bool = True
    incarnation: int = 0                     # bumped when it goes off: stale callbacks see it
    work_index: int = 0
    timers: TimerTable = field(default_factory=TimerTable)
    work: GatewayWork | None = None          # a gateway: what its machine's work is (interleave.py)
    finished: bool = False
    bytes_sent: int = 0
    recorded: int = 0                        # a gateway: its server's reports seen
    gossiped: GossipedRounds | None = None   # a gateway: its closed rounds waiting for their gossip
    saves: CheckpointSchedule | None = None  # a gateway a crash brings back: when a checkpoint is due
    checkpoint: tuple[ProtocolState, ProtocolState, int] | None = None  # machine, server, its rounds
    restarts: list[GatewayRestart] = field(default_factory=list)


class FederationRun:
    """One federation scenario, start to end."""

    def __init__(self, scenario: ScenarioConfig, progress: Progress | None = None, *,
                 joining: Collection[str] = ()) -> None:
        """``joining``: clients not on the roster at the start (a later version adds them:
        :meth:`roster_adding`, :meth:`change_roster`); they run from the start, as a device an operator
        turned on early does."""
        self.scenario = scenario
        self.section = scenario.federation
        self.config: FederationConfig = scenario.federation_config()
        self.progress = progress
        self.engine = Engine()
        self.gateways = self.section.gateway_names()
        self.clients = self.section.client_names()
        check_federation(scenario)
        self.joining = tuple(name for name in self.clients if name in set(joining))
        if len(self.joining) != len(set(joining)):
            unknown = sorted(set(joining) - set(self.clients))
            raise ConfigError(f"joining clients {unknown} are not clients of {scenario.source}")
        self.roster = self._roster()
        node_config = scenario.nodes.node_config()
        self.node_config = node_config
        _, trainers = build_trainers(scenario.network(), scenario.trainer_config(), members=self.clients)
        self.trainers = trainers
        # a second trainer of the first client: the same initial model, to evaluate the global ones
        _, spare = build_trainers(scenario.network(), scenario.trainer_config(), members=self.clients,
                                  wanted=self.clients[:1])
        self.evaluator = spare[self.clients[0]]
        self.initial = self.evaluator.flat_params.detach().clone()  # every gateway starts from it
        self.topologies: dict[str, Any] = {}   # each gateway's gossip graph (a roster change keeps it)
        nodes = scenario.nodes
        nics = {name: NicSpec(**{key: float(nodes.nic.get(name, {}).get(key, getattr(nodes, key)))
                                 for key in ("uplink_mbps", "downlink_mbps")})
                for name in (*self.gateways, *self.clients)}
        self.network = Network({}, default=scenario.links, seed=scenario.seed, nics=nics)
        # secure aggregation: the clients' roster identities (the daemon's are the roster's keys)
        self.secagg_roster = SeededKeyring(list(self.clients), scenario.seed) \
            if self.config.secure_aggregation is not None else None
        self.kind_bytes: Counter[str] = Counter()  # message kind -> bytes sent
        self.members: dict[str, Member] = {}
        for name in self.gateways:
            self.members[name] = self._gateway(name)
        for index, name in enumerate(self.clients):
            self.members[name] = self._client(name, self.section.gateway_of(index))
        self.dropped: Counter[str] = Counter()
        self.results_in_flight = 0   # final models (RoundResult) sent and not yet arrived: the run waits
        self.bytes_sent = 0
        self.traffic: dict[tuple[str, str], list[int]] = {}  # (src, dst) -> [messages, bytes]
        self.result = ScenarioResult(
            name=scenario.name, source=scenario.source, kind=f"federation:{self.config.mode}",
            seed=scenario.seed,
            n_members=len(self.members), n_params=int(self.initial.numel()),
            target_accuracy=scenario.target_accuracy, scenario=json_safe(dataclasses.asdict(scenario)))
        self.accuracy: dict[str, float] = {}   # each gateway's latest global accuracy
        self.loss: dict[str, float] = {}
        self.crashes = gateway_crashes(scenario)
        for name in sorted({e.node for e in self.crashes}):
            self.members[name].saves = CheckpointSchedule(scenario.checkpoint)

    # ------------------------------------------------------------ building

    def _gossip_members(self, name: str) -> tuple[str, ...]:
        """The gateways ``name`` gossips with (itself included)."""
        gossip = self.config.has_rounds and self.section.gossip_rounds > 0 and len(self.gateways) > 1
        return self.gateways if gossip else (name,)

    def _roster(self) -> Roster:
        """Version 1: the gateways (nominal addresses: nothing is dialled here) and the clients not
        joining later; keys from the scenario's seed."""
        gateways = tuple(RosterMember(name=name, public_id=sim_identity(self.scenario.seed, name).public_id,
                                      role="gateway", address=f"tcp://127.0.0.1:{20000 + i}")
                         for i, name in enumerate(self.gateways))
        return Roster((*gateways, *(self._edge_entry(name) for name in self.clients
                                           if name not in self.joining)))

    def _edge_entry(self, name: str) -> RosterMember:
        """A client's roster entry; a joiner's names its gateway (``hivemesh roster add --gateway``), the
        others are listed by their gateway's config (``hivemesh init``'s blocks)."""
        gateway = self.section.gateway_of(self.clients.index(name)) if name in self.joining else ""
        public_id = sim_identity(self.scenario.seed, name).public_id
        return RosterMember(name=name, public_id=public_id, role="edge", gateway=gateway)

    def roster_adding(self, names: Collection[str], *, effective_round: int) -> Roster:
        """The next version of the roster: ``names`` (joining clients) added, from ``effective_round``."""
        current = self.roster
        added = tuple(self._edge_entry(name) for name in self.clients if name in set(names))
        return dataclasses.replace(current, members=(*current.members, *added), version=current.version + 1,
                                   effective_round=effective_round)

    def change_roster(self, roster: Roster) -> None:
        """Every gateway learns roster version ``roster`` now (as a daemon that re-reads its roster
        file) and applies it from its ``effective_round``; the clients carry on."""
        self.roster = roster
        now = self.engine.now_s
        for name in self.gateways:
            member = self.members[name]
            self._carry_out(member, member.node.change_membership(roster, self.topologies[name], now,
                                                                  make_neighbour=Neighbour))

    def _gateway_parts(self, name: str,
                       params: torch.Tensor) -> tuple[Any, FedAvgServer | FedBuffServer, Any]:
        """A gateway's gossip machine and server, both on ``params``, as a gateway process makes them,
        and its gossip graph."""
        members = self._gossip_members(name)
        topology = build(f"complete:{len(members)}", members, seed=self.scenario.seed)
        total = gossip_total_rounds(self.config.rounds, self.section.gossip_rounds, mode=self.config.mode)
        machine = make_machine(self.scenario.gateway_gossip_config(total), name=name, topology=topology,
                               params=params)
        # the DP draws' root: the gateway's own in the daemon (from the OS), here the scenario's
        secret = derive_seed(self.scenario.seed, name, 0, "dp-secret")
        secure = None
        if self.config.secure_aggregation is not None and self.secagg_roster is not None:
            secure = SecureServer(self.config.secure_aggregation, run_id=self._run_id(),
                                  verify=self.secagg_roster.verify, like=params)
        server = make_server(self.config, name=name, params=params,
                             pause_between_rounds=self.config.has_rounds, secret_seed=secret, secure=secure)
        return machine, server, topology

    def _gateway(self, name: str) -> Member:
        params = self.initial.clone()
        machine, server, topology = self._gateway_parts(name, params)
        self.topologies[name] = topology
        # its config's list (hivemesh init's block of clients; one gateway alone lists none); a joiner
        # is served by its roster entry from its version's round (protocols/node/membership.py)
        block = tuple(c for i, c in enumerate(self.clients)
                      if self.section.gateway_of(i) == name and c not in self.joining)
        serving = Serving(name, block if len(self.gateways) > 1 else ())
        node: Node[Neighbour] = Node(
            name, machine, neighbours={n: Neighbour() for n in self._gossip_members(name) if n != name},
            config=self.node_config, early_per_neighbour=4, answer_source=lambda: (params.clone(), 0),
            roles={SERVER_ROLE: server}, clients=serving.clients(self.roster), serving=serving)
        node.set_membership(self.roster, self.topologies[name])
        return Member(name, node, server=server,
                      work=GatewayWork(server, gossip_rounds=self.section.gossip_rounds),
                      gossiped=self._gossiped())

    def _client(self, name: str, gateway: str) -> Member:
        trainer = self.trainers[name]
        client = FedAvgClient(self.config, name=name, server=gateway, params=trainer.flat_params,
                              num_samples=len(trainer.shard), steps_per_epoch=trainer.steps_per_epoch,
                              secure=self._secure_client(name, gateway))
        node: Node[Neighbour] = Node(name, EdgeMachine(client), neighbours={gateway: Neighbour()},
                                     config=self.node_config, early_per_neighbour=2,
                                     answer_source=lambda: (trainer.flat_params.clone(), 0))
        spec = self.section.client_availability.get(name, self.section.availability)
        attack = self.section.attack.get(name)
        if attack and client.secure is not None:  # a SecAgg insider's rounds (peer/train/attack.py)
            client.secure.insider = dict(parse_attack(attack).secagg)
        return Member(name, node, gateway=gateway, client=client, trainer=trainer,
                      availability=Availability.parse(spec),
                      attack=parse_attack(attack) if attack else Attack())

    def _run_id(self) -> str:
        return f"{self.scenario.name}:{self.scenario.seed}"

    def _secure_client(self, name: str, gateway: str) -> SecureClient | None:
        """A client's side of secure aggregation (None: off); its secret from the scenario's seed
        (the daemon's comes from the OS)."""
        secure, roster = self.config.secure_aggregation, self.secagg_roster
        if secure is None or roster is None:
            return None
        secret = hashlib.sha256(f"secagg-secret\x00{self.scenario.seed}\x00{name}".encode()).digest()
        return SecureClient(secure, name=name, server=gateway, run_id=self._run_id(), client_secret=secret,
                            sign=roster.signer(name), verify=roster.verify)

    # ------------------------------------------------------------ the run

    def run(self) -> ScenarioResult:
        started = time.perf_counter()
        seed = self.scenario.seed
        for name in self.clients:
            member = self.members[name]
            member.on = member.availability.on(seed, name, 0.0)
            if member.on:
                self.engine.at(0.0, functools.partial(self._start, member))
            self._schedule_availability(member, 0.0)
        for name in self.gateways:
            # the gateways start once their clients had a heartbeat's time to be heard
            start = functools.partial(self._start, self.members[name])
            self.engine.at(self.node_config.heartbeat_interval_s, start)
        for event in self.crashes:
            if event.at_step < 0:
                self.engine.at(event.at_s, functools.partial(self._crash, self.members[event.node], event))
        self.engine.run(until_s=self.scenario.duration_s)
        self.result.simulated_time_s = self.engine.now_s
        self.result.events_run = self.engine.events_run
        self.result.wall_s = time.perf_counter() - started
        self._finish()
        return self.result

    def _start(self, member: Member) -> None:
        if member.finished:
            return
        if member.saves is not None and member.checkpoint is None:
            self._save(member)  # none written yet: a crash restarts it from its start
        self._carry_out(member, member.node.start(self.engine.now_s))
        self._tick(member, member.incarnation)

    def _tick(self, member: Member, incarnation: int) -> None:
        if incarnation != member.incarnation or not member.on or self._over():
            return
        now = self.engine.now_s
        self._carry_out(member, member.node.tick(now, step=member.work_index, loss=0.0))
        _, actions = member.node.expire(now)
        self._carry_out(member, actions)
        self.engine.after(self.node_config.heartbeat_interval_s, lambda: self._tick(member, incarnation))

    def _over(self) -> bool:
        return all(self.members[g].finished for g in self.gateways)

    # ------------------------------------------------------------ availability

    def _schedule_availability(self, member: Member, now: float) -> None:
        at = member.availability.next_change_s(now)
        if at <= self.scenario.duration_s:
            self.engine.at(at, lambda: self._availability(member))

    def _availability(self, member: Member) -> None:
        now = self.engine.now_s
        on = member.availability.on(self.scenario.seed, member.name, now)
        if on != member.on and not self._over():
            member.on = on
            member.incarnation += 1
            member.timers.clear()
            if on:
                self._restart(member)
                self._start(member)
            else:
                member.node.stop()
        self._schedule_availability(member, now)

    def _restart(self, member: Member) -> None:
        """Back on: a new FedAvg client restored from the old one's state (its checkpoint), on the
        same Node (its counters and refusals carry over)."""
        old, trainer = member.client, member.trainer
        assert old is not None and trainer is not None
        client = FedAvgClient(self.config, name=member.name, server=member.gateway,
                              params=trainer.flat_params,
                              num_samples=old.num_samples, steps_per_epoch=old.steps_per_epoch,
                              secure=self._secure_client(member.name, member.gateway))
        client.restore_state(old.export_state())
        member.client = client
        member.node.restart(EdgeMachine(client), {member.gateway: Neighbour()})

    # ------------------------------------------------------------ a gateway's checkpoints and crashes

    def _rounds_done(self, member: Member) -> int:
        """What its checkpoints count (the daemon's count: ``GatewayWork.rounds_done``)."""
        assert member.work is not None
        return member.work.rounds_done(member.node.machine.position[1])

    def _save(self, member: Member) -> None:
        """Its checkpoint: the machine's and the server's state at one moment, as the daemon writes it."""
        server = member.server
        assert server is not None
        rounds = self._rounds_done(member)
        member.checkpoint = copy.deepcopy((member.node.machine.export_state(), server.export_state(), rounds))
        assert member.saves is not None
        member.saves.saved(rounds, self.engine.now_s)

    def _gateway_work_point(self, member: Member) -> bool:
        """A gateway's work point (its next gossip round asked for, the FedAvg round not yet opened):
        a checkpoint when due; True when a crash placed on its rounds fires here."""
        rounds = self._rounds_done(member)
        if member.saves is not None and member.saves.should_save(rounds, self.engine.now_s):
            self._save(member)
        crash = next((e for e in self.crashes if e.node == member.name and 0 <= e.at_step <= rounds
                      and e.at_s <= self.engine.now_s), None)
        if crash is None:
            return False
        self._crash(member, crash)
        return True

    def _crash(self, member: Member, event: ChurnEvent) -> None:
        """A ``kill -9``: its state since its checkpoint is lost; back ``down_s`` later, if given."""
        self.crashes.remove(event)
        if not member.on or member.finished:
            return
        member.restarts.append(GatewayRestart(self.engine.now_s, self._rounds_done(member)))
        member.on = False
        member.incarnation += 1
        member.timers.clear()
        member.node.stop()
        if event.down_s >= 0:
            self.engine.after(event.down_s, functools.partial(self._restart_gateway, member))

    def _restart_gateway(self, member: Member) -> None:
        """A new gateway process on its checkpoint (peer/runtime/daemon.py's restore): its server
        forgets who was registered (its clients register again as they are heard) and opens the
        round it was at again, which the work its restored machine asks for again waits for
        (``GatewayWork.restarted``)."""
        assert member.checkpoint is not None and member.server is not None
        machine_state, server_state, rounds = copy.deepcopy(member.checkpoint)
        params = member.server.params     # the one vector the machine and the server share
        machine, server, _ = self._gateway_parts(member.name, params)
        server.restore_state(server_state)
        server.forget_registrations()   # its clients register again as they are heard
        machine.restore_state(machine_state)
        work = GatewayWork(server, gossip_rounds=self.section.gossip_rounds)
        work.restarted()
        member.node.restart(machine, {n: Neighbour() for n in self._gossip_members(member.name)
                                      if n != member.name}, roles={SERVER_ROLE: server})
        member.server, member.work, member.recorded, member.on = server, work, 0, True
        member.gossiped = self._gossiped()    # what waited for its gossip died with the process
        assert member.saves is not None
        member.saves = CheckpointSchedule(self.scenario.checkpoint, start_step=rounds)
        member.saves.saved(rounds, self.engine.now_s)
        restart = member.restarts[-1]
        restart.restarted_at_s, restart.resumed_round = self.engine.now_s, rounds
        self._start(member)

    # ------------------------------------------------------------ actions

    def _carry_out(self, member: Member, actions: list[NodeAction]) -> None:
        for action in actions:
            self._act(member, action)
        if member.server is not None:
            self._gateway_progress(member)

    def _act(self, member: Member, action: NodeAction) -> None:
        now = self.engine.now_s
        match action:
            case Send(recipients=recipients, message=message):
                message = forge(message, member.attack)
                nbytes = message_bytes(message)
                for recipient in recipients:
                    self._send(member.name, recipient, message, nbytes, now)
                member.bytes_sent += nbytes * len(recipients)
                self.kind_bytes[message.KIND] += nbytes * len(recipients)
                if isinstance(message, SecAggMessage):  # by SecAgg round: what each of the five costs
                    self.kind_bytes[f"secagg/{type(unwrap(message)).__name__}"] += nbytes * len(recipients)
            case StartWork(steps=steps):
                self._work(member, steps)
            case SetTimer(key=key, at=at):
                token = member.timers.set(key, at)
                incarnation = member.incarnation
                self.engine.at(max(at, now), lambda: self._timer(member, incarnation, key, token))
            case CancelTimer(key=key):
                member.timers.cancel(key)
            case Finished() if member.server is None:
                member.finished = True  # a client got the final model (a gateway: _gateway_progress)
            case _:
                pass  # Metric, Note, Connect, a gateway machine's Finished: nothing to carry out

    def _send(self, sender: str, recipient: str, message: Message, nbytes: int, now: float) -> None:
        transfer = self.network.transmit(sender, recipient, nbytes, now)
        self.bytes_sent += nbytes
        counts = self.traffic.setdefault((sender, recipient), [0, 0])
        counts[0] += 1
        counts[1] += nbytes
        if transfer.arrival_s is None:
            self.dropped[transfer.dropped or "lost"] += 1
            return
        self.results_in_flight += isinstance(message, RoundResult)
        target = self.members[recipient]
        incarnation = target.incarnation
        self.engine.at(transfer.arrival_s, lambda: self._arrive(sender, target, incarnation, message))

    def _arrive(self, sender: str, target: Member, incarnation: int, message: Message) -> None:
        self.results_in_flight -= isinstance(message, RoundResult)
        if not target.on or incarnation != target.incarnation:
            self.dropped["gateway_down" if target.server is not None else "client_offline"] += 1
        else:
            self._carry_out(target, target.node.receive(sender, message, self.engine.now_s))
        self._maybe_end()

    def _timer(self, member: Member, incarnation: int, key: str, token: int) -> None:
        if incarnation == member.incarnation and member.timers.take(key, token):
            self._feed(member, TimerFired(key))

    def _feed(self, member: Member, event: Event) -> None:
        self._carry_out(member, member.node.handle(event, self.engine.now_s))

    # ------------------------------------------------------------ work

    def _work(self, member: Member, steps: int) -> None:
        if member.work is not None:  # a gateway's gossip round: its work is a FedAvg round, or nothing
            if self._gateway_work_point(member):
                return
            begun, done = member.work.begin(self.engine.now_s, member.node.machine.position[0])
            if begun:
                self._carry_out(member, member.node.role_actions("fedavg", begun))
            if done:
                self.engine.after(0.0, lambda: self._feed(member, WorkDone(steps=steps, loss=0.0)))
            return
        assert member.trainer is not None and member.client is not None
        loss = train_round(member.trainer, member.client, steps)
        if member.attack.flip_scale > 0 and member.client.anchor is not None:
            sign_flip(member.trainer.flat_params, member.client.anchor, member.attack.flip_scale)
        speed = self.scenario.nodes.speed.get(member.name, 1.0)
        took = work_seconds(self.scenario, speed, member.name, member.work_index, steps)
        member.work_index += 1
        incarnation = member.incarnation
        self.engine.after(took, lambda: self._done(member, incarnation, steps, loss))

    def _done(self, member: Member, incarnation: int, steps: int, loss: float) -> None:
        if incarnation != member.incarnation:
            self.dropped["work_lost_offline"] += 1
            return
        self._feed(member, WorkDone(steps=steps, loss=loss))

    def _gateway_progress(self, member: Member) -> None:
        """After a gateway acted: record the rounds its server closed; a closed FedAvg round is its
        gossip machine's work done."""
        server = member.server
        assert server is not None
        self._record(member)
        if member.work is not None and member.work.closed():
            self.engine.after(0.0, lambda: self._feed(member, WorkDone(steps=1, loss=0.0)))
        gossip_done = member.node.finished or not self.config.has_rounds  # its last gossip rounds too
        if server.phase.value == "finished" and gossip_done and not member.finished:
            member.finished = True
            self._maybe_end()

    def _maybe_end(self) -> None:
        """Every gateway is done and its final model has reached its clients (as a real edge client
        waits for it): the run ends here, not at ``duration_s``."""
        if self._over() and self.results_in_flight == 0:
            self.engine.stop()

    # ------------------------------------------------------------ results

    def _gossiped(self) -> GossipedRounds:
        return GossipedRounds(gossip_rounds=self.section.gossip_rounds, mode=self.config.mode)

    def _record(self, member: Member, *, flush: bool = False) -> None:
        """A gateway's closed rounds, each recorded (its global model evaluated) once the gossip after
        it is over, as the daemon's rounds.jsonl (protocols/federation/interleave.py's GossipedRounds);
        ``flush``: the run is over, what waits is recorded as it stands."""
        server, gossiped = member.server, member.gossiped
        assert server is not None and gossiped is not None
        gossip_round = member.node.machine.position[0]
        if len(server.reports) > member.recorded:
            if member.restarts and math.isnan(member.restarts[-1].first_closed_at_s) and member.on:
                member.restarts[-1].first_closed_at_s = self.engine.now_s
            for index in sorted(server.reports)[member.recorded:]:  # reports are only ever added
                member.recorded += 1
                gossiped.closed(index, gossip_round, last=server.finished and index == max(server.reports))
        for index in gossiped.ready(gossip_round, flush=flush or member.node.finished):
            self.evaluator.flat_params.copy_(server.params)
            metrics = self.evaluator.evaluate("test")
            self.accuracy[member.name] = float(metrics["accuracy"])
            self.loss[member.name] = float(metrics["loss"])
            row = _round_row(member.name, index, server.reports[index], self.engine.now_s, self.bytes_sent,
                             self.accuracy[member.name])
            self.result.rounds.append(row)
            self._trace()

    def _trace(self) -> None:
        accuracies = list(self.accuracy.values())
        point = TracePoint(time_s=self.engine.now_s, bytes_sent=self.bytes_sent,
                           mean_loss=math.fsum(self.loss.values()) / len(self.loss),
                           mean_accuracy=math.fsum(accuracies) / len(accuracies),
                           min_accuracy=min(accuracies),
                           consensus_rms=_spread([self.members[g].node.machine.params
                                                  for g in self.gateways]),
                           running=sum(1 for c in self.clients if self.members[c].on))
        if self.result.trace and self.result.trace[-1].time_s == point.time_s:
            self.result.trace[-1] = point
        else:
            self.result.trace.append(point)
        if self.progress is not None:
            self.progress(self.engine.now_s, self.scenario.duration_s, point)

    def _finish(self) -> None:
        result = self.result
        for name in self.gateways:      # a run cut by its duration: as a daemon's stop writes them
            if self.members[name].on:
                self._record(self.members[name], flush=True)
        if len(self.gateways) > 1:  # the models after the last gossip rounds: a last trace point
            for name in self.gateways:
                self.evaluator.flat_params.copy_(self.members[name].node.machine.params)
                metrics = self.evaluator.evaluate("test")
                self.accuracy[name], self.loss[name] = float(metrics["accuracy"]), float(metrics["loss"])
            self._trace()
        for name, member in sorted(self.members.items()):
            counters: dict[str, float] = {}
            if member.server is not None:
                counters = {f"fedavg.{k}": float(v) for k, v in sorted(member.server.counters.items())}
                counters["accuracy"] = self.accuracy.get(name, math.nan)
            elif member.client is not None:
                counters = {f"client.{k}": float(v) for k, v in sorted(member.client.counters.items())}
            result.peers[name] = {"role": "gateway" if member.server is not None else "client",
                                  "bytes_sent": member.bytes_sent, **counters}
            if member.trainer is not None:      # a client: what its trainer would warn (sim/comparison.py)
                result.peers[name]["warnings"] = member.trainer.warnings()
            if member.server is not None:
                result.peers[name]["restarts_detail"] = [r.as_dict() for r in member.restarts]
            for reason, count in sorted(member.node.all_rejections().items()):
                result.rejections[reason] = result.rejections.get(reason, 0) + count
        for row in result.rounds:  # updates that came after a round closed are added to its report
            server = self.members[row["gateway"]].server
            report = server.reports.get(row["round"]) if server is not None else None
            if report is not None and hasattr(report, "late"):
                row["late"] = list(report.late)
        result.dropped = dict(sorted((self.dropped + self.network.dropped).items()))
        result.links = [(src, dst, m, b) for (src, dst), (m, b) in sorted(self.traffic.items())]
        result.metrics = {"rounds_closed": float(len(result.rounds)),
                          "final_accuracy": result.trace[-1].mean_accuracy if result.trace else math.nan}
        self._privacy_note()
        self._secure_note()

    def _secure_note(self) -> None:
        """SecAgg on: the bytes its messages cost, by kind (each round's row has its phases' time and
        bytes at the gateway: ``secagg_phases``)."""
        secure = self.config.secure_aggregation
        if secure is None:
            return
        self.result.metrics["bytes_secagg"] = float(self.kind_bytes["secagg"])
        for kind, nbytes in sorted(self.kind_bytes.items()):
            if kind.startswith("secagg/"):
                self.result.metrics[f"bytes_secagg_{kind[len('secagg/'):]}"] = float(nbytes)
        self.result.metrics["bytes_round_start"] = float(self.kind_bytes["round_start"])
        self.result.notes.append(
            f"secure aggregation ({'masked' if secure.masking else 'quantised only, unmasked'}, "
            f"{secure.bits}-bit, clip {secure.clip_value:g}): {self.kind_bytes['secagg']} bytes of SecAgg "
            f"messages; the aggregate is the survivors' mean weighted by their samples (capped at "
            f"{secure.weight_cap_samples})")

    def _privacy_note(self) -> None:
        """DP on: the budget the gateways spent (the largest, for several), as a metric and a note."""
        dp = self.config.differential_privacy
        spent = [(server.epsilon(), server.round) for g in self.gateways
                 if (server := self.members[g].server) is not None and isinstance(server, FedAvgServer)]
        if dp is None or not spent:
            return
        epsilon, rounds = max((e, r) for e, r in spent if e is not None)
        self.result.metrics["epsilon"] = epsilon
        self.result.notes.append(f"client-level DP: epsilon = {epsilon:.3g} at delta = {dp.delta:g} after "
                                 f"{rounds} rounds (noise multiplier {dp.noise_multiplier:g}, sampling rate "
                                 f"{dp.sampling_rate:g}, clip norm {dp.clip_norm:g}"
                                 f"{', adaptive' if dp.adaptive else ''}"
                                 f"{self._distributed_words()})")

    def _distributed_words(self) -> str:
        secure = self.config.secure_aggregation
        if secure is None:
            return ""
        return (f"; distributed under SecAgg: each client adds its discrete Gaussian share, calibrated "
                f"to t + 1 = {secure.threshold + 1} survivors, and the sum is divided by q N, not by "
                "the survivors")


def _spread(vectors: list[torch.Tensor]) -> float:
    if len(vectors) < 2:
        return 0.0
    stacked = torch.stack([v.detach().float() for v in vectors])
    return float(torch.linalg.vector_norm(stacked - stacked.mean(0), dim=1).pow(2).mean().sqrt())


def _round_row(gateway: str, index: int, report: Any, now: float, nbytes: int,
               accuracy: float) -> dict[str, Any]:
    """One closed round (a FedAvg round or a FedBuff aggregation) as plain data."""
    row: dict[str, Any] = {"gateway": gateway, "round": index, "time_s": now, "bytes_sent": nbytes,
                           "accuracy": accuracy}
    for key in ("asked", "taken", "missing", "late", "contributors", "staleness", "closed_by", "refused"):
        if hasattr(report, key):
            value = getattr(report, key)
            row[key] = list(value) if isinstance(value, tuple) else value
    row["participants"] = len(row.get("taken", row.get("contributors", [])))
    if getattr(report, "epsilon", None) is not None:  # DP on: the budget spent so far, the clip norm used
        row["epsilon"] = report.epsilon
        row["clip_norm"] = report.clip_norm
    if getattr(report, "secagg_phases", None):  # SecAgg on: each phase's time, messages and bytes
        row["secagg_phases"] = list(report.secagg_phases)
    if report.bounds:  # the influence bounds the updates met (protocols/federation/influence.py)
        row["bounds"] = dict(report.bounds)
    if getattr(report, "blamed", None):  # SecAgg's culprits of the round (protocols/secagg/blame.py)
        row["blamed"] = dict(report.blamed)
    return row


def run_federation(scenario: ScenarioConfig, progress: Progress | None = None) -> ScenarioResult:
    return FederationRun(scenario, progress).run()


def check_federation(scenario: ScenarioConfig) -> None:
    """What a federation scenario is refused for before anything is built (``hivemesh config check``
    and :class:`FederationRun` alike): a member it names that does not exist, churn other than a
    gateway's crash, and a ``[federation]`` whose rounds can never run for a gateway's clients
    (FederationConfig.check_cohorts). Errors name the file and the key."""
    section = scenario.federation
    gateways, clients = section.gateway_names(), section.client_names()
    known = set(clients) | set(gateways)
    nodes = scenario.nodes
    named: dict[str, Mapping[str, object]] = {"nodes.speed": nodes.speed, "nodes.nic": nodes.nic,
                                              "federation.attack": section.attack,
                                              "federation.client_availability": section.client_availability}
    for key, table in named.items():
        for name in sorted(table):
            if name not in known:
                raise ConfigError(f"{scenario.source}: key '{key}.{name}': no such member "
                                  f"(clients are {clients[0]}..{clients[-1]}, "
                                  f"gateways {', '.join(gateways)})", key=f"{key}.{name}")
    gateway_crashes(scenario)
    try:
        scenario.federation_config().check_cohorts(section.clients)
    except ValueError as error:
        raise ConfigError(f"{scenario.source}: key 'federation' ({section.clients} clients per gateway): "
                          f"{error}", key="federation") from None


def gateway_crashes(scenario: ScenarioConfig) -> list[ChurnEvent]:
    """The churn of the scenario: gateways' crashes only (a client's comings and goings are its
    ``availability``), under FedAvg (a FedBuff gateway's checkpoints count its model versions,
    which this driver does not check between its work points)."""
    churn, gateways = scenario.faults.churn, scenario.federation.gateway_names()
    for event in churn:
        if event.node not in gateways or event.kind != "crash":
            raise ConfigError(f"{scenario.source}: key 'faults.churn': a federation takes a "
                              f"gateway's crash (with down_s), not a {event.kind} of {event.node!r} "
                              "(clients: federation.availability)", key="faults.churn")
    mode = scenario.federation_config().mode
    if churn and mode != "sync":
        raise ConfigError(f"{scenario.source}: key 'faults.churn': a gateway's crash is modelled "
                          f"for federation mode 'sync', not {mode!r}", key="faults.churn")
    return sorted(churn, key=lambda e: (e.at_s, e.node))
