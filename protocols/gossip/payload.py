"""A flat parameter-like vector <-> the tensors/meta of a ParamPush, through the configured operator.

``identity`` travels as the raw tensor in the parameters' own dtype (no copy
through float32, so a float64 run stays exact); every other spec goes through
``protocols.compress`` (``from_spec``, ``pack``/``unpack``). Decoding checks the
length and rejects non-finite values with ``BadParts``, so nothing malformed
reaches the mixing maths. Message tensors are on the CPU (ready for the wire;
no copy when the parameters are already there); decoded vectors are on the
parameters' device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from protocols.compress import BadParts, Compressor, RngKey, from_spec, pack, unpack
from protocols.finite import all_finite
from protocols.messages import Scalar

RAW = "x"  # the tensor name of an uncompressed vector
PREFIX = "q"  # the pack prefix of a compressed vector
CPU = torch.device("cpu")


def encodable(x: torch.Tensor, *, compressed: bool) -> bool:
    """Whether ``x`` can be sent: its values finite and, through an operator (``compressed``), its norm
    too (the operators' norms and scales are float32, and each refuses what overflows them)."""
    if not compressed:
        return all_finite(x)
    return bool(torch.isfinite(torch.linalg.vector_norm(x.detach().float())))


class Payload:
    """Encoder/decoder for one peer's vectors of ``numel`` elements of ``dtype`` on ``device``."""

    def __init__(self, spec: str, *, numel: int, dtype: torch.dtype, seed: int, name: str,
                 device: torch.device | str = "cpu", shapes: Sequence[tuple[int, ...]] | None = None) -> None:
        self.numel = numel
        self.dtype = dtype
        self.device = torch.device(device)
        self._seed = seed
        self._name = name
        self._compressor: Compressor | None = (None if spec.strip() == "identity"
                                               else from_spec(spec, shapes=shapes))

    def encode(self, x: torch.Tensor, round_index: int, *, raw: bool = False
               ) -> tuple[dict[str, torch.Tensor], dict[str, Scalar], torch.Tensor]:
        """(tensors, meta) for the message, and the vector the receivers will decode (a fresh tensor).

        ``raw``: send uncompressed whatever the operator. The returned tensors are
        never modified afterwards by the machine, so a driver may send them
        without copying.
        """
        if self._compressor is None or raw:
            sent = x.detach().clone()
            return {RAW: sent.to(CPU)}, {}, sent
        compressed = self._compressor.compress(x.detach(), RngKey(self._seed, self._name, round_index))
        tensors, meta = pack(compressed, PREFIX)
        decoded = self._compressor.decompress(compressed).to(device=self.device, dtype=self.dtype)
        return {k: t.to(CPU) for k, t in tensors.items()}, meta, decoded

    def encodable(self, x: torch.Tensor) -> bool:
        """Whether :meth:`encode` takes ``x`` (:func:`encodable`)."""
        return encodable(x, compressed=self._compressor is not None)

    def export_state(self) -> dict[str, torch.Tensor]:
        """A stateful operator's state (PowerSGD's warm start), for checkpoints; else empty."""
        export = getattr(self._compressor, "export_state", None)
        return dict(export()) if export is not None else {}

    def restore_state(self, state: Mapping[str, torch.Tensor]) -> None:
        restore = getattr(self._compressor, "restore_state", None)
        if restore is not None:
            restore(state)

    def decode(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Scalar], *,
               raw: bool = False) -> torch.Tensor:
        """The received vector in our dtype; raises BadParts(reason) when it must not be applied."""
        if self._compressor is None or raw:
            x = tensors.get(RAW)
            if x is None:
                raise BadParts("missing_part", RAW)
            if x.dim() != 1 or x.numel() != self.numel:
                raise BadParts("wrong_length", f"{tuple(x.shape)}, expected ({self.numel},)")
            if not x.is_floating_point():
                raise BadParts("wrong_dtype", str(x.dtype))
        else:
            x = self._compressor.decompress(unpack(tensors, meta, PREFIX, self.numel))
        x = x.to(device=self.device, dtype=self.dtype)
        if not all_finite(x):
            raise BadParts("nonfinite", "NaN or Inf in a received vector")
        return x
