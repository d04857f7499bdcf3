"""Two peers with `hivemesh init` defaults gossiping an ~85M-parameter model (a 340 MB message; issue 29).

The network is what ``hivemesh init --peers 2 --task charlm`` writes (D-PSGD, the 10 s round
deadline, CurveZMQ on, every transport default), with the char-LM at ``--width`` 768 and
``--layers`` 12: 85M float32 parameters. Both peers run ``--steps`` rounds as real processes on
127.0.0.1; the table then says, from their status files:

- rounds closed with both members' messages (rounds minus ``rounds_alone``), messages refused as
  ``incomplete``, sends abandoned;
- the model messages' bytes each peer sent against what the other accepted (heartbeats aside);
- the loop's time per round outside the training steps (``train_s - work_s``: sealing, sending,
  waiting, receiving, mixing), beside a raw pyzmq exchange of the same bytes both ways (DEALER/ROUTER,
  4 MiB frames, no encryption) and our wire's exchange over CurveZMQ (bench_exchange.py's), both
  measured in the same run after the peers have exited;
- each peer's peak RSS against the model's size.

Before the fix the two peers' waits for their own sends stalled each other (about 200 MB and up):
half the rounds closed alone and messages were dropped ``incomplete``. Loopback figures drift
30-50 % between runs here; only the same-run ratios count.
Run: ``.venv/bin/python bench/bench_large_message.py [--width W] [--layers L] [--steps N] [--quick]``
(``--quick``: the shipped char-LM's size, 2 steps: a smoke run for CI, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_exchange import WIRE_FRAME_BYTES, _raw_side, _wire_side, run_pair

from peer.cli.init import default_network
from peer.files.statefiles import read_status
from peer.net.transport import reserve_listeners
from peer.runtime.launch import PeerProcesses
from peer.runtime.netinit import create_network

CEILING_S = 1800.0      # a healthy 4-step run at 85M parameters took about 2 minutes here


def run_peers(out: Path, *, width: int, layers: int, steps: int) -> tuple[dict[str, dict[str, Any]], float]:
    """Both peers' final statuses, and the wall seconds from start to both exited."""
    network = default_network(topology="ring", task="charlm", algorithm="dpsgd", compression="identity",
                              steps=steps, seed=0)
    network["task_options"] = {"width": width, "layers": layers}
    files = create_network(out, peers=2, network=network, peer_options={"progress": False}, reserve=True)
    began = time.monotonic()
    with PeerProcesses(dict(files.configs), listeners=dict(files.listeners)) as processes:
        processes.start_all()
        finished = processes.wait(CEILING_S)
        codes = processes.exitcodes()
    wall_s = time.monotonic() - began
    if not finished or any(code != 0 for code in codes.values()):
        raise SystemExit(f"peers did not finish cleanly: {codes}")
    statuses = {}
    for name in files.configs:
        found = read_status(out / "data" / name)
        if found is None:
            raise SystemExit(f"{name} wrote no status")
        statuses[name] = found
    return statuses, wall_s


def model_bytes(status: dict[str, Any]) -> int:
    """One model message's bytes on the wire (the largest kind a D-PSGD peer sends)."""
    sent = status["bytes_sent_by_kind"]["param_push"]
    return int(sent // status["messages_sent_by_kind"]["param_push"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="raw exchanges timed (median), after a warm-up")
    parser.add_argument("--quick", action="store_true", help="the shipped char-LM, 2 steps (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.width, args.layers, args.steps, args.repeat = 48, 2, 2, 1
    with tempfile.TemporaryDirectory(prefix="bench-large-") as folder:
        statuses, wall_s = run_peers(Path(folder) / "net", width=args.width, layers=args.layers,
                                     steps=args.steps)
    a, b = statuses["p00"], statuses["p01"]
    message = model_bytes(a)
    numel = message // 4
    raw_s = run_pair(_raw_side, reserve_listeners(2), numel, args.repeat, False)   # no CurveZMQ
    curve_s = run_pair(_wire_side, reserve_listeners(2), numel, args.repeat, "curve", WIRE_FRAME_BYTES)

    print(f"2 peers, charlm width {args.width} x {args.layers} layers, {args.steps} steps, init defaults: "
          f"a {message / 1e6:.1f} MB message, {wall_s:.0f} s from start to exit")
    print(f"{'peer':<6}{'rounds':>8}{'both':>6}{'incomplete':>12}{'abandoned':>11}"
          f"{'MB sent':>10}{'MB accepted by the other':>26}{'loop s/round':>14}{'x raw':>8}{'x curve':>9}"
          f"{'peak RSS MB':>13}{'x model':>9}")
    for name, mine, other in (("p00", a, b), ("p01", b, a)):
        rounds = int(mine["metrics"].get("round", 0))
        both = rounds - int(mine["metrics"].get("rounds_alone", 0))
        loop_s = (mine["train_s"] - mine["work_s"]) / max(rounds, 1)
        sent = mine["bytes_sent_by_kind"].get("param_push", 0)
        accepted = other["bytes_accepted_by_kind"].get("param_push", 0)
        print(f"{name:<6}{rounds:>8}{both:>6}{mine['rejections'].get('incomplete', 0):>12}"
              f"{sum(mine['abandoned_sends'].values()):>11}{sent / 1e6:>10.1f}{accepted / 1e6:>26.1f}"
              f"{loop_s:>14.2f}{loop_s / raw_s:>8.1f}{loop_s / curve_s:>9.1f}"
              f"{mine['memory_peak_mib']:>13.0f}{mine['memory_peak_mib'] * 2**20 / message:>9.1f}")
    print(f"raw pyzmq exchange of the same bytes both ways: {raw_s * 1000:.0f} ms; "
          f"our wire over CurveZMQ (signed, as the daemon): {curve_s * 1000:.0f} ms")
    print("statuses: " + json.dumps({n: {k: s.get(k) for k in ("metrics", "rejections", "neighbour_down")}
                                     for n, s in statuses.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
