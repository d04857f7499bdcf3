"""The rooms of peer/ keep their import rules, so the simulator never reaches ZeroMQ.

The training room (peer.train) and the config and state-file room (peer.files) never reach zmq nor
the rooms that run peers (peer.net, peer.runtime, peer.cli); sim/ imports from peer/ only those two.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("peer", "protocols", "topology", "sim")
SIM_ROOMS = ("peer.train", "peer.files")  # what the simulator may import from peer/
RUNNING_ROOMS = ("peer.net", "peer.runtime", "peer.cli")  # ZeroMQ, processes, the command line


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
    for node in ast.walk(_executed(ast.parse(path.read_text()))):
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


def _executed(tree: ast.Module) -> ast.Module:
    """``tree`` less what importing the module never runs: ``if TYPE_CHECKING:`` blocks and a
    module ``__getattr__`` (PEP 562: it runs when that attribute is asked for, as ``peer.join``)."""
    def runs(node: ast.stmt) -> bool:
        checking = (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                    and node.test.id == "TYPE_CHECKING")
        lazy = isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        return not (checking or lazy)

    return ast.Module(body=[node for node in tree.body if runs(node)], type_ignores=[])


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


def in_room(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(f"{room}.") for room in rooms)


def forbidden(found: set[str]) -> list[str]:
    return sorted(name for name in found if name.split(".")[0] == "zmq" or in_room(name, RUNNING_ROOMS))


def modules_under(package: str, root: Path = ROOT) -> list[str]:
    """Every module of ``package`` (a folder under ``root``), sub-packages included."""
    folder = root.joinpath(*package.split("."))
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def peer_imports_outside(package: str, allowed: tuple[str, ...], root: Path = ROOT) -> dict[str, list[str]]:
    """Per module of ``package``: what it imports from peer/ that is not in one of the ``allowed`` rooms."""
    found = {}
    for module in modules_under(package, root):
        path = module_file(module, root)
        assert path is not None
        outside = sorted(name for name in imports_of(path, module)
                         if name.split(".")[0] == "peer" and not in_room(name, allowed))
        if outside:
            found[module] = outside
    return found


SIM_ROOM_MODULES = modules_under("peer.train") + modules_under("peer.files")


def test_the_rooms_are_found() -> None:
    # the parametrized lists below are not vacuous: they hold the modules the simulator relies on
    assert {"peer.train.trainer", "peer.train.tasks", "peer.train.tasks.charlm", "peer.train.build",
            "peer.train.checkpoint", "peer.files.schema", "peer.files.config"} <= set(SIM_ROOM_MODULES)
    assert {"sim.world", "sim.scenario", "sim.from_network", "sim.run"} <= set(modules_under("sim"))


@pytest.mark.parametrize("module", SIM_ROOM_MODULES + modules_under("sim"))
def test_training_config_and_sim_modules_never_reach_zmq_or_the_running_rooms(module: str) -> None:
    found = reachable(module)
    assert module_file(module) is not None
    assert not forbidden(found)


def test_sim_imports_from_peer_only_the_training_and_config_rooms() -> None:
    assert peer_imports_outside("sim", SIM_ROOMS) == {}


def test_the_guard_flags_the_daemon_which_does_reach_zmq() -> None:
    # Negative control on the real tree: the daemon imports the transport, which imports zmq.
    assert {"peer.net.transport", "zmq"} <= set(forbidden(reachable("peer.runtime.daemon")))


def test_the_room_rule_flags_a_sim_module_that_imports_the_runtime(tmp_path: Path) -> None:
    # Negative control on a made-up tree: sim/ importing the runtime room, or peer/ by its bare
    # package, is flagged; importing the training and config rooms is not.
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "__init__.py").write_text("")
    (tmp_path / "sim" / "fine.py").write_text("from peer.train.trainer import Trainer\n"
                                             "from peer.files import tomlout\n")
    (tmp_path / "sim" / "bad.py").write_text("def run():\n    from peer.runtime.daemon import run_peer\n")
    (tmp_path / "sim" / "flat.py").write_text("from peer import checkpoint\n")
    assert peer_imports_outside("sim", SIM_ROOMS, tmp_path) == {
        "sim.bad": ["peer.runtime.daemon", "peer.runtime.daemon.run_peer"],
        "sim.flat": ["peer", "peer.checkpoint"]}


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
