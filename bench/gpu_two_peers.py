"""On a CUDA machine: two peers on one GPU train and gossip correctly, and what an exchange costs.

1. Correctness: a network of two peer daemons (``hivemesh peer`` processes) on
   127.0.0.1 with ``device = "cuda"`` trains digits-mlp with D-PSGD; both must
   finish with test accuracy >= 0.90 and their models within 1e-2 of each other.
2. Cost: one push-pull exchange of a 25M-parameter float32 vector that lives on
   the GPU, between two processes sharing the GPU: device -> pinned host buffer
   (Trainer.host_params' way), seal (BLAKE3 + Ed25519), send, verify, decode into
   a reused host buffer, host -> device, mix on the GPU; beside the same
   exchange of a CPU tensor in the same run.

Run: ``.venv/bin/python bench/gpu_two_peers.py [--numel N] [--repeat R] [--quick]``. Exits 1
if a check fails, 2 without CUDA. ``--quick`` (a smoke run for CI, not a measurement): a
100,000-parameter exchange, once; without CUDA it runs the CPU path alone (training on the CPU,
the CPU exchange) and exits 0 when that is correct.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from multiprocessing.queues import Queue
from pathlib import Path

import torch


def check_training(folder: Path, device: str) -> bool:
    from peer.cli.init import default_network
    from peer.files.statefiles import read_status
    from peer.runtime.export import latest_params
    from peer.runtime.launch import PeerProcesses
    from peer.runtime.netinit import create_network
    from peer.runtime.peerconfig import load_peer_config

    network = default_network(topology="complete", task="digits-mlp", algorithm="dpsgd",
                              compression="identity", steps=200, seed=0)
    network["trainer"]["device"] = device
    files = create_network(folder, peers=2, network=network, peer_options={"progress": False}, reserve=True)
    started = time.monotonic()
    with PeerProcesses(files.configs, listeners=files.listeners) as processes:
        processes.start_all()
        finished = processes.wait(600)
        codes = processes.exitcodes()
    elapsed = time.monotonic() - started
    statuses = {name: read_status(files.out / "data" / name) or {} for name in files.configs}
    print(f"training on {device}: exit codes {codes}, {elapsed:.1f} s")
    for name, found in statuses.items():
        print(f"  {name}: {found.get('state')} step {found.get('step')} accuracy {found.get('accuracy')}")
    if not finished or any(c != 0 for c in codes.values()):
        # a peer that failed may have left no checkpoint: report it, do not crash reading one
        print("  correct: NO (a peer failed or did not finish)")
        return False
    params = [latest_params(load_peer_config(path))[0].double() for path in files.configs.values()]
    mean = (params[0] + params[1]) / 2
    spread = max(torch.linalg.vector_norm(p - mean) for p in params)
    consensus = float(spread / torch.linalg.vector_norm(mean))
    print(f"  consensus distance {consensus:.2e}")
    accuracies = [found.get("accuracy") or 0.0 for found in statuses.values()]
    ok = min(accuracies) >= 0.90 and consensus < 1e-2
    print(f"  correct: {'yes' if ok else 'NO'}")
    return ok


def _side(index: int, listeners: list[socket.socket], numel: int, repeat: int, device: str,
          results: Queue) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_exchange import Mailbox, _signed_codec, adopt

    from peer.net.transport import Transport

    torch.set_num_threads(1)
    names = ["alice", "bob"]
    me, other = names[index], names[1 - index]
    x = torch.full((numel,), float(1 + 2 * index), device=device)
    staged = torch.empty(numel, pin_memory=device == "cuda")      # what Trainer.host_params stages into
    received = torch.empty(numel, pin_memory=device == "cuda")
    seal, open_ = _signed_codec(me, other, names, lambda dtype, numel: received, staged)
    times = []
    addresses, listen_fd = adopt(index, listeners)
    with Transport(listen=addresses[index], listen_fd=listen_fd,
                   neighbours={other: addresses[1 - index]}) as transport:
        mailbox = Mailbox(transport, other)
        for round_index in range(repeat + 1):
            mailbox.barrier(round_index)
            start = time.perf_counter()
            staged.copy_(x, non_blocking=True)
            if device == "cuda":
                torch.cuda.synchronize()
            mailbox.send(seal(round_index))
            y = open_(mailbox)     # the header-first wire, received one frame at a time
            transport.wait_sent()
            x.lerp_(y.to(device, non_blocking=True), 0.5)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if float(x[0]) != 2.0 or float(x[-1]) != 2.0:
                raise AssertionError("the exchange did not average")
            x.fill_(float(1 + 2 * index))
        mailbox.barrier(-1)
    results.put((index, times[1:]))


def time_exchange(numel: int, repeat: int, device: str) -> float:
    """Median over ``repeat`` exchanges of the slower side's time (bench_exchange.run_pair)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_exchange import run_pair

    from peer.net.transport import reserve_listeners

    return run_pair(_side, reserve_listeners(2), numel, repeat, device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="tiny exchange, once; the CPU path alone where there is no CUDA (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repeat = 100_000, 1
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("no CUDA device: run this on a GPU machine (or --quick for the CPU path alone)")
        return 2
    print(f"device: {torch.cuda.get_device_name(0) if cuda else 'no CUDA: the CPU path alone'}")
    with tempfile.TemporaryDirectory(prefix="hivemesh-gpu-") as folder:
        ok = check_training(Path(folder) / "net", "cuda" if cuda else "cpu")
    gpu_s = time_exchange(args.numel, args.repeat, "cuda") if cuda else None
    cpu_s = time_exchange(args.numel, args.repeat, "cpu")
    print(f"\none signed push-pull exchange of {args.numel:,} float32, median of {args.repeat}:")
    print(f"  {'exchange':<56} {'ms':>7}")
    gpu_cell = f"{gpu_s * 1000:7.0f}" if gpu_s is not None else f"{'skipped (no CUDA)':>7}"
    print(f"  {'GPU tensors (D2H pinned, seal, send, verify, H2D, mix)':<56} {gpu_cell}")
    print(f"  {'CPU tensors (seal, send, verify, mix)':<56} {cpu_s * 1000:7.0f}")
    if gpu_s is not None:
        print(f"  GPU / CPU: {gpu_s / cpu_s:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
