"""The link model: shared NICs, per-link latency and bandwidth with FIFO queueing, loss, jitter, partitions.

A message of ``B`` bytes from ``src`` to ``dst`` passes three cut-through FIFO
stages, each serving messages in the order they were sent: ``src``'s uplink
(``NicSpec.uplink_mbps``, shared by its links), the directed link (its own
``bandwidth_mbps``, then ``latency_ms``), and ``dst``'s downlink
(``NicSpec.downlink_mbps``). Alone on an idle path a message takes
``8 B / min(U, R, D) + latency``; with unlimited NICs (the default) this is the
per-link model::

    start   = max(now, link_free_at)
    arrival = start + 8 B / R + latency_ms / 1000 (+ jitter)

Every stage is O(1) per message and decided at send time (so a downlink serves in
send order, not arrival order). Loss and jitter draws are counter-based (scenario
seed, link, message index on that link), so the same messages meet the same fate
whatever order the engine ran other work in. A lost message still used the
bandwidth along its way. A message across a cut edge of an active partition never
leaves, unless the partition models TCP (``retransmit_rto_s``): then it is held
until TCP's retransmission back-off lets the connection carry again, or lost with
a connection the transport dials afresh (``reconnect_after_s``). More:
docs/design/simulator.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from protocols.rng import derive_seed

_TWO_63 = float(2**63)
RTO_MAX_S = 120.0   # Linux's TCP_RTO_MAX: the retransmission timeout doubles up to this and no further


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
class NicSpec:
    """One member's network interface, shared by all of its links (graph node attributes, or the
    scenario's ``[nodes]`` table)."""

    uplink_mbps: float = math.inf    # unlimited: only each link's own bandwidth counts
    downlink_mbps: float = math.inf

    def __post_init__(self) -> None:
        for name in ("uplink_mbps", "downlink_mbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def _stage(free_at_s: float, rate_mbps: float, nbytes: int, first_bit_s: float,
           last_bit_s: float) -> tuple[float, float]:
    """(start, end) of a message on a cut-through FIFO stage free from ``free_at_s`` (see module doc)."""
    start_s = max(first_bit_s, free_at_s)
    return start_s, max(start_s + 8.0 * nbytes / (rate_mbps * 1e6), last_bit_s)


class NicQueue:
    """One direction of a member's NIC: a FIFO stage every link of that member shares."""

    def __init__(self, rate_mbps: float) -> None:
        self.rate_mbps = rate_mbps
        self.free_at_s = 0.0

    def carry(self, nbytes: int, first_bit_s: float, last_bit_s: float) -> tuple[float, float]:
        """When the message's first and last bit leave this NIC, given when they reach it."""
        start_s, self.free_at_s = _stage(self.free_at_s, self.rate_mbps, nbytes, first_bit_s, last_bit_s)
        return start_s, self.free_at_s


@dataclass(frozen=True, kw_only=True)
class PartitionSpec:
    """Cut some links between ``start_s`` and ``end_s`` (simulated seconds).

    ``groups``: members in different groups cannot talk (members named in no
    group form one more group together). ``edges``: these pairs cannot talk,
    in either direction. Give one or both.

    ``retransmit_rto_s`` > 0 models TCP connections rather than lost
    datagrams: nothing sent across the cut is lost, it is held, and a held
    connection carries again only at its sender's next retransmission after
    the heal. The timeout starts at ``retransmit_rto_s`` (Linux: a 200 ms
    floor on a LAN) at the connection's first message into the cut and
    doubles after each retransmission lost, up to Linux's ``TCP_RTO_MAX``
    (``RTO_MAX_S``, 120 s), so the link carries again at the first such
    retransmission at or after ``end_s`` (:meth:`resume_s`), and then
    delivers everything held, in order (the receiving machine drops what is
    stale), through the link alone: a held connection does not hold up its
    members' NICs for their other links. A connection that sent nothing into
    the cut was never held. 0: what is sent across the cut is dropped, and
    the links carry again at ``end_s``. ``reconnect_after_s`` (finite) models
    a transport that gives a silent connection up and dials afresh (ZeroMQ's
    ZMTP heartbeat timeout): ``reconnect_after_s`` after the first message
    (and up to ``reconnect_spread_s`` more, drawn per connection: ZeroMQ's
    heartbeat phase) into the cut the held connection is closed, and a new one carries at
    once if the partition has healed by then, else at the heal (the
    transport keeps dialling, at its reconnect interval); so the link carries again
    at the earlier of ``max(end_s, first + reconnect_after_s)`` and the
    retransmission. When the new connection comes first, what the old one
    held is lost with it (dropped, ``connection_reset``: a closed TCP
    connection's unsent bytes go with it; measured on the multi-host suite's
    split, every message sent into the cut was lost).
    """

    start_s: float           # simulated time the links are cut
    end_s: float = math.inf  # a partition that never heals unless told otherwise
    groups: tuple[tuple[str, ...], ...] = ()  # members in different groups cannot talk
    edges: tuple[tuple[str, ...], ...] = ()   # pairs of members that cannot talk, either way
    retransmit_rto_s: float = 0.0  # TCP's first retransmission timeout; 0: messages across are dropped
    reconnect_after_s: float = math.inf  # a held connection is dialled afresh after this long silent
    reconnect_spread_s: float = 0.0  # ... and up to this much later, drawn per connection (a timer's phase)

    def __post_init__(self) -> None:
        if not (self.start_s >= 0 and self.end_s > self.start_s):
            raise ValueError(f"a partition needs 0 <= start_s < end_s, got {self.start_s}..{self.end_s}")
        if not (math.isfinite(self.retransmit_rto_s) and self.retransmit_rto_s >= 0):
            raise ValueError(f"retransmit_rto_s must be >= 0, got {self.retransmit_rto_s}")
        if not self.reconnect_after_s > 0:
            raise ValueError(f"reconnect_after_s must be > 0, got {self.reconnect_after_s}")
        if not (math.isfinite(self.reconnect_spread_s) and self.reconnect_spread_s >= 0):
            raise ValueError(f"reconnect_spread_s must be >= 0, got {self.reconnect_spread_s}")
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

    def retransmit_s(self, first_s: float) -> float:
        """TCP's first retransmission at or after the heal, of a connection whose first message into
        the cut was at ``first_s``: the timeout doubles from ``retransmit_rto_s`` up to Linux's
        ``TCP_RTO_MAX`` (``RTO_MAX_S``) and stays there."""
        retransmit_s, timeout_s = first_s + self.retransmit_rto_s, self.retransmit_rto_s
        while retransmit_s < self.end_s:
            timeout_s = min(2.0 * timeout_s, RTO_MAX_S)
            retransmit_s += timeout_s
        return retransmit_s

    def redial_s(self, first_s: float, draw: float = 0.0) -> float:
        """When that connection's new one carries: ``reconnect_after_s`` plus ``draw`` (in [0, 1))
        of ``reconnect_spread_s`` after ``first_s``, or at the heal if that is later."""
        return max(self.end_s, first_s + self.reconnect_after_s + draw * self.reconnect_spread_s)

    def reconnects(self, first_s: float, draw: float = 0.0) -> bool:
        """Whether that connection is replaced by a fresh one (dialled before its retransmission
        carries): what it held is then lost with it."""
        if not self.retransmit_rto_s or math.isinf(self.end_s):
            return False
        return self.redial_s(first_s, draw) < self.retransmit_s(first_s)

    def resume_s(self, first_s: float, draw: float = 0.0) -> float:
        """When a connection whose first message into the cut was at ``first_s`` carries again
        (``draw``: where in ``reconnect_spread_s`` its redial falls, in [0, 1))."""
        if not self.retransmit_rto_s or math.isinf(self.end_s):
            return self.end_s
        return min(self.retransmit_s(first_s), self.redial_s(first_s, draw))

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
        _, last_bit_s = self.carry(nbytes, now_s, now_s)
        return self.in_order(last_bit_s + extra_delay_s)

    def carry(self, nbytes: int, first_bit_s: float, last_bit_s: float) -> tuple[float, float]:
        """When the message's first and last bit reach the far end, given when they are ready to go."""
        start_s, self.free_at_s = _stage(self.free_at_s, self.spec.bandwidth_mbps, nbytes, first_bit_s,
                                         last_bit_s)
        self.messages += 1
        self.bytes_sent += nbytes
        latency_s = self.spec.latency_ms / 1000.0
        return start_s + latency_s, self.free_at_s + latency_s

    def in_order(self, arrival_s: float) -> float:
        """``arrival_s``, or later: jitter must not reorder a FIFO stream (TCP delivers in order)."""
        arrival_s = max(arrival_s, self.last_arrival_s)
        self.last_arrival_s = arrival_s
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
        nics: Mapping[str, NicSpec] | None = None,
    ) -> None:
        self._specs = dict(links)
        self.default = default
        self.seed = seed
        self.partitions = tuple(partitions)
        self._links: dict[tuple[str, str], FifoLink] = {}
        self.dropped: Counter[str] = Counter()
        self.held = 0   # messages a partition with retransmit_rto_s held until its links carried again
        self._first_held: dict[tuple[int, str, str], float] = {}    # (partition, src, dst) -> first_s
        # Only limited NICs are stages; a member absent here (or unlimited) adds nothing to a path.
        nics = nics or {}
        self._uplinks = {name: NicQueue(nic.uplink_mbps) for name, nic in sorted(nics.items())
                         if math.isfinite(nic.uplink_mbps)}
        self._downlinks = {name: NicQueue(nic.downlink_mbps) for name, nic in sorted(nics.items())
                           if math.isfinite(nic.downlink_mbps)}

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

    def _held_until(self, src: str, dst: str, now_s: float) -> float:
        """When a message sent at ``now_s`` leaves, given partitions that hold rather than drop (the
        latest ``resume_s`` of those holding this link; ``now_s`` if none)."""
        leaves_s = now_s
        for index, partition in enumerate(self.partitions):
            if not (partition.retransmit_rto_s and partition.start_s <= now_s and partition.cuts(src, dst)):
                continue
            key = (index, src, dst)
            if key not in self._first_held and now_s < partition.end_s:
                self._first_held[key] = now_s
            if key in self._first_held:
                resumes_s = partition.resume_s(self._first_held[key], self._draw(index, src, dst))
                leaves_s = max(leaves_s, resumes_s)
        return leaves_s

    def _draw(self, index: int, src: str, dst: str) -> float:
        """Where in partition ``index``'s ``reconnect_spread_s`` this connection's redial falls."""
        return uniform(self.seed, f"{src}->{dst}", index, "redial")

    def _reconnects(self, src: str, dst: str, now_s: float) -> bool:
        """Whether a message held now is in a connection that is dialled afresh before it carries."""
        return any(partition.reconnects(first_s, self._draw(index, src, dst))
                   for index, partition in enumerate(self.partitions)
                   if (first_s := self._first_held.get((index, src, dst))) is not None
                   and partition.start_s <= now_s
                   and partition.resume_s(first_s, self._draw(index, src, dst)) > now_s)

    def transmit(self, src: str, dst: str, nbytes: int, now_s: float) -> Transfer:
        """Send ``nbytes`` from ``src`` to ``dst`` at ``now_s``: when it arrives, or why it never does."""
        if any(p.active(now_s) and p.cuts(src, dst) and not p.retransmit_rto_s for p in self.partitions):
            self.dropped["partitioned"] += 1
            return Transfer(None, "partitioned")
        leaves_s = self._held_until(src, dst, now_s)
        if leaves_s > now_s and self._reconnects(src, dst, now_s):
            # in the connection the transport gave up: lost with it, as ZeroMQ's closed TCP
            # connection takes its unsent bytes along (the new connection starts empty)
            self.dropped["connection_reset"] += 1
            return Transfer(None, "connection_reset")
        if leaves_s > now_s:
            # held in its own connection's buffer, not in the NICs' queues (which would make the
            # member's other connections wait for this one's retransmission): the link's FIFO only
            self.held += 1
            link = self.link(src, dst)
            _, last_bit_s = link.carry(nbytes, leaves_s, leaves_s)
            return Transfer(link.in_order(last_bit_s))
        link = self.link(src, dst)
        index = link.messages
        spec = link.spec
        jitter_s = 0.0
        if spec.jitter_ms > 0:
            jitter_s = spec.jitter_ms / 1000.0 * uniform(self.seed, f"{src}->{dst}", index, "jitter")
        arrival_s = self.arrival_s(src, dst, nbytes, now_s, jitter_s)
        if spec.loss > 0 and uniform(self.seed, f"{src}->{dst}", index, "loss") < spec.loss:
            self.dropped["lost"] += 1
            return Transfer(None, "lost")
        return Transfer(arrival_s)

    def arrival_s(self, src: str, dst: str, nbytes: int, now_s: float, extra_delay_s: float = 0.0) -> float:
        """When ``nbytes`` handed over at ``now_s`` reach ``dst``: ``src``'s uplink, the link, ``dst``'s
        downlink, plus ``extra_delay_s`` (no loss, no partitions: :meth:`transmit` decides those)."""
        link = self.link(src, dst)
        first_bit_s = last_bit_s = now_s
        uplink = self._uplinks.get(src)
        if uplink is not None:
            first_bit_s, last_bit_s = uplink.carry(nbytes, first_bit_s, last_bit_s)
        first_bit_s, last_bit_s = link.carry(nbytes, first_bit_s, last_bit_s)
        downlink = self._downlinks.get(dst)
        if downlink is not None:
            first_bit_s, last_bit_s = downlink.carry(nbytes, first_bit_s, last_bit_s)
        return link.in_order(last_bit_s + extra_delay_s)

    def traffic(self) -> list[tuple[str, str, int, int]]:
        """``(src, dst, messages, bytes)`` for every link that carried anything, sorted."""
        return [(src, dst, link.messages, link.bytes_sent)
                for (src, dst), link in sorted(self._links.items())]


def uniform(seed: int, name: str, index: int, purpose: str) -> float:
    """A counter-based uniform draw in [0, 1) keyed by (seed, name (a member or a link), index, purpose)."""
    return derive_seed(seed, name, index, purpose) / _TWO_63
