"""Federated learning as pure Roles (the sans-IO contract of shared/DESIGN.md).

A gateway's Node hosts a server beside its gossip machine; an edge client's
Node hosts a :class:`FedAvgClient`. Both update a flat parameter vector the
driver owns, in place, and speak ``RoundStart`` / ``ClientUpdate`` /
``RoundResult`` (protocols/messages.py).

- :func:`make_server`: the server of ``config.mode``, :class:`FedAvgServer`
  (synchronous rounds: sampling, over-selection, deadlines, reports) or
  :class:`FedBuffServer` (asynchronous, buffered, staleness-weighted).
- :class:`FedAvgClient`: trains when asked, uploads its delta compressed with
  error feedback.
- ``privacy`` and ``accountant``: client-level differential privacy at the gateway (DP-FedAvg:
  Poisson sampling, clipping, fixed or adaptive, Gaussian noise) and the (epsilon, delta) spent
  (``[federation.differential_privacy]``, :class:`DifferentialPrivacyConfig`).
- ``secure``: secure aggregation, SecAgg+ (``[federation.secure_aggregation]``,
  :class:`SecureAggregationConfig`): the driver gives the server a :class:`SecureServer`
  (``secure=``, with the roster's signature check) and each client a :class:`SecureClient`
  (its secret, its signer); the five SecAgg rounds then run inside each FedAvg round as
  ``SecAggMessage`` through the same Node path, and the round's aggregate is the survivors'
  mean weighted by their samples (capped at ``weight_cap_samples``), as plain FedAvg's.
- ``aggregate``: FedAvg, median, trimmed mean, Krum, multi-Krum, norm clipping;
  ``server_opt``: FedAvgM, FedAdagrad, FedAdam, FedYogi, FedProx's proximal term.

What a driver does with them (the simulator: sim/federation.py; real processes: the daemon's
gateway, peer/runtime/daemon.py with ``[federation]``, and ``hivemesh edge``, peer/runtime/edge.py):

- gateway: ``make_server(config, name=..., params=<the flat global model>)`` as a Node role
  (``roles={"fedavg": server}``, ``clients=<the roster's edge members>``); the Node routes
  ``ClientUpdate`` to it and its prefixed timers back, and tells it ``NeighbourUp`` when it
  hears a client (registered) and ``NeighbourDown`` when the client falls silent or says
  goodbye. A direct call (``resume``) goes back through ``Node.role_actions``. Both servers share
  server_base.FederationServer; once finished, one answers a client that registers late with
  the final ``RoundResult`` (at most once per client per ``round_timeout_s``).
  ``reports`` (per round), ``status()``, ``counters`` and ``last_contact_s`` feed the
  status (with DP on: ``status()["privacy"]`` and each report's ``epsilon``; the server then
  needs ``secret_seed=``, a seed only the gateway knows); ``export_state`` /
  ``restore_state`` a checkpoint. Gossip between rounds:
  ``pause_between_rounds=True``, then ``resume(now)`` after the gossip rounds (``interleave``:
  which gossip rounds' work is a FedAvg round).
- edge: ``FedAvgClient(config, name=..., server=..., params=trainer.mixed,
  num_samples=len(shard), steps_per_epoch=trainer.steps_per_epoch)`` as its Node's machine
  through ``edge.EdgeMachine``, the gateway its one neighbour; ``StartWork(n)`` is
  ``trainer.run_steps(n)`` then ``WorkDone``; with ``client.prox_mu > 0`` the trainer adds
  ``proximal_gradient(params, client.anchor, client.prox_mu)`` to its gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from protocols.federation.client import ClientPhase, FedAvgClient
from protocols.federation.config import AGGREGATORS, FederationConfig
from protocols.federation.fedbuff import BufferReport, BuffPhase, FedBuffServer, staleness_weight
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure import SecureClient, SecureServer
from protocols.federation.secure_config import SecureAggregationConfig
from protocols.federation.server import FedAvgServer, RoundReport, ServerPhase, report_row
from protocols.federation.server_base import SERVER_ROLE
from protocols.federation.server_opt import (
    SERVER_OPTIMIZERS,
    ServerOptConfig,
    proximal_gradient,
    proximal_loss,
    server_step,
)

__all__ = [
    "AGGREGATORS",
    "SERVER_OPTIMIZERS",
    "SERVER_ROLE",
    "BuffPhase",
    "BufferReport",
    "ClientPhase",
    "DifferentialPrivacyConfig",
    "FedAvgClient",
    "FedAvgServer",
    "FedBuffServer",
    "FederationConfig",
    "RoundReport",
    "SecureAggregationConfig",
    "SecureClient",
    "SecureServer",
    "ServerOptConfig",
    "ServerPhase",
    "make_server",
    "proximal_gradient",
    "proximal_loss",
    "report_row",
    "server_step",
    "staleness_weight",
]


def make_server(config: FederationConfig, *, name: str, params: torch.Tensor, clients: Sequence[str] = (),
                pause_between_rounds: bool = False, shapes: Sequence[tuple[int, ...]] | None = None,
                secret_seed: int | None = None,
                secure: SecureServer | None = None) -> FedAvgServer | FedBuffServer:
    """The server ``config.mode`` names, updating ``params`` (the global model, flat) in place.

    ``pause_between_rounds`` (sync only: FedBuff has no rounds to pause between);
    ``secret_seed``: the gateway's own root of its DP draws (needed with differential privacy);
    ``secure``: the gateway's side of secure aggregation (needed with it; sync only)."""
    if config.mode == "fedbuff":
        if pause_between_rounds:
            raise ValueError("federation mode 'fedbuff' has no rounds to pause between")
        return FedBuffServer(config, name=name, params=params, clients=clients, shapes=shapes)
    return FedAvgServer(config, name=name, params=params, clients=clients,
                        pause_between_rounds=pause_between_rounds, shapes=shapes, secret_seed=secret_seed,
                        secure=secure)
