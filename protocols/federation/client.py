"""The FedAvg client as a pure Role: train when asked, upload the compressed delta.

An edge client's Node hosts it. It owns no model: ``params`` is the trainer's
flat vector, which the client overwrites with each round's global model and
the trainer trains in place between ``StartWork`` and ``WorkDone`` (as the
gossip machines do).

1. ``RoundStart`` from the server: the global model is decoded (the downlink
   may be compressed), copied into ``params`` and kept as the round's anchor;
   the client asks its driver for the local work (``StartWork``: the round's
   ``local_steps``, or ``local_epochs`` times ``steps_per_epoch``). A
   RoundStart that comes while the client trains waits (the newest only) until
   the work is done.
2. ``WorkDone``: the delta ``params - anchor`` goes up in a ``ClientUpdate``,
   compressed by the federation's ``uplink`` operator with error feedback
   (Seide et al. 2014; Karimireddy et al. 2019): what a round's compression
   dropped is added to the next upload, whenever that is; the residual
   survives the rounds the client is not asked in (``export_state`` keeps it
   across restarts). An identity uplink sends the delta as it is.
3. ``RoundResult`` from the server: the final model goes into ``params``;
   ``Finished`` (heard while training: after the work is done and uploaded).

FedProx (Li et al. 2020): when the round's ``prox_mu`` is > 0 the trainer adds
``server_opt.proximal_gradient(params, client.anchor, client.prox_mu)`` to its
gradient; the client only carries the two values.

Refusals, counted ``refused_<reason>``: a message from anyone but the server
(``not_server``), a RoundStart older than one already started (``old_round``)
or with a model or work it cannot use (``bad_model``, ``bad_work``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from enum import Enum
from typing import Any

import torch

from protocols.compress import BadParts, ErrorFeedback, RngKey, from_spec, pack
from protocols.events import Action, Event, Finished, ProtocolState, Received, Send, StartWork, WorkDone
from protocols.federation import client_metrics
from protocols.federation.common import Counted, payload
from protocols.federation.config import FederationConfig
from protocols.federation.secure import SecureClient
from protocols.gossip.payload import PREFIX, encodable
from protocols.messages import ClientUpdate, Message, RoundResult, RoundStart, SecAggMessage


class ClientPhase(Enum):
    IDLE = "idle"  # waiting to be asked
    TRAINING = "training"  # StartWork issued: params belong to the trainer until WorkDone
    FINISHED = "finished"


class FedAvgClient(Counted):
    """Client ``name`` of the server ``server``, holding ``num_samples`` samples."""

    ACCEPTS: frozenset[type[Message]] = frozenset({RoundStart, RoundResult})

    def __init__(self, config: FederationConfig, *, name: str, server: str, params: torch.Tensor,
                 num_samples: int, steps_per_epoch: int,
                 shapes: Sequence[tuple[int, ...]] | None = None, secure: SecureClient | None = None) -> None:
        """``secure``: this client's side of secure aggregation (protocols/federation/secure.py),
        needed when ``config.secure_aggregation`` is set."""
        super().__init__()
        if (config.secure_aggregation is None) != (secure is None):
            raise ValueError("federation.secure_aggregation needs the client's secure side (secure=, a "
                             "SecureClient) and secure= needs it: this driver does not wire it")
        # the hooks below hand it RoundStart, its messages and the trained delta
        self.secure = secure
        if secure is not None:  # distributed DP: its noise share goes in before masking
            secure.privacy = config.differential_privacy
        if params.dim() != 1 or not params.is_floating_point():
            raise ValueError(f"params must be the trainer's flat 1-D float tensor, got {tuple(params.shape)}")
        if num_samples < 1 or steps_per_epoch < 1:
            raise ValueError("num_samples and steps_per_epoch must be >= 1, "
                             f"not {num_samples}, {steps_per_epoch}")
        self.config = config
        self.name = name
        self.server = server
        self.params = params
        self.num_samples = num_samples
        # the round's metrics from the user's fit (client_metrics.py), sent with the update (not under SecAgg)
        self.metrics: dict[str, float] = {}
        self.steps_per_epoch = steps_per_epoch
        self.downlink = payload(config.downlink, params, seed=config.seed, name=server, shapes=shapes)
        self.compress_uplink = config.uplink.strip() != "identity"
        self.feedback = ErrorFeedback(from_spec(config.uplink, shapes=shapes))
        self.phase = ClientPhase.IDLE
        self.round = -1  # the round being trained, or last trained
        self.anchor: torch.Tensor | None = None  # the global model of that round (FedProx's anchor)
        self.prox_mu = 0.0
        self.pending: RoundStart | None = None
        self.pending_result: RoundResult | None = None  # the end, heard while the trainer held params

    @property
    def accepts(self) -> frozenset[type[Message]]:
        return self.ACCEPTS if self.secure is None else self.ACCEPTS | self.secure.ACCEPTS

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        match event:
            case Received(sender=sender) if sender != self.server:
                self._refuse("not_server")
                return []
            case Received(message=RoundStart() as start):
                return self._round_start(start, now)
            case Received(message=SecAggMessage() as message) if self.secure is not None:
                return self._secure(self.secure.receive(message, now))
            case Received(message=RoundResult() as result):
                return self._result(result)
            case WorkDone():
                return self._work_done(now) if self.phase is ClientPhase.TRAINING else []
            case _:
                return []

    # ------------------------------------------------------------ a round

    def _secure(self, actions: list[Action]) -> list[Action]:
        assert self.secure is not None
        self.counters.update(self.secure.drain())
        return actions

    def _round_start(self, start: RoundStart, now: float) -> list[Action]:
        if self.phase is ClientPhase.FINISHED:
            self._refuse("after_finish")
            return []
        if start.round < self.round:  # the same round again: a restarted server, or FedBuff's same version
            self._refuse("old_round")
            return []
        if self.phase is ClientPhase.TRAINING:
            self.counters["round_start_while_training"] += 1
            self.pending = start
            return []
        steps = self._steps(start)
        if steps is None:
            self._refuse("bad_work")
            return []
        try:
            model = self.downlink.decode(start.tensors, start.meta)
        except BadParts as error:
            self.counters[f"refused_bad_model_{error.reason}"] += 1
            self._refuse("bad_model")
            return []
        self.params.copy_(model)
        self.anchor = model
        self.prox_mu = float(start.meta.get("prox_mu", 0.0))
        self.counters[self._work_kind(start.round)] += 1
        self.round = start.round
        self.phase = ClientPhase.TRAINING
        return [StartWork(steps), *(self._secure(self.secure.start(start, now)) if self.secure else [])]

    def _work_kind(self, round_index: int) -> str:
        """What training for ``round_index`` counts as: ``rounds_trained`` (a round not trained before:
        so never more than the rounds run), or ``rounds_retrained`` (the same round asked again, as a
        restarted gateway does). Under FedBuff every dispatch is new work, whatever its version."""
        if round_index > self.round or self.config.mode == "fedbuff":
            return "rounds_trained"
        return "rounds_retrained"

    def _steps(self, start: RoundStart) -> int | None:
        """The local work as optimiser steps, or None when the server asked for nothing sensible."""
        epochs, steps, mu = (start.meta.get(k, 0) for k in ("local_epochs", "local_steps", "prox_mu"))
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (epochs, steps)):
            return None
        if isinstance(mu, bool) or not isinstance(mu, int | float) or not 0.0 <= mu < float("inf"):
            return None
        assert isinstance(epochs, int) and isinstance(steps, int)
        work = steps if steps > 0 else epochs * self.steps_per_epoch
        return work if work > 0 else None

    def _work_done(self, now: float) -> list[Action]:
        assert self.anchor is not None
        delta = self.params.detach() - self.anchor
        self.phase = ClientPhase.IDLE
        actions: list[Action] = []
        if not encodable(delta, compressed=self.compress_uplink and self.secure is None):
            # a diverged trainer (or a norm past the operator's float32): the server would refuse it
            self.counters["nonfinite_update"] += 1
        elif self.secure is not None:
            actions += self._secure(self.secure.upload(self.round, delta, self.num_samples, now))
            self.counters["updates_sent"] += 1
        else:
            if self.compress_uplink:
                compressed = self.feedback.compress(delta, RngKey(self.config.seed, self.name, self.round))
                tensors, meta = pack(compressed, PREFIX)
                payload = {k: t.to("cpu") for k, t in tensors.items()}
            else:
                payload, meta = {"x": delta.to("cpu")}, {}
            meta = {**meta, **client_metrics.to_meta(self.metrics)}
            update = ClientUpdate(round=self.round, num_samples=self.num_samples, tensors=payload, meta=meta)
            actions.append(Send((self.server,), update))
            self.counters["updates_sent"] += 1
        if self.pending_result is not None:
            result, self.pending_result = self.pending_result, None
            return [*actions, *self._result(result)]
        if self.pending is not None:
            pending, self.pending = self.pending, None
            actions.extend(self._round_start(pending, now))
        return actions

    def _result(self, result: RoundResult) -> list[Action]:
        if self.phase is ClientPhase.FINISHED:
            return []
        if self.phase is ClientPhase.TRAINING:  # the trainer holds params: the end waits for WorkDone
            self.pending_result = result
            return []
        try:
            self.params.copy_(self.downlink.decode(result.tensors, result.meta))
        except BadParts as error:
            self.counters[f"refused_bad_model_{error.reason}"] += 1
            self._refuse("bad_model")
            return []
        self.phase = ClientPhase.FINISHED
        return [Finished()]

    # ------------------------------------------------------------ checkpoints

    def export_state(self) -> ProtocolState:
        """The error-feedback residual and the last round: a restarted client uploads what it owes."""
        tensors = {f"feedback/{k}": v for k, v in self.feedback.export_state().items()}
        meta: dict[str, Any] = {"name": self.name, "round": self.round,
                                "counters": dict(sorted(self.counters.items()))}
        return tensors, meta

    def restore_state(self, state: ProtocolState) -> None:
        tensors, meta = state
        if meta.get("name") != self.name:
            raise ValueError(f"client state of {meta.get('name')!r} does not fit {self.name!r}")
        prefix = "feedback/"
        self.feedback.restore_state({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
        self.round = int(meta["round"])
        self.counters = Counter({str(k): int(v) for k, v in meta["counters"].items()})
