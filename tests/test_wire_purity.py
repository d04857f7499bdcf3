"""The wire modules stay sans-IO: no sockets, threads, clocks, global randomness or zmq."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["protocols/identity.py", "protocols/roster.py", "protocols/codec.py", "protocols/replay.py",
           "protocols/wire.py"]
FORBIDDEN_IMPORTS = {"zmq", "socket", "asyncio", "threading", "time", "random", "pickle", "peer", "sim"}


@pytest.mark.parametrize("module", MODULES)
def test_no_io_or_global_randomness(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text(), filename=module)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in ("manual_seed", "seed"):
            found.append(f"<call .{node.attr}>")
    bad = [name for name in found if name.split(".")[0] in FORBIDDEN_IMPORTS or name.startswith("<")]
    assert not bad, f"{module} uses {bad}"
