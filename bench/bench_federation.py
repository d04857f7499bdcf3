"""The same FedAvg task in Flower's simulation and in ours (sim/federation.py), side by side in one run.

``digits-mlp`` (the 64-128-10 MLP, the project's stratified 80/20 split of
scikit-learn's digits), every client in every round, 1 local epoch, batch 32,
SGD at lr 0.1, float32 updates sent whole (our uplink ``identity``, as
Flower's NumPy arrays). Both sides get the same shards: Flower's script splits
a seeded permutation of the training set into equal parts, and ours reads the
same index lists from a partition file. Sizes: 10 clients x 10 rounds and 100
clients x 5 rounds; then the same task over real processes on loopback (1 gateway,
``hivemesh peer`` with ``[federation]``, and 10 edge clients, ``hivemesh edge``:
signed messages over ZeroMQ with CurveZMQ, 10 rounds) beside our simulation of that
very federation, whose final model it must equal bit for bit (issue 12 g; on seeded
iid shards, since a partition file would need a shard for the gateway, which trains
nothing); then ours alone with 1,000 clients x 10 rounds, in its own process, with
its peak memory (Flower's users hit out-of-memory at that scale; ``--flower-1000``
runs Flower there too).

Timing: from the API call (ours: ``FederationRun(...).run()``, what ``sim.run.run_scenario`` calls; Flower:
``run_simulation``) to the end, in an already-warm process: interpreter start,
``import torch`` and loading the dataset are outside both. Per round: the wall
time at which each round's global model was evaluated (Flower: its
``evaluate_fn``; ours: the trace point at each round's close); "later rounds"
is the mean of rounds 2.. (Flower's first round carries Ray's start). Real processes:
from their start (forked from a server that has imported torch, started before the
clock) until every one exited; a round ends when the gateway's ``rounds.jsonl``
shows it, so its first round carries each process's set-up (dataset, model, keys,
the CurveZMQ handshake) and the clients' registration.

What differs (said, not hidden): Flower's model starts from ``torch.manual_seed``,
ours from the task's seeded init (at seed 0 they give the same curves at 100 x 5, where
each shard is one batch); the batch order within an epoch differs; our simulation models the network
(link latency and bandwidth) and runs the gateway and clients on the
per-member Node with heartbeats, on a virtual clock, in one process.

Flower runs from its own venv (``--flower-python``, default
/tmp/flwrvenv/bin/python), so the project's environment is untouched; make it
with ``python3 -m venv /tmp/flwrvenv && /tmp/flwrvenv/bin/pip install torch==2.13.0
"flwr[simulation]==1.42.*" scikit-learn`` (about 2 min); without it only Flower's rows are
skipped, with a note.

Measured here (2 CPUs shared with other work, load 5-8; two runs, flwr 1.42 with Ray): 10 x 10,
Flower 25-52 s end to end (19-46 s to its first round) and 370-400 ms per later round, ours
0.35-0.75 s and 35-73 ms (33-147x end to end, 5.1-11.7x per later round), final accuracy 0.869
against 0.883; 100 x 5, Flower 32-42 s and 3.1-3.2 s per later round, ours 0.42-1.0 s and
64-154 ms (42-77x, 21-48x), both 0.444 after 5 rounds (the same accuracy in every round, to
three decimals); 1,000 x 10, ours 16.5-17.7 s with a peak of
510-530 MB. Our later rounds are mostly the clients' SGD steps themselves (1 ms each).
A third run (load 5.7): Flower 55.2 s and 457 ms per later round at 10 x 10, ours 0.90 s and
79 ms (61x, 5.8x); 100 x 5, 46.8 s / 3.3 s against 1.6 s / 259 ms (29x, 13x); over real
processes on loopback, 1 gateway + 10 edge clients x 10 rounds took 11.2 s end to end (7.5 s
to its first round: eleven processes set up and registered on two busy CPUs) and 298 ms per
later round, final accuracy 0.878, its final model our simulation's bit for bit (1.1 s,
109 ms per later round); 1,000 x 10, ours 33.5 s with a peak of 511 MB.

Run: ``.venv/bin/python bench/bench_federation.py [--flower-python PY] [--quick]``
(``--quick``: 4 clients x 2 rounds, 3 x 2 over processes and 20 x 2, no Flower: a smoke run,
not a measurement; tests/test_bench_smoke.py runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

EPOCHS, BATCH, LR, SEED = 1, 32, 0.1, 0
TRAINER = {"lr": LR, "batch_size": BATCH, "device": "cpu"}
# the real-process row's shards: seeded iid by member name (a partition file would need a shard for
# the gateway too, which trains nothing), and our simulation beside it on the same
LOOPBACK_PARTITION = {"scheme": "iid"}


def shard_file(clients: int, folder: Path) -> Path:
    """Flower's script's shards (equal parts of a seeded permutation) as our partition file."""
    from peer.train.partition import save_index_file
    from peer.train.tasks import get_task

    n = len(get_task("digits-mlp").labels)
    parts = np.array_split(np.random.default_rng(SEED).permutation(n), clients)
    width = max(3, len(str(clients - 1)))
    path = folder / f"shards-{clients}.json"
    save_index_file(path, {f"e{i:0{width}d}": part for i, part in enumerate(parts)})
    return path


def ours(clients: int, rounds: int, folder: Path, partition: dict[str, Any] | None = None) -> dict[str, Any]:
    """Our federation simulation of the task, timed from the API call (``partition``: the scenario's
    table; default: Flower's script's shards)."""
    from peer.train.tasks import get_task
    from sim.federation import FederationRun
    from sim.scenario import scenario_from_dict
    from sim.world import TracePoint

    get_task("digits-mlp")  # the dataset loaded before the clock starts, as Flower's script does
    data = {"name": f"fed-{clients}x{rounds}", "seed": SEED, "duration_s": 1e6,
            "task": {"name": "digits-mlp"}, "trainer": TRAINER,
            "partition": partition or {"scheme": "file", "path": str(shard_file(clients, folder))},
            "nodes": {"step_time_ms": 10.0, "heartbeat_interval_s": 5.0, "neighbour_timeout_s": 60.0},
            "federation": {"gateways": 1, "clients": clients,
                           "server": {"rounds": rounds, "fraction": 1.0, "min_clients": clients,
                                      "local_epochs": EPOCHS, "uplink": "identity", "seed": SEED}}}
    ends_s: list[float] = []
    accuracy: list[float] = []
    started = time.perf_counter()

    def progress(now: float, duration: float, point: TracePoint) -> None:
        ends_s.append(time.perf_counter() - started)
        accuracy.append(point.mean_accuracy)

    run = FederationRun(scenario_from_dict(data), progress)   # (what sim.run.run_scenario calls)
    result = run.run()
    total_s = time.perf_counter() - started
    assert len(result.rounds) == rounds and all(r["participants"] == clients for r in result.rounds)
    server = run.members["gw0"].server
    assert server is not None
    return {"total_s": total_s, "round_end_s": ends_s, "accuracy": accuracy, "params": server.params,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def real_processes(clients: int, rounds: int, folder: Path) -> dict[str, Any]:
    """The same task over real processes on loopback: a gateway (``hivemesh peer`` with
    ``[federation]``) and ``clients`` edge clients (``hivemesh edge``), signed messages over ZeroMQ
    with CurveZMQ. Timed from the processes' start (forked from a server that already imported
    torch, as the other rows exclude ``import torch``) until all of them exited; a round ends when
    the gateway's ``rounds.jsonl`` shows it (polled every 10 ms)."""
    from peer.runtime.export import latest_params
    from peer.runtime.launch import PeerProcesses, context
    from peer.runtime.netinit import create_federation
    from peer.runtime.peerconfig import load_peer_config

    network = {"topology": "ring", "seed": SEED, "task": "digits-mlp", "partition": LOOPBACK_PARTITION,
               "gossip": {"algorithm": "dpsgd", "total_steps": rounds, "seed": SEED}, "trainer": TRAINER}
    # every client in every round; a deadline that never fires: the rounds close at their quota
    federation = {"rounds": rounds, "fraction": 1.0, "min_clients": clients, "local_epochs": EPOCHS,
                  "uplink": "identity", "seed": SEED, "round_timeout_s": 600.0}
    liveness = {"progress": False, "heartbeat_interval_s": 0.5, "neighbour_timeout_s": 60.0}
    files = create_federation(folder / f"real-{clients}x{rounds}", gateways=1, edges=clients, network=network,
                              federation=federation, reserve=True,
                              peer_options={**liveness, "eval_every_steps": 0, "start_timeout_s": 120.0,
                                            "finish_grace_s": 0.5},
                              edge_options=liveness)
    [gateway] = files.network.configs
    rounds_file = files.network.out / "data" / gateway / "rounds.jsonl"
    warm = context().Process(target=os.getpid)   # the forkserver up, torch imported, before the clock
    warm.start()
    warm.join()
    ends_s: list[float] = []
    accuracy: list[float] = []
    with PeerProcesses(files.network.configs, listeners=dict(files.network.listeners),
                       edges=files.edge_configs) as run:
        started = time.perf_counter()
        run.start_all()
        deadline = started + 600.0
        while run.alive() and time.perf_counter() < deadline:
            rows = rounds_file.read_text().splitlines() if rounds_file.exists() else []
            for line in rows[len(ends_s):]:
                ends_s.append(time.perf_counter() - started)
                accuracy.append(float(json.loads(line)["accuracy"]))
            time.sleep(0.01)
        total_s = time.perf_counter() - started
        codes = run.exitcodes()
    rows = rounds_file.read_text().splitlines()
    accuracy = [float(json.loads(line)["accuracy"]) for line in rows]
    ends_s += [total_s] * (len(rows) - len(ends_s))      # closed between the last poll and the exit
    if any(code != 0 for code in codes.values()) or len(rows) != rounds:
        raise RuntimeError(f"real federation: exit codes {codes}, {len(rows)} of {rounds} rounds "
                           f"(logs in {files.network.out / 'data'})")
    final = latest_params(load_peer_config(files.network.configs[gateway]))[0]
    return {"total_s": total_s, "round_end_s": ends_s, "accuracy": accuracy, "params": final}


def ours_in_child(clients: int, rounds: int) -> dict[str, Any]:
    """:func:`ours` in a fresh process, for its own peak memory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, "--child", str(clients), str(rounds)], env=env,
                          capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child run failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def flower(python: str, clients: int, rounds: int) -> tuple[dict[str, Any] | None, str]:
    if not python:
        return None, "not asked for (--flower-python '')"
    if not Path(python).exists():
        return None, f"no Flower venv at {python} (see this script's docstring)"
    started = time.perf_counter()
    try:
        command = [python, str(HERE / "_flower_fedavg.py"),
                   *(str(v) for v in (clients, rounds, EPOCHS, BATCH, LR, SEED))]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "Flower run timed out (30 min)"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return None, f"Flower run failed after {time.perf_counter() - started:.0f} s: {tail}"
    report = dict(json.loads(lines[-1]))
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    report["peak_mb"] = peak  # the largest single process of its tree so far (Ray's workers apart)
    return report, f"flwr {report['version']}"


def later_round_ms(run: dict[str, Any]) -> float:
    ends = run["round_end_s"]
    if len(ends) < 2:
        return math.nan
    return 1000.0 * (ends[-1] - ends[0]) / (len(ends) - 1)


def per_round(run: dict[str, Any]) -> str:
    return " ".join(f"{a:.3f}" for a in run["accuracy"])


def row(size: str, system: str, run: dict[str, Any]) -> str:
    ends = run["round_end_s"]
    return (f"{size:<12} {system:<8} {run['total_s']:>8.2f} {ends[0] if ends else math.nan:>14.2f} "
            f"{later_round_ms(run):>19.1f} {run['accuracy'][-1]:>9.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flower-python", default="/tmp/flwrvenv/bin/python")
    parser.add_argument("--flower-1000", action="store_true", help="run Flower at 1,000 clients too")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as folder:
            found = ours(args.child[0], args.child[1], Path(folder))
            print(json.dumps({k: v for k, v in found.items() if k != "params"}))
        return 0
    sizes, large, loopback = [(10, 10), (100, 5)], (1000, 10), (10, 10)
    if args.quick:
        sizes, large, loopback, args.flower_python = [(4, 2)], (20, 2), (3, 2), ""
    import torch  # imported before any clock starts, on both sides

    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work shares them)")
    print(f"{'size':<12} {'system':<8} {'total s':>8} {'first round s':>14} {'later rounds ms':>19} "
          f"{'final acc':>9}")
    notes = []
    with tempfile.TemporaryDirectory() as folder:
        for clients, rounds in sizes:
            size = f"{clients} x {rounds}"
            if (clients, rounds) == sizes[0]:
                ours(clients, rounds, Path(folder))  # warm-up: the first run in a process pays lazy imports
            mine = ours(clients, rounds, Path(folder))
            theirs, note = flower(args.flower_python, clients, rounds)
            if theirs is not None:
                print(row(size, "flower", theirs))
            else:
                print(f"{size:<12} {'flower':<8} skipped")
            notes.append(f"{size}: {note}")
            print(row(size, "ours", mine))
            if theirs is not None:
                print(f"{size:<12} {'speed-up':<8} {theirs['total_s'] / mine['total_s']:>7.1f}x "
                      f"{'':>14} {later_round_ms(theirs) / later_round_ms(mine):>18.1f}x "
                      f"{mine['accuracy'][-1] - theirs['accuracy'][-1]:>+9.3f}")
                print(f"{'':<12} accuracy per round, flower: {per_round(theirs)}")
            print(f"{'':<12} accuracy per round, ours:   {per_round(mine)}")
        clients, rounds = loopback
        mine = ours(clients, rounds, Path(folder), LOOPBACK_PARTITION)
        real = real_processes(clients, rounds, Path(folder))
        size = f"{clients} x {rounds}"
        print(f"{size} over real processes on loopback (1 gateway + {clients} edge clients), iid shards:")
        print(row(size, "ours", mine))
        print(row(size, "real", real))
        print(f"{'':<12} accuracy per round, real: {per_round(real)}")
        same = "yes" if torch.equal(real["params"], mine["params"]) else "NO"
        print(f"{'':<12} real's final model is ours bit for bit: {same}; real / ours: "
              f"{real['total_s'] / mine['total_s']:.1f}x end to end, "
              f"{later_round_ms(real) / later_round_ms(mine):.1f}x per later round")
    clients, rounds = large
    big = ours_in_child(clients, rounds)
    print(row(f"{clients} x {rounds}", "ours", big))
    print(f"peak memory (ru_maxrss) ours at {clients} clients: {big['peak_mb']:.0f} MB")
    if args.flower_1000 and not args.quick:
        theirs, note = flower(args.flower_python, clients, rounds)
        print(row(f"{clients} x {rounds}", "flower", theirs) if theirs else f"flower at {clients}: {note}")
        if theirs:
            print(f"peak memory (ru_maxrss, largest process) Flower at {clients} clients: "
                  f"{theirs['peak_mb']:.0f} MB")
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
