"""What both servers (synchronous FedAvg, server.py; FedBuff, fedbuff.py) do alike, in one base class.

Each holds the flat global model ``params`` it updates in place, the clients registered (the
roster's, and those its Node says are up), the uplink and downlink payloads, the server
optimiser's state and each client's last contact. Each is told a client is up
(``NeighbourUp``: registered) or gone (``NeighbourDown``), takes ``ClientUpdate`` messages, and
checkpoints the model, the optimiser, the clients and its counters. How rounds open and close
is each subclass's own (``_start``, ``_timer``, ``_update``, ``_extra_status``, ``_export_meta`` and
``_restore_meta``).

After the end. A finished server sends every registered client the final ``RoundResult``;
a client that was away then (or whose copy was lost) would wait for a round that never comes.
So a finished server answers a client that registers (``NeighbourUp``) or sends an update with
that same ``RoundResult`` (counted ``final_answers``); the update is still refused
(``after_finish``). A client is answered at most once per ``round_timeout_s`` (a request within
that time after its last copy is counted ``final_answer_limited``): a lost copy is sent again
after the time a round may take, while a client that floods the finished server gets no more
models than a running federation that asks it in every round sends it (a round lasts at most
``round_timeout_s``), so the answer amplifies nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from protocols.compress import BadParts
from protocols.events import (
    Action,
    Event,
    NeighbourDown,
    NeighbourUp,
    ProtocolState,
    Received,
    Send,
    Start,
    TimerFired,
)
from protocols.federation.common import Combined, Counted, combine, payload
from protocols.federation.config import FederationConfig
from protocols.federation.server_opt import OptState
from protocols.messages import ClientUpdate, Message, RoundResult, Scalar

SERVER_ROLE = "fedavg"  # the role a gateway's server (either mode) holds on its Node and in its checkpoint
OPT_PREFIX = "opt/"  # the server optimiser's tensors in a checkpoint, beside "params"


class FederationServer(Counted):
    """The part of a federation server that does not depend on how its rounds run."""

    ACCEPTS: frozenset[type[Message]] = frozenset({ClientUpdate})
    MODE = ""  # the config's ``mode`` a subclass runs (also written in its checkpoints)

    def __init__(self, config: FederationConfig, *, name: str, params: torch.Tensor, clients: Sequence[str],
                 shapes: Sequence[tuple[int, ...]] | None, other: str) -> None:
        """``other``: the class to name when ``config.mode`` is not this one's."""
        super().__init__()
        if config.mode != self.MODE:
            raise ValueError(f"{type(self).__name__} runs mode {self.MODE!r}, not {config.mode!r} "
                             f"(use {other})")
        if params.dim() != 1 or not params.is_floating_point():
            raise ValueError(f"params must be a flat 1-D float tensor, got {tuple(params.shape)}")
        self.config = config
        self.name = name
        self.params = params
        self.registered: set[str] = set(clients)
        self.uplink = payload(config.uplink, params, seed=config.seed, name=name, shapes=shapes)
        self.downlink = payload(config.downlink, params, seed=config.seed, name=name, shapes=shapes)
        self.opt_state: OptState = {}
        self.last_contact_s: dict[str, float] = {}
        self.final: RoundResult | None = None  # the end's message, once finished (see the module docstring)
        self.final_sent_s: dict[str, float] = {}  # client -> when it was last sent ``final``

    @property
    def accepts(self) -> frozenset[type[Message]]:
        return self.ACCEPTS

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------ membership

    def register(self, client: str, now: float) -> list[Action]:
        """A client may be asked from now on (a finished server answers it with the end)."""
        self.registered.add(client)
        if self.finished:
            return self._answer_final(client, now)
        return self._registered(now)

    def unregister(self, client: str) -> None:
        """Not asked again; work it holds runs out at its deadline."""
        self.registered.discard(client)

    def forget_registrations(self) -> None:
        """Restored from a checkpoint into a new process: its clients' connections are new, so each
        registers again as it is heard; a round opened for the old registrations would go to
        nobody and wait out its deadline. (The daemon and the simulator restore a gateway so.)"""
        for client in sorted(self.registered):
            self.unregister(client)

    def status(self) -> dict[str, Any]:
        """What a gateway's status shows now (JSON-able); the rounds closed are in ``reports``."""
        return {"mode": self.MODE, "phase": self._phase_name(), "round": self._round_now(),
                "registered": sorted(self.registered), **self._extra_status(),
                "last_contact_s": dict(sorted(self.last_contact_s.items()))}

    # ------------------------------------------------------------ events

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        match event:
            case Start():
                return self._start(now)
            case Received(sender=sender, message=ClientUpdate() as update):
                self.last_contact_s[sender] = now
                if self.finished:
                    self._refuse("after_finish")
                    return self._answer_final(sender, now)
                return self._update(sender, update, now)
            case TimerFired(key=key):
                return self._timer(key, now)
            case NeighbourUp(name=client):
                return self.register(client, now)
            case NeighbourDown(name=client, left=left):
                self.unregister(client)
                return self._left(client, now) if left and not self.finished else []
            case _:
                return []

    def _bad_num_samples(self, update: ClientUpdate) -> bool:
        count = update.num_samples
        return isinstance(count, bool) or not isinstance(count, int) or count < 1

    def _decode(self, update: ClientUpdate) -> torch.Tensor | None:
        """The update's delta, or None when it is malformed (counted ``refused_bad_update_<why>``;
        the caller refuses it ``bad_update``)."""
        try:
            return self.uplink.decode(update.tensors, update.meta)
        except BadParts as error:
            self.counters[f"refused_bad_update_{error.reason}"] += 1
            return None

    def _combine(self, updates: Mapping[str, tuple[torch.Tensor, int]],
                 weights: Mapping[str, float] | None = None,
                 voters: Mapping[str, str] | None = None) -> Combined:
        """The updates' aggregate (common.combine), each bounded first; what was bounded is counted
        ``bounded_<reason>`` (influence.py: ``samples_median``, ``samples_max``, ``norm_median``,
        ``norm_fixed``)."""
        combined = combine(self.config, updates, weights, voters)
        for reason, count in combined.bounds.bounded.items():
            self.counters[f"bounded_{reason}"] += count
        return combined

    # ------------------------------------------------------------ the end

    def _finish(self, now: float, tensors: dict[str, torch.Tensor], meta: dict[str, Scalar]) -> list[Action]:
        """The federation is over: ``final`` (the model encoded as ``tensors``, ``meta``) goes to every
        registered client (the ``Finished`` after it is the caller's)."""
        self.final = RoundResult(round=self._round_now(), tensors=dict(tensors), meta=dict(meta))
        clients = tuple(sorted(self.registered))
        self.final_sent_s.update(dict.fromkeys(clients, now))
        return [Send(clients, self.final)] if clients else []

    def _model_message(self) -> tuple[dict[str, torch.Tensor], dict[str, Scalar]] | None:
        """The global model as the downlink sends it (tensors, meta); None when it cannot be (its values,
        or through a lossy spec its norm, not finite: an update without a bound overflowed it), counted
        ``model_unsendable``: the round then asks without a model, and no final model goes out."""
        if not self.downlink.encodable(self.params):
            self.counters["model_unsendable"] += 1
            return None
        tensors, meta, _ = self.downlink.encode(self.params, self._round_now())
        return tensors, meta

    def _answer_final(self, client: str, now: float) -> list[Action]:
        """The end again, for one client that asked after it (at most once per ``round_timeout_s``)."""
        sent = self.final_sent_s.get(client)
        if sent is not None and now - sent < self.config.round_timeout_s:
            self.counters["final_answer_limited"] += 1
            return []
        if self.final is None:  # restored finished: the checkpoint holds the final model
            model = self._model_message()
            if model is None:
                return []
            self.final = RoundResult(round=self._round_now(), tensors=dict(model[0]), meta=dict(model[1]))
        self.final_sent_s[client] = now
        self.counters["final_answers"] += 1
        return [Send((client,), self.final)]

    # ------------------------------------------------------------ checkpoints

    def export_state(self) -> ProtocolState:
        """The global model, the optimiser's state, the clients and the counters, and what the
        subclass keeps (``_export_meta``)."""
        tensors = {"params": self.params.detach().clone(),
                   **{f"{OPT_PREFIX}{k}": v.detach().clone() for k, v in self.opt_state.items()}}
        meta: dict[str, Any] = {"mode": self.MODE, "name": self.name, **self._export_meta(),
                                "finished": self.finished, "registered": sorted(self.registered),
                                "counters": dict(sorted(self.counters.items()))}
        return tensors, meta

    def restore_state(self, state: ProtocolState) -> None:
        """Continue from ``export_state`` (before ``Start``)."""
        tensors, meta = state
        if meta.get("mode") != self.MODE or meta.get("name") != self.name:
            raise ValueError(f"server state of {meta.get('mode')!r}/{meta.get('name')!r} does not fit "
                             f"{self.MODE}/{self.name!r}")
        self.params.copy_(tensors["params"])
        self.opt_state = {k[len(OPT_PREFIX):]: v.to(self.params) for k, v in tensors.items()
                          if k.startswith(OPT_PREFIX)}
        self.registered = set(meta["registered"])
        self.counters = Counter({str(k): int(v) for k, v in meta["counters"].items()})
        self._restore_meta(meta, finished=bool(meta["finished"]))

    # ------------------------------------------------------------ what each server does its own way

    def _phase_name(self) -> str:
        raise NotImplementedError

    def _round_now(self) -> int:
        """The round (FedBuff: the model version) the server is at."""
        raise NotImplementedError

    def _registered(self, now: float) -> list[Action]:
        """A client registered while not finished: what that starts (a round waiting for clients)."""
        raise NotImplementedError

    def _start(self, now: float) -> list[Action]:
        raise NotImplementedError

    def _timer(self, key: str, now: float) -> list[Action]:
        raise NotImplementedError

    def _update(self, sender: str, update: ClientUpdate, now: float) -> list[Action]:
        """A ``ClientUpdate`` while not finished."""
        raise NotImplementedError

    def _left(self, client: str, now: float) -> list[Action]:
        """``client`` said it leaves (it stopped) while not finished: what that changes now (work it
        holds runs out at its deadline unless the server says otherwise)."""
        return []

    def _extra_status(self) -> dict[str, Any]:
        return {}

    def _export_meta(self) -> dict[str, Any]:
        raise NotImplementedError

    def _restore_meta(self, meta: dict[str, Any], *, finished: bool) -> None:
        raise NotImplementedError
