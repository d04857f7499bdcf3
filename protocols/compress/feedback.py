"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019) around any operator.

Per slot (a tensor, or a destination when each neighbour gets its own
stream): send C(x + e) and keep e <- (x + e) - decompress(C(x + e)). Nothing
is lost: over any number of steps, everything sent plus the residual equals
everything fed in (up to float rounding of the running sums).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from protocols.compress.base import Compressed, Compressor, RngKey, check_input

_RESIDUAL = "residual/"
_OPERATOR = "operator/"  # operator/<slot>/<entry> for operators with state (PowerSGD's warm start)


class ErrorFeedback:
    """Wraps ``compressor``; ``compress(x, key, slot)`` folds in and updates that slot's residual."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self.residuals: dict[str, torch.Tensor] = {}
        # A stateful operator (one with ``fresh()``) gets its own copy per slot, so each
        # stream's warm start depends only on that stream, never on the order of other slots.
        self.operators: dict[str, Compressor] = {}

    def _operator(self, slot: str) -> Compressor:
        fresh = getattr(self.compressor, "fresh", None)
        if fresh is None:
            return self.compressor
        operator = self.operators.get(slot)
        if operator is None:
            operator = self.operators[slot] = fresh()
        return operator

    @property
    def name(self) -> str:
        return self.compressor.name

    def compress(self, x: torch.Tensor, key: RngKey, slot: str = "") -> Compressed:
        """Compress ``x`` plus the slot's residual; the new residual is what was not sent."""
        x = check_input(x)
        residual = self.residuals.get(slot)
        if residual is None or residual.numel() != x.numel():
            residual = torch.zeros_like(x)
            self.residuals[slot] = residual
        residual.add_(x)  # residual now holds x + e, the vector actually compressed
        operator = self._operator(slot)
        c = operator.compress(residual, key)
        subtract = getattr(operator, "subtract_sent", None)
        if subtract is not None:
            subtract(c, residual)
        else:
            residual.sub_(operator.decompress(c))
        return c

    def decompress(self, c: Compressed, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.compressor.decompress(c, out)

    def residual(self, slot: str = "") -> torch.Tensor | None:
        """The slot's current residual (the live tensor), or None before its first use."""
        return self.residuals.get(slot)

    def reset(self, slot: str | None = None) -> None:
        """Forget one slot's residual (e.g. a neighbour left), or all of them."""
        if slot is None:
            self.residuals.clear()
            self.operators.clear()
        else:
            self.residuals.pop(slot, None)
            self.operators.pop(slot, None)

    def export_state(self) -> dict[str, torch.Tensor]:
        """Residuals (and per-slot operator state, e.g. PowerSGD's Q) for a checkpoint."""
        state = {_RESIDUAL + slot: t.clone() for slot, t in self.residuals.items()}
        for slot, operator in self.operators.items():
            export = getattr(operator, "export_state", None)
            if export is not None:
                state.update({f"{_OPERATOR}{slot}/{k}": v for k, v in export().items()})
        return state

    def restore_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Inverse of ``export_state``; unknown keys are an error (a checkpoint of another setup)."""
        residuals: dict[str, torch.Tensor] = {}
        operator_states: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            if name.startswith(_RESIDUAL):
                if tensor.dim() != 1 or not tensor.is_floating_point():
                    raise ValueError(f"error-feedback state {name!r} is not a 1-D float tensor")
                residuals[name[len(_RESIDUAL):]] = tensor.to(torch.float32, copy=True)
            elif name.startswith(_OPERATOR) and "/" in name[len(_OPERATOR):]:
                slot, entry = name[len(_OPERATOR):].rsplit("/", 1)
                operator_states.setdefault(slot, {})[entry] = tensor
            else:
                raise ValueError(f"unknown error-feedback state entry {name!r}")
        if operator_states and getattr(self.compressor, "fresh", None) is None:
            raise ValueError(f"operator {self.name!r} has no state to restore")
        self.residuals = residuals
        self.operators = {}
        for slot, entries in operator_states.items():
            operator = self._operator(slot)
            operator.restore_state(entries)  # type: ignore[attr-defined]
