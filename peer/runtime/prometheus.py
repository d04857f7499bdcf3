"""An opt-in Prometheus endpoint for one peer (``[peer] metrics_port``, ``hivemesh peer --metrics-port``).

The collector reads the daemon's latest status snapshot at each scrape, so the
endpoint and ``status.json`` show the same numbers from one bookkeeping. Names,
types, help texts and units come from ``peer.files.fields``; every number of
the snapshot becomes a sample (``hivemesh_bytes_sent_total{neighbour="p01"}``,
``hivemesh_rejections_total{reason="bad_signature"}``, ``hivemesh_gossip_round``, ...),
in base units (seconds, bytes) as Prometheus' conventions ask. The collector
lives in its own registry, not the library's global one: two peers in one
process (the tests, the simulator one day) never mix.
"""

from __future__ import annotations

import errno
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from peer.files.fields import FIELDS_BY_KEY, MACHINE_GAUGE_WORDS, SNAPSHOT_FIELDS, Field, field_for
from protocols.errors import HivemeshError

PREFIX = "hivemesh"
# units the snapshot keeps for people, converted to Prometheus' base units
TO_BASE_UNIT: dict[str, tuple[str, float]] = {"s": ("seconds", 1.0), "ms": ("seconds", 1e-3),
                                              "bytes": ("bytes", 1.0)}
NO_SNAPSHOT: Mapping[str, Any] = {}
# stamps of the files, not numbers of the peer
SNAPSHOT_ONLY = ("time", "updated_at")
# the numbers each neighbour's entry carries, one family each, labelled by neighbour
NEIGHBOUR_NUMBERS = tuple(field for field in SNAPSHOT_FIELDS if field.key.startswith("neighbours.*.")
                          and field.kind not in ("text", "nested"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    if value == "inf":      # how the snapshot's JSON writes an infinite number (a DP run's epsilon)
        return math.inf
    return None


def metric_name(field: Field, key: str = "") -> str:
    """The family name of ``field`` (or of ``key`` under it), in base units and without ``_total``
    (the client adds it to a counter's samples): ``uptime_s`` -> ``hivemesh_uptime_seconds``."""
    unit = TO_BASE_UNIT.get(field.unit, ("", 1.0))[0]
    stem = (key or field.prometheus or field.key).removesuffix("_s").removesuffix("_ms").replace(".", "_")
    if unit and unit not in stem.split("_"):    # bytes_sent names its unit already
        stem = f"{stem}_{unit}"
    return f"{PREFIX}_{stem}"


def sample_key(path: str) -> tuple[str, dict[str, str]] | None:
    """Which sample serves the snapshot's number at dotted ``path`` (``"rejections.bad_signature"`` ->
    ``("hivemesh_rejections_total", {"reason": "bad_signature"})``); None for one not served."""
    field = field_for(path)
    if field is None or field.prometheus == "-" or field.kind in ("text", "nested"):
        return None
    total = "_total" if field.kind == "counter" else ""
    head, _, rest = path.partition(".")
    if head == "neighbours":
        name, _, part = rest.rpartition(".")
        return metric_name(field, f"neighbour_{part}"), {"neighbour": name}
    if head == "metrics":
        if field.key == "metrics.*":
            return f"{PREFIX}_protocol_events_total", {"event": rest}
        return f"{PREFIX}_{field.prometheus or rest}", {}
    if field.label:
        return metric_name(field) + total, {field.label: rest}
    return metric_name(field) + total, {}


def _family(field: Field, name: str, labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    if field.kind == "counter":
        return CounterMetricFamily(name, field.meaning, labels=labels)
    return GaugeMetricFamily(name, field.meaning, labels=labels)


class SnapshotCollector(Collector):
    """Metric families from ``latest()``, the daemon's last status snapshot (None: not written yet)."""

    def __init__(self, latest: Callable[[], Mapping[str, Any] | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest() or NO_SNAPSHOT
        info = InfoMetricFamily(f"{PREFIX}_peer", "this peer's name, state, and why it stopped short")
        info.add_metric([], {key: str(snapshot.get(key, "")) for key in ("name", "state", "stranded")})
        yield info
        warnings = GaugeMetricFamily(f"{PREFIX}_warnings", "the gossip machine's warnings now")
        warnings.add_metric([], float(len(snapshot.get("warnings") or [])))
        yield warnings
        for field in SNAPSHOT_FIELDS:
            if (field.kind in ("text", "nested") or field.prometheus == "-" or "*" in field.key
                    or field.key in SNAPSHOT_ONLY or field.key.startswith("metrics.")):
                continue    # not served, or served by _neighbours and _machine
            yield from self._plain(field, snapshot)
        yield from self._neighbours(snapshot)
        yield from self._machine(snapshot)

    def _plain(self, field: Field, snapshot: Mapping[str, Any]) -> Iterator[Metric]:
        head, _, tail = field.key.partition(".")
        value = snapshot.get(head)
        if tail:
            value = value.get(tail) if isinstance(value, Mapping) else None
        scale = TO_BASE_UNIT.get(field.unit, ("", 1.0))[1]
        family = _family(field, metric_name(field), [field.label] if field.label else [])
        if field.label:
            for label, count in sorted((value or {}).items()):
                if (number := _number(count)) is not None:
                    family.add_metric([str(label)], number * scale)
        elif (number := _number(value)) is not None:
            family.add_metric([], number * scale)
        yield family

    def _neighbours(self, snapshot: Mapping[str, Any]) -> Iterator[Metric]:
        neighbours = snapshot.get("neighbours") or {}
        for field in NEIGHBOUR_NUMBERS:
            part = field.key.rpartition(".")[2]
            scale = TO_BASE_UNIT.get(field.unit, ("", 1.0))[1]
            family = _family(field, metric_name(field, f"neighbour_{part}"), ["neighbour"])
            for neighbour, info in sorted(neighbours.items()):
                if (number := _number(info.get(part))) is not None:
                    family.add_metric([neighbour], number * scale)
            yield family

    def _machine(self, snapshot: Mapping[str, Any]) -> Iterator[Metric]:
        """The machine's gauges under their own names; its event counts as one family, by event."""
        metrics: Mapping[str, Any] = snapshot.get("metrics") or {}
        events = CounterMetricFamily(f"{PREFIX}_protocol_events", FIELDS_BY_KEY["metrics.*"].meaning,
                                     labels=["event"])
        for key, value in sorted(metrics.items()):
            number = _number(value)
            if number is not None and f"metrics.{key}" not in FIELDS_BY_KEY:    # a gauge has its own row
                events.add_metric([key], number)
        yield events
        for key in MACHINE_GAUGE_WORDS:
            field = FIELDS_BY_KEY[f"metrics.{key}"]
            family = _family(field, f"{PREFIX}_{field.prometheus or key}", [])
            if (number := _number(metrics.get(key))) is not None:
                family.add_metric([], number)
            yield family


class MetricsServer:
    """The HTTP endpoint of one peer's collector; ``close()`` stops it (the daemon's shutdown)."""

    def __init__(self, latest: Callable[[], Mapping[str, Any] | None], *, host: str, port: int,
                 key: str = "[peer] metrics_port") -> None:
        """Serve on ``host:port`` (port 0: any free one, see ``port``); a port in use is a
        HivemeshError naming ``key``."""
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(latest))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise HivemeshError(f"{key} = {port}: {host}:{port} is in use by another program; "
                                    "choose another port (or 0 for none)") from None
            raise HivemeshError(f"{key} = {port}: cannot serve metrics on {host}:{port}: "
                                f"{error.strerror or error}") from None
        self.port: int = self._server.server_address[1]
        self.host = host

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
