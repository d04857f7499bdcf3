"""The training modules stay importable by the simulator: no ZeroMQ anywhere below them."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("peer", "protocols", "topology", "sim")
FORBIDDEN = ("zmq", "peer.transport", "peer.daemon")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path, module: str) -> set[str]:
    """Absolute names ``module`` (in ``path``) imports, relative imports resolved against it."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # `from . import x` / `from ..a import y`: level 1 is the module's own package.
            anchor = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            if base:
                names.add(base)
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return names


def reachable(root_module: str, root: Path = ROOT, project: tuple[str, ...] = PROJECT) -> set[str]:
    seen: set[str] = set()
    todo = [root_module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            todo.append(".".join(parts[:i]))
        path = module_file(name, root)
        if path is not None:
            todo.extend(n for n in imports_of(path, name)
                        if n.split(".")[0] in project or n.split(".")[0] == "zmq")
    return seen


def forbidden(found: set[str]) -> list[str]:
    return sorted(name for name in found if name.split(".")[0] == "zmq" or name in FORBIDDEN)


@pytest.mark.parametrize("module", ["peer.trainer", "peer.tasks", "peer.tasks.charlm", "peer.tasks.digits",
                                    "peer.tasks.logreg", "peer.partition", "peer.checkpoint",
                                    # the schema and the builder both drivers use, and their users in sim/
                                    "peer.schema", "peer.build", "sim.scenario", "sim.world",
                                    "sim.from_network"])
def test_training_modules_never_reach_zmq(module: str) -> None:
    found = reachable(module)
    assert module_file(module) is not None
    assert not forbidden(found)


def test_the_guard_flags_the_daemon_which_does_reach_zmq() -> None:
    # Negative control on the real tree: the daemon imports the transport, which imports zmq.
    assert {"peer.transport", "zmq"} <= set(forbidden(reachable("peer.daemon")))


def test_the_guard_follows_relative_and_package_imports(tmp_path: Path) -> None:
    # Negative control on a made-up package: zmq three hops away, through an __init__ and a
    # relative import, is still found; the same package without that import is clean.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "trainer.py").write_text("from pkg.sub import helpers\n")
    (package / "sub" / "__init__.py").write_text("from . import wire\n")
    (package / "sub" / "helpers.py").write_text("import math\n")
    (package / "sub" / "wire.py").write_text("def send():\n    from ..net import socket\n")
    (package / "net.py").write_text("import zmq.asyncio\n")
    assert forbidden(reachable("pkg.trainer", tmp_path, ("pkg",))) == ["zmq", "zmq.asyncio"]
    (package / "net.py").write_text("import socket\n")
    assert forbidden(reachable("pkg.trainer", tmp_path, ("pkg",))) == []
