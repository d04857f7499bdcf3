"""What a running peer shows: its ``status.json`` snapshot, and the consensus estimate in it.

One function of the daemon's state (peer/runtime/daemon.py), read on the
loop's thread; the field names are what ``hivemesh status``, the metrics
endpoint and the tests read, so none is renamed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from peer.runtime.daemon_parts import Daemon, NeighbourInfo
from peer.runtime.memory import peak_mib, resident_mib
from protocols.consensus import max_relative_distance
from protocols.node import waiting_line
from protocols.node.member import Phase


def consensus_estimate(own: torch.Tensor, neighbours: Iterable[NeighbourInfo]) -> float:
    """``max_relative_distance`` over {self} ∪ neighbours, from the last full parameters heard;
    nan (unknown, not 0) before any neighbour's parameters arrived."""
    heard = [info.params for info in neighbours if info.params is not None]
    if not heard:
        return math.nan
    return max_relative_distance([own.detach().cpu(), *heard])


def remember_params(info: NeighbourInfo, carried: Callable[[], torch.Tensor | None], numel: int) -> None:
    """Keep a neighbour's last full parameters (``carried``: what its message holds of them, None
    unless whole) for the estimate, of ``numel`` parameters; none for big models (a copy a message)."""
    if numel > 10_000_000:
        return
    params = carried()
    if params is not None:
        # the estimate is over parameters: a mixed vector's buffers (its tail) are left out
        info.params = params[:numel].to(torch.float32).clone()


def snapshot(daemon: Daemon) -> dict[str, Any]:
    transport, node, counters, store, status = (daemon.transport, daemon.node, daemon.counters,
                                                daemon.store, daemon.status)
    assert transport is not None
    sent = daemon.host.counters
    now = daemon.now()
    evaluated = daemon.last_eval
    dial_down = transport.dial_down()
    return {
        "name": daemon.name, "state": daemon.state, "epoch": daemon.parts.epoch, "uptime_s": round(now, 3),
        "step": daemon.trainer.step, "steps_done": daemon.machine.position[1], "lr": daemon.trainer.last_lr,
        "loss": daemon.last_loss,
        "train_s": (daemon.train_end_s if node.finished else now) - daemon.train_start_s,
        "work_s": counters.work_s,
        "accuracy": evaluated.get("accuracy", math.nan),
        "test_loss": evaluated.get("loss", math.nan), "eval_step": daemon.last_eval_step,
        "consensus_max_relative": consensus_estimate(daemon.trainer.flat_params, daemon.neighbours.values()),
        "neighbours": {
            name: {"up": info.up, "presence": info.presence().value, "finished": info.finished,
                   "last_seen_s": (now - info.last_seen) if info.last_seen > -math.inf
                   else None, "latency_ms": info.latency_ms, "step": info.step,
                   "dial_down_s": round(dial_down.get(name, (0.0, ""))[0], 1),
                   "dial_reason": dial_down.get(name, (0.0, ""))[1]}
            for name, info in daemon.neighbours.items()},
        "bytes_sent": transport.bytes_sent, "bytes_received": transport.bytes_received,
        "bytes_sent_to": dict(transport.bytes_sent_to),
        "bytes_received_from": dict(counters.bytes_received_from),
        "payload_bytes_sent": sent.payload_bytes_sent,
        "gossip_wire_bytes_sent": sent.wire_bytes_sent,
        "messages_sent": sent.messages_sent,
        "messages_sent_by_kind": dict(sent.messages_by_kind),
        "bytes_sent_by_kind": dict(sent.wire_bytes_by_kind),
        "messages_accepted": counters.messages_accepted,
        "bytes_accepted_by_kind": dict(counters.wire_bytes_accepted_by_kind),
        "rejections": dict(daemon.endpoint.rejections + counters.rejected + node.all_rejections()),
        "internal_errors": dict(node.internal_errors),
        "frames_dropped": dict(daemon.endpoint.assembler.frames_dropped + transport.hostile),
        "sync_answers_sent": node.sync.answers_sent,
        "early_held": node.early.held_total,
        "state_sync": dict(sorted(node.sync.outcomes.items())),
        "trainer_steps_set": list(counters.trainer_steps_set),
        "unreachable": dict(counters.unreachable),
        "neighbour_down": dict(counters.neighbour_down),
        "neighbour_finished": dict(counters.neighbour_finished),
        "test_cut_dropped": dict(counters.test_cut_dropped),
        "stranded": daemon.member.stranded,
        "checkpoint_step": store.step,
        "checkpoints_written": store.written,
        "checkpoint_failures": dict(store.failures),
        "checkpoint_error": store.error,
        "checkpoint_nonfinite": dict(store.nonfinite),
        "status_write_failures": dict(status.failures),
        "status_values_replaced": dict(status.replaced),
        "roster_version": daemon.roster_watch.roster.version,
        "roster_reloads": counters.roster_reloads,
        "waiting_for": (waiting_line(node.neighbourhood.presence())
                        if daemon.member.phase is Phase.WAITING else ""),
        "absent_at_start": dict(counters.absent_at_start),
        "abandoned_sends": dict(transport.abandoned),
        "curve": daemon.config.peer.curve,
        "memory_peak_mib": peak_mib(),
        "memory_rss_mib": resident_mib(),
        "transport_refused": dict(transport.refused),
        "transport_connections": dict(transport.connections),
        "redialed": dict(transport.redialed),
        "handshake_refused": dict(transport.handshake_refused),
        "receive_buffers": {"reused": daemon.receive_buffers.reused, "fresh": daemon.receive_buffers.fresh,
                            "held": daemon.receive_buffers.held},
        "metrics": daemon.host.metrics,
        "federation": ({} if daemon.gateway is None else daemon.gateway.federation_status(
            now, routes=daemon.routes, clients=node.clients, counters=counters)),
        "warnings": [*daemon.config_warnings, *daemon.machine.warnings(), *daemon.trainer.warnings()],
        "timeline": daemon.timeline,
    }
