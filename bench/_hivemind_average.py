"""hivemind's DecentralizedAverager on the bench's tensor: two processes, one DHT each, on 127.0.0.1.

Run by bench_exchange.py with the python of a separate venv where hivemind is
installed (never the project's). Prints one JSON line: the step times and their median.
Settings as measured in shared/ANCHORS.md: the second DHT starts from the
first one's visible maddrs; request_timeout is half of min_matchmaking_time.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any


def worker(index: int, numel: int, steps: int, maddrs: Any, results: Any) -> None:
    import hivemind
    import torch

    torch.set_num_threads(1)
    if index == 0:
        dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
        maddrs.put([str(m) for m in dht.get_visible_maddrs()])
    else:
        dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs.get(timeout=60),
                           start=True)
    x = torch.full((numel,), float(1 + 2 * index))
    averager = hivemind.averaging.DecentralizedAverager(
        [x], dht, prefix="bench_exchange", target_group_size=2, min_matchmaking_time=2.0,
        request_timeout=1.0, start=True)
    times = []
    for _ in range(steps + 1):
        with averager.get_tensors() as tensors:
            tensors[0].fill_(float(1 + 2 * index))
        start = time.perf_counter()
        group = averager.step(timeout=120)
        times.append(time.perf_counter() - start)
        if group is None:
            raise RuntimeError("averaging step failed")
    with averager.get_tensors() as tensors:
        value = float(tensors[0][0])
    results.put((index, times[1:], value))
    averager.shutdown()
    dht.shutdown()


def main() -> None:
    import hivemind

    numel, steps = int(sys.argv[1]), int(sys.argv[2])
    ctx = mp.get_context("fork")   # hivemind starts its own processes with the default (fork) context
    maddrs, results = ctx.Queue(), ctx.Queue()
    processes = [ctx.Process(target=worker, args=(i, numel, steps, maddrs, results)) for i in range(2)]
    for process in processes:
        process.start()
    collected = {}
    for _ in processes:
        index, times, value = results.get(timeout=600)
        collected[index] = (times, value)
    for process in processes:
        process.join(60)
    if any(abs(value - 2.0) > 1e-6 for _, value in collected.values()):
        raise SystemExit(f"hivemind did not average to 2: {[v for _, v in collected.values()]}")
    slower = [max(a, b) for a, b in zip(collected[0][0], collected[1][0], strict=True)]
    print(json.dumps({"version": hivemind.__version__, "times_s": [round(t, 3) for t in slower],
                      "median_s": statistics.median(slower)}))


if __name__ == "__main__":
    main()
