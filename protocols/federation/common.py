"""What both servers (synchronous FedAvg and FedBuff) and the client share as functions: who is
asked, how updates combine, the payload codec, and how counters become metrics (the servers' common
state and events are in server_base.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from protocols.events import Action, Event, Metric
from protocols.federation import aggregate, influence
from protocols.federation.config import FederationConfig
from protocols.gossip.payload import Payload
from protocols.rng import derive_seed


def sample(seed: int, draw: int, names: Iterable[str], count: int,
           purpose: str = "fed-sample") -> tuple[str, ...]:
    """``count`` of ``names`` chosen by a counter-based draw keyed by (seed, name, draw), sorted.

    Each name's score depends on the key alone (a rendezvous draw), never on the order the
    names were registered in, so both drivers ask the same clients; a client that registers
    or leaves changes the choice only where it would have been chosen itself."""
    ranked = sorted(set(names), key=lambda name: (derive_seed(seed, name, draw, purpose), name))
    return tuple(sorted(ranked[:max(0, count)]))


@dataclass(frozen=True)
class Combined:
    """A round's (a buffer's) aggregate delta, and the bounds its updates met on the way."""

    delta: torch.Tensor
    bounds: influence.Bounds


def combine(config: FederationConfig, updates: Mapping[str, tuple[torch.Tensor, int]],
            weights: Mapping[str, float] | None = None, voters: Mapping[str, str] | None = None) -> Combined:
    """The configured aggregate of ``{client: (delta, num_samples)}``, taken in client-name order
    (so ties and float sums do not depend on arrival order). Each update's influence is bounded
    first (influence.py: its claim capped, its delta clipped), then scaled by its ``weights`` entry
    (FedBuff's staleness discount; none: 1). ``voters``: the client of each update, where one
    client may send several (FedBuff's buffer): one vote each in the bounds' medians."""
    bounds = influence.bound_updates(updates, samples_multiple=config.samples_multiple,
                                     norm_multiple=config.norm_multiple, max_samples=config.max_samples,
                                     clip_norm=config.clip_norm, voters=voters)
    names = sorted(updates)
    deltas = [bounds.updates[name][0] * (1.0 if weights is None else weights[name]) for name in names]
    return Combined(_aggregate(config, deltas, [bounds.updates[name][1] for name in names]), bounds)


def _aggregate(config: FederationConfig, deltas: list[torch.Tensor], counts: list[int]) -> torch.Tensor:
    match config.aggregator:
        case "fedavg":
            return aggregate.fedavg(deltas, counts)
        case "mean":
            return aggregate.mean(deltas)
        case "median":
            return aggregate.median(deltas)
        case "trimmed_mean":
            return aggregate.trimmed_mean(deltas, config.trim_beta)
        case "krum":
            return aggregate.krum(deltas, config.byzantine)
        case _:
            selected = config.krum_selected or len(deltas) - config.byzantine
            return aggregate.multi_krum(deltas, config.byzantine, selected)


def payload(spec: str, params: torch.Tensor, *, seed: int, name: str,
            shapes: Sequence[tuple[int, ...]] | None) -> Payload:
    """The encoder/decoder of ``spec`` for vectors shaped like ``params`` (the gossip machines' own)."""
    return Payload(spec, numel=params.numel(), dtype=params.dtype, seed=seed, name=name,
                   device=params.device, shapes=shapes)


class Counted:
    """Counters by reason, reported as ``Metric`` actions (running totals) when they change."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()

    def handle(self, event: Event, now: float) -> list[Action]:
        """Feed one event; the actions to carry out, in order (changed counters last)."""
        before = dict(self.counters)
        actions = self._dispatch(event, now)
        for key in sorted(self.counters):
            if self.counters[key] != before.get(key, 0):
                actions.append(Metric(key, float(self.counters[key])))
        return actions

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        raise NotImplementedError

    def _refuse(self, reason: str) -> None:
        self.counters["refused_update"] += 1
        self.counters[f"refused_{reason}"] += 1

