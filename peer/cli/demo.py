"""``hivemesh demo``: the main job — a real local network of peer processes training together.

By default: 8 peers on 127.0.0.1 on a ring, D-PSGD, ``digits-mlp`` with
Dirichlet(0.5) label skew (each peer sees mostly a few digits), every message
signed and verified. It creates the network with ``hivemesh init``'s code in
a temporary folder (or ``--out``), starts one ``hivemesh peer`` daemon per
member as a process, shows live progress, and ends with every peer's test
accuracy, the distance between the peers' models and the bytes moved.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.files.console import Reading


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the main job: a local network of peers training together",
        description="Start a local network of peer daemons on 127.0.0.1 (default: 8 peers on a ring, "
                    "D-PSGD, digits-mlp, Dirichlet(0.5) shards), show live progress, and print every "
                    "peer's accuracy, the consensus distance and the bytes moved.")
    parser.add_argument("--peers", type=int, default=8, help="number of peers (default: 8)")
    parser.add_argument("--topology", default="ring", help="topology spec (default: ring)")
    parser.add_argument("--algorithm", default="dpsgd", help="gossip algorithm (default: dpsgd)")
    parser.add_argument("--compression", default="identity", help="compression spec (default: identity)")
    parser.add_argument("--steps", type=int, default=300, help="local steps per peer (default: 300)")
    parser.add_argument("--task", default="digits-mlp", help="training task (default: digits-mlp)")
    parser.add_argument("--seed", type=int, default=0, help="network seed (default: 0)")
    parser.add_argument("--out", default=None,
                        help="keep the network (keys, roster, configs, checkpoints, metrics) in this new "
                             "folder instead of a temporary one")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tempfile

    if args.out is not None:
        return _demo(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="hivemesh-demo-") as folder:
        return _demo(args, Path(folder) / "net")


def _demo(args: argparse.Namespace, out: Path) -> int:
    from peer.cli.init import default_network, task_as_written
    from peer.runtime.launch import PeerProcesses
    from peer.runtime.netinit import create_network
    from topology import build, default_names

    build(args.topology, default_names(args.peers), seed=args.seed)   # a bad spec fails before any file
    network = default_network(topology=args.topology, task=task_as_written(args.task),
                              algorithm=args.algorithm, compression=args.compression, steps=args.steps,
                              seed=args.seed)
    files = create_network(out, peers=args.peers, network=network,
                           peer_options={"progress": False, "eval_every_steps": 50}, reserve=True)
    print(f"hivemesh demo: {args.peers} peers on 127.0.0.1, topology {args.topology}, {args.algorithm}"
          f"{'' if args.compression == 'identity' else ' + ' + args.compression}, task {args.task}, "
          f"Dirichlet(0.5) shards, {args.steps} steps each; every message signed (Ed25519) and verified")
    print(f"  network files in {out} (hivemesh init writes the same: keys, roster.toml, one config per peer)")
    print("  starting the peer processes (forked from a server that has imported torch once) ...", flush=True)
    started = time.monotonic()
    with PeerProcesses(files.configs, listeners=files.listeners) as processes:
        try:
            processes.start_all()
            _watch(processes, files.configs, args.steps)
        except KeyboardInterrupt:
            print("\nstopping the peers (each writes a checkpoint) ...", flush=True)
            for name in processes.alive():
                processes.terminate(name)
            processes.wait(15)
            raise
        codes = processes.exitcodes()
    return _report(files.configs, codes, time.monotonic() - started)


def _statuses(configs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    from peer.files.statefiles import read_status

    found = {}
    for name, path in configs.items():
        status = read_status(path.parent / "data" / name)
        if status is not None:
            found[name] = status
    return found


def _watch(processes: Any, configs: dict[str, Path], total_steps: int) -> None:
    """The live display of the whole network: the slowest peer's step, mean accuracy, bytes, refusals,
    and which peers are not training and why (``p03: waiting for p02 (1/2 up)``)."""
    from peer.files.console import Progress

    display = Progress(f"{len(configs)} peers", total_steps)
    try:
        while processes.alive():
            time.sleep(0.5)
            exited = set(configs) - set(processes.alive())
            display.update(_network_reading(_statuses(configs), exited))
    finally:
        display.close()


def _network_reading(statuses: dict[str, dict[str, Any]], exited: set[str]) -> Reading:
    """``exited``: peers whose process has ended (one that did not finish, stop or strand has crashed)."""
    from peer.files.console import Reading

    accuracies = [s["accuracy"] for s in statuses.values()
                  if isinstance(s.get("accuracy"), float) and math.isfinite(s["accuracy"])]
    states = {name: str(s.get("waiting_for") or s.get("state")) for name, s in statuses.items()}
    for name in exited:
        if states.get(name) not in ("finished", "stranded", "stopped"):
            states[name] = "exited (see its peer.log)"
    odd = [f"{name}: {state}" for name, state in sorted(states.items()) if state != "training"]
    finished = sum(1 for state in states.values() if state == "finished")
    note = (f"{finished}/{len(states)} finished" if odd and finished == len(odd) else
            "; ".join(odd[:2]) + (f"; +{len(odd) - 2} more" if len(odd) > 2 else ""))
    return Reading(done=min((s.get("step", 0) for s in statuses.values()), default=0),
                   accuracy=sum(accuracies) / len(accuracies) if accuracies else None,
                   bytes_sent=sum(s.get("bytes_sent", 0) for s in statuses.values()),
                   bytes_received=sum(s.get("bytes_received", 0) for s in statuses.values()),
                   rejected=sum(sum(s.get("rejections", {}).values()) for s in statuses.values()),
                   note=note if statuses else "starting")


def _report(configs: dict[str, Path], codes: dict[str, int | None], elapsed_s: float) -> int:
    import torch

    from peer.files.units import human_bytes
    from peer.runtime.export import latest_params
    from peer.runtime.peerconfig import load_peer_config
    from protocols.consensus import max_relative_distance

    statuses = _statuses(configs)
    params = {}
    for name, path in configs.items():
        try:
            params[name] = latest_params(load_peer_config(path))[0].to(torch.float64)
        except Exception:   # a peer that crashed before its first checkpoint: reported below
            continue
    consensus = max_relative_distance(list(params.values())) if len(params) > 1 else float("nan")
    print(f"\n{'peer':<6} {'exit':>4} {'step':>5} {'accuracy':>8} {'sent':>9} {'received':>9} "
          f"{'rejected':>8}")
    total_sent = total_received = 0
    failed = False
    for name in configs:
        status = statuses.get(name, {})
        code = codes.get(name)
        failed |= code != 0
        accuracy = status.get("accuracy")
        total_sent += status.get("bytes_sent", 0)
        total_received += status.get("bytes_received", 0)
        print(f"{name:<6} {code if code is not None else '-':>4} {status.get('step', '-'):>5} "
              f"{accuracy if accuracy is None else format(accuracy, '.4f'):>8} "
              f"{human_bytes(status.get('bytes_sent', 0)):>9} "
              f"{human_bytes(status.get('bytes_received', 0)):>9} "
              f"{sum(status.get('rejections', {}).values()):>8}")
    accuracies = [s["accuracy"] for s in statuses.values() if isinstance(s.get("accuracy"), float)]
    print(f"\naccuracy: min {min(accuracies, default=float('nan')):.4f}, "
          f"mean {sum(accuracies) / max(len(accuracies), 1):.4f} over {len(accuracies)} peers")
    print(f"consensus distance max_i ||x_i - mean|| / ||mean|| (relative): {consensus:.2e}")
    print(f"bytes moved: {human_bytes(total_sent)} sent, {human_bytes(total_received)} received, "
          f"in {elapsed_s:.1f} s (process start-up included)")
    if failed:
        print("some peers did not finish cleanly: see data/NAME/peer.log", file=sys.stderr)
        return 1
    return 0
