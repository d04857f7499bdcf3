"""The plots of a simulation report: accuracy, loss and consensus over time and bytes; traffic per link;
the graph each scenario ran on.

Every panel has a title, every line one legend entry, and every size a scale: a report is read by
someone who did not write the scenario. matplotlib is imported only when plots are drawn (Agg
backend, no display); :func:`figures` returns the figures unsaved so tests can read their axes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from peer.files.units import human_bytes
from sim.world import ScenarioResult

# Above this many members the topology plot is left out of the report: one arrow per edge of a
# large graph takes longer to draw than the simulation, and shows only a blur.
TOPOLOGY_PLOT_MAX_MEMBERS = 128

# (file, x field, y field, title, x label, y label)
PANELS = (
    ("accuracy_vs_time.png", "time_s", "mean_accuracy", "Mean test accuracy over simulated time",
     "simulated time (s)", "mean test accuracy (honest members)"),
    ("loss_vs_time.png", "time_s", "mean_loss", "Mean test loss over simulated time",
     "simulated time (s)", "mean test loss (honest members)"),
    ("accuracy_vs_bytes.png", "bytes_sent", "mean_accuracy", "Mean test accuracy against bytes sent",
     "bytes sent (all members)", "mean test accuracy (honest members)"),
    ("loss_vs_bytes.png", "bytes_sent", "mean_loss", "Mean test loss against bytes sent",
     "bytes sent (all members)", "mean test loss (honest members)"),
    ("consensus_vs_time.png", "time_s", "consensus_rms", "Consensus distance over simulated time",
     "simulated time (s)", "RMS of ||x_i - mean|| (parameter units)"),
)


def draw_plots(results: Sequence[ScenarioResult], out: Path) -> list[Path]:
    """Save every figure of :func:`figures` as a PNG in ``out``; return the files written."""
    drawn = figures(results)  # selects the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    written = []
    for filename, figure in drawn.items():
        path = out / filename
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    written.extend(_draw_topologies(results, out))
    return written


def figures(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    """Every plot of the report but the topology, by file name, as unsaved matplotlib figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn: dict[str, Any] = {}
    labels = legend_labels(results)
    for filename, x_name, y_name, title, x_label, y_label in PANELS:
        figure, axes = plt.subplots(figsize=(7.0, 4.2))
        for result, label in zip(results, labels, strict=True):
            xs = [getattr(p, x_name) for p in result.trace]
            ys = [getattr(p, y_name) for p in result.trace]
            axes.plot(xs, ys, label=label, linestyle="-" if result.kind.startswith("gossip") else "--")
        if x_name == "bytes_sent" and any(r.bytes_sent for r in results):
            axes.set_xscale("symlog")
        if y_name == "consensus_rms":
            _consensus_axis(axes, [p.consensus_rms for r in results for p in r.trace])
        if y_name == "mean_accuracy":
            for target in sorted({r.target_accuracy for r in results if r.target_accuracy > 0}):
                axes.axhline(target, color="grey", linestyle=":", linewidth=1.2,
                             label=f"target accuracy {target:g}")
        axes.set_title(title)
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.legend(fontsize="small")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        drawn[filename] = figure
    for index, result in enumerate(results):
        drawn[f"traffic_{index:02d}_{safe_name(result.name)}.png"] = _traffic_figure(plt, result)
    if any(result.rounds for result in results):
        drawn["federation_rounds.png"] = _federation_figure(plt, [r for r in results if r.rounds])
    return drawn


def _federation_figure(plt: Any, results: Sequence[ScenarioResult]) -> Any:
    """A federation's rounds (sim/federation.py): each gateway's global accuracy at each closed round
    against simulated time and bytes sent, and how many clients' updates each round took."""
    figure, (by_time, by_bytes, taken) = plt.subplots(1, 3, figsize=(15.0, 4.2))
    for result, label in zip(results, legend_labels(results), strict=True):
        for gateway in sorted({row["gateway"] for row in result.rounds}):
            rows = [row for row in result.rounds if row["gateway"] == gateway]
            name = f"{label} {gateway}" if len({r["gateway"] for r in result.rounds}) > 1 else label
            accuracy = [r["accuracy"] for r in rows]
            by_time.plot([r["time_s"] for r in rows], accuracy, marker=".", label=name)
            by_bytes.plot([r["bytes_sent"] for r in rows], accuracy, marker=".", label=name)
            taken.plot([r["round"] for r in rows], [r["participants"] for r in rows], marker="o",
                       drawstyle="steps-mid", label=name)
    for axes, title, x_label, y_label in (
            (by_time, "Global accuracy per round over simulated time", "simulated time (s)", "test accuracy"),
            (by_bytes, "Global accuracy per round against bytes sent", "bytes sent (all members)",
             "test accuracy"),
            (taken, "Participation per round", "round (FedBuff: aggregation)", "client updates aggregated")):
        axes.set_title(title, fontsize="medium")
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.legend(fontsize="small")
        axes.grid(alpha=0.3)
    by_bytes.set_xscale("symlog")
    taken.set_ylim(bottom=0)
    figure.tight_layout()
    return figure


def legend_labels(results: Sequence[ScenarioResult]) -> list[str]:
    """One distinct label per scenario: its name, with its kind where the name does not already say
    it ('ring (gossip:dpsgd)', 'ring/allreduce'); a name given twice gets its position."""
    labels = []
    for result in results:
        kind = result.kind.removeprefix("gossip:")
        labels.append(result.name if kind in result.name else f"{result.name} ({result.kind})")
    repeated = {label for label in labels if labels.count(label) > 1}
    return [f"{label} [{index + 1}]" if label in repeated else label for index, label in enumerate(labels)]


def _consensus_axis(axes: Any, values: Iterable[float]) -> None:
    """A log axis from the decade below the smallest positive distance to the decade above the
    largest, at least two decades tall (reaching down), so several decades carry a label; an
    exact average (distance 0) is drawn on the floor."""
    from matplotlib.ticker import LogLocator

    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    top_exp = math.ceil(math.log10(max(positive))) if positive else 0
    floor_exp = min(math.floor(math.log10(min(positive))) if positive else -6, top_exp - 2)
    for line in axes.get_lines():
        line.set_ydata([max(float(y), 10.0 ** floor_exp) for y in line.get_ydata()])
    axes.set_yscale("log")
    axes.set_ylim(10.0 ** floor_exp, 10.0 ** top_exp)
    axes.yaxis.set_major_locator(LogLocator(base=10, numticks=12))
    if len(positive) < len(finite):
        axes.text(0.99, 0.01, f"0 (exact average) drawn at 1e{floor_exp}", transform=axes.transAxes,
                  ha="right", va="bottom", fontsize="small", color="dimgrey")


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]


def _traffic_figure(plt: Any, result: ScenarioResult) -> Any:
    """Members on a circle (sorted), a parameter server in the middle, each link drawn with width
    proportional to its bytes; a legend gives the bytes of three widths and the node colours."""
    from matplotlib.lines import Line2D

    members = sorted(name for name, peer in result.peers.items() if peer.get("behaviour") != "server")
    servers = sorted(name for name, peer in result.peers.items() if peer.get("behaviour") == "server")
    position = {name: (math.cos(2 * math.pi * i / len(members)), math.sin(2 * math.pi * i / len(members)))
                for i, name in enumerate(members)}
    position.update({name: (0.0, 0.0) for name in servers})
    figure, axes = plt.subplots(figsize=(8.0, 6.0), layout="constrained")  # makes room for the legend
    links = [(s, d, b) for s, d, b in traffic_edges(result.links, members) if s in position and d in position]
    heaviest = max((b for _, _, b in links), default=0) or 1

    def width(nbytes: float) -> float:
        return 0.5 + 5.0 * nbytes / heaviest

    for src, dst, nbytes in links:
        (x0, y0), (x1, y1) = position[src], position[dst]
        axes.plot([x0, x1], [y0, y1], color="tab:blue", alpha=0.5, linewidth=width(nbytes))
    colours = {"honest": "tab:orange", "server": "tab:green"}
    behaviours = set()
    for name in members + servers:
        x, y = position[name]
        behaviour = result.peers[name].get("behaviour", "honest")
        behaviours.add(behaviour if behaviour in colours else "attacker")
        axes.scatter([x], [y], s=60, zorder=3, color=colours.get(behaviour, "tab:red"))
        if len(members) <= 40 or behaviour == "server":
            axes.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    scale = [Line2D([], [], color="tab:blue", alpha=0.5, linewidth=width(heaviest * share),
                    label=f"{human_bytes(heaviest * share)} on a link")
             for share in (1.0, 0.5, 0.1)] if links else []
    nodes = [Line2D([], [], linestyle="", marker="o", color={**colours, "attacker": "tab:red"}[kind],
                    label=kind) for kind in ("honest", "attacker", "server") if kind in behaviours]
    figure.legend(handles=scale + nodes, title="edge width: bytes sent", fontsize="small",
                  loc="outside right upper")
    total = sum(b for _, _, _, b in result.links)
    axes.set_title(f"{result.name}: traffic per link (total {human_bytes(total)})")
    axes.set_aspect("equal")
    axes.axis("off")
    return figure


def traffic_edges(links: Sequence[tuple[str, str, int, int]], members: Sequence[str]
                  ) -> list[tuple[str, str, float]]:
    """``(src, dst, bytes)`` per drawn edge. A ``*`` end is a queue every member shares (the
    parameter server's link, sim/baselines.py): it is drawn as one edge per member with an equal
    share, since every member moves the same model through it."""
    edges: list[tuple[str, str, float]] = []
    for src, dst, _, nbytes in links:
        if "*" in (src, dst) and members:
            share = nbytes / len(members)
            edges.extend((m if src == "*" else src, m if dst == "*" else dst, share) for m in members)
        else:
            edges.append((src, dst, float(nbytes)))
    return edges


def _draw_topologies(results: Sequence[ScenarioResult], out: Path) -> list[Path]:
    """The graph of each gossip scenario (a baseline runs on its scenario's members, not its edges);
    one file per distinct graph."""
    from topology.plot import draw

    written: list[Path] = []
    drawn: set[tuple[str, tuple[str, ...]]] = set()
    for result in results:
        topology = result.topology
        if topology is None or not result.kind.startswith("gossip"):
            continue
        if topology.size > TOPOLOGY_PLOT_MAX_MEMBERS:
            continue
        key = (topology.spec, tuple(topology.names))
        if key in drawn:
            continue
        drawn.add(key)
        path = out / f"topology_{len(written):02d}_{safe_name(result.name)}.png"
        draw(topology, path)
        written.append(path)
    return written
