"""Stateful property tests (Hypothesis ``RuleBasedStateMachine``) over every gossip machine.

One machine (member p00 of ring:4) is fed arbitrary interleavings of every
event kind: Start (again, too), the trainer's work (done, or done twice),
deadlines (its own timer, and keys it never set), honest pushes for rounds
near its own and far from it, duplicates of what it was sent, crafted
messages of any kind and shape (``_hostile.crafted``), NeighbourDown/Up,
and a trainer that goes non-finite. After every event:

- no exception escaped ``handle``;
- no counter decreased;
- the parameters are finite unless the trainer itself made them non-finite (from then on the
  other checks go on);
- nothing non-finite was sent (the machine's own non-finite parameters are
  counted, never sent);
- while WORKING the machine never touched the trainer's parameters;
- push-sum: the mass it holds plus what it sent equals what it held plus the
  share it was handed, exactly when nothing was refused (and never more);
- export → restore into a fresh machine → the same event gives the same
  actions and the same parameters.
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
import torch
from _hostile import CONFIGS, HONEST, INSIDER, ME, D, crafted, honest_push
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocols.events import (
    Action,
    Event,
    NeighbourDown,
    NeighbourUp,
    Received,
    Send,
    SetTimer,
    Start,
    TimerFired,
    WorkDone,
)
from protocols.gossip import Phase, PushSum, make_machine
from protocols.gossip.pushsum import WEIGHT, weight_share
from protocols.messages import ParamPush
from topology import build

TOPOLOGY = build("ring:4")
# counters that mean "nothing was refused": push-sum's mass must balance exactly when only these moved
BENIGN = {"round", "late_message", "rounds_skipped", "steps_skipped", "missed_deadline",
          "resent_on_neighbour_up", "requests_served", "restarted"}


def _same(a: Any, b: Any) -> bool:
    """Structural equality of actions: tensors bit for bit, NaN equal to NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num())
                and torch.equal(a.isnan(), b.isnan()))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _sent_tensors(actions: list[Action]) -> list[torch.Tensor]:
    return [t for a in actions if isinstance(a, Send) and isinstance(a.message, ParamPush)
            for t in a.message.tensors.values() if t.is_floating_point()]


def _sent_mass(actions: list[Action], limit: float) -> float:
    shares = [(weight_share(a.message.meta, limit) or 0.0) * len(a.recipients) for a in actions
              if isinstance(a, Send) and isinstance(a.message, ParamPush) and WEIGHT in a.message.meta]
    return math.fsum(shares)


class MachineUnderFire(RuleBasedStateMachine):
    key = "dpsgd"

    def __init__(self) -> None:
        super().__init__()
        self.params = torch.linspace(-1.0, 1.0, D)
        self.machine = make_machine(CONFIGS[self.key], name=ME, topology=TOPOLOGY, params=self.params, seed=0)
        self.now = 0.0
        self.timers: list[str] = []
        self.delivered: list[tuple[str, Any]] = []
        self.counters = dict(self.machine.counters)
        self.poisoned = False        # the trainer made the parameters non-finite (not the machine)
        self.poison_next = False

    # ------------------------------------------------------------ one event, checked

    def _feed(self, event: Event) -> list[Action]:
        machine = self.machine
        self.now += 0.25
        phase = machine.phase
        working = phase is Phase.WORKING and not isinstance(event, WorkDone)
        before = self.params.clone()
        mass = machine.mass if isinstance(machine, PushSum) else 0.0
        counters = dict(machine.counters)
        actions = machine.handle(event, self.now)      # no exception may escape
        if working:
            assert torch.equal(before.nan_to_num(), self.params.nan_to_num()), "touched while WORKING"
        for tensor in _sent_tensors(actions):
            assert bool(torch.isfinite(tensor).all()), f"sent non-finite values after {event}"
        if isinstance(machine, PushSum):
            limit = machine.max_share
            handed = 0.0
            if isinstance(event, Received) and isinstance(event.message, ParamPush):
                handed = weight_share(event.message.meta, limit) or 0.0
            # What NeighbourUp, or Start after a restart, sends again is the round's message already
            # counted as sent: the receiver keeps one copy of each (sender, round), so it adds no mass.
            resend = isinstance(event, NeighbourUp) or (isinstance(event, Start) and phase is not Phase.IDLE)
            sent = 0.0 if resend else _sent_mass(actions, limit)
            balance = machine.mass + sent
            refused = any(machine.counters.get(k, 0) > counters.get(k, 0)
                          for k in machine.counters if k not in BENIGN)
            if refused:
                assert balance <= mass + handed + 1e-9, (balance, mass, handed)
            elif not self.poisoned:
                assert balance == pytest.approx(mass + handed, abs=1e-9), (balance, mass, handed, event)
        self.timers += [a.key for a in actions if isinstance(a, SetTimer)]
        return actions

    # ------------------------------------------------------------ rules

    @rule()
    def start(self) -> None:
        self._feed(Start())

    @rule(loss=st.floats(allow_nan=True, allow_infinity=True), steps=st.integers(0, 3))
    def work_done(self, loss: float, steps: int) -> None:
        if self.machine.phase is Phase.WORKING:      # the trainer's steps, then WorkDone
            if self.poison_next:                    # from here on the parameters are the trainer's NaN
                self.params[1] = math.nan
                self.poisoned, self.poison_next = True, False
            else:
                self.params.mul_(0.9)
            steps = self.machine.round_steps
        self._feed(WorkDone(steps, loss))           # when not WORKING: an impossible event

    @rule()
    def diverge(self) -> None:
        self.poison_next = True

    @precondition(lambda self: bool(self.timers))
    @rule(data=st.data())
    def fire_a_timer(self, data: st.DataObject) -> None:
        self._feed(TimerFired(data.draw(st.sampled_from(self.timers))))

    @rule(key=st.sampled_from(["gossip-deadline:0", "gossip-deadline:99", "", "nonsense"]))
    def fire_an_unknown_timer(self, key: str) -> None:
        self._feed(TimerFired(key))

    @rule(sender=st.sampled_from([INSIDER, HONEST]), ahead=st.integers(-3, 12))
    def push_honest(self, sender: str, ahead: int) -> None:
        r = max(0, self.machine.position[0] + ahead)
        message = honest_push(self.machine, sender, r)
        self.delivered.append((sender, message))
        self._feed(Received(sender, message))

    @precondition(lambda self: bool(self.delivered))
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        sender, message = data.draw(st.sampled_from(self.delivered))
        self._feed(Received(sender, message))

    @rule(stream=crafted())
    def crafted_message(self, stream: tuple[str, Any]) -> None:
        self._feed(Received(*stream))

    @rule(who=st.sampled_from([INSIDER, HONEST, "p02"]), up=st.booleans())
    def liveness(self, who: str, up: bool) -> None:
        self._feed(NeighbourUp(who) if up else NeighbourDown(who))

    @rule(sender=st.sampled_from([INSIDER, HONEST]), ahead=st.integers(-1, 3),
          which=st.sampled_from(["start", "work", "push", "timer", "down"]))
    def export_restore_then_the_same_next_actions(self, sender: str, ahead: int, which: str) -> None:
        if self.machine.phase is Phase.WORKING and which != "work":
            which = "work"      # (a checkpoint is taken between pieces of work)
        state = self.machine.export_state()
        twin_params = self.params.clone()
        twin = make_machine(CONFIGS[self.key], name=ME, topology=TOPOLOGY, params=twin_params, seed=0)
        twin.restore_state(state)
        r = max(0, self.machine.position[0] + ahead)
        event: Event
        match which:
            case "start":
                event = Start()
            case "work":
                event = WorkDone(self.machine.round_steps, 0.5)
            case "push":
                event = Received(sender, honest_push(self.machine, sender, r))
            case "timer":
                event = TimerFired(self.timers[-1] if self.timers else "gossip-deadline:0")
            case _:
                event = NeighbourDown(sender)
        twin_actions = twin.handle(event, self.now + 0.25)
        actions = self._feed(event)
        assert _same(actions, twin_actions), (event, actions, twin_actions)
        assert torch.equal(self.params.nan_to_num(), twin_params.nan_to_num())

    # ------------------------------------------------------------ invariants

    @invariant()
    def counters_never_decrease(self) -> None:
        now = dict(self.machine.counters)
        assert all(now.get(k, 0) >= v for k, v in self.counters.items()), (self.counters, now)
        self.counters = now

    @invariant()
    def parameters_stay_finite(self) -> None:
        if not self.poisoned:
            assert bool(torch.isfinite(self.params).all()), self.params


def _case(key: str) -> type[MachineUnderFire]:
    case = type(f"MachineUnderFire_{key.replace('-', '_')}", (MachineUnderFire,), {"key": key})
    case.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
    return case


@pytest.mark.parametrize("key", list(CONFIGS))
def test_every_machine_survives_any_interleaving(key: str) -> None:
    _case(key).TestCase().runTest()

