"""Secure aggregation: the gateway learns the sum of the clients' updates, not any one of them.

SecAgg (Bonawitz et al. 2017) with SecAgg+'s sparse masking graph (Bell et al. 2020), sans-IO: one
:class:`SecAggClient` per client per round and one :class:`SecAggServer` per gateway per round,
fed messages and ``now_s`` and answering with messages. No clock, socket or thread; the only
randomness is the 32-byte ``client_secret`` the driver injects and pycryptodome's Shamir
coefficients (crypto.py says why that is harmless to determinism of results).

The five rounds (server.py has the verdict table, client.py the abort table): 0 advertise keys
(AdvertiseKeys -> KeyRoster), 1 share keys (ShareKeys -> ForwardedShares: Shamir shares, threshold
t, to the k masking neighbours of graph.py), 2 masked input (MaskedInput -> SurvivorSet), 3
consistency (ConsistencySignature -> ConsistencyProof), 4 unmask (UnmaskShares: per neighbour the
self-seed share if it survived, else the mask-key share, never both), and, rarely, 5 recover
(RecoveryRequest to a culprit's neighbours when a survivor dealt a wrong self-mask seed: blame.py).

Wiring (protocols/federation/secure.py; nothing here imports federation/, peer/ or sim/):
``[federation.secure_aggregation]`` parses into :class:`SecAggConfig` (:func:`check_compatible`,
``SecAggConfig.validate``); the gateway makes a ``SecAggServer`` at RoundStart, routes the five
client kinds to ``receive``, calls ``tick`` at ``deadline_s`` and dequantises ``result.ring_sum``;
a client makes a ``SecAggClient`` at RoundStart, sends ``start``, then ``provide_input`` after
training; ``messages.to_wire``/``from_wire`` give msgpack-able maps for the signed envelope.

The gateway learns the survivors' sum (at least t + 1 clients), who dropped and message sizes;
with 2t > k it alone cannot get both secrets of a survivor. Collusion, garbage inputs and
differencing across rounds: the threat model in full, docs/design/secagg.md.
"""

from protocols.secagg.client import ClientPhase, SecAggClient
from protocols.secagg.config import REFUSED_COMPRESSORS, SecAggConfig, SecAggConfigError, check_compatible
from protocols.secagg.fixedpoint import dequantise_sum, max_clients_for_bits, quantise
from protocols.secagg.server import Deliver, SecAggResult, SecAggServer, ServerPhase

__all__ = [
    "REFUSED_COMPRESSORS",
    "ClientPhase",
    "Deliver",
    "SecAggClient",
    "SecAggConfig",
    "SecAggConfigError",
    "SecAggResult",
    "SecAggServer",
    "ServerPhase",
    "check_compatible",
    "dequantise_sum",
    "max_clients_for_bits",
    "quantise",
]
