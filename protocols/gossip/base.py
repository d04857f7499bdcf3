"""What every gossip machine shares: the round schedule (training rounds, then the final
gossip rounds), counters reported as metrics, the insider filter, the optional outer
optimiser, buffered messages in checkpoints, and the Topology it reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import torch

from protocols.errors import HivemeshError
from protocols.events import Action, Event, Metric, ProtocolState
from protocols.gossip.config import GossipConfig
from protocols.gossip.diloco import OuterNesterov
from protocols.gossip.payload import Payload
from protocols.gossip.robust import NormFilter, Report
from protocols.messages import Message, ParamPush
from topology.membership import GraphView


class Phase(Enum):
    IDLE = "idle"  # before Start
    WORKING = "working"  # StartWork issued: the parameters belong to the trainer until WorkDone
    WAITING = "waiting"  # work done, waiting for neighbours (a deadline timer is set)
    FINISHED = "finished"


class MachineBase:
    """Shared plumbing; subclasses implement ``_dispatch`` and their own state."""

    JOINABLE = True  # False: join_at refuses (the algorithm's shared state cannot be handed over)
    SENDS_OWN_PARAMS = False  # True: an uncompressed message is the sender's parameter vector itself
    SUGGESTED_COMPRESSION = "identity"  # what a new network's config starts from (`hivemesh init`)
    ACCEPTS: frozenset[type[Message]] = frozenset({ParamPush})  # the message kinds it takes (Node routing)

    def __init__(self, config: GossipConfig, *, name: str, topology: GraphView, params: torch.Tensor,
                 seed: int, shapes: Sequence[tuple[int, ...]] | None = None) -> None:
        if name not in topology.names:
            raise ValueError(f"{name!r} is not a member of the topology ({len(topology.names)} members)")
        if params.dim() != 1 or not params.is_floating_point():
            raise ValueError(f"params must be the trainer's flat 1-D float tensor, got {tuple(params.shape)}")
        self.config = config
        self.name = name
        self.topology = topology
        self.params = params
        self.seed = seed
        self.payload = Payload(config.compression, numel=params.numel(), dtype=params.dtype, seed=seed,
                               name=name, device=params.device, shapes=shapes)
        self.filter = NormFilter(config.norm_multiple, owner=name)
        self.outer = (OuterNesterov(params, lr=config.outer_lr, momentum=config.outer_momentum,
                                    every=config.outer_every) if config.outer == "diloco" else None)
        self.counters: Counter[str] = Counter()
        self._gauges_sent: dict[str, float] = {}
        self._reset_schedule(0, 0)

    def _reset_schedule(self, round_index: int, steps_done: int) -> None:
        """The round schedule at the start of ``round_index`` (IDLE, before Start)."""
        self.phase = Phase.IDLE
        self.round = round_index
        self.steps_done = steps_done
        self.round_steps = 0  # local steps of the current round (0 in a gossip-only round)
        self.training_over = False
        self.final_done = 0  # gossip-only rounds started
        self.start_s: float | None = None
        self.timer_set = False
        self.down: set[str] = set()  # NeighbourDown: not waited for until NeighbourUp

    # ------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[Action]:
        """Feed one event; returns the actions to carry out, in order (counter changes last)."""
        before = dict(self.counters)
        actions = self._dispatch(event, now)
        for key in sorted(self.counters):
            if self.counters[key] != before.get(key, 0):
                actions.append(Metric(key, float(self.counters[key])))
        for key, value in sorted(self.gauges().items()):
            if self._gauges_sent.get(key) != value:
                self._gauges_sent[key] = value
                actions.append(Metric(key, value))
        return actions

    def gauges(self) -> dict[str, float]:
        """Settings the machine chose or changed while running (reported as metrics when they change)."""
        return {}

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        raise NotImplementedError

    def export_state(self) -> ProtocolState:
        """The whole protocol state: named tensors (copies) plus JSON-able meta."""
        raise NotImplementedError

    def restore_state(self, state: ProtocolState) -> None:
        """Continue exactly where ``export_state`` was taken (same config, name and topology)."""
        raise NotImplementedError

    # ------------------------------------------------------------ what a driver or the Node asks

    @property
    def position(self) -> tuple[int, int]:
        """(round, steps_done): the schedule position, read without exporting the state (which
        copies every tensor the machine holds)."""
        return self.round, self.steps_done

    @property
    def accepts(self) -> frozenset[type[Message]]:
        """The message kinds this machine takes; the Node counts any other it would have to route here."""
        return self.ACCEPTS

    @property
    def joinable(self) -> bool:
        """Whether a state sync can hand this algorithm a neighbour's state (``join_at``)."""
        return self.JOINABLE

    def join_at(self, round_index: int, steps_done: int) -> None:
        """Continue as a member that adopted a neighbour's parameters (state sync).

        The caller has copied the neighbour's parameters into ``params``; the machine goes back to
        IDLE at the start of ``round_index`` with ``steps_done`` local steps counted and nothing
        buffered; feed ``Start`` next. Raises HivemeshError when the algorithm is not ``joinable``.
        """
        if not self.joinable:
            raise HivemeshError(f"algorithm {self.config.algorithm!r} cannot join by state sync: "
                                "restart the run, or use dpsgd, local, pushsum or adpsgd")
        if round_index < 0 or steps_done < 0:
            raise ValueError(f"join_at needs round_index, steps_done >= 0, not {round_index}, {steps_done}")
        self._reset_schedule(round_index, steps_done)
        self._forget_exchanges()
        if self.outer is not None:
            self.outer.rebase(self.params, steps_done)
        self._joined()

    def set_graph(self, topology: GraphView) -> None:
        """Membership changed while running: ``topology`` answers for every round from now on
        (topology/membership.py: the old graph before the change's round, the new one from it).
        Raises HivemeshError when the algorithm cannot follow a change without a restart."""
        if self.name not in topology.names:
            raise ValueError(f"{self.name!r} is not a member of the new graph")
        if topology.directed != self.topology.directed:
            raise HivemeshError("a membership change cannot change whether the graph is directed")
        previous, self.topology = self.topology, topology
        try:
            self._graph_changed()
        except HivemeshError:
            self.topology = previous
            raise

    def _graph_changed(self) -> None:
        """``set_graph``: recompute what was derived from the graph at construction."""

    def _forget_exchanges(self) -> None:
        """``join_at``: drop what was buffered or in flight for the rounds left behind."""

    def _joined(self) -> None:
        """``join_at``: reset the algorithm's own state for the adopted parameters."""

    def sender_params(self, message: Message) -> torch.Tensor | None:
        """The sender's own parameters (its whole mixed vector, flat) when ``message`` carries them
        uncompressed, else None: compressed values, push-sum shares and CHOCO's differences are
        not the sender's parameters. The driver's consensus estimate reads this, so it never
        needs to know which algorithm sends what."""
        if not self.SENDS_OWN_PARAMS or self.config.compressed or not isinstance(message, ParamPush):
            return None
        numel = self.params.numel()
        for tensor in message.tensors.values():
            if tensor.is_floating_point() and tensor.numel() == numel:
                return tensor.detach().reshape(-1)
        return None

    def notes(self) -> list[str]:
        """What an operator should read at start-up (settings the machine chose, and why)."""
        return []

    def warnings(self) -> list[str]:
        """What an operator must not miss now (a setting the machine had to change while running)."""
        if self.counters["nonfinite_params"]:
            return [f"own parameters not finite (or past the compression's range) in "
                    f"{self.counters['nonfinite_params']} round(s) (not sent)"]
        return []

    @property
    def last_round(self) -> int:
        """The highest round any honest member can be in or send: the training rounds
        (``ceil(total_steps / local_steps)``) then the final gossip rounds. A message for a later
        (or a negative) round is impossible, whoever signed it: it is counted ``bad_round``, never
        followed. A round within the schedule may still be forged (a member's valid message for
        ``last_round``): how far such a claim moves a peer is bounded by its sender's reach, or
        needs confirming in-neighbours (protocols/gossip/catchup.py).
        """
        config = self.config
        return -(-config.total_steps // config.local_steps) + config.final_gossip_rounds - 1

    # ------------------------------------------------------------ schedule

    def _time_up(self, now: float) -> bool:
        limit = self.config.duration_s
        return limit > 0 and self.start_s is not None and now - self.start_s >= limit

    def _schedule_round(self, now: float, *, can_gossip: bool = True) -> bool:
        """Set ``round_steps`` for the round starting now: local steps while training lasts
        (``total_steps`` or ``duration_s``), then ``final_gossip_rounds`` gossip-only rounds.
        False (phase FINISHED) when those are done, or at once when ``can_gossip`` is False."""
        config = self.config
        if self.steps_done >= config.total_steps or self._time_up(now):
            self.training_over = True
        if self.training_over:
            if self.final_done >= config.final_gossip_rounds or not can_gossip:
                self.phase = Phase.FINISHED
                return False
            self.final_done += 1
            self.round_steps = 0
        else:
            self.round_steps = min(config.local_steps, config.total_steps - self.steps_done)
        return True

    # ------------------------------------------------------------ helpers

    def _distance(self, a: torch.Tensor, b: torch.Tensor | None = None) -> float:
        """||a - b|| (or ||a||) for the insider filter; 0 when the filter is off (no pass over memory)."""
        if self.config.norm_multiple == 0:
            return 0.0
        return float(torch.linalg.vector_norm(a) if b is None else torch.dist(a, b))

    def _own_copy(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """A restored tensor as a fresh copy on the parameters' device and dtype."""
        if tensor is None:
            return None
        return tensor.to(device=self.params.device, dtype=self.params.dtype, copy=True)

    def _count(self, key: str, n: int = 1) -> None:
        if n:
            self.counters[key] += n

    def _sendable(self, own: torch.Tensor) -> bool:
        """Whether our own values can go out: non-finite ones (a diverged trainer), or ones whose norm
        overflows the operator's float32 norms (Payload.encodable), are counted and never sent, since
        a neighbour would refuse them and mixing them would spread the damage."""
        if self.payload.encodable(own):
            return True
        self._count("nonfinite_params")
        return False

    def _reject(self, reason: str) -> None:
        """An update refused before the filter's screen (malformed, non-finite...)."""
        self.counters["rejected_update"] += 1
        self.counters[f"rejected_{reason}"] += 1

    def _screen(self, norms: Sequence[float], senders: Sequence[str], own_norm: float,
                origin: torch.Tensor, reports: Sequence[Report] | None = None) -> list[bool]:
        """The insider filter's verdict on ``norms`` from ``senders``, each judged against the other
        senders (see robust.py); distances are measured from ``origin`` (our own value), whose norm
        is the reference when nothing else gives one. ``reports``: the senders' far reports, the
        evidence that lets a far half back in after a split (counted in ``far_corroborated``)."""
        verdict = self.filter.screen(norms, own_norm, scale=lambda: self._distance(origin), senders=senders,
                                     reports=reports)
        self._count("rejected_update", verdict.count(False))
        self._count("far_corroborated", self.filter.corroborated)
        return verdict

    def _outer_step(self) -> bool:
        """Run the outer optimiser after a round; True when it replaced the parameters."""
        return self.outer is not None and self.outer.after_round(self.steps_done, self.params)

    # ------------------------------------------------------------ checkpoints

    def _export_common(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {
            "algorithm": self.config.algorithm,
            "name": self.name,
            "steps_done": self.steps_done,
            "counters": dict(sorted(self.counters.items())),
            "norm_history": self.filter.export(),
            "norm_report": self.filter.export_report(),
            "phase": self.phase.value,
            "round": self.round,
            "round_steps": self.round_steps,
            "training_over": self.training_over,
            "final_done": self.final_done,
            "start_s": self.start_s,
            "timer_set": self.timer_set,
            "down": sorted(self.down),
            "gauges_sent": dict(sorted(self._gauges_sent.items())),   # so a restore re-sends none
        }
        if self.outer is not None:
            outer_tensors, outer_meta = self.outer.export()
            tensors.update(outer_tensors)
            meta.update(outer_meta)
        tensors.update({f"compressor/{k}": v.clone() for k, v in self.payload.export_state().items()})
        return tensors, meta

    def _restore_common(self, state: ProtocolState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = state
        if meta.get("algorithm") != self.config.algorithm or meta.get("name") != self.name:
            raise ValueError(f"protocol state of {meta.get('algorithm')!r}/{meta.get('name')!r} cannot be "
                             f"restored into {self.config.algorithm!r}/{self.name!r}")
        self.steps_done = int(meta["steps_done"])
        self.counters = Counter({str(k): int(v) for k, v in meta["counters"].items()})
        self.filter.restore(meta["norm_history"])
        self.filter.restore_report(meta.get("norm_report", {}))
        self.phase = Phase(meta["phase"])
        self.round = int(meta["round"])
        self.round_steps = int(meta["round_steps"])
        self.training_over = bool(meta["training_over"])
        self.final_done = int(meta["final_done"])
        self.start_s = None if meta["start_s"] is None else float(meta["start_s"])
        self.timer_set = bool(meta["timer_set"])
        self.down = set(meta["down"])
        self._gauges_sent = {str(k): float(v) for k, v in meta.get("gauges_sent", {}).items()}
        if self.outer is not None:
            self.outer.restore(dict(tensors), meta)
        prefix = "compressor/"
        self.payload.restore_state({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
        return dict(tensors), dict(meta)


# ------------------------------------------------------------ messages in checkpoints


def export_messages(prefix: str, entries: Sequence[tuple[str, ParamPush]],
                    tensors: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Buffered (sender, message) pairs as JSON entries plus tensors named ``prefix/i/name``."""
    out: list[dict[str, Any]] = []
    for i, (sender, message) in enumerate(entries):
        names = sorted(message.tensors)
        for tname in names:
            tensors[f"{prefix}/{i}/{tname}"] = message.tensors[tname].clone()
        out.append({"sender": sender, "round": message.round, "meta": dict(message.meta),
                    "want_reply": message.want_reply, "tensors": names})
    return out


def restore_messages(prefix: str, entries: Sequence[Mapping[str, Any]],
                     tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, ParamPush]]:
    out: list[tuple[str, ParamPush]] = []
    for i, entry in enumerate(entries):
        message = ParamPush(round=int(entry["round"]),
                            tensors={t: tensors[f"{prefix}/{i}/{t}"].clone() for t in entry["tensors"]},
                            meta=dict(entry["meta"]), want_reply=bool(entry["want_reply"]))
        out.append((str(entry["sender"]), message))
    return out
