"""Simulator cost: overhead per peer-round against a plain torch loop, and a 1,000-peer run.

Part 1, overhead. A D-PSGD scenario (logreg on generated data, exponential
graph) is simulated, and the same SGD maths (the same models, batches and
steps, mixing included) is run as a plain torch loop in the same process.
Overhead per peer-round = (simulation wall time - plain loop) / peer-rounds:
the engine, links, signing and verifying, encoding, the machines' rounds.
Shown with every message verified and with ``verify_fraction`` (scale runs).
Anchor (shared/ANCHORS.md): Flower's simulation spends about 20 ms per
client-round here; the goal is at most 2 ms.

Part 2, scale. 1,000 peers on an exponential graph, 100 rounds: wall time and
peak memory (ru_maxrss), goal under 10 minutes and 4 GB.

Part 0, optional (``--against REV``): the same simulation, timed alternately with
this tree's code and with commit REV's (a temporary git worktree, each run a fresh
process), so a change's cost per peer-round is a same-run ratio, not a memory.

Run:  .venv/bin/python bench/bench_sim.py [--peers 100] [--rounds 30] [--scale-peers 1000]
      [--scale-rounds 100] [--scale-verify 0.05] [--skip-scale] [--quick]
      [--against REV [--repeats 3]]
(--quick: 8 peers and 3 rounds, then 16 peers and 2 rounds: a smoke run for CI, not a measurement.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

FLOWER_MS_PER_CLIENT_ROUND = 20.0  # shared/ANCHORS.md: 10 clients x 10 rounds, ~210 ms per round


def scenario(peers: int, rounds: int, verify_fraction: float, samples_per_peer: int = 64) -> Any:
    from sim.scenario import scenario_from_dict

    return scenario_from_dict(scenario_dict_for(peers, rounds, verify_fraction, samples_per_peer))


def scenario_dict_for(peers: int, rounds: int, verify_fraction: float,
                      samples_per_peer: int = 64) -> dict[str, Any]:
    return {
        "name": f"bench-{peers}", "seed": 0, "duration_s": 1e6, "eval_every_s": 1e6, "eval_sample": 20,
        "verify_fraction": verify_fraction,
        "graph": {"spec": f"exponential:{peers}"},
        "links": {"latency_ms": 1.0, "bandwidth_mbps": 1000.0},
        "nodes": {"step_time_ms": 10.0},
        "algorithm": {"algorithm": "dpsgd", "total_steps": rounds, "deadline_s": 60.0},
        "task": {"name": "logreg", "options": {"n_samples": peers * samples_per_peer, "n_features": 20,
                                               "n_classes": 2}},
        "partition": {"scheme": "iid"},
        "trainer": {"lr": 0.1, "batch_size": 32},
    }


def simulate(peers: int, rounds: int, verify_fraction: float) -> tuple[float, float, Any]:
    """(seconds running the rounds, seconds of the final evaluation of every member, result)."""
    from sim.gossip_driver import GossipRun
    from sim.world import build_world

    world = build_world(scenario(peers, rounds, verify_fraction))
    run = GossipRun(world)
    started = time.perf_counter()
    run.begin()
    world.engine.run(until_s=world.scenario.duration_s)
    ran = time.perf_counter()
    result = run.end()
    return ran - started, time.perf_counter() - ran, result


def plain_loop(peers: int, rounds: int) -> float:
    """The same SGD and mixing maths as a bare torch loop: the floor a simulator cannot go below."""
    from peer.train.partition import partition
    from peer.train.tasks import get_task
    from topology import build

    sc = scenario(peers, rounds, 1.0)
    task = get_task(sc.task.name, **sc.task.options)
    topology = build(sc.graph.spec)
    shards = list(partition(task.labels, topology.names, scheme="iid", seed=0).values())
    x, y = task.data("train", torch.float32, torch.device("cpu"))
    models = [task.build_model(0) for _ in range(peers)]
    flats = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
    neighbours = [[(topology.index(j), w) for j, w in topology.in_neighbours(n, 0).items()]
                  for n in topology.names]
    self_weights = [topology.self_weight(n, 0) for n in topology.names]
    batches = [torch.from_numpy(s[:32]) for s in shards]
    started = time.perf_counter()
    for _ in range(rounds):
        sent = [f.clone() for f in flats]
        for i, model in enumerate(models):
            xb, yb = x.index_select(0, batches[i]), y.index_select(0, batches[i])
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)  # type: ignore[arg-type]
        for i in range(peers):
            mixed = sent[i] * self_weights[i]
            for j, w in neighbours[i]:
                mixed.add_(sent[j], alpha=w)
            flats[i] = mixed
    return time.perf_counter() - started


# One timed simulation in a fresh process, importing whichever tree PYTHONPATH names; only the
# public entry points both trees have (scenario_from_dict, build_world, GossipRun).
_TIMED = """
import json, sys, time, torch
torch.set_num_threads(1)
from sim.scenario import scenario_from_dict
from sim.world import build_world
from sim.gossip_driver import GossipRun
world = build_world(scenario_from_dict(json.loads(sys.argv[1])))
run = GossipRun(world)
started = time.perf_counter()
run.begin()
world.engine.run(until_s=world.scenario.duration_s)
print(json.dumps({"wall_s": time.perf_counter() - started}))
"""


def timed_in(tree: Path, scenario_dict: dict[str, Any]) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _TIMED, json.dumps(scenario_dict)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["wall_s"])


def against(rev: str, peers: int, rounds: int, repeats: int) -> None:
    """Part 0: this tree against commit ``rev``, alternating, median of ``repeats`` each."""
    here = Path(__file__).resolve().parent.parent
    scenario_dict = scenario_dict_for(peers, rounds, 1.0)
    with tempfile.TemporaryDirectory(prefix="hivemesh-bench-") as scratch:
        other = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", "-q", str(other), rev],
                       check=True)
        try:
            times: dict[str, list[float]] = {"this tree": [], rev: []}
            for _ in range(repeats):
                times["this tree"].append(timed_in(here, scenario_dict))
                times[rev].append(timed_in(other, scenario_dict))
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(other)], check=True)
    peer_rounds = peers * rounds
    base = statistics.median(times[rev])
    print(f"part 0: {peers} peers, {rounds} rounds, this tree against {rev} "
          f"(median of {repeats}, alternating, fresh processes)")
    print(f"{'code':<34} {'wall s':>8} {'ms/peer-round':>14} {'ratio':>8}")
    for label, walls in times.items():
        median = statistics.median(walls)
        print(f"{label:<34} {median:8.2f} {1000 * median / peer_rounds:14.3f} {median / base:8.3f}")
    print()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--scale-peers", type=int, default=1000)
    parser.add_argument("--scale-rounds", type=int, default=100)
    parser.add_argument("--scale-verify", type=float, default=0.05)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--against", metavar="REV", help="also time the simulation with commit REV's code")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side for --against")
    args = parser.parse_args()
    if args.quick:
        args.peers, args.rounds, args.scale_peers, args.scale_rounds = 8, 3, 16, 2
    torch.set_num_threads(1)
    if args.against:
        against(args.against, args.peers, args.rounds, args.repeats)

    peer_rounds = args.peers * args.rounds
    floor_s = plain_loop(args.peers, args.rounds)
    print(f"part 1: {args.peers} peers, exponential graph, logreg, D-PSGD, {args.rounds} rounds "
          f"({peer_rounds} peer-rounds)")
    print("(simulated runs: the rounds, with 20 members evaluated at the start; not the final evaluation)")
    print(f"{'run':<34} {'wall s':>8} {'ms/peer-round':>14} {'overhead ms':>12} {'vs Flower 20 ms':>16}")
    print(f"{'plain torch loop (floor)':<34} {floor_s:8.2f} {1000 * floor_s / peer_rounds:14.3f} "
          f"{'-':>12} {'-':>16}")
    for fraction in (1.0, 0.05):
        wall_s, _, result = simulate(args.peers, args.rounds, fraction)
        overhead_ms = 1000 * (wall_s - floor_s) / peer_rounds
        label = f"sim, verify_fraction={fraction:g}"
        # at tiny sizes the simulation can beat the floor's first (cold) loop: no ratio then
        versus = f"{FLOWER_MS_PER_CLIENT_ROUND / overhead_ms:15.1f}x" if overhead_ms > 0 else f"{'-':>16}"
        print(f"{label:<34} {wall_s:8.2f} {1000 * wall_s / peer_rounds:14.3f} {overhead_ms:12.3f} {versus}")
    messages = sum(p["messages_sent"] for p in result.peers.values())
    print(f"  messages per peer-round: {messages / peer_rounds:.1f}; events: {result.events_run}")

    if args.skip_scale:
        return
    print(f"\npart 2: {args.scale_peers} peers, exponential graph, logreg, D-PSGD, "
          f"{args.scale_rounds} rounds, verify_fraction={args.scale_verify:g}")
    before_mb = peak_rss_mb()
    started = time.perf_counter()
    wall_s, final_eval_s, result = simulate(args.scale_peers, args.scale_rounds, args.scale_verify)
    total_s = time.perf_counter() - started
    accuracy = result.trace[-1].mean_accuracy if result.trace else float("nan")
    print(f"{'wall (build, run, evaluate)':<28} {total_s:9.1f} s   (goal < 600 s: {total_s / 600:.2f} of it)")
    print(f"{'wall (rounds only)':<28} {wall_s:9.1f} s   "
          f"({1000 * wall_s / (args.scale_peers * args.scale_rounds):.2f} ms per peer-round)")
    print(f"{'wall (final evaluation)':<28} {final_eval_s:9.1f} s   (every member, test and train split)")
    print(f"{'peak memory (ru_maxrss)':<28} {peak_rss_mb():9.0f} MB  "
          f"(goal < 4096 MB; {before_mb:.0f} MB before)")
    print(f"{'messages / events':<28} {sum(p['messages_sent'] for p in result.peers.values()):9d} / "
          f"{result.events_run}")
    print(f"{'final mean accuracy':<28} {accuracy:9.3f}   simulated {result.simulated_time_s:.1f} s")


if __name__ == "__main__":
    main()
