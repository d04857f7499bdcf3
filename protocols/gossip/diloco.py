"""DiLoCo-style outer optimiser over any gossip machine (Douillard et al. 2023).

The inner machine runs its rounds as usual; every ``outer_every`` local steps,
right after a round's mixing, the outer step treats ``anchor - params`` (the
pseudo-gradient accumulated since the last outer step, after averaging) as a
gradient for Nesterov SGD on the anchor, and the parameters restart from the
new anchor.

Only the leading ``stepped`` elements (the trained parameters) take the outer step;
the rest of a mixed vector (BatchNorm statistics averaged like the parameters) keeps
its mixed value: statistics are not descended, and Nesterov's overshoot could make a
running variance negative.
"""

from __future__ import annotations

from typing import Any

import torch

from protocols.gossip.mixing import nesterov_outer_step


class OuterNesterov:
    """The outer state (anchor and momentum) and when to step."""

    def __init__(self, params: torch.Tensor, *, lr: float, momentum: float, every: int) -> None:
        self.lr = lr
        self.momentum = momentum
        self.every = every
        self.anchor = params.detach().clone()
        self.momentum_buffer = torch.zeros_like(self.anchor)
        self.last_step = 0  # steps_done at the last outer step (no second step without new local steps)
        self.outer_steps = 0
        self.stepped: int | None = None  # elements that take the outer step; None: all of them

    def after_round(self, steps_done: int, params: torch.Tensor) -> bool:
        """Take the outer step if ``steps_done`` just reached a multiple of ``every``; True if taken."""
        if steps_done == self.last_step or steps_done % self.every:
            return False
        n = params.numel() if self.stepped is None else self.stepped
        nesterov_outer_step(params[:n], self.anchor[:n], self.momentum_buffer[:n], lr=self.lr,
                            momentum=self.momentum)
        self.anchor[n:].copy_(params[n:])
        self.last_step = steps_done
        self.outer_steps += 1
        return True

    def rebase(self, params: torch.Tensor, steps_done: int) -> None:
        """Restart the outer optimiser from ``params`` (after a state sync), momentum cleared."""
        self.anchor.copy_(params)
        self.momentum_buffer.zero_()
        self.last_step = steps_done

    def export(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {"outer/anchor": self.anchor.clone(), "outer/momentum": self.momentum_buffer.clone()}
        return tensors, {"outer_last_step": self.last_step, "outer_steps": self.outer_steps}

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.anchor.copy_(tensors["outer/anchor"])
        self.momentum_buffer.copy_(tensors["outer/momentum"])
        self.last_step = int(meta["outer_last_step"])
        self.outer_steps = int(meta["outer_steps"])
