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
_OPERATOR = "operator/"


class ErrorFeedback:
    """Wraps ``compressor``; ``compress(x, key, slot)`` folds in and updates that slot's residual."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self.residuals: dict[str, torch.Tensor] = {}

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
        c = self.compressor.compress(residual, key)
        subtract = getattr(self.compressor, "subtract_sent", None)
        if subtract is not None:
            subtract(c, residual)
        else:
            residual.sub_(self.compressor.decompress(c))
        return c

    def decompress(self, c: Compressed) -> torch.Tensor:
        return self.compressor.decompress(c)

    def residual(self, slot: str = "") -> torch.Tensor | None:
        """The slot's current residual (the live tensor), or None before its first use."""
        return self.residuals.get(slot)

    def reset(self, slot: str | None = None) -> None:
        """Forget one slot's residual (e.g. a neighbour left), or all of them."""
        if slot is None:
            self.residuals.clear()
        else:
            self.residuals.pop(slot, None)

    def export_state(self) -> dict[str, torch.Tensor]:
        """Residuals (and the operator's own state, e.g. PowerSGD's Q) for a checkpoint."""
        state = {_RESIDUAL + slot: t.clone() for slot, t in self.residuals.items()}
        export = getattr(self.compressor, "export_state", None)
        if export is not None:
            state.update({_OPERATOR + k: v for k, v in export().items()})
        return state

    def restore_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Inverse of ``export_state``; unknown keys are an error (a checkpoint of another setup)."""
        residuals: dict[str, torch.Tensor] = {}
        operator: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if name.startswith(_RESIDUAL):
                if tensor.dim() != 1 or not tensor.is_floating_point():
                    raise ValueError(f"error-feedback state {name!r} is not a 1-D float tensor")
                residuals[name[len(_RESIDUAL):]] = tensor.to(torch.float32, copy=True)
            elif name.startswith(_OPERATOR):
                operator[name[len(_OPERATOR):]] = tensor
            else:
                raise ValueError(f"unknown error-feedback state entry {name!r}")
        restore = getattr(self.compressor, "restore_state", None)
        if operator and restore is None:
            raise ValueError(f"operator {self.name!r} has no state to restore")
        if restore is not None:
            restore(operator)
        self.residuals = residuals
