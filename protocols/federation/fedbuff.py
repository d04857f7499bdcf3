"""Asynchronous FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous
Aggregation") as a pure Role: no rounds to wait for, a model version every K updates.

The server keeps ``concurrency`` clients training at once. Each is sent the current
global model in a ``RoundStart`` whose ``round`` is the model's *version*, and answers
with a ``ClientUpdate`` for that version. An update ``s`` versions old is weighed
``(1 + s)^-staleness_exponent`` and buffered; once at least ``buffer_size`` (K) updates
from at least ``min_clients`` distinct clients are buffered, the server aggregates them
(common.combine: bounded against the buffer, influence.py, then weighted), steps its
optimiser, and the version advances. A client whose update arrived is free, and a free
client is asked by a counter-based draw keyed by (seed, client, dispatch number), so a slow
client never holds up the others; only a full buffer that still waits for distinct clients
asks none of those already in it (a fast client cannot make a buffer its round of one).

What a ``ClientUpdate`` meets (counted ``refused_<reason>``): after the end,
``after_finish`` (answered with the final ``RoundResult``, at most once per client
per ``round_timeout_s``); from a client whose dispatch timed out, ``late``; from one
not training for us, ``not_sampled``; for another version than it was sent,
``wrong_round``; more than ``max_staleness`` versions old, ``stale``; malformed, not
finite or ``num_samples < 1``, ``bad_update``/``bad_num_samples``; otherwise
buffered (``updates_taken``). A dispatch not answered within ``round_timeout_s`` is
given up (``missing``) and another client asked. The verdict table:
docs/design/federation.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from protocols.events import Action, CancelTimer, Finished, Metric, Send, SetTimer
from protocols.federation.common import sample
from protocols.federation.config import FederationConfig
from protocols.federation.server_base import FederationServer
from protocols.federation.server_opt import server_step
from protocols.messages import ClientUpdate, RoundStart, Scalar


def staleness_weight(staleness: int, exponent: float) -> float:
    """``(1 + s)^-exponent``: Nguyen et al. 2022's polynomial staleness discount (0.5: 1/sqrt(1 + s))."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, not {staleness}")
    return float((1.0 + staleness) ** -exponent)


class BuffPhase(Enum):
    IDLE = "idle"  # before Start
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class BufferReport:
    """One aggregation: which updates made version ``version`` and how stale each was."""

    version: int  # the version the aggregation produced
    at_s: float
    contributors: tuple[str, ...]  # in buffer order (a client may appear twice)
    staleness: tuple[int, ...]
    weights: tuple[float, ...]
    update_norm: float
    bounds: dict[str, Any]  # the influence bounds the buffer's updates met (influence.Bounds.report)


@dataclass(frozen=True)
class _Dispatch:
    version: int
    number: int  # the dispatch's sequence number: its timer key, so a stale timer is recognised


class FedBuffServer(FederationServer):
    """The FedBuff server for clients ``clients`` (roster names; more may ``register``)."""

    MODE = "fedbuff"

    def __init__(self, config: FederationConfig, *, name: str, params: torch.Tensor,
                 clients: Sequence[str] = (), shapes: Sequence[tuple[int, ...]] | None = None) -> None:
        super().__init__(config, name=name, params=params, clients=clients, shapes=shapes,
                         other="FedAvgServer")
        self.phase = BuffPhase.IDLE
        self.version = 0
        self.dispatches = 0
        self.busy: dict[str, _Dispatch] = {}
        self.expired: dict[str, int] = {}  # client -> the version of its dispatch that timed out
        self.buffer: list[tuple[str, torch.Tensor, int, int]] = []  # (client, delta, num_samples, staleness)
        self.reports: dict[int, BufferReport] = {}
        self._sent: tuple[int, dict[str, torch.Tensor], dict[str, Scalar]] | None = None

    @property
    def round(self) -> int:
        """The current model version (what a status shows as the round)."""
        return self.version

    @property
    def finished(self) -> bool:
        return self.phase is BuffPhase.FINISHED

    def _phase_name(self) -> str:
        return self.phase.value

    def _round_now(self) -> int:
        return self.version

    def _extra_status(self) -> dict[str, Any]:
        return {"training": {c: d.version for c, d in sorted(self.busy.items())},
                "buffered": len(self.buffer),
                # a full buffer that waits for more distinct clients: who is in it (else absent)
                **({"buffer_clients": sorted(self._buffered_clients()),
                    "buffer_needs_clients": self.config.min_clients} if self._short_of_clients() else {})}

    # ------------------------------------------------------------ events

    def _start(self, now: float) -> list[Action]:
        if self.phase is not BuffPhase.IDLE:
            return []
        self.phase = BuffPhase.RUNNING
        return self._fill(now)

    def _registered(self, now: float) -> list[Action]:
        return self._fill(now) if self.phase is BuffPhase.RUNNING else []

    def _timer(self, key: str, now: float) -> list[Action]:
        return self._timeout(key, now)

    def _fill(self, now: float) -> list[Action]:
        """Ask free clients until ``concurrency`` train (all of them asked with one message); none while
        the model cannot be sent (``_model_message``)."""
        model = self._model()
        if model is None:
            return []
        chosen: list[str] = []
        # who is in a buffer that waits for other clients is not asked again until it is aggregated
        waiting = self._buffered_clients() if self._short_of_clients() else set()
        while len(self.busy) < self.config.concurrency:
            free = self.registered - set(self.busy) - waiting
            if not free:
                break
            (client,) = sample(self.config.seed, self.dispatches, free, 1, "fedbuff-dispatch")
            self.busy[client] = _Dispatch(self.version, self.dispatches)
            self.dispatches += 1
            chosen.append(client)
        if not chosen:
            return []
        tensors, meta = model
        start = RoundStart(round=self.version, tensors=tensors, meta={**meta, **self.config.local_work()},
                           deadline_s=self.config.round_timeout_s)
        deadline = now + self.config.round_timeout_s
        timers: list[Action] = [SetTimer(self._timer_key(c), deadline) for c in chosen]
        return [Send(tuple(sorted(chosen)), start), *timers]

    def _buffer_full(self) -> bool:
        return len(self.buffer) >= self.config.buffer_size

    def _buffered_clients(self) -> set[str]:
        return {client for client, _, _, _ in self.buffer}

    def _short_of_clients(self) -> bool:
        """A full buffer still short of ``min_clients`` distinct clients: it waits for the others."""
        return self._buffer_full() and len(self._buffered_clients()) < self.config.min_clients

    def _model(self) -> tuple[dict[str, torch.Tensor], dict[str, Scalar]] | None:
        """The current version as sent (encoded once per version); None when it cannot be."""
        if self._sent is None or self._sent[0] != self.version:
            model = self._model_message()
            if model is None:
                return None
            self._sent = (self.version, *model)
        return self._sent[1], self._sent[2]

    def _timer_key(self, client: str) -> str:
        return f"client/{client}/{self.busy[client].number}"

    def _timeout(self, key: str, now: float) -> list[Action]:
        _, _, rest = key.partition("/")
        client, _, number = rest.rpartition("/")
        dispatch = self.busy.get(client)
        if self.phase is not BuffPhase.RUNNING or dispatch is None or str(dispatch.number) != number:
            return []
        del self.busy[client]
        self.expired[client] = dispatch.version
        self.counters["missing"] += 1
        return self._fill(now)

    # ------------------------------------------------------------ updates

    def _update(self, sender: str, update: ClientUpdate, now: float) -> list[Action]:
        dispatch = self.busy.get(sender)
        if dispatch is None:
            if self.expired.get(sender) == update.round:
                del self.expired[sender]
                self._refuse("late")
            else:
                self._refuse("not_sampled")
            return []
        if update.round != dispatch.version:
            self._refuse("wrong_round")
            return []
        actions: list[Action] = [CancelTimer(self._timer_key(sender))]
        del self.busy[sender]
        staleness = self.version - update.round
        if staleness > self.config.max_staleness:
            self._refuse("stale")
        elif self._bad_num_samples(update):
            self._refuse("bad_num_samples")
        elif (delta := self._decode(update)) is None:
            self._refuse("bad_update")
        else:
            self.buffer.append((sender, delta, update.num_samples, staleness))
            self.counters["updates_taken"] += 1
            if self._buffer_full() and not self._short_of_clients():
                actions.extend(self._aggregate(now))
                if self.phase is BuffPhase.FINISHED:
                    return actions
        return [*actions, *self._fill(now)]

    def _aggregate(self, now: float) -> list[Action]:
        exponent = self.config.staleness_exponent
        weights = [staleness_weight(s, exponent) for _, _, _, s in self.buffer]
        keys = [f"{i:06d}/{client}" for i, (client, _, _, _) in enumerate(self.buffer)]
        buffered = {key: (delta, n) for key, (_, delta, n, _) in zip(keys, self.buffer, strict=True)}
        voters = {key: client for key, (client, _, _, _) in zip(keys, self.buffer, strict=True)}
        combined = self._combine(buffered, dict(zip(keys, weights, strict=True)), voters)  # bounded, weighted
        delta = combined.delta
        new, self.opt_state = server_step(self.params, delta, self.opt_state, self.config.server_opt)
        self.params.copy_(new)
        self.version += 1
        self.reports[self.version] = BufferReport(
            version=self.version, at_s=now, contributors=tuple(c for c, _, _, _ in self.buffer),
            staleness=tuple(s for _, _, _, s in self.buffer), weights=tuple(weights),
            update_norm=float(torch.linalg.vector_norm(delta)), bounds=combined.bounds.report())
        self.buffer = []
        self.counters["aggregations"] += 1
        actions: list[Action] = [Metric("round", float(self.version))]
        if self.version >= self.config.rounds:
            self.phase = BuffPhase.FINISHED
            cancels: list[Action] = [CancelTimer(self._timer_key(c)) for c in sorted(self.busy)]
            model = self._model()
            return [*actions, *cancels, *(self._finish(now, *model) if model is not None else []), Finished()]
        return actions

    # ------------------------------------------------------------ checkpoints

    def _export_meta(self) -> dict[str, Any]:
        """The version and the dispatch count; the buffer and the dispatches in flight are not kept
        (after a restore the server asks afresh)."""
        return {"version": self.version, "dispatches": self.dispatches}

    def _restore_meta(self, meta: dict[str, Any], *, finished: bool) -> None:
        self.version = int(meta["version"])
        self.dispatches = int(meta["dispatches"])
        self.phase = BuffPhase.FINISHED if finished else BuffPhase.IDLE
