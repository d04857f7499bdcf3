"""Acceptance h: protocols/ (gossip/, node/, ...) is pure -- no sockets, threads, clocks, files, global RNG.

An AST scan of every module under protocols/, and every gossip machine run
with the clock and the global random generators patched to raise.
"""

from __future__ import annotations

import ast
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gossip_driver import Driver, QuadraticWorker

from protocols.gossip import GossipConfig, make_machine
from topology import build

PROTOCOLS = Path(__file__).resolve().parent.parent / "protocols"

FORBIDDEN_MODULES = {
    "socket", "ssl", "selectors", "select", "asyncio", "threading", "_thread", "multiprocessing",
    "concurrent", "subprocess", "signal", "time", "datetime", "random", "zmq", "requests", "urllib", "http",
    # files: key files, checkpoints and configs are peer/'s (peer/files, peer/train)
    "os", "pathlib", "shutil", "tempfile", "glob", "fileinput", "mmap", "pickle", "safetensors",
}
# calls that read or write files whatever the module imported: open(), torch's and numpy's file functions
FILE_CALLS = {"open", "torch.save", "torch.load", "np.save", "np.load", "np.savez", "np.savez_compressed",
              "np.fromfile", "np.loadtxt", "np.savetxt", "numpy.save", "numpy.load", "numpy.fromfile"}
PATH_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes", "tofile"}
# numpy's seeded generator classes are fine; its module-level functions draw from global state
NUMPY_RANDOM_ALLOWED = {"Generator", "PCG64", "PCG64DXSM", "Philox", "SFC64", "SeedSequence", "BitGenerator"}
TORCH_GLOBAL_RANDOM = {"manual_seed", "seed", "initial_seed", "set_rng_state", "get_rng_state"}
# sampling functions are fine only with an explicit generator= (a counter-based one from protocols.rng)
TORCH_SAMPLERS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
                  "bernoulli", "multinomial", "normal", "poisson"}
TENSOR_SAMPLERS = {"random_", "uniform_", "normal_", "bernoulli_", "exponential_", "geometric_",
                   "cauchy_", "log_normal_"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def impurities(source: str, filename: str) -> list[str]:
    """What in ``source`` breaks the sans-IO contract, as "file:line: what" strings."""
    found: list[str] = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where}: from {node.module} import ...")
            if node.module in ("numpy.random", "torch.random"):
                found += [f"{where}: from {node.module} import {a.name}" for a in node.names
                          if a.name not in NUMPY_RANDOM_ALLOWED]
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            parts = name.split(".")
            keywords = {k.arg for k in node.keywords}
            global_numpy = parts[:2] in (["np", "random"], ["numpy", "random"])
            if (global_numpy and parts[-1] not in NUMPY_RANDOM_ALLOWED) or (
                    parts[0] == "torch" and parts[-1] in TORCH_GLOBAL_RANDOM):
                found.append(f"{where}: {name}()")
            elif parts[0] == "torch" and parts[-1] in TORCH_SAMPLERS and "generator" not in keywords:
                found.append(f"{where}: {name}() without generator=")
            elif (isinstance(node.func, ast.Attribute) and node.func.attr in TENSOR_SAMPLERS
                  and "generator" not in keywords):
                found.append(f"{where}: .{node.func.attr}() without generator=")
            elif parts[0] == "os" and parts[-1] in ("fork", "system", "popen", "urandom"):
                found.append(f"{where}: {name}()")
            elif name in FILE_CALLS or (
                    isinstance(node.func, ast.Attribute) and node.func.attr in PATH_METHODS):
                found.append(f"{where}: {name}() reads or writes a file")
    return found


def test_h_the_scan_finds_what_it_looks_for() -> None:
    bad = "\n".join([
        "import time", "from threading import Thread", "import numpy as np", "import torch",
        "x = np.random.rand(3)", "torch.manual_seed(0)", "y = torch.randn(3)", "y.uniform_()",
        "ok = torch.randn(3, generator=g)", "ok2 = np.random.Generator(np.random.PCG64(1))",
        "import os", "from pathlib import Path", "f = open('k.key')", "torch.save(x, 'm.pt')",
        "np.load('a.npy')", "Path('a').write_text('x')", "p.read_bytes()",
        "ok3 = server.open(round_index)", "ok4 = io.BytesIO(b'')",
    ])
    found = impurities(bad, "bad.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "import time", "from threading import ...", "import os", "from pathlib import ...",
        "np.random.rand()", "torch.manual_seed()",
        "torch.randn() without generator=", ".uniform_() without generator=", "open() reads or writes a file",
        "torch.save() reads or writes a file", "np.load() reads or writes a file",
        "?.write_text() reads or writes a file", "p.read_bytes() reads or writes a file",
    ]


def test_h_protocols_has_no_socket_thread_clock_or_global_random_use() -> None:
    files = sorted(PROTOCOLS.rglob("*.py"))
    assert any(f.parent.name == "gossip" for f in files)
    assert any(f.parent.name == "node" for f in files)  # the Node is protocol too
    found = [hit for f in files for hit in impurities(f.read_text(), str(f.relative_to(PROTOCOLS.parent)))]
    assert found == []


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("protocol code read the clock or the global random state")


@pytest.mark.parametrize("options", [
    {"algorithm": "dpsgd", "total_steps": 6, "final_gossip_rounds": 2},
    {"algorithm": "local", "local_steps": 2, "total_steps": 6, "outer": "diloco", "outer_every": 2},
    {"algorithm": "choco", "compression": "sign", "consensus_step": 0.5, "total_steps": 6},
    {"algorithm": "choco", "compression": "topk:fraction=0.5", "total_steps": 6},
    {"algorithm": "pushsum", "total_steps": 6},
    {"algorithm": "adpsgd", "total_steps": 6, "final_gossip_rounds": 2},
], ids=lambda o: "-".join(str(v) for v in o.values())[:40])
def test_h_machines_run_with_the_clock_and_global_random_patched_to_raise(
        options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = "directed-exponential:5" if options["algorithm"] == "pushsum" else "ring:5"
    topology = build(spec)
    targets = torch.linspace(-1, 1, 5 * 4, dtype=torch.float64).reshape(5, 4)
    workers = {n: QuadraticWorker(torch.zeros(4, dtype=torch.float64), targets[i], lr=0.2)
               for i, n in enumerate(topology.names)}
    machines = {n: make_machine(GossipConfig(**options), name=n, topology=topology,
                                params=workers[n].flat_params, seed=1) for n in topology.names}
    for name in ("time", "monotonic", "perf_counter", "process_time", "sleep", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, _raise)
    for name in ("random", "randint", "randrange", "choice", "shuffle", "uniform", "gauss", "sample",
                 "getrandbits", "seed"):
        monkeypatch.setattr(random, name, _raise)
    for name in ("rand", "randn", "randint", "random", "choice", "shuffle", "permutation", "seed", "normal"):
        monkeypatch.setattr(np.random, name, _raise)
    monkeypatch.setattr(torch, "manual_seed", _raise)
    monkeypatch.setattr(torch, "seed", _raise)
    driver = Driver(machines, workers)
    driver.start()
    assert driver.run()
    assert driver.finished == set(topology.names)
    assert all(driver.steps[n] == 6 for n in topology.names)
