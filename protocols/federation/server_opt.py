"""Server optimisers and FedProx's proximal term: pure functions, no hidden state.

A server optimiser treats the round's aggregate delta (the mean of the
clients' "trained minus sent" vectors) as a pseudo-gradient pointing downhill
(Reddi et al. 2021, "Adaptive Federated Optimization"). Each is a function
``(global, delta, state, config) -> (new global, new state)``: the caller keeps
the state (so it checkpoints like any other tensors) and the inputs are never
modified. Plain FedAvg is ``server_lr = 1`` with no state.

Reddi et al. give the adaptive rules without bias correction, and so do we:

- FedAvgM: ``m = beta1 m + delta``; ``x += lr m`` (Hsu et al. 2019, server momentum)
- FedAdagrad: ``v = v + delta^2``
- FedAdam: ``v = beta2 v + (1 - beta2) delta^2``
- FedYogi: ``v = v - (1 - beta2) delta^2 sign(v - delta^2)``
- the three adaptive ones: ``m = beta1 m + (1 - beta1) delta``; ``x += lr m / (sqrt(v) + tau)``

FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks")
is a client-side change: the local loss gets ``mu/2 ||w - w_global||^2``, so
local training cannot wander far from the model it was sent. The trainer adds
:func:`proximal_gradient` to its gradient (or :func:`proximal_loss` to its loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

ServerOptimizer = Literal["fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"]
SERVER_OPTIMIZERS: tuple[str, ...] = ("fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi")

OptState = dict[str, torch.Tensor]
"""A server optimiser's state: ``m`` (momentum) and ``v`` (second moment) as the rule needs."""


@dataclass(frozen=True, kw_only=True)
class ServerOptConfig:
    """One server optimiser and its settings (defaults: Reddi et al. 2021's usual choices)."""

    name: ServerOptimizer = "fedavg"  # x += lr * delta: McMahan et al.'s server step
    lr: float = 1.0  # 1.0: FedAvg's global model is exactly the clients' average; adaptive: try 0.01-0.1
    beta1: float = 0.9  # momentum of FedAvgM and of the adaptive rules' first moment
    beta2: float = 0.99  # second-moment decay of FedAdam and FedYogi
    tau: float = 1e-3  # adaptivity floor: larger is closer to momentum SGD (Reddi et al. tune 1e-3)

    def __post_init__(self) -> None:
        if self.name not in SERVER_OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, "
                             f"not {self.name!r}")
        if not self.lr > 0:
            raise ValueError(f"server lr must be > 0, not {self.lr}")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), not {self.beta1}, {self.beta2}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, not {self.tau}")


def _moment(state: OptState, key: str, like: torch.Tensor) -> torch.Tensor:
    current = state.get(key)
    return torch.zeros_like(like) if current is None else current


def fedavgm(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig
            ) -> tuple[torch.Tensor, OptState]:
    """FedAvgM (Hsu et al. 2019; Reddi et al. 2021's baseline): server momentum on the delta."""
    m = config.beta1 * _moment(state, "m", delta) + delta
    return params + config.lr * m, {"m": m}


def _adaptive(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig,
              v: torch.Tensor) -> tuple[torch.Tensor, OptState]:
    m = config.beta1 * _moment(state, "m", delta) + (1 - config.beta1) * delta
    return params + config.lr * m / (v.sqrt() + config.tau), {"m": m, "v": v}


def fedadagrad(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig
               ) -> tuple[torch.Tensor, OptState]:
    """FedAdagrad (Reddi et al. 2021): second moment summed over rounds."""
    v = _moment(state, "v", delta) + delta * delta
    return _adaptive(params, delta, state, config, v)


def fedadam(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig
            ) -> tuple[torch.Tensor, OptState]:
    """FedAdam (Reddi et al. 2021): exponential moving second moment."""
    v = config.beta2 * _moment(state, "v", delta) + (1 - config.beta2) * delta * delta
    return _adaptive(params, delta, state, config, v)


def fedyogi(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig
            ) -> tuple[torch.Tensor, OptState]:
    """FedYogi (Reddi et al. 2021, after Zaheer et al. 2018): the second moment moves by at most
    ``(1 - beta2) delta^2`` a round, towards ``delta^2``, so it grows slower than Adam's."""
    squared = delta * delta
    v = _moment(state, "v", delta)
    v = v - (1 - config.beta2) * squared * torch.sign(v - squared)
    return _adaptive(params, delta, state, config, v)


def server_step(params: torch.Tensor, delta: torch.Tensor, state: OptState, config: ServerOptConfig
                ) -> tuple[torch.Tensor, OptState]:
    """The configured rule: the new global model (a fresh tensor) and the new state."""
    if params.shape != delta.shape:
        raise ValueError(f"delta {tuple(delta.shape)} does not match the model {tuple(params.shape)}")
    delta = delta.to(params.dtype)
    if config.name == "fedavg":
        return params + config.lr * delta, {}
    if config.name == "fedavgm":
        return fedavgm(params, delta, state, config)
    if config.name == "fedadagrad":
        return fedadagrad(params, delta, state, config)
    if config.name == "fedadam":
        return fedadam(params, delta, state, config)
    return fedyogi(params, delta, state, config)


def proximal_loss(params: torch.Tensor, anchor: torch.Tensor, mu: float) -> torch.Tensor:
    """FedProx's proximal term (Li et al. 2020): ``mu/2 ||params - anchor||^2`` (differentiable in params)."""
    return 0.5 * mu * (params - anchor.detach()).pow(2).sum()


def proximal_gradient(params: torch.Tensor, anchor: torch.Tensor, mu: float) -> torch.Tensor:
    """The gradient of :func:`proximal_loss` in ``params``: ``mu (params - anchor)``, to add to the
    trainer's flat gradient before its optimiser step."""
    return mu * (params.detach() - anchor)
