"""No import circles among the project's modules (peer, protocols, topology, sim).

Every import counts, wherever it is written: at the top, inside a function, or under
``TYPE_CHECKING``. A circle is broken by moving the shared piece down into a module both can
import, not by hiding one side of it in a function. ``from package import name`` points at
``package.name`` when that is a module, else at the package; importing a module's own parent
package on the way (what Python does for ``a.b.c``) is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("peer", "protocols", "topology", "sim")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under each package folder of ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules in ``known`` that ``module`` (at ``path``) imports anywhere in its text."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                targets.add(full if full in known else base)
    return {target for target in targets if target in known and target != module}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> nx.DiGraph:
    modules = module_names(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        graph.add_edges_from((module, target) for target in imported_modules(path, module, set(modules)))
    return graph


def circles(graph: nx.DiGraph) -> list[str]:
    """Each import circle as ``a -> b -> a``, from its first module in sorted order; sorted."""
    found = []
    for cycle in nx.simple_cycles(graph):
        start = cycle.index(min(cycle))
        turned = cycle[start:] + cycle[:start]
        found.append(" -> ".join([*turned, turned[0]]))
    return sorted(found)


def test_the_graph_holds_the_project_and_the_modules_once_in_circles() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 150
    # the four circles issue 28 broke, each now one way down through a module of its own
    assert graph.has_edge("peer.net.handshakes", "peer.net.transport_config")
    assert graph.has_edge("protocols.federation.distributed_dp", "protocols.federation.secure_config")
    assert graph.has_edge("peer.files.console", "peer.files.units")
    assert graph.has_edge("sim.report_html", "sim.comparison")


def test_no_module_imports_itself_back() -> None:
    assert circles(import_graph()) == []


def test_the_scan_sees_imports_inside_functions_and_under_type_checking(tmp_path: Path) -> None:
    # Negative control on a made-up package: a circle closed by a function-local import and one closed
    # under TYPE_CHECKING are both found; with the shared piece moved down, none is.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "report.py").write_text("def write():\n    from pkg.html import render\n")
    (package / "html.py").write_text("from pkg.report import rows\n")
    (package / "transport.py").write_text("from . import watch\n")
    (package / "watch.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from .transport import Config\n")
    assert circles(import_graph(tmp_path, ("pkg",))) == [
        "pkg.html -> pkg.report -> pkg.html", "pkg.transport -> pkg.watch -> pkg.transport"]
    (package / "rows.py").write_text("")
    (package / "html.py").write_text("from pkg.rows import rows\n")
    (package / "config.py").write_text("")
    (package / "watch.py").write_text("from pkg.config import Config\n")
    assert circles(import_graph(tmp_path, ("pkg",))) == []
