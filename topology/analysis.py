"""How fast a topology mixes and what it costs: spectral gap, consensus rate, diameter, traffic.

Gossip ``x <- W x`` shrinks the distance to the average by about
``|lambda_2(W)|`` per round, where ``lambda_2`` is the eigenvalue of second
largest modulus (the largest is 1). For a time-varying schedule the same
holds for the product of one period's matrices, ``P = W_{p-1} ... W_0``;
we report it per round, ``|lambda_2(P)| ** (1 / p)``, so static and
time-varying graphs compare on one scale.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx
import numpy as np

from topology.schedule import Topology

# |lambda_2| below this is exact averaging up to rounding (e.g. the one-peer
# product J/n); without the floor, 1e-16 ** (1/4) would read as 1e-4.
EXACT_AVERAGING = 1e-12
BYTES_PER_FLOAT32 = 4


def second_eigenvalue_modulus(matrix: np.ndarray) -> float:
    """|lambda_2|: the second largest eigenvalue modulus of a stochastic matrix (0 for 1 x 1)."""
    n = matrix.shape[0]
    if n <= 1:
        return 0.0
    if np.allclose(matrix, matrix.T, atol=1e-12):
        # Symmetric doubly stochastic: removing the mean direction leaves exactly the rest of the spectrum.
        moduli = np.abs(np.linalg.eigvalsh(matrix - np.full((n, n), 1.0 / n)))
        value = float(moduli.max())
    else:
        moduli = np.sort(np.abs(np.linalg.eigvals(matrix)))
        value = float(moduli[-2])
    return 0.0 if value < EXACT_AVERAGING else min(value, 1.0)


def period_product(topology: Topology) -> np.ndarray:
    """P = W_{p-1} ... W_1 W_0: what one full period of the schedule does to x."""
    product = np.eye(topology.size)
    for t in range(topology.period):
        product = topology.mixing(t) @ product
    return product


def consensus_rate(topology: Topology) -> float:
    """Predicted factor by which disagreement (distance to the average) shrinks per round."""
    period_modulus = second_eigenvalue_modulus(period_product(topology))
    return period_modulus ** (1.0 / topology.period) if period_modulus > 0 else 0.0


def spectral_gap(topology: Topology) -> float:
    """1 - |lambda_2| per round (for a schedule: from the period product, per round)."""
    return 1.0 - consensus_rate(topology)


def rounds_to_shrink(topology: Topology, factor: float = 1000.0) -> int | None:
    """Rounds for disagreement to shrink ``factor``-fold (None if it never does)."""
    rate = consensus_rate(topology)
    if rate == 0.0:
        return topology.period  # exact averaging after one full period
    if rate >= 1.0:
        return None
    return max(1, math.ceil(math.log(factor) / -math.log(rate)))


def diameter(topology: Topology) -> int:
    """Longest shortest path (hops) in the union graph; directed graphs count directed hops."""
    if topology.size <= 1:
        return 0
    return int(nx.diameter(topology.graph))


@dataclass(frozen=True, kw_only=True)
class DegreeStats:
    minimum: int
    maximum: int
    mean: float


def degree_stats(topology: Topology) -> DegreeStats:
    """Neighbours per member in the union graph (out-degree when directed)."""
    graph = topology.graph
    degrees = [d for _, d in (graph.out_degree() if graph.is_directed() else graph.degree())]
    return DegreeStats(minimum=min(degrees), maximum=max(degrees), mean=float(np.mean(degrees)))


def messages_per_round(topology: Topology) -> float:
    """Point-to-point messages per round (W_t[i, j] > 0, i != j), averaged over the period."""
    counts = []
    for t in range(topology.period):
        w = topology.mixing(t)
        counts.append(int(np.count_nonzero(w > 0)) - int(np.count_nonzero(np.diag(w) > 0)))
    return float(np.mean(counts))


def bytes_per_round(topology: Topology, model_params: int, bytes_per_param: int = BYTES_PER_FLOAT32) -> float:
    """Bytes all members send in one round of uncompressed gossip: messages x params x bytes."""
    return messages_per_round(topology) * model_params * bytes_per_param


def summary(topology: Topology, model_params: int | None = None) -> dict[str, Any]:
    """Everything ``hivemesh topology show`` reports, as plain JSON-able values."""
    rate = consensus_rate(topology)
    report: dict[str, Any] = {
        "spec": topology.spec,
        "nodes": topology.size,
        "edges": topology.graph.number_of_edges(),
        "directed": topology.directed,
        "period": topology.period,
        "spectral_gap": 1.0 - rate,
        "lambda2": rate,
        "period_lambda2": second_eigenvalue_modulus(period_product(topology)),
        "rounds_to_1000x": rounds_to_shrink(topology, 1000.0),
        "diameter": diameter(topology),
        "degree": asdict(degree_stats(topology)),
        "messages_per_round": messages_per_round(topology),
        "members": list(topology.names),
    }
    if model_params is not None:
        report["model_params"] = model_params
        report["bytes_per_round"] = bytes_per_round(topology, model_params)
    return report
