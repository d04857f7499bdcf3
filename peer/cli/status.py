"""``hivemesh status``: what running (or stopped) peers are doing, from their status.json files.

One peer shows in detail; several (``hivemesh status DIR/*.toml``, ``--net DIR``) show as
one table, a row per peer. A federation's folder (``hivemesh init --gateways G --edges E``)
lists its gateways, then its edge clients (their configs have an [edge] table): an edge's row
shows its round and its gateway in the neighbours column. ``--watch`` redraws either until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from peer.files.fields import MACHINE_GAUGE_WORDS, machine_words
from peer.files.units import format_number as _num
from peer.files.units import human_bytes

# states a peer (or an edge client: "gave up" on its gateway) leaves only by being started again
ENDED = ("finished", "stopped", "stranded", "gave up")
# an edge client's counts shown on their own line, not again among its client events
EDGE_OWN_COUNTS = ("rounds_trained", "updates_sent")
CLEAR_SCREEN = "\033[H\033[2J"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="show peers' step, loss, accuracy, neighbours, traffic and rejections",
        description="Show what peers are doing: step, training and test loss, test accuracy, neighbours "
                    "(up, down or finished; last heard, latency), bytes in and out, rejections by reason "
                    "and the estimated distance to consensus. Reads the status file each peer refreshes "
                    "every second in its data folder. One peer is shown in detail, several as one table.")
    parser.add_argument("configs", nargs="*", metavar="PEER.toml", help="peers' config files")
    parser.add_argument("--config", action="append", default=[], metavar="PEER.toml",
                        help="a peer's config file (repeat for several peers)")
    parser.add_argument("--data-dir", action="append", default=[], metavar="DIR",
                        help="a peer's data folder, instead of its config")
    parser.add_argument("--net", metavar="DIR",
                        help="every peer of a network folder written by `hivemesh init` or `hivemesh demo` "
                             "(a federation's gateways, then its edge clients)")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until Ctrl-C")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="with --watch: stop after N redraws")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from protocols.errors import HivemeshError

    folders = _folders(args)
    if not folders:
        raise HivemeshError("give the peers' configs (PEER.toml ..., --config, --data-dir) or --net DIR")
    if args.watch is not None and args.watch <= 0:
        raise HivemeshError(f"--watch {args.watch:g}: the interval must be positive (seconds)")
    table = len(folders) > 1 or args.net is not None
    if args.watch is None:
        statuses = _read(folders, tolerate_missing=table)
        print(_show(statuses, as_json=args.json, table=table))
        return 0
    redraws = 0
    try:
        while args.count is None or redraws < args.count:
            if redraws:
                time.sleep(args.watch)
            text = _show(_read(folders, tolerate_missing=True), as_json=args.json, table=table)
            print((CLEAR_SCREEN if sys.stdout.isatty() else "") + text, flush=True)
            redraws += 1
    except KeyboardInterrupt:
        pass        # Ctrl-C is how a watch ends
    return 0


def _folders(args: argparse.Namespace) -> list[Path]:
    configs = [Path(p) for p in [*args.configs, *args.config]]
    if args.net is not None:
        configs += network_configs(Path(args.net))
    return [_data_dir(path) for path in configs] + [Path(d) for d in args.data_dir]


def _data_dir(path: Path) -> Path:
    """The data folder of a peer's or gateway's config, or of an edge client's (an [edge] table)."""
    from peer.runtime.edgeconfig import load_edge_config
    from peer.runtime.peerconfig import load_peer_config

    try:
        is_edge = "edge" in tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        is_edge = False     # the peer loader says what is wrong with it
    return load_edge_config(path).data_dir if is_edge else load_peer_config(path).data_dir


def network_configs(folder: Path) -> list[Path]:
    """The configs of a network folder: its TOML files with a [peer] table (peers and gateways), then
    those with an [edge] table (a federation's edge clients); not the roster."""
    from protocols.errors import HivemeshError

    if not folder.is_dir():
        raise HivemeshError(f"--net {folder}: no such folder")
    peers, edges = [], []
    for path in sorted(folder.glob("*.toml")):
        try:
            tables = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise HivemeshError(f"{path}: not TOML ({error})") from None
        if "peer" in tables:
            peers.append(path)
        elif "edge" in tables:
            edges.append(path)
    if not peers and not edges:
        raise HivemeshError(f"--net {folder}: no peer config (a TOML file with a [peer] or [edge] "
                            "table) there")
    return peers + edges


def _read(folders: list[Path], *, tolerate_missing: bool) -> list[dict[str, Any]]:
    from peer.files.statefiles import pid_alive, read_status
    from protocols.errors import HivemeshError

    statuses = []
    for folder in folders:
        status = read_status(folder)
        if status is None:
            if not tolerate_missing:
                raise HivemeshError(f"{folder}: no status yet (has this peer been started?)")
            statuses.append({"name": folder.name, "state": "no status yet", "running": False})
            continue
        pid = status.get("pid")
        # pid 0 and negative ones name process groups (kill(-1, 0) succeeds): never a peer
        status["running"] = (isinstance(pid, int) and pid_alive(pid)
                             and status.get("state") not in ENDED)
        status["age_s"] = time.time() - float(status.get("updated_at", 0.0))
        statuses.append(status)
    return statuses


def _show(statuses: list[dict[str, Any]], *, as_json: bool, table: bool) -> str:
    if as_json:
        return json.dumps(statuses if table else statuses[0], indent=1, sort_keys=True)
    return render_table(statuses) if table else render(statuses[0])


def neighbour_word(info: dict[str, Any], *, running: bool) -> str:
    """A neighbour's presence in words: a finished one reads "finished" (its heartbeats said so) even
    inside its grace period, and one up when a stopped peer last wrote reads "up at exit"."""
    if info.get("finished"):
        return "finished"
    presence = str(info.get("presence") or ("up" if info.get("up") else "down"))
    if presence == "up" and not running:
        return "up at exit"
    return presence


def _headline(status: dict[str, Any]) -> str:
    state = status.get("state")
    if status.get("waiting_for") and status.get("running"):
        state = status["waiting_for"]  # "waiting for p01, p03 (1/3 up)" says more than the state
    if status.get("running"):
        when = f"updated {_num(status.get('age_s'), '.1f', ' s')} ago"
    elif state in ENDED:
        when = f"{_num(status.get('age_s'), '.1f', ' s')} ago, not running"
    else:       # the process is gone without saying so: a crash or a kill
        when = f"not running (last update {_num(status.get('age_s'), '.1f', ' s')} ago)"
    epoch = status.get("epoch")
    restarts = ""
    if isinstance(epoch, int) and epoch:
        restarts = f", restarted {epoch} time{'' if epoch == 1 else 's'}"
    return f"peer {status.get('name')}: {state}, {when}{restarts}"


def _machine_line(metrics: dict[str, Any]) -> str:
    gauges = [f"{MACHINE_GAUGE_WORDS[k]} {metrics[k]:g}" for k in MACHINE_GAUGE_WORDS if k in metrics]
    events = [f"{machine_words(k)} {v:g}" for k, v in sorted(metrics.items()) if k not in MACHINE_GAUGE_WORDS]
    return ("  " + ", ".join(gauges or ["gossip round -"])
            + "; protocol events: " + (", ".join(events) or "none"))


def render_edge(status: dict[str, Any]) -> str:
    """One edge client in detail."""
    client = {k: v for k, v in (status.get("client") or {}).items() if k not in EDGE_OWN_COUNTS}
    return "\n".join([
        _headline(status).replace("peer ", "edge client ", 1),
        f"  gateway {status.get('gateway')} at {status.get('gateway_address')} "
        f"({gateway_word(status)}); listening on nothing",
        f"  {round_of(status.get('round'), status.get('rounds'))}  rounds trained "
        f"{status.get('rounds_trained')}  updates sent {status.get('updates_sent')}  "
        f"samples {status.get('num_samples')}  "
        f"training loss {_num(status.get('loss'), '.4f')}",
        (f"  learning rate {_num(status.get('lr'), '.3g')} at schedule step {status['schedule_step']} "
         "(the federation's: round x local steps)" if status.get("schedule_step") is not None
         else "  learning rate: no step trained yet"), *_warning_lines(status),
        f"  bytes out {human_bytes(status.get('bytes_sent', 0))}"
        f"  in {human_bytes(status.get('bytes_received', 0))}",
        "  client events: " + (", ".join(f"{k} {v}" for k, v in sorted(client.items())) or "none"),
        "  rejections: " + (", ".join(f"{k} {v}" for k, v in sorted((status.get("rejections") or {}).items()))
                            or "none"), *_internal_error_lines(status)])


def _warning_lines(status: dict[str, Any]) -> list[str]:
    """The member's warnings (its machine's and its trainer's, e.g. a learning rate at 0 early)."""
    return [f"  warning: {text}" for text in status.get("warnings") or []]


def round_of(round_index: Any, rounds: Any) -> str:
    """``round 6/10``: a federation's FedAvg rounds closed (the 0-based index of the round open, or
    next), of the rounds it runs; ``round -`` before any."""
    if not isinstance(round_index, int) or round_index < 0:
        return "round -"
    return f"round {round_index}/{rounds}" if isinstance(rounds, int) else f"round {round_index}"


def gateway_word(status: dict[str, Any]) -> str:
    """An edge client's gateway in words: ``finished`` once the final model came, ``up at exit`` when
    the client stopped while it heard it, else ``up`` or ``not heard``."""
    if status.get("state") == "finished":
        return "finished"
    if not status.get("gateway_up"):
        return "not heard"
    return "up" if status.get("running") else "up at exit"


def client_word(info: dict[str, Any], *, running: bool) -> str:
    """A gateway's edge client in words (its ``presence``): ``finished`` once sent the final model,
    and one up when a stopped gateway last wrote reads ``up at exit``."""
    presence = str(info.get("presence") or ("up" if info.get("up") else "down"))
    return "up at exit" if presence == "up" and not running else presence


def _internal_error_lines(status: dict[str, Any]) -> list[str]:
    """Messages dropped because handling them raised (a bug their sender's input met), by sender."""
    errors = status.get("internal_errors") or {}
    if not errors:
        return []
    return ["  internal errors (messages dropped, a bug to report): "
            + ", ".join(f"{sender} {count}" for sender, count in sorted(errors.items()))]


def _federation_lines(federation: dict[str, Any], *, running: bool = True) -> list[str]:
    """A gateway's rounds and clients (status.json's ``federation``)."""
    counters = federation.get("counters") or {}
    progress = round_of(federation.get("round"), federation.get("rounds"))
    head = f"  federation ({federation.get('mode')}): {progress} ({federation.get('phase')})"
    if federation.get("phase") == "waiting" and "needed" in federation:   # no round opens: say why
        registered = federation.get("registered") or []
        head += (f"; a round opens with {federation['needed']} registered clients (min_clients, "
                 f"min_registered), {len(registered)} now: {', '.join(registered) or 'none'}")
    if "buffer_clients" in federation:     # FedBuff: a full buffer waits for more distinct clients
        head += (f"; the buffer is full and waits for updates of {federation['buffer_needs_clients']} "
                 f"distinct clients (min_clients), {len(federation['buffer_clients'])} now: "
                 f"{', '.join(federation['buffer_clients'])}")
    if federation.get("phase") == "open":
        head += (f"; open round asked {', '.join(federation.get('asked') or []) or '-'}, taken "
                 f"{', '.join(federation.get('taken') or []) or '-'}")
    lines = [head,
             "  server: " + (", ".join(f"{k} {v}" for k, v in sorted(counters.items())) or "nothing yet")]
    for report in (federation.get("last_rounds") or [])[-1:]:
        lines.append(_last_report_line(report))
        lines += _bounds_lines(report.get("bounds") or {})
        lines += _secagg_lines(report.get("secagg_phases") or [])
    lines += _privacy_lines(federation.get("privacy") or {})
    secagg = federation.get("secagg")
    if secagg:  # secure aggregation on: where the open round's SecAgg is
        lines.append(f"  secagg round {secagg.get('round')}: phase {secagg.get('phase')}")
        if secagg.get("offences"):  # SecAgg's culprits (protocols/secagg/blame.py) and who is barred
            offences = ", ".join(f"{name} {count}" for name, count in sorted(secagg["offences"].items()))
            barred = ", ".join(secagg.get("barred") or []) or "-"
            lines.append(f"  secagg offences: {offences}; barred {barred}")
    lines.append("  clients:")
    for name, info in sorted((federation.get("clients") or {}).items()):
        contact = info.get("last_contact_s")
        lines.append(f"    {name:<12} {client_word(info, running=running):<11} last update "
                     f"{_num(contact, '.1f', ' s ago') if contact is not None else 'never':<12} "
                     f"out {human_bytes(info.get('bytes_sent', 0))}"
                     f"  in {human_bytes(info.get('bytes_received', 0))}")
    return lines


def _last_report_line(report: dict[str, Any]) -> str:
    """The last closed round (sync) or aggregation (FedBuff: its report has a model ``version``)."""
    if "version" in report:
        staleness = report.get("staleness") or []
        return (f"  last aggregation: model version {report.get('version')} from "
                f"{len(report.get('contributors') or [])} updates "
                f"({', '.join(report.get('contributors') or []) or '-'}), staleness up to "
                f"{max(staleness, default=0)}")
    return (f"  last closed round {report.get('round')}: by {report.get('closed_by')}, taken "
            f"{len(report.get('taken') or [])}/{len(report.get('asked') or [])}, missing "
            f"{', '.join(report.get('missing') or []) or '-'}, late "
            f"{', '.join(report.get('late') or []) or '-'}")


def _privacy_lines(privacy: dict[str, Any]) -> list[str]:
    """DP's numbers (status.json's ``federation.privacy``; none when DP is off): the mechanism, the
    epsilon spent at its delta over the rounds accounted, and under distributed DP what one round
    costs against the gateway, which sees who takes part."""
    if not privacy:
        return []

    def epsilon(value: Any) -> str:
        return "inf (no noise)" if value == "inf" else _num(value, ".3g")

    line = (f"  privacy: {privacy.get('mechanism', '?')} DP, epsilon {epsilon(privacy.get('epsilon'))} spent "
            f"at delta {_num(privacy.get('delta'), '.3g')} over {privacy.get('rounds_accounted', 0)} rounds "
            f"(noise multiplier {_num(privacy.get('noise_multiplier'), '.3g')}, sampling rate "
            f"{_num(privacy.get('sampling_rate'), '.3g')}, clip norm "
            f"{_num(privacy.get('clip_norm'), '.3g')})")
    if "epsilon_vs_gateway_per_round" in privacy:
        line += f"; {epsilon(privacy['epsilon_vs_gateway_per_round'])} per round against the gateway"
    return [line]


def _bounds_lines(bounds: dict[str, Any]) -> list[str]:
    """A closed round's influence bounds (its report's ``bounds``; none under DP or SecAgg)."""
    if not bounds:
        return []
    bounded = ", ".join(f"{k} {v}" for k, v in sorted((bounds.get("bounded") or {}).items())) or "none"
    norm = bounds.get("norm_bound")
    return [f"    bounds: num_samples cap {bounds.get('samples_cap') or 'off'}, norm bound "
            f"{'off' if norm is None else _num(norm, '.4g')}; bounded {bounded}"]


def _secagg_lines(phases: list[dict[str, Any]]) -> list[str]:
    """A closed round's SecAgg phases (its report's ``secagg_phases``): time and bytes at the gateway."""
    return [f"    secagg {cost.get('phase', '?'):<12} {_num(cost.get('duration_s'), '.2f', ' s'):>9}  in "
            f"{human_bytes(cost.get('bytes_received', 0))} ({cost.get('messages_received', 0)})  out "
            f"{human_bytes(cost.get('bytes_sent', 0))} ({cost.get('messages_sent', 0)})"
            for cost in phases]


def render(status: dict[str, Any]) -> str:
    """One peer in detail (a gateway's rounds and clients too; an edge client's own view)."""
    if status.get("role") == "edge":
        return render_edge(status)
    running = bool(status.get("running"))
    lines = [
        _headline(status),
        _progress_line(status),
        _machine_line(status.get("metrics") or {}),
        f"  distance to consensus {_num(status.get('consensus_max_relative'), '.2e')} "
        "(max ||x_i - mean|| / ||mean|| over this peer and its neighbours' last parameters)",
        f"  bytes out {human_bytes(status.get('bytes_sent', 0))}"
        f"  in {human_bytes(status.get('bytes_received', 0))}"
        f"  (gossip payload out {human_bytes(status.get('payload_bytes_sent', 0))})",
    ]
    lines += _warning_lines(status)
    if status.get("stranded"):
        lines.append(f"  stopped short: {status['stranded']}")
    if status.get("curve") is False:
        lines.append("  warning: CurveZMQ is off ([peer] curve = false): traffic is unencrypted and anyone "
                     "who reaches the port reaches the message decoder")
    refused = status.get("transport_refused") or {}
    if refused:
        lines.append("  connections refused: " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
    rejections = status.get("rejections") or {}
    lines.append("  rejections: " + (", ".join(f"{k} {v}" for k, v in sorted(rejections.items())) or "none"))
    lines += _internal_error_lines(status)
    if status.get("federation"):
        lines += _federation_lines(status["federation"], running=running)
    lines.append("  neighbours:")
    age_s = float(status.get("age_s") or 0.0) if not running else 0.0
    for name, info in sorted((status.get("neighbours") or {}).items()):
        seen = info.get("last_seen_s")
        heard = _num(seen + age_s, '.1f', ' s ago') if seen is not None else "never"
        # a gateway's neighbours are gateways, which train nothing: no step to show
        step = "" if status.get("federation") else f"  step {info.get('step')}"
        # our socket to it, while it has no connection: for how long and why (peer/net/reach.py)
        dial = (f"  no connection from us for {float(info.get('dial_down_s') or 0.0):.1f} s "
                f"({info['dial_reason']})" if running and info.get("dial_reason") else "")
        lines.append(f"    {name:<12} {neighbour_word(info, running=running):<11} last heard {heard}  "
                     f"latency {_num(info.get('latency_ms'), '.2f', ' ms')}{step}{dial}")
    return "\n".join(lines)


def _progress_line(status: dict[str, Any]) -> str:
    """A peer's steps, losses and accuracy; a gateway (which trains nothing) counts FedAvg rounds."""
    federation = status.get("federation") or {}
    if federation:
        head = round_of(federation.get("round"), federation.get("rounds"))
        at = f" (at round {status['eval_step']})" if _evaluated(status) else ""
        return (f"  {head}  test loss {_num(status.get('test_loss'), '.4f')}"
                f"  test accuracy {_num(status.get('accuracy'), '.4f')}{at}")
    return (f"  step {status.get('step')}"
            + (f" (gossip schedule at step {status['steps_done']})"
               if status.get("steps_done") not in (None, status.get("step")) else "")
            + f"  learning rate {_num(status.get('lr'), '.3g')}"
            f"  training loss {_num(status.get('loss'), '.4f')}"
            f"  test loss {_num(status.get('test_loss'), '.4f')}"
            f"  test accuracy {_num(status.get('accuracy'), '.4f')}"
            + (f" (at step {status['eval_step']})" if _evaluated(status) else ""))


def _evaluated(status: dict[str, Any]) -> bool:
    step = status.get("eval_step")
    return isinstance(step, int) and step >= 0


TABLE_COLUMNS = ("peer", "state", "step", "train loss", "test loss", "test acc", "round", "consensus",
                 "neighbours", "sent", "received", "rejected", "updated")


def table_row(status: dict[str, Any]) -> tuple[str, ...]:
    running = bool(status.get("running"))
    if status.get("role") == "edge":
        return _edge_row(status)
    words = [neighbour_word(info, running=running) for info in (status.get("neighbours") or {}).values()]
    counted = ", ".join(f"{words.count(w)} {w}" for w in sorted(set(words))) or "-"
    state = _row_state(status)
    age = status.get("age_s")
    federation = status.get("federation") or {}
    # a gateway trains nothing: its progress is FedAvg rounds, never its gossip machine's rounds
    step = "-" if federation else str(status.get("step", "-"))
    round_cell = (round_of(federation.get("round"), federation.get("rounds")).removeprefix("round ")
                  if federation else _num((status.get("metrics") or {}).get("round"), ".0f"))
    return (str(status.get("name")), state, step,
            _num(status.get("loss"), ".4f"), _num(status.get("test_loss"), ".4f"),
            _num(status.get("accuracy"), ".4f"), round_cell,
            _num(status.get("consensus_max_relative"), ".2e"), counted,
            human_bytes(status.get("bytes_sent", 0)), human_bytes(status.get("bytes_received", 0)),
            str(sum((status.get("rejections") or {}).values())), _num(age, ".1f", " s ago"))


def _row_state(status: dict[str, Any]) -> str:
    state = str(status.get("state"))
    if not status.get("running") and state not in ENDED and "updated_at" in status:
        state += " (gone)"      # the process died without writing its end
    return state


def _edge_row(status: dict[str, Any]) -> tuple[str, ...]:
    """An edge client's row: no test metrics or consensus of its own (its gateway's row has them); its
    round, and its gateway where a peer's neighbours go."""
    state = _row_state(status)
    return (str(status.get("name")), state, str(status.get("step", "-")), _num(status.get("loss"), ".4f"),
            "-", "-", round_of(status.get("round"), status.get("rounds")).removeprefix("round "), "-",
            f"gateway {status.get('gateway', '-')} {gateway_word(status)}" if "gateway" in status else "-",
            human_bytes(status.get("bytes_sent", 0)), human_bytes(status.get("bytes_received", 0)),
            str(sum((status.get("rejections") or {}).values())), _num(status.get("age_s"), ".1f", " s ago"))


def render_table(statuses: list[dict[str, Any]]) -> str:
    """Several peers, one row each, under one header."""
    rows = [TABLE_COLUMNS, *(table_row(s) for s in statuses)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)
