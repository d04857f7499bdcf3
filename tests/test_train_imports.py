"""The training modules stay importable by the simulator: no ZeroMQ anywhere below them."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("peer", "protocols", "topology", "sim")
FORBIDDEN = ("zmq", "peer.transport", "peer.daemon")


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reachable(root: str) -> set[str]:
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            todo.append(".".join(parts[:i]))
        path = module_file(name)
        if path is not None:
            todo.extend(n for n in imports_of(path) if n.split(".")[0] in PROJECT or n.split(".")[0] == "zmq")
    return seen


@pytest.mark.parametrize("module", ["peer.trainer", "peer.tasks", "peer.tasks.charlm", "peer.tasks.digits",
                                    "peer.tasks.logreg", "peer.partition", "peer.checkpoint"])
def test_training_modules_never_reach_zmq(module: str) -> None:
    found = reachable(module)
    assert module_file(module) is not None
    assert not [name for name in found if name.split(".")[0] == "zmq" or name in FORBIDDEN]
