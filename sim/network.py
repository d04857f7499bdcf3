"""The link model: latency, bandwidth with FIFO queueing, loss, jitter and partitions.

Every directed link ``src -> dst`` is a FIFO pipe. A message of ``B`` bytes
handed to it at ``now`` starts serialising when the link is free, takes
``8 B / R`` seconds at ``R`` bits per second, and arrives ``latency`` after
its last bit left::

    start   = max(now, link_free_at)
    arrival = start + 8 B / R + latency_ms / 1000 (+ jitter)

so a second message sent right behind the first waits for it. Loss and
jitter draws are counter-based (keyed by the scenario seed, the link and the
message's index on that link), never drawn from a shared generator, so the
same messages meet the same fate whatever order the engine ran other work
in. A lost message still used the link's bandwidth (it was sent); a message
sent across a cut edge of an active partition never leaves.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from protocols.rng import derive_seed

_TWO_63 = float(2**63)


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One directed link's properties (a scenario's ``[links]`` table gives the defaults)."""

    latency_ms: float = 1.0        # a LAN round trip is ~0.2-2 ms; WAN figures go in the scenario
    bandwidth_mbps: float = 1000.0  # 1 Gbit/s, a common NIC
    loss: float = 0.0              # probability a whole message is lost (TCP hides packet loss)
    jitter_ms: float = 0.0         # extra delay drawn uniformly from [0, jitter_ms] per message

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if not (math.isfinite(self.bandwidth_mbps) and self.bandwidth_mbps > 0):
            raise ValueError(f"bandwidth_mbps must be > 0, got {self.bandwidth_mbps}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        if not (math.isfinite(self.jitter_ms) and self.jitter_ms >= 0):
            raise ValueError(f"jitter_ms must be >= 0, got {self.jitter_ms}")

    def serialisation_s(self, nbytes: int) -> float:
        """Seconds to push ``nbytes`` onto this link (8 B / R)."""
        return 8.0 * nbytes / (self.bandwidth_mbps * 1e6)


@dataclass(frozen=True, kw_only=True)
class PartitionSpec:
    """Cut some links between ``start_s`` and ``end_s`` (simulated seconds).

    ``groups``: members in different groups cannot talk (members named in no
    group form one more group together). ``edges``: these pairs cannot talk,
    in either direction. Give one or both.
    """

    start_s: float
    end_s: float = math.inf  # a partition that never heals unless told otherwise
    groups: tuple[tuple[str, ...], ...] = ()
    edges: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if not (self.start_s >= 0 and self.end_s > self.start_s):
            raise ValueError(f"a partition needs 0 <= start_s < end_s, got {self.start_s}..{self.end_s}")
        if not self.groups and not self.edges:
            raise ValueError("a partition needs 'groups' or 'edges'")
        for edge in self.edges:
            if len(edge) != 2:
                raise ValueError(f"a partition edge is a pair of names, got {list(edge)}")
        seen: set[str] = set()
        for group in self.groups:
            for name in group:
                if name in seen:
                    raise ValueError(f"member {name!r} is in two partition groups")
                seen.add(name)

    def active(self, now_s: float) -> bool:
        return self.start_s <= now_s < self.end_s

    def cuts(self, src: str, dst: str) -> bool:
        """Whether this partition (when active) separates ``src`` from ``dst``."""
        if (src, dst) in self._edge_set or (dst, src) in self._edge_set:
            return True
        if self.groups:
            return self._group_of(src) != self._group_of(dst)
        return False

    @cached_property
    def _edge_set(self) -> set[tuple[str, str]]:
        return {(edge[0], edge[1]) for edge in self.edges}

    def _group_of(self, name: str) -> int:
        for index, group in enumerate(self.groups):
            if name in group:
                return index
        return len(self.groups)

    def names(self) -> list[str]:
        """Every member this partition names (to check them against the roster)."""
        return sorted({n for g in self.groups for n in g} | {n for e in self.edges for n in e})


class FifoLink:
    """One FIFO pipe: serialisation at the link rate, then latency."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.free_at_s = 0.0
        self.last_arrival_s = 0.0
        self.messages = 0
        self.bytes_sent = 0

    def send(self, nbytes: int, now_s: float, extra_delay_s: float = 0.0) -> float:
        """Queue ``nbytes`` at ``now_s``; return the arrival time (FIFO order is kept)."""
        start_s = max(now_s, self.free_at_s)
        self.free_at_s = start_s + self.spec.serialisation_s(nbytes)
        arrival_s = self.free_at_s + self.spec.latency_ms / 1000.0 + extra_delay_s
        # Jitter must not reorder a FIFO stream (TCP delivers in order).
        arrival_s = max(arrival_s, self.last_arrival_s)
        self.last_arrival_s = arrival_s
        self.messages += 1
        self.bytes_sent += nbytes
        return arrival_s


@dataclass(frozen=True)
class Transfer:
    """The fate of one message on one link: ``arrival_s``, or ``dropped`` with a reason."""

    arrival_s: float | None
    dropped: str | None = None


class Network:
    """All directed links between members, with defaults for pairs the graph does not describe."""

    def __init__(
        self,
        links: Mapping[tuple[str, str], LinkSpec],
        *,
        default: LinkSpec,
        seed: int,
        partitions: Sequence[PartitionSpec] = (),
    ) -> None:
        self._specs = dict(links)
        self.default = default
        self.seed = seed
        self.partitions = tuple(partitions)
        self._links: dict[tuple[str, str], FifoLink] = {}
        self.dropped: Counter[str] = Counter()

    def spec(self, src: str, dst: str) -> LinkSpec:
        return self._specs.get((src, dst), self.default)

    def link(self, src: str, dst: str, spec: LinkSpec | None = None) -> FifoLink:
        """The FIFO pipe ``src -> dst``, made on first use (with ``spec`` if given, else the link's own)."""
        key = (src, dst)
        found = self._links.get(key)
        if found is None:
            found = self._links[key] = FifoLink(spec or self.spec(src, dst))
        return found

    def partitioned(self, src: str, dst: str, now_s: float) -> bool:
        return any(p.active(now_s) and p.cuts(src, dst) for p in self.partitions)

    def transmit(self, src: str, dst: str, nbytes: int, now_s: float) -> Transfer:
        """Send ``nbytes`` from ``src`` to ``dst`` at ``now_s``: when it arrives, or why it never does."""
        if self.partitioned(src, dst, now_s):
            self.dropped["partitioned"] += 1
            return Transfer(None, "partitioned")
        link = self.link(src, dst)
        index = link.messages
        spec = link.spec
        jitter_s = 0.0
        if spec.jitter_ms > 0:
            jitter_s = spec.jitter_ms / 1000.0 * uniform(self.seed, f"{src}->{dst}", index, "jitter")
        arrival_s = link.send(nbytes, now_s, jitter_s)
        if spec.loss > 0 and uniform(self.seed, f"{src}->{dst}", index, "loss") < spec.loss:
            self.dropped["lost"] += 1
            return Transfer(None, "lost")
        return Transfer(arrival_s)

    def traffic(self) -> list[tuple[str, str, int, int]]:
        """``(src, dst, messages, bytes)`` for every link that carried anything, sorted."""
        return [(src, dst, link.messages, link.bytes_sent)
                for (src, dst), link in sorted(self._links.items())]


def uniform(seed: int, name: str, index: int, purpose: str) -> float:
    """A counter-based uniform draw in [0, 1) keyed by (seed, name (a member or a link), index, purpose)."""
    return derive_seed(seed, name, index, purpose) / _TWO_63
