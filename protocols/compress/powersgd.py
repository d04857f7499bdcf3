"""PowerSGD (Vogels et al. 2019): rank-r power iteration with warm start, per layer.

The flat vector is the model's parameters laid end to end with ``shapes``.
Each layer with two or more dimensions is viewed as rows x cols (dim 0 by
the rest, as the paper does for convolutions) and, where r (rows + cols) is
smaller than rows x cols, sent as two factors: P = orth(M Q), Q' = M^T P,
decoded as P Q'^T. Q' is kept as the next call's starting Q (warm start),
so one power iteration per step tracks the dominant subspace. Biases, norms
and any layer too small to gain are sent exactly.

Without ``shapes`` the vector is padded to a near-square matrix.

The first Q of layer i is drawn from a generator keyed by (seed, peer, i,
"powersgd"), so two peers built from the same key start identically. The
warm-start state makes the operator stateful: error feedback keeps one copy
per slot (``fresh``), and ``export_state``/``restore_state`` checkpoint it.
Parts: ``p`` and ``q`` (all layers' factors end to end) and ``exact``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from protocols.compress.base import (
    BadParts,
    Compressed,
    RngKey,
    check_finite,
    check_header,
    check_input,
    get_part,
    output,
)
from protocols.rng import torch_generator


@dataclass(frozen=True)
class Layer:
    """Where one parameter lives in the flat vector and how it is sent."""

    offset: int
    numel: int
    rows: int
    cols: int
    low_rank: bool


def plan(shapes: Sequence[tuple[int, ...]] | None, numel: int, rank: int) -> list[Layer]:
    """The per-layer layout for a flat vector of ``numel`` elements."""
    if shapes is None:
        rows = max(1, math.isqrt(numel))
        cols = -(-numel // rows) if numel else 0
        return [Layer(0, numel, rows, cols, rank * (rows + cols) < numel)]
    layers: list[Layer] = []
    offset = 0
    for shape in shapes:
        size = math.prod(shape)
        rows = shape[0] if len(shape) >= 2 else size
        cols = size // rows if len(shape) >= 2 and rows else 1
        low_rank = len(shape) >= 2 and rank * (rows + cols) < size
        layers.append(Layer(offset, size, rows, cols, low_rank))
        offset += size
    if offset != numel:
        raise ValueError(f"powersgd: the shapes hold {offset} elements, the vector has {numel}")
    return layers


def _matrix(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    segment = x[layer.offset:layer.offset + layer.numel]
    if layer.rows * layer.cols == layer.numel:
        return segment.view(layer.rows, layer.cols)
    padded = torch.zeros(layer.rows * layer.cols, dtype=torch.float32)
    padded[:layer.numel] = segment
    return padded.view(layer.rows, layer.cols)


@dataclass(frozen=True, kw_only=True)
class PowerSGD:
    """Rank-``rank`` factors per matrix-shaped layer; the rest exact."""

    rank: int = 4  # rank 4: the paper's default, within 1% of full accuracy on its ResNet/LSTM runs
    shapes: tuple[tuple[int, ...], ...] | None = None  # the model's parameter shapes, in flat order
    _warm: dict[int, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"powersgd rank must be a positive integer, got {self.rank}")
        if self.shapes is not None:
            for shape in self.shapes:
                if not all(isinstance(d, int) and d >= 0 for d in shape):
                    raise ValueError(f"powersgd: bad parameter shape {shape}")

    @property
    def name(self) -> str:
        return "powersgd"

    def fresh(self) -> PowerSGD:
        """The same operator with no warm-start state (one per error-feedback slot)."""
        return PowerSGD(rank=self.rank, shapes=self.shapes)

    def _start(self, index: int, layer: Layer, key: RngKey) -> torch.Tensor:
        q = self._warm.get(index)
        if q is None or q.shape != (layer.cols, self.rank) or not bool(q.abs().sum() > 0):
            generator = torch_generator(key.seed, key.peer, index, self.name)
            q = torch.randn(layer.cols, self.rank, generator=generator)
        return q

    def compress(self, x: torch.Tensor, key: RngKey) -> Compressed:
        x = check_input(x)
        layers = plan(self.shapes, x.numel(), self.rank)
        p_parts: list[torch.Tensor] = []
        q_parts: list[torch.Tensor] = []
        exact_parts: list[torch.Tensor] = []
        for index, layer in enumerate(layers):
            if not layer.low_rank:
                exact_parts.append(x[layer.offset:layer.offset + layer.numel])
                continue
            matrix = _matrix(x, layer)
            p = torch.linalg.qr(matrix @ self._start(index, layer, key)).Q
            q = matrix.T @ p
            self._warm[index] = q
            p_parts.append(p.reshape(-1))
            q_parts.append(q.reshape(-1))
        return Compressed(
            op=self.name,
            numel=x.numel(),
            parts={"p": _join(p_parts), "q": _join(q_parts), "exact": _join(exact_parts)},
        )

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        check_header(c, self.name, {"p", "q", "exact"})
        try:
            layers = plan(self.shapes, c.numel, self.rank)
        except ValueError as error:
            raise BadParts("wrong_numel", str(error)) from None
        low = [layer for layer in layers if layer.low_rank]
        p = get_part(c, "p", torch.float32, sum(layer.rows for layer in low) * self.rank)
        q = get_part(c, "q", torch.float32, sum(layer.cols for layer in low) * self.rank)
        exact_numel = sum(layer.numel for layer in layers if not layer.low_rank)
        exact = get_part(c, "exact", torch.float32, exact_numel)
        for name, part in (("p", p), ("q", q), ("exact", exact)):
            check_finite(part, name)
        result = output(c.numel, out)
        p_at = q_at = exact_at = 0
        for layer in layers:
            target = result[layer.offset:layer.offset + layer.numel]
            if not layer.low_rank:
                target.copy_(exact[exact_at:exact_at + layer.numel])
                exact_at += layer.numel
                continue
            p_layer = p[p_at:p_at + layer.rows * self.rank].view(layer.rows, self.rank)
            q_layer = q[q_at:q_at + layer.cols * self.rank].view(layer.cols, self.rank)
            p_at += p_layer.numel()
            q_at += q_layer.numel()
            if layer.rows * layer.cols == layer.numel:
                torch.mm(p_layer, q_layer.T, out=target.view(layer.rows, layer.cols))
            else:
                target.copy_((p_layer @ q_layer.T).reshape(-1)[:layer.numel])
        return result

    def export_state(self) -> dict[str, torch.Tensor]:
        """The warm-start Q of each layer, for a checkpoint."""
        return {f"q.{index}": q.clone() for index, q in self._warm.items()}

    def restore_state(self, state: Mapping[str, torch.Tensor]) -> None:
        warm: dict[int, torch.Tensor] = {}
        for name, tensor in state.items():
            prefix, _, number = name.partition(".")
            if prefix != "q" or not number.isdigit() or tensor.dim() != 2:
                raise ValueError(f"powersgd state: unexpected entry {name!r}")
            warm[int(number)] = tensor.to(torch.float32, copy=True)
        self._warm.clear()
        self._warm.update(warm)


def _join(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32)
