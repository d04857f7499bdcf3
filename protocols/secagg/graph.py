"""The masking graph: who masks with whom, derived from every advertised key so anyone can check it.

SecAgg+ (Bell et al. 2020) replaces SecAgg's complete graph with a sparse random one of degree
k = O(log n). Ours is a Harary-style ring: the clients are ordered by SHA-256(graph seed || name),
and each is joined to the k/2 nearest on either side (k even). The graph seed is SHA-256 of the
run id, the round and every advertised (name, cipher key, mask key), so a gateway cannot pick the
graph: it would have to pick the clients' fresh keys. k >= n - 1 gives the complete graph, plain
SecAgg.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from protocols.secagg.crypto import frame


def graph_seed(run_id: str, round_index: int, keys: Mapping[str, tuple[bytes, bytes]]) -> bytes:
    """SHA-256 over the run, the round and each client's (cipher, mask) public keys, in name order."""
    parts: list[bytes | str | int] = ["masking-graph", run_id, round_index]
    for name in sorted(keys):
        cipher_public, mask_public = keys[name]
        parts += [name, cipher_public, mask_public]
    return hashlib.sha256(frame(*parts)).digest()


def neighbours(seed: bytes, members: list[str] | tuple[str, ...], degree: int) -> dict[str, frozenset[str]]:
    """Each member's masking neighbours: the ``degree // 2`` ring positions on each side (all others
    when ``degree >= len(members) - 1``). Symmetric: v is u's neighbour exactly when u is v's."""
    names = sorted(members)
    n = len(names)
    if degree >= n - 1:
        return {name: frozenset(names) - {name} for name in names}
    ring = sorted(names, key=lambda name: hashlib.sha256(seed + name.encode("utf-8")).digest())
    half = degree // 2
    result: dict[str, frozenset[str]] = {}
    for position, name in enumerate(ring):
        around = {ring[(position + step) % n] for step in range(1, half + 1)}
        around |= {ring[(position - step) % n] for step in range(1, half + 1)}
        result[name] = frozenset(around)
    return result
