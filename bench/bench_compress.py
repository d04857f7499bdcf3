"""Compression operators: compress / decompress throughput, ratio, and break-even link speed.

Workloads: one 25M-element float32 vector, a ResNet-18's parameter shapes
(11.7M) and a small transformer's (d=512, 6 blocks, 8k vocabulary: 23.5M),
as lists below (no torchvision). For each operator: GB/s of float32 input for
compress and for decompress, into fresh memory and into a reused buffer
(``decompress(c, out=buffer)``) (best of ``--repeat`` after a warm-up: other
processes share this machine, and the minimum is the least disturbed run),
the compression ratio of the whole message as the codec sends it (header
included, ``accounting.message_bytes``), and the link speed below which the
operator pays for itself: bytes saved / (compress + decompress time).

Baselines measured in the same run: a plain copy of the same bytes (into a
touched buffer, and a fresh ``clone``), naive top-k (``torch.topk`` on |x|)
and naive 8-bit QSGD (``torch.rand_like`` noise). Goals: every operator >=
0.5 GB/s both ways; top-k and QSGD >= 5x their naive versions; PowerSGD rank
4 on the transformer shapes >= 0.5 GB/s.
Run: ``.venv/bin/python bench/bench_compress.py [--numel N] [--repeat R] [--only SPEC,...] [--quick]``
(``--quick``: every operator on each workload shrunk to about 100,000 elements, one repetition:
a smoke run for CI, not a measurement).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence

import torch

from protocols.compress import RngKey, from_spec, pack
from protocols.compress.accounting import message_bytes
from protocols.messages import ParamPush

SPECS = [
    "identity", "fp16", "bf16", "qsgd:bits=8", "qsgd:bits=8,bucket=0", "qsgd:bits=4", "qsgd:bits=2",
    "topk:fraction=0.01",
    "topk-approx:fraction=0.01", "randomk:fraction=0.01", "sign", "powersgd:rank=4",
]
GOAL_GBPS = 0.5
GOAL_SPEEDUP = 5.0


def resnet18_shapes(width: int = 64) -> list[tuple[int, ...]]:
    """torchvision's resnet18 (ImageNet head), parameters in registration order (real at ``width`` 64)."""
    shapes: list[tuple[int, ...]] = [(width, 3, 7, 7), (width,), (width,)]
    inplanes = width
    for planes, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
        for block in range(2):
            first = block == 0
            cin = inplanes if first else planes
            shapes += [(planes, cin, 3, 3), (planes,), (planes,)]
            shapes += [(planes, planes, 3, 3), (planes,), (planes,)]
            if first and (stride != 1 or inplanes != planes):
                shapes += [(planes, inplanes, 1, 1), (planes,), (planes,)]
        inplanes = planes
    return [*shapes, (1000, 8 * width), (1000,)]


def transformer_shapes(
    d: int = 512, blocks: int = 6, vocab: int = 8192, context: int = 512
) -> list[tuple[int, ...]]:
    """A GPT-style decoder: embeddings, then per block LN, QKV, projection, LN, MLP (4d)."""
    shapes: list[tuple[int, ...]] = [(vocab, d), (context, d)]
    for _ in range(blocks):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,)]  # LN, attention
        shapes += [(d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]  # LN, MLP
    return [*shapes, (d,), (d,)]


def workload_shapes(name: str, quick: bool) -> list[tuple[int, ...]]:
    """The named model's shapes; quick: the same layers, narrow (about 100,000 parameters each)."""
    if name == "resnet18":
        return resnet18_shapes(width=4) if quick else resnet18_shapes()
    if name == "transformer":
        return transformer_shapes(d=32, blocks=2, vocab=1024, context=64) if quick else transformer_shapes()
    raise SystemExit(f"unknown workload {name!r} (flat, resnet18, transformer)")


def best_time(repeat: int, work: Callable[[], object]) -> float:
    """Fastest of ``repeat`` runs after one warm-up run, in seconds."""
    work()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def naive_topk(x: torch.Tensor, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    indices = torch.topk(x.abs(), max(1, round(fraction * x.numel())), sorted=False).indices
    return indices, x[indices]


def naive_qsgd(x: torch.Tensor, levels: int = 127) -> torch.Tensor:
    scaled = x.abs() * (levels / x.norm())
    return ((scaled + torch.rand_like(x)).floor() * x.sign()).to(torch.int8)


def row(cells: Sequence[object], widths: Sequence[int]) -> str:
    pairs = enumerate(zip(cells, widths, strict=True))
    return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in pairs)


def run_workload(name: str, x: torch.Tensor, shapes: list[tuple[int, ...]] | None, specs: list[str],
                 repeat: int) -> list[str]:
    size = x.numel() * 4
    touched = torch.empty_like(x)
    copy_s = best_time(repeat, lambda: touched.copy_(x))
    clone_s = best_time(repeat, lambda: x.clone())
    print(f"\n== {name}: {x.numel():,} float32 ({size / 1e6:.0f} MB)"
          f"{'' if shapes is None else f', {len(shapes)} tensors'}")
    print(f"   plain copy {size / copy_s / 1e9:.2f} GB/s into a touched buffer, "
          f"{size / clone_s / 1e9:.2f} GB/s into fresh memory (clone)")
    naive: dict[str, float] = {}
    if any(s.startswith("topk") for s in specs):
        naive["topk"] = best_time(repeat, lambda: naive_topk(x, 0.01))
    if any(s.startswith("qsgd") for s in specs):
        naive["qsgd"] = best_time(repeat, lambda: naive_qsgd(x))
    for family, seconds in naive.items():
        print(f"   naive {family}: {seconds * 1e3:.0f} ms ({size / seconds / 1e9:.2f} GB/s)")
    widths = [26, 8, 9, 8, 9, 9, 8, 8, 10, 8, 5]
    print(row(["operator", "comp ms", "comp GB/s", "dec ms", "dec GB/s", "dec GB/s", "ratio", "vs copy",
               "break-even", "vs naive", "goal"], widths))
    print(row(["", "", "", "(fresh)", "(fresh)", "(reused)", "", "(comp)", "GB/s link", "(comp)", ""],
              widths))
    buffer = torch.empty_like(x)
    lines = []
    for spec in specs:
        op = from_spec(spec, shapes=shapes)
        key = RngKey(1, "p00", 0)
        c = op.compress(x, key)
        tensors, meta = pack(c, "params")
        wire = message_bytes(ParamPush(round=1, tensors=tensors, meta=meta))
        raw = message_bytes(ParamPush(round=1, tensors={"params": x}, meta={}))
        compress_s = best_time(repeat, lambda: op.compress(x, key))  # noqa: B023
        decompress_s = best_time(repeat, lambda: op.decompress(c))  # noqa: B023
        reused_s = best_time(repeat, lambda: op.decompress(c, out=buffer))  # noqa: B023
        family = spec.split(":")[0].removesuffix("-approx")
        speedup = naive[family] / compress_s if family in naive else None
        saved = raw - wire
        decode_s = min(decompress_s, reused_s)
        break_even = saved / (compress_s + decode_s) / 1e9 if saved > 0 else 0.0
        met = size / compress_s / 1e9 >= GOAL_GBPS and size / decode_s / 1e9 >= GOAL_GBPS
        if speedup is not None:
            met = met and speedup >= GOAL_SPEEDUP
        line = row([
            spec, f"{compress_s * 1e3:.0f}", f"{size / compress_s / 1e9:.2f}", f"{decompress_s * 1e3:.0f}",
            f"{size / decompress_s / 1e9:.2f}", f"{size / reused_s / 1e9:.2f}", f"{raw / wire:.1f}x",
            f"{copy_s / compress_s:.2f}",
            f"{break_even:.2f}", "-" if speedup is None else f"{speedup:.1f}x", "met" if met else "MISS",
        ], widths)
        print(line, flush=True)
        lines.append(f"{name}: {line}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000, help="length of the flat vector")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="specs separated by ';' (default: all)")
    parser.add_argument("--workloads", default="flat,resnet18,transformer")
    parser.add_argument("--quick", action="store_true",
                        help="each workload shrunk to about 100,000 elements, one repetition (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.repeat = 100_000, 1
    torch.set_num_threads(1)
    specs = [s for s in args.only.split(";") if s] or SPECS
    generator = torch.Generator().manual_seed(0)
    for workload in args.workloads.split(","):
        if workload == "flat":
            x, shapes = torch.randn(args.numel, generator=generator), None
        else:
            shapes = workload_shapes(workload, args.quick)
            x = torch.randn(sum(math.prod(s) for s in shapes), generator=generator)
        run_workload(workload, x, shapes, specs, args.repeat)
    print("\nratio: raw float32 message / compressed message, headers included. break-even: links slower"
          " than this gain from the operator (GB/s; x8 for Gbit/s), with the faster decompress. goal: both"
          f" directions >= {GOAL_GBPS} GB/s (decompress into a reused buffer counts), top-k and QSGD"
          f" compress >= {GOAL_SPEEDUP:.0f}x their naive versions.")


if __name__ == "__main__":
    main()
