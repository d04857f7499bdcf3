"""The gpt task at a real shape: hivemesh's training step against a plain torch loop.

Builds the ``gpt`` task at a shape (default GPT-2 small: 12 layers x 768, 12 heads,
context 1024, vocab 50257, 124M parameters) and times AdamW steps of the same model on
the same kind of batches two ways, each in a fresh process so that each peak memory is
its own: a plain torch loop (``torch.optim.AdamW`` with its defaults, the baseline), and
hivemesh's ``Trainer.run_steps(1)`` (flat parameter vector, ``FlatOptimizer``). Both also
run under bf16 autocast (``autocast="bf16"``). Reported: median ms per step after one
warm-up step, wall and process CPU time (on a shared machine the CPU time is the steadier
one), and peak memory (ru_maxrss on CPU, so torch's own ~300 MB is in every row;
max_memory_allocated on CUDA), each as a ratio to the baseline measured in the same run.

On a CPU, torch's AdamW defaults to its loop over tensors (foreach is its CUDA default),
while hivemesh's optimizer updates one flat vector: most of a CPU step's difference.

The shipped text (7 KB) is shorter than a 1024-byte test window needs, so the run trains
on it repeated to 16 KB in a temporary file: the timings do not depend on the text.

Run:  .venv/bin/python bench/bench_gpt.py [--layers 12 --width 768 --heads 12 --context 1024
      --vocab 50257] [--batch 1] [--steps 3] [--device auto] [--threads 0] [--quick]
(--quick: 1 layer x 32, context 16, 2 steps: a smoke run for CI, not a measurement.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("torch", "hivemesh", "torch bf16", "hivemesh bf16")  # the first is the baseline
TEXT_BYTES = 16_384  # enough for a 1024-byte window in the last 10%
LR = 3e-4


def text_file(folder: Path) -> Path:
    from peer.train.tasks.gpt import read_bytes

    shipped = read_bytes(None)
    path = folder / "text.txt"
    path.write_bytes((shipped * (TEXT_BYTES // len(shipped) + 1))[:TEXT_BYTES])
    return path


def peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed(step: Any, steps: int, device: torch.device) -> dict[str, float]:
    """Median wall and process-CPU ms of ``steps`` calls of ``step`` after one warm-up call."""
    step()
    wall, cpu = [], []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started, started_cpu = time.perf_counter(), time.process_time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.process_time() - started_cpu) * 1000.0)
    return {"ms": statistics.median(wall), "cpu_ms": statistics.median(cpu)}


def measure(variant: str, options: dict[str, Any], batch: int, steps: int, device_choice: str) -> dict:
    """One variant in this process: {"ms": per step, "peak_mb": peak memory, "parameters": count}."""
    from peer.train.tasks import get_task
    from peer.train.trainer import Trainer, TrainerConfig, resolve_device

    bf16 = variant.endswith("bf16")
    task = get_task("gpt", **options, autocast="bf16" if bf16 else "off")
    device = resolve_device(device_choice)
    if variant.startswith("hivemesh"):
        config = TrainerConfig(optimizer="adamw", lr=LR, batch_size=batch, device=device_choice, threads=0)
        trainer = Trainer(task, config, np.arange(task.n_train), seed=0, member_index=0)
        parameters = trainer.flat_params.numel()
        times = timed(lambda: trainer.run_steps(1), steps, device)
        return {**times, "peak_mb": peak_mb(device), "parameters": parameters}

    model = task.build_model(0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    x_all, y_all = task.train_x.to(device), task.train_y.to(device)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        rows = torch.randint(len(x_all), (batch,), generator=generator).to(device)
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = task.loss_fn(model(x_all[rows]), y_all[rows])
        loss.backward()
        optimizer.step()

    times = timed(step, steps, device)
    return {**times, "peak_mb": peak_mb(device), "parameters": sum(p.numel() for p in model.parameters())}


def run_child(variant: str, args: argparse.Namespace, path: Path) -> dict:
    command = [sys.executable, __file__, "--child", variant, "--path", str(path),
               *(f"--{k}={getattr(args, k)}" for k in ("layers", "width", "heads", "context", "vocab",
                                                       "batch", "steps", "device", "threads"))]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=1, help="windows per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.width, args.heads, args.context, args.vocab, args.steps = 1, 32, 2, 16, 256, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    options = {"path": args.path, "layers": args.layers, "width": args.width, "heads": args.heads,
               "context": args.context, "vocab": args.vocab}
    if args.child:
        print(json.dumps(measure(args.child, options, args.batch, args.steps, args.device)))
        return

    with tempfile.TemporaryDirectory() as folder:
        path = text_file(Path(folder))
        results = {variant: run_child(variant, args, path) for variant in VARIANTS}
    base = results[VARIANTS[0]]
    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    memory = "peak CUDA MB" if on_cuda else "peak RSS MB"
    print(f"gpt {args.layers} x {args.width}, {args.heads} heads, context {args.context}, "
          f"vocab {args.vocab}: "
          f"{base['parameters']:,} parameters; batch {args.batch}, AdamW, median of {args.steps} steps, "
          f"{torch.get_num_threads()} threads")
    print(f"{'variant':<16} {'ms/step':>9} {'x torch':>8} {'CPU ms/step':>12} {'x torch':>8} "
          f"{memory:>12} {'x torch':>8}")
    for variant, result in results.items():
        print(f"{variant:<16} {result['ms']:9.1f} {result['ms'] / base['ms']:8.2f} "
              f"{result['cpu_ms']:12.1f} {result['cpu_ms'] / base['cpu_ms']:8.2f} "
              f"{result['peak_mb']:12.0f} {result['peak_mb'] / base['peak_mb']:8.2f}")


if __name__ == "__main__":
    main()
