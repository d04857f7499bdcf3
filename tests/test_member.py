"""The member lifecycle (protocols/node/member.py) through every phase, and its action interpreter
(protocols/node/host.py), on a network made of Python lists: no sockets, no clock, no engine."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from protocols.events import Finished, Send, SetTimer, WorkDone
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import Heartbeat, ParamPush, StateSyncRequest
from protocols.node import Neighbour, Node, NodeConfig, Note
from protocols.node.checkpoints import CheckpointConfig
from protocols.node.host import Host, TimerTable
from protocols.node.member import (
    EXIT_STRANDED,
    SYNC_TIMER,
    ArmCrash,
    Arrived,
    Beat,
    Crash,
    Entered,
    Exit,
    Expire,
    Halt,
    Heal,
    Launch,
    Member,
    MemberConfig,
    Phase,
    Reached,
    Release,
    ScheduleMoved,
    WorkPoint,
    ahead_steps,
)
from protocols.node.membership import Connect
from protocols.node.schedule import Cut, Flood, Hold, Schedule, Stop
from protocols.node.schedule import Reached as Reach
from topology import build

NAMES = ("p00", "p01")
NODE = NodeConfig(heartbeat_interval_s=1.0, neighbour_timeout_s=5.0, start_timeout_s=60.0,
                  sync_timeout_s=10.0)


@dataclass
class ListPort:
    """A host made of lists: what went out, what was trained, saved, said and marked."""

    name: str
    outbox: list[tuple[str, Send]]
    on_work: Callable[[str, int], None]
    sent: list[Send] = field(default_factory=list)
    trains: list[int] = field(default_factory=list)
    saves: list[bool] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    wakes: list[tuple[float, str, int]] = field(default_factory=list)
    marks: list[Any] = field(default_factory=list)

    def send(self, send: Send) -> None:
        self.outbox.append((self.name, send))
        self.sent.append(send)

    def work_point(self, steps: int) -> None:
        self.on_work(self.name, steps)

    def train(self, steps: int) -> None:
        self.trains.append(steps)

    def save(self, final: bool) -> None:
        self.saves.append(final)

    def say(self, note: Note) -> None:
        self.notes.append(note)

    def connect(self, connect: Connect) -> None:
        self.marks.append(connect)

    def wake(self, at: float, key: str, token: int) -> None:
        self.wakes.append((at, key, token))

    def mark(self, action: Any) -> None:
        self.marks.append(action)


class Net:
    """Members wired by a list: each ``Send`` is delivered to its recipients when ``deliver`` runs."""

    def __init__(self, *, total_steps: int = 3, schedule: Schedule | None = None,
                 checkpoint: CheckpointConfig | None = None) -> None:
        topology = build("complete:2")
        self.outbox: list[tuple[str, Send]] = []
        self.now = 0.0
        self.reached: dict[str, int] = {}
        self.ports: dict[str, ListPort] = {}
        self.members: dict[str, Member[Neighbour]] = {}
        self.hosts: dict[str, Host] = {}
        config = GossipConfig(total_steps=total_steps)
        scheduled = schedule is not None
        for name in NAMES:
            params = torch.zeros(2)
            machine = make_machine(config, name=name, topology=topology, params=params)
            others = {n: Neighbour() for n in NAMES if n != name}
            node: Node[Neighbour] = Node(name, machine, neighbours=others, config=NODE,
                                         early_per_neighbour=config.max_rounds_ahead + 1,
                                         answer_source=lambda params=params: (params.clone(), 0))
            member_config = MemberConfig(ahead_steps=ahead_steps(max_rounds_ahead=config.max_rounds_ahead,
                                                                 local_steps=config.local_steps,
                                                                 scheduled=scheduled),
                                         checkpoint=checkpoint or CheckpointConfig(every_steps=0),
                                         keeps_checkpoints=checkpoint is not None)
            self.members[name] = Member(node, member_config, schedule=schedule,
                                        reached=lambda m: self.reached.get(m, -1))
            self.ports[name] = ListPort(name, self.outbox, self.work_point)
            self.hosts[name] = Host(self.members[name].handle, self.ports[name])

    def feed(self, name: str, now: float, event: Any) -> None:
        self.now = now
        self.hosts[name].handle(now, event)
        for mark in self.ports[name].marks:
            if isinstance(mark, Reached):
                self.reached[name] = mark.round

    def work_point(self, name: str, steps: int) -> None:
        """The host takes the work from its queue at once: the member's work point."""
        self.hosts[name].handle(self.now, WorkPoint(steps))

    def deliver(self, now: float, *, drop_to: frozenset[str] = frozenset()) -> int:
        """One wave: what is in flight now arrives (what it makes them send waits for the next)."""
        delivered = 0
        wave, self.outbox[:] = list(self.outbox), []
        for sender, send in wave:
            for recipient in send.recipients:
                if recipient not in drop_to and not self.members[sender].drops(recipient, send.message):
                    delivered += 1
                    self.feed(recipient, now, Arrived(sender, send.message))
        return delivered

    def work(self, now: float) -> None:
        """Every train asked so far is done."""
        for name, port in sorted(self.ports.items()):
            while port.trains:
                self.feed(name, now, WorkDone(port.trains.pop(0), 0.5))

    def phases(self) -> dict[str, Phase]:
        return {name: member.phase for name, member in self.members.items()}


def entered(port: ListPort) -> list[Phase]:
    return [mark.phase for mark in port.marks if isinstance(mark, Entered)]


def run_rounds(net: Net, now: float, rounds: int) -> float:
    for _ in range(rounds):
        net.deliver(now)
        net.work(now)
        now += 0.1
    return now


def test_two_members_wait_for_each_other_then_train_to_the_end() -> None:
    net = Net(total_steps=3)
    net.feed("p00", 0.0, Launch(step=0))
    assert net.phases() == {"p00": Phase.WAITING, "p01": Phase.IDLE}
    net.deliver(0.0)                       # its heartbeat: p01 is not up yet
    net.feed("p01", 0.0, Launch(step=0))
    net.deliver(0.0)                       # p01's heartbeat: p00 starts; p01 hears p00's round
    net.deliver(0.0)
    assert net.phases() == {"p00": Phase.TRAINING, "p01": Phase.TRAINING}
    run_rounds(net, 1.0, 10)
    assert net.phases() == {"p00": Phase.FINISHED, "p01": Phase.FINISHED}
    for name in NAMES:
        assert entered(net.ports[name]) == [Phase.WAITING, Phase.TRAINING, Phase.FINISHED]
        assert any(isinstance(m, Finished) for m in net.ports[name].marks)
        assert net.members[name].step == 3 and net.ports[name].saves == []
        assert sum(isinstance(s.message, ParamPush) for s in net.ports[name].sent) >= 3


def test_a_late_joiner_syncs_first_then_trains() -> None:
    net = Net(total_steps=20)
    net.feed("p00", 0.0, Launch(step=0))
    net.feed("p01", 0.0, Launch(step=0, sync=True))
    net.deliver(0.0)
    assert net.members["p01"].phase is Phase.SYNCING
    assert any(isinstance(s.message, StateSyncRequest) for _, s in net.outbox)
    net.deliver(0.0)                       # the request answered, the answer adopted
    net.deliver(0.0)
    assert net.members["p01"].phase is Phase.TRAINING
    assert entered(net.ports["p01"]) == [Phase.WAITING, Phase.SYNCING, Phase.TRAINING]


def test_an_unanswered_sync_times_out_by_its_timer_then_the_member_is_judged() -> None:
    net = Net()
    member = net.members["p01"]
    net.feed("p00", 0.0, Launch(step=0))
    net.feed("p01", 0.0, Launch(step=0, resumed=True))
    net.deliver(0.0, drop_to=frozenset({"p00"}))    # p00 never hears p01: never answers
    assert member.phase is Phase.SYNCING
    at, key, token = net.ports["p01"].wakes[-1]
    assert (at, key) == (10.0, SYNC_TIMER) and member.next_deadline() == 1.0   # the heartbeat's first
    attempts = 0
    while member.phase is Phase.SYNCING:
        at, key, token = net.ports["p01"].wakes[-1]
        net.hosts["p01"].fire(at, key, token)
        net.outbox.clear()
        attempts += 1
    assert attempts == member.node.sync.attempts
    assert member.phase in (Phase.TRAINING, Phase.STRANDED)


def test_a_silent_neighbour_strands_a_started_member_with_its_state_kept() -> None:
    net = Net(total_steps=50, checkpoint=CheckpointConfig(every_steps=0))
    net.feed("p00", 0.0, Launch(step=0))
    net.feed("p01", 0.0, Launch(step=0))
    net.deliver(0.0)
    net.feed("p01", 0.0, Beat())
    run_rounds(net, 0.0, 3)
    port = net.ports["p00"]
    port.saves.clear()
    beat = Heartbeat(step=3, loss=0.5, sent_at_s=0.0, finished=True, roster_version=1)
    net.feed("p00", 1.0, Arrived("p01", beat))   # p01 says it has finished, then falls silent
    net.feed("p00", 20.0, Expire())
    member = net.members["p00"]
    assert member.phase is Phase.STRANDED and member.stranded
    exits = [m for m in port.marks if isinstance(m, Exit)]
    assert exits == [Exit(EXIT_STRANDED, member.stranded)] and port.saves == [False]
    net.outbox.clear()
    net.feed("p00", 21.0, Beat())           # a stranded member takes nothing more
    assert net.outbox == []
    assert member.next_deadline() == math.inf


def test_checkpoints_fall_due_at_work_points_and_an_armed_crash_fires_at_its_step() -> None:
    net = Net(total_steps=50, checkpoint=CheckpointConfig(every_steps=2))
    for name in NAMES:
        net.feed(name, 0.0, Launch(step=0))
    assert net.ports["p00"].saves == [False]            # the first: what a crash restarts from
    net.feed("p00", 0.0, ArmCrash(at_step=3))
    net.deliver(0.0)
    net.feed("p01", 0.0, Beat())
    now = run_rounds(net, 0.0, 3)
    assert net.ports["p00"].saves == [False, False]     # at step 2
    run_rounds(net, now, 1)
    crashes = [m for m in net.ports["p00"].marks if isinstance(m, Crash)]
    assert crashes == [Crash(3)] and net.ports["p00"].trains == []
    net.feed("p00", now, Halt())
    assert net.members["p00"].phase is Phase.STOPPED


def test_a_schedule_holds_floods_cuts_heals_and_stops_at_work_points() -> None:
    schedule = Schedule((
        Flood(member="p00", at_round=0, to="p01", requests=2),
        Hold(member="p00", at_round=1, until=(Reach("p01", 2),)),
        Cut(side_a=frozenset({"p00"}), side_b=frozenset({"p01"}), from_round=3, heal_when=(Reach("p01", 3),)),
        Stop(member="p00", at_round=5, restart_when=(Reach("p01", 6),)),
    ))
    net = Net(total_steps=50, schedule=schedule)
    member, port = net.members["p00"], net.ports["p00"]
    for name in NAMES:
        net.feed(name, 0.0, Launch(step=0))
    floods = [s for s in port.sent if isinstance(s.message, StateSyncRequest) and s.message.reason == "flood"]
    assert floods == [] and member.phase is Phase.WAITING
    held, cut, healed = [], [], []
    for wave in range(40):
        net.deliver(0.0)
        net.work(0.0)
        for name in NAMES:                   # what a host does at ScheduleMoved: heal, then release
            net.feed(name, 0.0, Heal())
        for name in NAMES:
            net.feed(name, 0.0, Release())
        held.append(member.deferred_steps)
        push = next((s.message for s in reversed(port.sent) if isinstance(s.message, ParamPush)), None)
        if push is not None and member.drops("p01", push):
            cut.append(wave)
        elif cut and not healed:
            healed.append(wave)
        if member.phase is Phase.STOPPED:
            break
    floods = [s for s in port.sent if isinstance(s.message, StateSyncRequest) and s.message.reason == "flood"]
    assert len(floods) == 2 and Reached(0) in port.marks and ScheduleMoved() in port.marks
    assert 1 in held and held[-1] == 0          # held at round 1, released when p01 reached round 2
    assert cut and healed                        # round 3's pushes dropped until p01 reached round 3
    assert member.phase is Phase.STOPPED and port.saves == [False]
    assert [m for m in port.marks if isinstance(m, Exit)] == [
        Exit(0, "stopped by the fault schedule", (Reach("p01", 6),))]
    assert member.reached_round == 5 and net.reached["p00"] == 5


def test_a_stopped_member_launches_again_from_its_checkpoint_and_resyncs() -> None:
    net = Net(total_steps=50, checkpoint=CheckpointConfig(every_steps=100))
    for name in NAMES:
        net.feed(name, 0.0, Launch(step=0))
    net.deliver(0.0)
    net.feed("p01", 0.0, Beat())
    now = run_rounds(net, 0.0, 3)
    net.feed("p00", now, Halt())
    net.hosts["p00"].end_life()
    net.outbox[:] = [(s, send) for s, send in net.outbox if s != "p00"]
    member = net.members["p00"]
    member.node.restart(member.node.machine, {"p01": Neighbour()})
    net.feed("p00", now + 1.0, Launch(step=1, resumed=True))
    assert member.phase is Phase.WAITING and member.step == 1
    assert entered(net.ports["p00"])[-1] is Phase.WAITING


def test_the_member_sets_its_sync_deadline_as_a_timer_for_the_host() -> None:
    net = Net()
    net.feed("p00", 0.0, Launch(step=0, sync=True))
    net.feed("p01", 0.0, Launch(step=0))
    net.deliver(0.0)
    actions = net.members["p00"].handle(0.0, Beat())
    assert actions == [] or all(not isinstance(a, SetTimer) for a in actions)
    assert net.members["p00"].phase is Phase.SYNCING
    assert net.hosts["p00"].timers.next_at() == 10.0


def test_the_timer_table_fires_the_live_timer_of_each_key_in_deadline_order() -> None:
    table = TimerTable()
    first = table.set("a", 2.0)
    table.set("b", 1.0)
    table.set("a", 3.0)                    # replaces the first
    table.set("c", 0.5)
    table.cancel("c")
    assert not table.take("a", first) and table.next_at() == 1.0
    assert table.due(2.5) == ["b"] and table.due(3.0) == ["a"] and table.next_at() is None


def test_ahead_steps_is_what_the_machine_buffers_unless_a_schedule_runs() -> None:
    assert ahead_steps(max_rounds_ahead=4, local_steps=5, scheduled=False) == 20.0
    assert ahead_steps(max_rounds_ahead=4, local_steps=5, scheduled=True) == math.inf


def test_the_timer_table_stays_the_size_of_its_live_timers_when_fired_by_token() -> None:
    table = TimerTable()
    for round_index in range(1000):
        token = table.set("deadline", float(round_index))
        assert table.take("deadline", token)
        table.set("beat", float(round_index))
    assert table.held <= 2 * 2 + 16 and table.next_at() == 999.0
