"""Secure aggregation's cost: bytes and CPU per client and at the gateway, beside plain FedAvg.

One SecAgg round, simulated in-process (protocols/secagg/local.py: the real machines, keys,
Shamir sharing, encryption and masks; an instant lossless link), for n = 10, 100 and 1,000 clients
with SecAgg+'s masking degree k = 2 ceil(1.5 log2 n) (the config's auto), and plain SecAgg
(k = n - 1) up to n = 100 only: Shamir sharing to 999 others costs seconds per secret here. The
update is the size of ``digits-mlp`` (9,610 parameters), quantised to 16 bits in the 32-bit ring,
plus the one element that carries the client's weight (protocols/federation/secure.py).

Bytes are the msgpack of each SecAgg message (no envelope), summed per client (up: what it sends,
down: what the gateway sends it) and at the gateway (in + out). CPU is ``time.process_time``
charged to whichever party's machine ran; per client it is the mean of the first 10 clients, which
verify every advert signature themselves, while the others share one memo of verdicts (an n^2
cost of simulating, not of any one client). The baseline, plain FedAvg, sends the float32 model
down and the float32 update up (4 bytes per parameter each way, no envelope either); "x FedAvg"
is a client's (model down + every SecAgg message) over that. Its CPU at the gateway is the
sample-weighted mean of the n float32 updates (protocols/federation/aggregate.fedavg, best of 3),
"FedAvg gw ms", and SecAgg's gateway CPU over it, "gw CPU x FedAvg"; a FedAvg client computes
nothing beyond its training, which both pay ("x FedAvg" is the bytes).

Bonawitz et al. (2017) report a communication expansion of 1.73x over sending the data in the
clear for 2^10 users and 2^20-dimensional vectors. Ours beside it: a client's bytes (up + down)
over its 16-bit vector sent in the clear, measured at 9,610 parameters, and projected to 2^20
parameters by keeping the measured key/share/signature bytes and scaling the 4-byte ring elements.

Run: ``.venv/bin/python bench/bench_secagg.py [--quick] [--numel N] [--clients 10,100,1000]``
(``--quick``: n = 10 and 30 with a 1,000-element update: a smoke run for CI, not a measurement).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from protocols.federation.aggregate import fedavg  # noqa: E402
from protocols.secagg import SecAggConfig, quantise  # noqa: E402
from protocols.secagg.local import GATEWAY, LocalRound  # noqa: E402

DIGITS_MLP_PARAMS = 64 * 128 + 128 + 128 * 10 + 10  # peer/train/tasks/digits.py's MLP
BITS = 16
BONAWITZ_EXPANSION = 1.73  # Bonawitz et al. 2017, 2^10 users, 2^20-dimensional vectors
PLAIN_SECAGG_MAX_N = 100
CPU_SAMPLE = 10  # clients whose CPU is measured (they verify every signature themselves; see local.py)


def one_round(n: int, degree: int, numel: int) -> dict[str, float]:
    """Run one round of n clients; per-client means and gateway totals."""
    rng = np.random.default_rng(n)
    inputs = {f"c{i:04d}": np.append(quantise(rng.normal(0.0, 0.1, numel), clip_value=1.0, bits=BITS), 100)
              for i in range(n)}  # the update and its weight (100 samples), as a federation client sends
    config = SecAggConfig(degree=degree, bits=BITS, max_clients=max(n, 2))
    sample = frozenset(sorted(inputs)[:CPU_SAMPLE])
    started = time.perf_counter()
    local = LocalRound(config, inputs, run_id="bench", seed=1, clock=time.process_time, sample=sample)
    result = local.run()
    wall_s = time.perf_counter() - started
    if result is None:
        raise RuntimeError(f"n={n} k={degree}: round failed ({local.server.failure})")
    expected = np.sum(list(inputs.values()), axis=0) & 0xFFFFFFFF
    if not np.array_equal(result.ring_sum, expected):
        raise RuntimeError(f"n={n} k={degree}: the sum is wrong")
    client_cpu = [local.cpu_s[name] for name in sample]
    up = float(np.mean(list(local.bytes_up.values())))
    down = float(np.mean(list(local.bytes_down.values())))
    return {"k": float(config.degree_for(n)), "t": float(config.threshold_for(n)), "up": up, "down": down,
            "client_ms": 1000 * float(np.mean(client_cpu)),
            "gateway_in": float(sum(local.bytes_up.values())),
            "gateway_out": float(sum(local.bytes_down.values())),
            "gateway_s": local.cpu_s[GATEWAY], "wall_s": wall_s}


def fedavg_gateway_s(n: int, numel: int) -> float:
    """Plain FedAvg's CPU at the gateway for one round: the weighted mean of n float32 updates (s)."""
    generator = torch.Generator().manual_seed(n)
    updates = [torch.randn(numel, generator=generator) for _ in range(n)]
    counts = [100 + i for i in range(n)]
    fedavg(updates, counts)  # warm-up: torch's first call allocates
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        fedavg(updates, counts)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 10, 30 and a 1,000-element update (smoke)")
    parser.add_argument("--numel", type=int, default=DIGITS_MLP_PARAMS,
                        help="update length (default: digits-mlp's parameters)")
    parser.add_argument("--clients", default="10,100,1000", help="comma-separated cohort sizes")
    args = parser.parse_args()
    numel = 1000 if args.quick else args.numel
    sizes = [10, 30] if args.quick else [int(n) for n in args.clients.split(",")]
    model_bytes = 4 * numel  # the float32 global model every client downloads, with or without SecAgg
    fedavg_bytes = 2 * model_bytes  # + the float32 update up
    clear_bytes = numel * BITS // 8  # the 16-bit vector sent in the clear

    print(f"SecAgg one round, update {numel:,} elements ({BITS}-bit in Z_2^32); plain FedAvg moves "
          f"{fedavg_bytes / 1024:.1f} KB per client")
    print(f"{'mode':<10} {'n':>5} {'k':>4} {'t':>4} {'client up KB':>13} {'down KB':>8} {'client ms':>10} "
          f"{'gateway MB':>11} {'gateway s':>10} {'FedAvg gw ms':>13} {'gw CPU x FedAvg':>16} "
          f"{'x FedAvg':>9} {'x clear':>8} {'x clear@2^20':>13} {'wall s':>7}")
    rows: list[tuple[str, int, dict[str, float]]] = []
    for n in sizes:
        for mode, degree in (("secagg+", 0), ("plain", n - 1)):
            if mode == "plain" and n > PLAIN_SECAGG_MAX_N:
                continue
            row = one_round(n, degree, numel)
            rows.append((mode, n, row))
            total = row["up"] + row["down"]
            overhead = total - 4 * (numel + 1)  # everything but the masked input's ring elements
            projected = (overhead + 4 * 2**20) / (2**20 * BITS // 8)
            baseline_s = fedavg_gateway_s(n, numel)
            print(f"{mode:<10} {n:>5} {row['k']:>4.0f} {row['t']:>4.0f} {row['up'] / 1024:>13.1f} "
                  f"{row['down'] / 1024:>8.1f} {row['client_ms']:>10.1f} "
                  f"{(row['gateway_in'] + row['gateway_out']) / 2**20:>11.2f} {row['gateway_s']:>10.2f} "
                  f"{1000 * baseline_s:>13.2f} {row['gateway_s'] / max(baseline_s, 1e-6):>16.0f} "
                  f"{(model_bytes + total) / fedavg_bytes:>9.2f} {total / clear_bytes:>8.2f} "
                  f"{projected:>13.2f} {row['wall_s']:>7.1f}", flush=True)
    by_mode = {(mode, n): row for mode, n, row in rows}
    for n in sizes:
        if ("plain", n) in by_mode:
            plus, plain = by_mode[("secagg+", n)], by_mode[("plain", n)]
            print(f"n={n}: SecAgg+ needs k={plus['k']:.0f} against plain SecAgg's {plain['k']:.0f}; "
                  f"client CPU {plus['client_ms'] / plain['client_ms']:.2f}x, gateway CPU "
                  f"{plus['gateway_s'] / plain['gateway_s']:.2f}x of plain")
    largest = max(sizes)
    row = by_mode[("secagg+", largest)]
    projected = (row["up"] + row["down"] - 4 * (numel + 1) + 4 * 2**20) / (2**20 * BITS // 8)
    print(f"traffic over the clear data: Bonawitz et al. {BONAWITZ_EXPANSION:.2f}x (2^10 users, 2^20 "
          f"elements); ours {projected:.2f}x (SecAgg+ n={largest}, projected to 2^20 elements; "
          f"our ring is 32 bits for {BITS}-bit inputs, 2x before any key)")


if __name__ == "__main__":
    main()
