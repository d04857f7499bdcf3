"""A picture of a topology: the graph (edge width by mixing weight) beside the heatmap of W.

matplotlib is imported here only, lazily, with the Agg backend, so importing
``topology`` never pulls in a GUI toolkit.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from topology.analysis import consensus_rate
from topology.errors import HivemeshError
from topology.schedule import Topology


def layout(topology: Topology) -> dict[str, tuple[float, float]]:
    """Grid positions for a torus, otherwise a circle in name order (index 0 at the top)."""
    grid = topology.graph.graph.get("grid")
    if grid:
        rows, cols = grid
        return {name: (float(k % cols), float(rows - 1 - k // cols)) for k, name in enumerate(topology.names)}
    n = topology.size
    return {name: (math.sin(2 * math.pi * k / n), math.cos(2 * math.pi * k / n))
            for k, name in enumerate(topology.names)}


def draw(topology: Topology, path: str | Path) -> None:
    """Write a PNG: the graph on the left, W (or its mean over the period) on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    positions = layout(topology)
    grid = topology.graph.graph.get("grid")
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 6.6), layout="constrained",
                                         gridspec_kw={"width_ratios": [1, 1.15]})
    edges = list(topology.graph.edges(data="weight", default=1.0))
    heaviest = max((float(weight) for _, _, weight in edges), default=1.0) or 1.0
    for a, b, weight in edges:
        (xa, ya), (xb, yb) = positions[a], positions[b]
        width = 0.4 + 3.6 * float(weight) / heaviest
        if grid and (abs(xa - xb) > 1 or abs(ya - yb) > 1):
            # A wrap-around link: a short stub leaving each end towards the opposite side.
            for (x, y), (dx, dy) in (((xa, ya), (np.sign(xa - xb), np.sign(ya - yb))),
                                     ((xb, yb), (np.sign(xb - xa), np.sign(yb - ya)))):
                left.plot([x, x + 0.4 * dx], [y, y + 0.4 * dy], color="tab:gray", linewidth=width,
                          linestyle=(0, (2, 1)), zorder=1)
            continue
        left.add_patch(FancyArrowPatch(
            (xa, ya), (xb, yb), arrowstyle="-|>" if topology.directed else "-", mutation_scale=12,
            connectionstyle=f"arc3,rad={0.08 if topology.directed else 0.0}",  # a <-> b pairs stay apart
            linewidth=width, color="tab:blue", alpha=0.75, shrinkA=8, shrinkB=8, zorder=2))
    xs = [p[0] for p in positions.values()]
    ys = [p[1] for p in positions.values()]
    left.scatter(xs, ys, s=60 if topology.size > 32 else 110, c="white", edgecolors="black", zorder=3)
    if topology.size <= 64:
        for name, (x, y) in positions.items():
            # Labels beside the node: below it on a grid, radially outside on a circle.
            lx, ly = (x, y - 0.22) if grid else (1.13 * x, 1.13 * y)
            left.annotate(name, (lx, ly), ha="center", va="center", fontsize=6 if topology.size > 16 else 8,
                          zorder=4)
    margin = 0.6 if grid else 0.3
    left.set_xlim(min(xs) - margin, max(xs) + margin)
    left.set_ylim(min(ys) - margin, max(ys) + margin)
    left.set_aspect("equal")
    left.axis("off")
    left.set_title("graph (edge width: mixing weight" + ("; dashed: wrap-around)" if grid else ")"))
    gap = 1.0 - consensus_rate(topology)
    period = f", time-varying with period {topology.period}" if topology.period > 1 else ""
    kind = "directed" if topology.directed else "undirected"
    figure.suptitle(f"{topology.spec or 'topology'}: {topology.size} members, "
                    f"{topology.graph.number_of_edges()} {kind} edges{period}; "
                    f"spectral gap {gap:.4f} per round")

    matrix = np.mean([topology.mixing(t) for t in range(topology.period)], axis=0)
    image = right.imshow(matrix, cmap="viridis", vmin=0.0, interpolation="nearest")
    figure.colorbar(image, ax=right, fraction=0.046, pad=0.04)
    right.set_title("W (mean over the period)" if topology.period > 1 else "W: x_i <- sum_j W[i, j] x_j")
    if topology.size <= 32:
        ticks = range(topology.size)
        right.set_xticks(ticks, topology.names, rotation=90, fontsize=6)
        right.set_yticks(ticks, topology.names, fontsize=6)
    right.set_xlabel("j (sender)")
    right.set_ylabel("i (receiver)")
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise HivemeshError(f"cannot write plot {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)
