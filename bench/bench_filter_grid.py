"""The insider filter's false alarms on honest runs: refusals per cell of acceptance (c)'s grid.

Exact D-PSGD (compression identity), no attacker, the default ``norm_multiple``,
``digits-mlp`` trained by 16 simulated peers on ring:16, exponential:16 and
hypercube:16, with iid and Dirichlet(0.3) shards, then ``--final-rounds``
gossip-only rounds (where the disagreement left is a slow eigenvector of W:
the filter's hardest honest case). Every refusal is a false positive; the goal
is 0 in every cell. The table also gives the final mean accuracy and
consensus distance, so a filter that "passes" by refusing nothing while the
run diverges would show.
Run: ``.venv/bin/python bench/bench_filter_grid.py [--steps N] [--final-rounds R] [--seeds S]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sim.run import run_scenario
from sim.scenario import scenario_from_dict

SPECS = ("ring:16", "exponential:16", "hypercube:16")
PARTITIONS: dict[str, dict[str, Any]] = {"iid": {"scheme": "iid"},
                                         "dirichlet(0.3)": {"scheme": "dirichlet", "alpha": 0.3}}


def honest_scenario(spec: str, partition: dict[str, Any], *, steps: int, final_rounds: int,
                    seed: int) -> Any:
    """One honest cell: exact D-PSGD with the default filter, no faults."""
    return scenario_from_dict({
        "name": f"{spec} {partition['scheme']}", "seed": seed, "duration_s": 600.0, "eval_every_s": 5.0,
        "target_accuracy": 0.0, "graph": {"spec": spec},
        "links": {"latency_ms": 1.0, "bandwidth_mbps": 10_000.0}, "nodes": {"step_time_ms": 10.0},
        "algorithm": {"algorithm": "dpsgd", "compression": "identity", "deadline_s": 1.0,
                      "total_steps": steps, "final_gossip_rounds": final_rounds},
        "partition": partition, "task": {"name": "digits-mlp"}, "trainer": {"lr": 0.1},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--final-rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one cell (ring:16, first shards), 40 steps")
    args = parser.parse_args()
    specs, partitions = SPECS, PARTITIONS
    if args.quick:
        specs, partitions = SPECS[:1], dict(list(PARTITIONS.items())[:1])
        args.steps, args.final_rounds, args.seeds = 40, 5, 1
    print(f"{'graph':<15} {'shards':<15} {'seed':>4} {'refused':>8} {'max/peer':>8} {'final acc':>9} "
          f"{'consensus':>10} {'wall':>6}")
    total = 0
    for spec in specs:
        for label, partition in partitions.items():
            for seed in range(1, args.seeds + 1):
                started = time.perf_counter()
                result = run_scenario(honest_scenario(spec, partition, steps=args.steps,
                                                      final_rounds=args.final_rounds, seed=seed))
                refused = int(result.metrics.get("rejected_update", 0.0))
                worst = int(result.metrics.get("rejected_update.max", 0.0))
                last = result.trace[-1]
                total += refused
                print(f"{spec:<15} {label:<15} {seed:>4} {refused:>8} {worst:>8} {last.mean_accuracy:>9.3f} "
                      f"{last.consensus_rms:>10.2e} {time.perf_counter() - started:>5.1f}s", flush=True)
    print(f"false positives in all cells: {total} (goal: 0)")


if __name__ == "__main__":
    main()
