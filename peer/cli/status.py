"""``hivemesh status``: what a running (or stopped) peer is doing, from its status.json."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="show a peer's step, loss, accuracy, neighbours, traffic and rejections",
        description="Show what a peer is doing: step, loss, accuracy, neighbours (last seen, latency), "
                    "bytes in and out, rejections by reason and the estimated distance to consensus. "
                    "Reads the status file the peer refreshes every second in its data folder.")
    parser.add_argument("--config", action="append", default=[], metavar="PEER.toml",
                        help="a peer's config file (repeat for several peers)")
    parser.add_argument("--data-dir", action="append", default=[], metavar="DIR",
                        help="a peer's data folder, instead of its config")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from peer.files.statefiles import pid_alive, read_status
    from peer.runtime.peerconfig import load_peer_config
    from topology.errors import HivemeshError

    folders = [load_peer_config(path).data_dir for path in args.config] + [Path(d) for d in args.data_dir]
    if not folders:
        raise HivemeshError("give --config PEER.toml (or --data-dir DIR) of the peer to show")
    statuses = []
    for folder in folders:
        status = read_status(folder)
        if status is None:
            raise HivemeshError(f"{folder}: no status yet (has this peer been started?)")
        pid = status.get("pid")
        status["running"] = isinstance(pid, int) and pid_alive(pid) and status.get("state") not in (
            "finished", "stopped", "stranded")
        status["age_s"] = time.time() - float(status.get("updated_at", 0.0))
        statuses.append(status)
    if args.json:
        print(json.dumps(statuses[0] if len(statuses) == 1 else statuses, indent=1, sort_keys=True))
        return 0
    for status in statuses:
        print(render(status))
    return 0


def render(status: dict[str, Any]) -> str:
    from peer.files.statefiles import format_number as _num
    from peer.files.statefiles import human_bytes

    lines = [
        f"peer {status.get('name')}: {status.get('state')}"
        + ("" if status.get("running") else " (not running)")
        + f", updated {_num(status.get('age_s'), '.1f', ' s')} ago, epoch {status.get('epoch')}",
        f"  step {status.get('step')}"
        + (f" (gossip steps done {status['steps_done']})"
           if status.get("steps_done") not in (None, status.get("step")) else "")
        + f"  loss {_num(status.get('loss'), '.4f')}  "
        f"accuracy {_num(status.get('accuracy'), '.4f')} (at step {status.get('eval_step')})",
        f"  consensus distance, max ||x_i - mean|| / ||mean|| over this peer and its neighbours' last "
        f"parameters (relative) {_num(status.get('consensus_max_relative'), '.2e')}",
        f"  bytes out {human_bytes(status.get('bytes_sent', 0))}"
        f"  in {human_bytes(status.get('bytes_received', 0))}"
        f"  (gossip payload out {human_bytes(status.get('payload_bytes_sent', 0))})",
    ]
    if status.get("stranded"):
        lines.append(f"  stopped short: {status['stranded']}")
    rejections = status.get("rejections") or {}
    lines.append("  rejections: " + (", ".join(f"{k} {v}" for k, v in sorted(rejections.items())) or "none"))
    lines.append("  neighbours:")
    for name, info in sorted((status.get("neighbours") or {}).items()):
        seen = info.get("last_seen_s")
        presence = info.get("presence") or ("up" if info.get("up") else "down")
        lines.append(f"    {name:<12} {presence if presence == 'up' else presence.upper():<11} "
                     f"last seen {_num(seen, '.1f', ' s ago') if seen is not None else 'never'}  "
                     f"latency {_num(info.get('latency_ms'), '.2f', ' ms')}  step {info.get('step')}")
    metrics = status.get("metrics") or {}
    if metrics:
        lines.append("  machine: " + ", ".join(f"{k} {v:g}" for k, v in sorted(metrics.items())))
    return "\n".join(lines)
