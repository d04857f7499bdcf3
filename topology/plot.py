"""A picture of a topology: the graph (edge width by mixing weight) beside the heatmap of W.

matplotlib is imported here only, lazily, with the Agg backend, so importing
``topology`` never pulls in a GUI toolkit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from protocols.errors import HivemeshError
from topology.analysis import consensus_rate
from topology.schedule import Topology

MATRIX_LABEL_PT = 8      # the smallest tick label that reads on a screen at the saved 110 dpi
MAX_MATRIX_LABELS = 24   # tick labels per axis of W; more overlap at 8 pt in the panel's height
MAX_ROUND_PANELS = 12    # one-peer-exponential:4096 has a period of 12


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
    """Write a PNG of :func:`figure_of`."""
    import matplotlib.pyplot as plt

    figure = figure_of(topology)
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise HivemeshError(f"cannot write plot {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)


def figure_of(topology: Topology) -> Any:
    """The graph on the left, W (or its mean over the period) on the right; a time-varying graph
    adds a row with W of each round of its period (the first ``MAX_ROUND_PANELS``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    rounds = min(topology.period, MAX_ROUND_PANELS) if topology.period > 1 else 0
    figure = plt.figure(figsize=(13, 6.6 + (3.0 if rounds else 0.0)), layout="constrained")
    top: Any = figure
    if rounds:
        halves: Any = figure.subfigures(2, 1, height_ratios=[6.6, 3.0])
        top, bottom = halves
    left, right = top.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.15]})
    positions = layout(topology)
    grid = topology.graph.graph.get("grid")
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
    _label_members(right, topology.names)
    right.set_xlabel("j (sender)")
    right.set_ylabel("i (receiver)")
    if rounds:
        panels = bottom.subplots(1, rounds, squeeze=False)[0]
        heaviest_entry = max(float(topology.mixing(t).max()) for t in range(rounds))
        for t, axes in enumerate(panels):
            image = axes.imshow(topology.mixing(t), cmap="viridis", vmin=0.0, vmax=heaviest_entry,
                                interpolation="nearest")
            axes.set_title(f"round {t}", fontsize=10)
            axes.set_xticks([])
            axes.set_yticks([])
        bottom.colorbar(image, ax=list(panels), shrink=0.8)
        shown = "" if rounds == topology.period else f" (the first {rounds} of {topology.period})"
        bottom.suptitle(f"W in each round t of the period: round t uses W[t mod {topology.period}]{shown}",
                        fontsize=11)
    return figure


def _label_members(axes: Any, names: Sequence[str]) -> None:
    """Tick labels a reader can read (8 pt): every member up to ``MAX_MATRIX_LABELS``, else every
    k-th, so they never overlap."""
    stride = max(1, math.ceil(len(names) / MAX_MATRIX_LABELS))
    ticks = list(range(0, len(names), stride))
    axes.set_xticks(ticks, [names[k] for k in ticks], rotation=90, fontsize=MATRIX_LABEL_PT)
    axes.set_yticks(ticks, [names[k] for k in ticks], fontsize=MATRIX_LABEL_PT)
