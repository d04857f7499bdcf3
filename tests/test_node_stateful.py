"""Stateful property tests (Hypothesis ``RuleBasedStateMachine``) over the Node around each machine.

The Node of p00 (ring:4; neighbours p01 and p03, p02 is not one) is driven with arbitrary
interleavings of everything a driver can hand it: heartbeats (reachable or not, finished or not)
and its own heartbeat timer, its start wait and verdict,
state-sync requests and answers (usable, unusable, unasked), honest and crafted messages from
members and strangers, Start (again, too), a sync begun at any moment, its timeouts, silences,
goodbyes, the trainer's work, the machine's timers, and the messages and timers of a role held
beside the machine. After every call:

- no exception escaped;
- no counter decreased (the Node's refusals, state sync's outcomes and answers, the machine's);
- the parameters stay finite, and nothing non-finite was sent;
- a state sync never replaced the parameters once the machine had started;
- what is held before Start stays within its per-neighbour cap;
- the role beside the machine got only its own kind and its own timers (never the trainer's
  work), and nothing before the Node started.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _hostile import CONFIGS, HONEST, INSIDER, ME, D, crafted, honest_push
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from protocols.events import Action, Event, Received, Send, SetTimer, Start, TimerFired, WorkDone
from protocols.gossip import make_machine
from protocols.messages import (
    ClientUpdate,
    Heartbeat,
    Message,
    ParamPush,
    StateSyncRequest,
    StateSyncResponse,
)
from protocols.node import Neighbour, Node, NodeAction, NodeConfig, Wait
from topology import build

TOPOLOGY = build("ring:4")
CAP = 3
SENDERS = st.sampled_from([INSIDER, HONEST, "p02", ME])
NODE_CONFIGS = ["dpsgd", "local", "choco", "pushsum", "adpsgd"]


def _sent_floats(actions: list[NodeAction]) -> list[torch.Tensor]:
    return [t for a in actions if isinstance(a, Send) and isinstance(a.message, ParamPush | StateSyncResponse)
            for t in a.message.tensors.values() if t.is_floating_point()]


class Role:
    """A role beside the machine: takes ClientUpdate, sets a timer at Start, records its events."""

    accepts = frozenset({ClientUpdate})

    def __init__(self) -> None:
        self.events: list[Event] = []

    def handle(self, event: Event, now: float) -> list[Action]:
        self.events.append(event)
        return [SetTimer("round", now + 1.0)] if isinstance(event, Start) else []


class NodeUnderFire(RuleBasedStateMachine):
    key = "dpsgd"

    def __init__(self) -> None:
        super().__init__()
        self.params = torch.linspace(-1.0, 1.0, D)
        machine = make_machine(CONFIGS[self.key], name=ME, topology=TOPOLOGY, params=self.params, seed=0)
        self.role = Role()
        self.node: Node[Neighbour] = Node(
            ME, machine, neighbours={INSIDER: Neighbour(), HONEST: Neighbour()},
            config=NodeConfig(neighbour_timeout_s=1.0, sync_answer_interval_s=0.5, sync_attempts=2),
            early_per_neighbour=CAP, answer_source=lambda: (self.params.clone(), 0), roles={"fed": self.role})
        self.now = 0.0
        self.timers: list[str] = []
        self.counts = self._counts()

    def _counts(self) -> dict[str, float]:
        node = self.node
        counts: dict[str, float] = {f"node/{k}": v for k, v in node.all_rejections().items()}
        counts.update({f"sync/{k}": v for k, v in node.sync.outcomes.items()})
        counts["sync/answers_sent"] = node.sync.answers_sent
        counts.update({f"machine/{k}": v for k, v in node.machine.counters.items()})
        return counts

    def _call(self, call: Any, *args: Any, **kwargs: Any) -> list[NodeAction]:
        self.now += 0.25
        actions: list[NodeAction] = call(*args, **kwargs)     # no exception may escape
        for tensor in _sent_floats(actions):
            assert bool(torch.isfinite(tensor).all()), f"sent non-finite values after {call}"
        self.timers += [a.key for a in actions if isinstance(a, SetTimer)]
        return actions

    # ------------------------------------------------------------ lifecycle

    @rule()
    def start(self) -> None:
        self._call(self.node.start, self.now)

    @rule(resumed=st.booleans())
    def begin_sync(self, resumed: bool) -> None:
        started = self.node.started
        before = self.params.clone()
        actions = self._call(self.node.begin_sync, resumed=resumed)
        if started:
            assert actions == [] and not self.node.syncing and torch.equal(before, self.params)

    @rule(step=st.integers(0, 50))
    def tick(self, step: int) -> None:
        actions = self._call(self.node.tick, self.now, step=step, loss=0.5)
        assert all(isinstance(a, Send) and isinstance(a.message, Heartbeat) for a in actions)

    @rule(waited_s=st.floats(0.0, 100.0), resumed=st.booleans(), start_wait_over=st.booleans())
    def ask_whether_to_start_or_stop(self, waited_s: float, resumed: bool, start_wait_over: bool) -> None:
        assert isinstance(self.node.start_wait(waited_s=waited_s, resumed=resumed, ahead_steps=8), Wait)
        assert isinstance(self.node.judge(resumed=resumed, start_wait_over=start_wait_over), str)

    @rule(sender=SENDERS, r=st.integers(0, 3))
    def client_update(self, sender: str, r: int) -> None:
        self._receive(sender, ClientUpdate(round=r, num_samples=1))

    @rule()
    def sync_timed_out(self) -> None:
        self._call(self.node.sync_timed_out)

    @rule(steps=st.integers(1, 2))
    def work_done(self, steps: int) -> None:
        self._call(self.node.handle, WorkDone(steps, 0.5), self.now)

    @rule(data=st.data())
    def fire_a_timer(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from([*self.timers, "fed/round", "fed/other", "nobody/round"]))
        self._call(self.node.handle, TimerFired(key), self.now)

    @rule(wait_s=st.floats(0.0, 3.0))
    def time_passes(self, wait_s: float) -> None:
        self.now += wait_s
        self._call(lambda: self.node.expire(self.now)[1])

    @rule(who=SENDERS)
    def goodbye(self, who: str) -> None:
        self._call(self.node.goodbye, who, self.now)

    # ------------------------------------------------------------ what arrives

    def _receive(self, sender: str, message: Message, reachable: bool = True) -> None:
        started = self.node.started
        before = self.params.clone()
        self._call(self.node.receive, sender, message, self.now, reachable=reachable)
        if started and isinstance(message, StateSyncResponse):
            assert torch.equal(before.nan_to_num(), self.params.nan_to_num()), "adopted while running"

    @rule(sender=SENDERS, step=st.integers(-5, 50), finished=st.booleans(), reachable=st.booleans())
    def heartbeat(self, sender: str, step: int, finished: bool, reachable: bool) -> None:
        self._receive(sender, Heartbeat(step=step, loss=0.0, sent_at_s=0.0, finished=finished), reachable)

    @rule(sender=SENDERS)
    def sync_request(self, sender: str) -> None:
        self._receive(sender, StateSyncRequest(reason="join"))

    @rule(sender=SENDERS, r=st.integers(-2, 40), value=st.sampled_from([0.25, math.nan, math.inf]),
          numel=st.sampled_from([D, D - 1, D + 1]))
    def sync_answer(self, sender: str, r: int, value: float, numel: int) -> None:
        self._receive(sender, StateSyncResponse(round=r, tensors={"params": torch.full((numel,), value)},
                                                meta={"round": r, "steps_done": r, "trainer_step": r}))

    @rule(sender=st.sampled_from([INSIDER, HONEST]), r=st.integers(0, 12))
    def honest(self, sender: str, r: int) -> None:
        self._receive(sender, honest_push(self.node.machine, sender, r))  # type: ignore[arg-type]

    @rule(stream=crafted())
    def crafted_message(self, stream: tuple[str, Message]) -> None:
        self._receive(*stream)

    # ------------------------------------------------------------ invariants

    @invariant()
    def counters_never_decrease(self) -> None:
        now = self._counts()
        assert all(now.get(k, 0) >= v for k, v in self.counts.items()), (self.counts, now)
        self.counts = now

    @invariant()
    def parameters_stay_finite(self) -> None:
        assert bool(torch.isfinite(self.params).all()), self.params

    @invariant()
    def the_role_gets_only_its_own(self) -> None:
        for event in self.role.events:
            assert not isinstance(event, Received) or isinstance(event.message, ClientUpdate)
            assert not isinstance(event, TimerFired) or event.key in ("round", "other")
            assert not isinstance(event, WorkDone)
        assert not self.role.events or self.node.started

    @invariant()
    def what_is_held_is_bounded(self) -> None:
        for name in (INSIDER, HONEST):
            assert len(self.node.early.held(name)) <= CAP
        assert self.node.early.held("p02") == [] and self.node.early.held(ME) == []


def _case(key: str) -> type[NodeUnderFire]:
    case = type(f"NodeUnderFire_{key}", (NodeUnderFire,), {"key": key})
    case.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
    return case


@pytest.mark.parametrize("key", NODE_CONFIGS)
def test_the_node_survives_any_interleaving(key: str) -> None:
    _case(key).TestCase().runTest()
