"""``hivemesh config check FILE`` and ``hivemesh config reference``.

``check`` runs, offline, the checks a peer runs at start-up on a peer file (its key file, the
roster, the topology over the roster's peers, the task, the compressor, the algorithm on that
graph) or the checks ``hivemesh sim`` runs on a scenario, and says "ok" in one line; any mistake
is one line naming the file and the key (exit 2). Which kind a file is comes from its tables: a
peer file has ``[peer]`` (or ``[network]``), an edge client's ``[edge]``, a federation's shared
file (``federation.toml``) ``[network]`` and ``[federation]`` alone (every member config beside it
that includes it is checked), a scenario none of these.

``reference`` prints every key of both kinds, generated from the config classes
(peer.cli.reference), so it lists what the loaders accept and nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config", help="check a peer or scenario config offline; list every config key",
        description="'hivemesh config check FILE' validates a peer config or a scenario with the checks "
                    "a peer or 'hivemesh sim' runs, without starting anything. "
                    "'hivemesh config reference' lists every key with its type, default, unit and meaning.")
    commands = parser.add_subparsers(title="config commands", metavar="COMMAND", required=True)
    check = commands.add_parser("check", help="validate a peer config or a scenario, offline",
                                description="Validate FILE (a peer config: it has [peer]; otherwise a "
                                            "scenario) as 'hivemesh peer' or 'hivemesh sim' would. "
                                            "Exit 0 with one 'ok' line, or 2 with one line naming the "
                                            "file and the key at fault.")
    check.add_argument("file", metavar="FILE", help="a peer config (NAME.toml) or a scenario (TOML)")
    check.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                       help="check with this override, as 'hivemesh peer/sim --set' would apply it")
    check.set_defaults(func=run_check)
    reference = commands.add_parser("reference", help="every config key: type, default, unit, meaning",
                                    description="Every key a peer config or a scenario accepts, generated "
                                                "from the config classes the loaders use.")
    reference.set_defaults(func=run_reference)


def run_check(args: argparse.Namespace) -> int:
    print(check_file(args.file, args.overrides))
    return 0


def run_reference(args: argparse.Namespace) -> int:
    from peer.cli.reference import render

    print(render(), end="")
    return 0


def is_peer_file(data: dict[str, Any]) -> bool:
    """A peer file has ``[peer]`` (or at least ``[network]``); a scenario has neither."""
    return "peer" in data or "network" in data


def check_file(path: str | Path, overrides: Sequence[str] = ()) -> str:
    """Check ``path`` as its kind's command would; the one-line "ok" summary, or a ConfigError."""
    from peer.files.config import read_toml

    data = read_toml(path)
    if "edge" in data:
        return check_edge_file(path, overrides)
    if is_shared_file(data):
        return check_shared_file(path, overrides)
    if is_peer_file(data):
        return check_peer_file(path, overrides)
    return check_scenario_file(path, overrides)


def is_shared_file(data: dict[str, Any]) -> bool:
    """A federation's shared file (peer/files/include.py) has ``[network]`` and ``[federation]`` and no
    member's table (a scenario's [federation] comes without [network])."""
    return {"network", "federation"} <= set(data) and "peer" not in data and "edge" not in data


def check_shared_file(path: str | Path, overrides: Sequence[str] = ()) -> str:
    """Every member config in the shared file's folder that includes it, checked as its own kind:
    an edit of the shared file is checked for the whole federation at once."""
    from peer.files.config import ConfigError, read_toml
    from peer.files.include import INCLUDE_KEY

    path = Path(path)
    if overrides:
        raise _error(path, "--set", "check a member's config with --set, not the shared file")
    members = []
    for candidate in sorted(path.resolve().parent.glob("*.toml")):
        try:
            named = read_toml(candidate).get(INCLUDE_KEY)
        except ConfigError:
            continue        # not a config of this federation's: not ours to judge
        if isinstance(named, str) and (candidate.parent / named).resolve() == path.resolve():
            check_file(candidate)
            members.append(candidate.stem)
    if not members:
        raise ConfigError(f"{path}: no config in {path.resolve().parent} includes it "
                          f"({INCLUDE_KEY} = \"{path.name}\")")
    return f"ok: shared file {path}: included by {len(members)} members, each checked: {', '.join(members)}"


def check_peer_file(path: str | Path, overrides: Sequence[str] = ()) -> str:
    """What ``hivemesh peer`` checks before it opens a socket (peer.runtime.assemble), minus the
    data folder's lock and boot counter: nothing is written."""
    from peer.runtime.assemble import identity_and_roster, peer_topology, served_clients
    from peer.runtime.peerconfig import load_peer_config

    config = load_peer_config(path, overrides)
    _identity, roster, name = identity_and_roster(config)
    topology = peer_topology(config, roster)
    served = served_clients(config, roster, name) if config.federation is not None else ()
    for other in topology.neighbours(name):
        if not roster.member(other).address:
            raise _error(config.source, "peer.roster", f"neighbour {other!r} has no address in "
                                                       f"{config.roster_path}")
    _check_run(config.source, config.network.task, config.network.task_options, config.gossip, topology,
               name, keys=("network.task", "network.gossip.compression", "network.gossip.algorithm"))
    federation = config.federation
    if federation is None:
        return (f"ok: peer config {path}: member {name!r} of {len(topology.names)} peers, topology "
                f"{config.network_as_written.topology!r}, algorithm {config.gossip.algorithm!r}, task "
                f"{config.network.task!r}")
    features = {"secure aggregation": federation.secure_aggregation, "differential privacy":
                federation.differential_privacy}
    extras = [feature for feature, on in features.items() if on is not None]
    opening = federation.opening_registered()
    others = len(topology.names) - 1
    gossip = (f"{federation.gossip_rounds} gossip rounds with {others} other gateways after each round"
              if federation.gossip_rounds and others else "no gossip between gateways")
    wait = (f"; no round opens until {opening - len(served)} more edge clients join (min_clients / "
            f"min_registered {opening})" if len(served) < opening else "")
    wait += "".join(f"; warning: {text}" for text in federation.warnings(len(served)))
    return (f"ok: gateway config {path}: {name!r} serving {len(served)} edge clients, "
            f"{'FedBuff' if federation.mode == 'fedbuff' else 'FedAvg'} {federation.rounds} rounds"
            f"{''.join(', ' + extra for extra in extras)}, {gossip}, task {config.network.task!r}{wait}")


def check_edge_file(path: str | Path, overrides: Sequence[str] = ()) -> str:
    """What ``hivemesh edge`` checks before it dials its gateway, minus the data folder's lock: the
    file, its key and roster entry, its gateway's, and its task (nothing is written)."""
    from peer.runtime.edgeconfig import edge_identity_and_roster, load_edge_config

    if overrides:
        raise _error(path, "--set", "an edge client's config takes no --set (hivemesh edge reads the file "
                                    "as written)")
    config = load_edge_config(path)
    _named(config.source, "edge.name", lambda: edge_identity_and_roster(config))
    _check_run(config.source, config.network.task, config.network.task_options, None, None, config.edge.name,
               keys=("network.task", "", ""))
    federation = config.federation
    mode = "FedBuff" if federation.mode == "fedbuff" else "FedAvg"
    return (f"ok: edge config {path}: client {config.edge.name!r} of gateway {config.edge.gateway!r}, {mode} "
            f"{federation.rounds} rounds, task {config.network.task!r}")


def check_scenario_file(path: str | Path, overrides: Sequence[str] = ()) -> str:
    """What ``hivemesh sim`` checks before it runs (every variant), minus the training itself."""
    from sim.run import check_scenario
    from sim.scenario import load_scenario, variants

    scenario = load_scenario(path, overrides)
    for variant in variants(scenario):
        check_scenario(variant)
    if scenario.federation.gateways > 0:
        from sim.federation import check_federation

        check_federation(scenario)
        _check_run(scenario.source, scenario.task.name, scenario.task.options, None, None, "",
                   keys=("task.name", "", ""))
        section = scenario.federation
        return (f"ok: scenario {path}: a federation of {section.gateways} gateways with {section.clients} "
                f"clients each, {scenario.federation_config().mode}, task {scenario.task.name!r}, "
                f"{scenario.duration_s:g} s simulated at most")
    topology = scenario.topology()
    gossip = scenario.gossip_config() if scenario.baseline.kind == "none" else None
    _check_run(scenario.source, scenario.task.name, scenario.task.options, gossip, topology,
               topology.names[0], keys=("task.name", "algorithm.compression", "algorithm.algorithm"))
    runs = gossip.algorithm if gossip is not None else scenario.baseline.kind
    return (f"ok: scenario {path}: {len(topology.names)} members, graph {scenario.graph.spec!r}, "
            f"{runs}, task {scenario.task.name!r}, {scenario.duration_s:g} s simulated at most")


def _check_run(source: Path | str, task: str, task_options: dict[str, Any], gossip: Any, topology: Any,
               name: str, *, keys: tuple[str, str, str]) -> None:
    """The task can be built, the compressor parsed, and the algorithm run on this graph."""
    import torch

    from peer.train.tasks import get_task
    from protocols.compress import from_spec
    from protocols.gossip import make_machine

    task_key, compression_key, algorithm_key = keys
    _named(source, task_key, lambda: get_task(task, **task_options))
    if gossip is None:
        return
    _named(source, compression_key, lambda: from_spec(gossip.compression))
    _named(source, algorithm_key, lambda: make_machine(gossip, name=name, topology=topology,
                                                       params=torch.zeros(1)))


def _named(source: Path | str, key: str, check: Callable[[], T]) -> T:
    """``check()``, with an error it raises made one line naming the file and the key."""
    from protocols.errors import HivemeshError

    try:
        return check()
    except (HivemeshError, ValueError, KeyError, TypeError) as error:
        text = str(error).strip()
        raise _error(source, key, text.splitlines()[0] if text else type(error).__name__) from None


def _error(source: Path | str, key: str, text: str) -> Exception:
    from peer.files.config import ConfigError

    return ConfigError(f"{source}: key '{key}': {text}", key=key)
