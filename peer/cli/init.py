"""``hivemesh init``: keys, roster and one config per peer for a new network."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "init", help="create keys, roster and peer configs for a new network",
        description="Create a new network in OUT: one identity key per peer (keys/), the roster "
                    "(roster.toml) and one config per peer (NAME.toml). Start each peer with "
                    "`hivemesh peer --config OUT/NAME.toml`.")
    parser.add_argument("--peers", type=int, default=0, help="number of peers (a gossip network)")
    parser.add_argument("--gateways", type=int, default=0,
                        help="a federation instead: number of gateways (with --edges)")
    parser.add_argument("--edges", type=int, default=0,
                        help="a federation: number of edge clients (in blocks: client i of E belongs to "
                             "gateway i*G//E)")
    parser.add_argument("--rounds", type=int, default=30, help="a federation: FedAvg rounds (default: 30)")
    parser.add_argument("--min-registered", type=int, default=None, metavar="N",
                        help="a federation: no round opens before N edge clients registered with their "
                             "gateway (default: min_clients, 2)")
    parser.add_argument("--topology", default=None,
                        help="topology spec or graph file (default: ring; a federation: the gateways' "
                             "gossip graph, so only with two gateways or more)")
    parser.add_argument("--out", required=True, help="new (or empty) folder to write into")
    parser.add_argument("--task", default="digits-mlp", help="training task (default: digits-mlp)")
    parser.add_argument("--algorithm", default=None,
                        help="gossip algorithm: dpsgd, local, choco, pushsum, adpsgd (default: dpsgd; a "
                             "federation: the gateways', so only with two gateways or more)")
    parser.add_argument("--compression", default=None,
                        help="compression spec (default: identity; a federation: only with two "
                             "gateways or more)")
    parser.add_argument("--steps", type=int, default=None,
                        help="local training steps per peer (default: 300; not in a federation, "
                             "which counts --rounds)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="set a key of the shared tables every member agrees on (network.KEY, in a "
                             "federation also federation.KEY; repeatable): a federation writes them "
                             "once, in federation.toml")
    parser.add_argument("--seed", type=int, default=0, help="network seed (default: 0)")
    parser.add_argument("--partition", default="dirichlet", choices=("iid", "dirichlet", "shards"),
                        help="how the data is split (default: dirichlet)")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (default: 0.5)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--host", help="the one address every peer listens on (default: 127.0.0.1)")
    where.add_argument("--hosts", metavar="A,B,...",
                       help="one address per peer (gateway), in roster order (p00, p01, ...): "
                            "HOST or HOST:PORT")
    where.add_argument("--hosts-file", metavar="FILE",
                       help="as --hosts, one address a line ('#' starts a comment)")
    parser.add_argument("--base-port", type=int, default=0,
                        help="first port (then consecutive; with --hosts, for entries without a port); "
                             "default: free ports chosen now (only on this machine's own addresses)")
    parser.add_argument("--curve", action=argparse.BooleanOptionalAction, default=True,
                        help="CurveZMQ transport encryption and roster-only connections (default: on; "
                             "--no-curve writes curve = false, and `hivemesh status` warns)")
    parser.set_defaults(func=run)


def default_network(*, topology: str, task: str, algorithm: str, compression: str, steps: int, seed: int,
                    partition: str = "dirichlet", alpha: float = 0.5) -> dict[str, Any]:
    """The [network] table of a new gossip network (what every member agrees on); a federation's is
    :func:`federation_network`."""
    from peer.files.defaults import gossip_table, trainer_table

    return {
        "topology": topology,
        "seed": seed,
        "task": task,
        "partition": {"scheme": partition, "alpha": alpha},
        "gossip": gossip_table(algorithm=algorithm, compression=compression, steps=steps, seed=seed),
        "trainer": trainer_table(task=task, steps=steps),
    }


def federation_network(*, task: str, seed: int, gateways: int, topology: str | None = None,
                       algorithm: str | None = None, compression: str | None = None,
                       partition: str = "dirichlet", alpha: float = 0.5) -> dict[str, Any]:
    """The [network] table of a new federation: only keys that act in it. The task, seed, partition
    and trainer act on every member; the gossip graph and algorithm only between two gateways or
    more (written then, with the algorithm's steps left to the rounds: a gateway gossips once a
    round). ``None``: the default (ring, dpsgd, identity)."""
    from peer.files.defaults import trainer_table

    network: dict[str, Any] = {"seed": seed, "task": task, "partition": {"scheme": partition, "alpha": alpha},
                               "trainer": trainer_table(task=task, steps=0)}
    if gateways > 1:
        network["topology"] = topology or "ring"
        network["gossip"] = {"algorithm": algorithm or "dpsgd"}
        if compression not in (None, "identity"):
            network["gossip"]["compression"] = compression
    return network


def default_federation(*, rounds: int, gateways: int, edges: int, seed: int,
                       min_registered: int | None = None) -> dict[str, Any]:
    """The [federation] table of a new federation. The influence bounds and ``min_registered``
    (default: ``min_clients``) are written out, so an operator sees them to change
    (protocols/federation/influence.py, config.py)."""
    from protocols.federation import FederationConfig

    defaults = FederationConfig()
    min_clients = min(2, edges)
    table: dict[str, Any] = {
        "rounds": rounds, "fraction": 0.5, "min_clients": min_clients,
        "min_registered": min_clients if min_registered is None else min_registered,
        "round_timeout_s": 30.0, "local_epochs": 1, "seed": seed}
    if gateways > 1:    # one gateway has no one to gossip with
        table["gossip_rounds"] = 1
    return {**table, "samples_multiple": defaults.samples_multiple, "norm_multiple": defaults.norm_multiple}


def task_as_written(task: str) -> str:
    """``--task`` as the configs must hold it: a ``file.py:function`` given relative to the working
    folder becomes absolute, since a config's relative paths are taken from the config's folder."""
    from peer.train.tasks import resolve_task_paths

    return resolve_task_paths(task, {}, Path.cwd())[0]


def _named(option: str, check: Callable[[], T]) -> T:
    """``check()``, with any error it raises made one line that names the command-line option."""
    from peer.files.config import ConfigError
    from protocols.errors import HivemeshError

    try:
        return check()
    except (ConfigError, HivemeshError, ValueError, KeyError, TypeError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise HivemeshError(f"{option}: {message}") from None


def check_network(network: dict[str, Any], *, peers: int, out: str, federated: bool = False) -> None:
    """Every spec ``init`` writes, checked as a peer checks it at start-up (paths taken from the
    configs' folder ``out``), so that a mistake is one error now (naming the option) rather than a
    failure later on every peer."""
    import torch

    from peer.files.config import load
    from peer.files.schema import NetworkSection, gossip_config, trainer_config
    from peer.train.tasks import get_task, resolve_task_paths
    from protocols.compress import from_spec
    from protocols.errors import HivemeshError
    from protocols.gossip import make_machine
    from topology import build, default_names

    if peers < 1:
        raise HivemeshError("--peers must be at least 1")
    if int(network.get("gossip", {}).get("total_steps", 1)) < 1:
        raise HivemeshError("--steps must be at least 1")
    names = default_names(peers)
    section = _named("--partition/--alpha", lambda: load(NetworkSection, network, source="hivemesh init",
                                                         prefix="network"))
    topology = _named("--topology", lambda: build(section.topology, names, seed=section.seed))
    task, options = resolve_task_paths(section.task, section.task_options, Path(out).resolve())
    _named("--task", lambda: get_task(task, **options))
    only_algorithm = NetworkSection(gossip={k: v for k, v in section.gossip.items() if k == "algorithm"})
    _named("--algorithm", lambda: gossip_config(only_algorithm, source="hivemesh init", prefix="gossip"))
    _named("--compression", lambda: from_spec(str(section.gossip.get("compression", "identity"))))
    gossip = _named("--compression", lambda: gossip_config(section, source="hivemesh init",
                                                           prefix="network.gossip"))
    _named("--steps", lambda: trainer_config(section, source="hivemesh init", prefix="network.trainer",
                                             federated=federated))
    # the algorithm on this graph (D-PSGD refuses a directed one, say)
    _named("--algorithm", lambda: make_machine(gossip, name=names[0], topology=topology,
                                               params=torch.zeros(1)))


def check_written(configs: Iterable[Path]) -> None:
    """Each config ``init`` wrote, read back and checked as ``hivemesh config check`` checks it (its
    task loaded from the file as the peer or edge client will load it), so that ``init`` never
    reports a network one of its members cannot start; one line naming the file otherwise."""
    from peer.cli.config import check_file
    from protocols.errors import HivemeshError

    for path in configs:
        try:
            check_file(path)
        except HivemeshError as error:
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise HivemeshError(f"init wrote a config that does not load: {text} (fix the option and run "
                                f"init again into an empty folder)") from None


def with_sets(tables: dict[str, dict[str, Any]], assignments: list[str], *,
              allowed: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``tables`` with each ``--set KEY=VALUE`` applied (peer.files.config.apply_override); a key
    outside the ``allowed`` tables is refused, naming it (a member's own keys are its own file's)."""
    from peer.files.config import apply_override
    from protocols.errors import HivemeshError

    tables = dict(tables)
    for assignment in assignments:
        table = assignment.partition("=")[0].strip().split(".")[0]
        if table not in allowed:
            raise HivemeshError(f"--set {assignment}: init sets the shared tables only "
                                f"({', '.join(name + '.KEY' for name in allowed)})")
        try:
            apply_override(tables, assignment, source="hivemesh init")
        except HivemeshError as error:
            raise HivemeshError(f"--set: {error}") from None
    return tables


def secure_defaults(federation: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """[federation] with what secure aggregation needs where ``--set`` turned it on and said nothing
    of it: an uplink it can sum (identity: qsgd's per-client scales cannot be), and a round timeout
    that outlasts its five phase deadlines."""
    from protocols.federation.secure_config import SecureAggregationConfig

    secure = federation.get("secure_aggregation")
    if not isinstance(secure, dict):
        return federation
    try:
        phases_s = SecureAggregationConfig(**secure).total_timeout_s()
    except (TypeError, ValueError):
        return federation       # the table's own error: the load after this names it
    given = {assignment.partition("=")[0].strip() for assignment in assignments}
    federation = dict(federation)
    if "federation.uplink" not in given:
        federation["uplink"] = "identity"
    if "federation.round_timeout_s" not in given:
        federation["round_timeout_s"] = max(float(federation.get("round_timeout_s", 0.0)), phases_s)
    return federation


def hosts_given(args: argparse.Namespace) -> list[str] | None:
    """The per-member addresses of ``--hosts`` or ``--hosts-file`` (None: one ``--host`` for all)."""
    from protocols.errors import HivemeshError

    if args.hosts is not None:
        return [entry.strip() for entry in args.hosts.split(",")]
    if args.hosts_file is not None:
        try:
            text = Path(args.hosts_file).read_text(encoding="utf-8")
        except OSError as error:
            raise HivemeshError(f"--hosts-file {args.hosts_file}: {error.strerror}") from None
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return [line for line in lines if line]
    return None


def run(args: argparse.Namespace) -> int:
    from peer.runtime.netinit import create_network
    from protocols.errors import HivemeshError

    if args.gateways or args.edges:
        if args.peers:
            raise HivemeshError("--peers: a gossip network or a federation (--gateways, --edges), not both")
        return _federation(args)
    if args.peers < 1:
        raise HivemeshError("--peers (or --gateways and --edges) is required")

    if args.min_registered is not None:
        raise HivemeshError("--min-registered: only in a federation (--gateways, --edges)")
    network = _named("--algorithm", lambda: default_network(
        topology=args.topology or "ring", task=task_as_written(args.task),
        algorithm=args.algorithm or "dpsgd", compression=args.compression or "identity",
        steps=300 if args.steps is None else args.steps, seed=args.seed, partition=args.partition,
        alpha=args.alpha))
    network = with_sets({"network": network}, args.overrides, allowed=("network",))["network"]
    check_network(network, peers=args.peers, out=args.out)      # before any file is written
    files = create_network(args.out, peers=args.peers, network=network, host=args.host or "127.0.0.1",
                           base_port=args.base_port, peer_options={"curve": args.curve},
                           hosts=hosts_given(args))
    check_written(files.configs.values())
    print(f"created a network of {args.peers} peers in {files.out}")
    print(f"  roster:  {files.roster}")
    print(f"  keys:    {files.out / 'keys'}/ (mode 0600; give each machine only its own)")
    for name, path in files.configs.items():
        print(f"  {name}:  hivemesh peer --config {path}")
    return 0


def _federation(args: argparse.Namespace) -> int:
    """``--gateways G --edges E``: the gateways gossip over ``--topology`` (one gossip exchange after
    each FedAvg round when G > 1) and run ``--rounds`` FedAvg rounds for their edge clients."""
    from peer.files.config import load
    from peer.runtime.netinit import create_federation
    from peer.runtime.peerconfig import PeerFederationSection
    from protocols.errors import HivemeshError

    if args.gateways < 1 or args.edges < 1:
        raise HivemeshError("--gateways and --edges must both be at least 1")
    if args.steps is not None:
        raise HivemeshError("--steps: a federation counts --rounds (its clients' local work is "
                            "federation.local_epochs or local_steps: --set federation.local_steps=N)")
    if args.gateways == 1:
        given = [option for option, value in (("--topology", args.topology), ("--algorithm", args.algorithm),
                                              ("--compression", args.compression)) if value is not None]
        if given:
            raise HivemeshError(f"{given[0]}: one gateway gossips with no one (these set the gateways' "
                                "gossip, with --gateways 2 or more)")
    federation = default_federation(rounds=args.rounds, gateways=args.gateways, edges=args.edges,
                                    seed=args.seed, min_registered=args.min_registered)
    _named("--rounds/--min-registered", lambda: PeerFederationSection(**federation))
    network = federation_network(task=task_as_written(args.task), seed=args.seed, gateways=args.gateways,
                                 topology=args.topology, algorithm=args.algorithm,
                                 compression=args.compression, partition=args.partition, alpha=args.alpha)
    shared = with_sets({"network": network, "federation": federation}, args.overrides,
                       allowed=("network", "federation"))
    network, federation = shared["network"], shared["federation"]
    federation = secure_defaults(federation, args.overrides)
    _named("--set", lambda: load(PeerFederationSection, federation, source="federation.toml",
                                 prefix="federation"))
    check_network(network, peers=args.gateways, out=args.out, federated=True)
    curve = {"curve": args.curve}
    files = create_federation(args.out, gateways=args.gateways, edges=args.edges, network=network,
                              federation=federation, host=args.host or "127.0.0.1",
                              base_port=args.base_port, peer_options=curve, edge_options=curve,
                              hosts=hosts_given(args))
    check_written([*files.network.configs.values(), *files.edge_configs.values()])
    gateways = "1 gateway" if args.gateways == 1 else f"{args.gateways} gateways"
    edges = "1 edge client" if args.edges == 1 else f"{args.edges} edge clients"
    print(f"created a federation of {gateways} and {edges} in "
          f"{files.network.out}")
    print(f"  shared:  {files.shared} ([network] and [federation]: every member includes it; edit "
          f"them there)")
    print(f"  roster:  {files.network.roster}")
    print(f"  keys:    {files.network.out / 'keys'}/ (mode 0600; give each machine only its own)")
    for name, path in files.network.configs.items():
        print(f"  {name}:  hivemesh peer --config {path}")
    for name, path in files.edge_configs.items():
        print(f"  {name}:  hivemesh edge --config {path}")
    return 0
