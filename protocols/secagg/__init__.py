"""Secure aggregation: the gateway learns the sum of the clients' updates, not any one of them.

SecAgg (Bonawitz et al. 2017) with SecAgg+'s sparse masking graph (Bell et al. 2020), sans-IO: one
:class:`SecAggClient` per client per round and one :class:`SecAggServer` per gateway per round,
fed messages and ``now_s`` and answering with messages. No clock, socket or thread; the only
randomness is the 32-byte ``client_secret`` the driver injects and pycryptodome's Shamir
coefficients (crypto.py says why that is harmless to determinism of results).

The five rounds (server.py has the verdict table, client.py the abort table):

0. advertise keys   client -> AdvertiseKeys (two fresh X25519 keys, signed with its roster key);
                    gateway -> KeyRoster (all of U1) to each
1. share keys       client -> ShareKeys: Shamir shares (threshold t) of its mask key and self-mask
                    seed, one ChaCha20-Poly1305 bundle per masking neighbour (the k-regular graph
                    from graph.py, seeded by a hash of every advertised key);
                    gateway -> ForwardedShares to each client of U2
2. masked input     client -> MaskedInput: x + self mask + pairwise masks (fixedpoint.py's ring);
                    gateway -> SurvivorSet (U3) to each survivor
3. consistency      client -> ConsistencySignature over the set it was told;
                    gateway -> ConsistencyProof (the signer's neighbours' signatures)
4. unmask           client -> UnmaskShares: per neighbour, the self-seed share if it survived,
                    else the mask-key share, never both; gateway rebuilds and removes the masks
5. recover (rare)   gateway -> RecoveryRequest to a culprit's neighbours, only when a survivor
                    dealt a wrong self-mask seed (blame.py); client -> its mask-key share

Plugging it into the federation (done by protocols/federation/secure.py; nothing here imports
federation/, peer/ or sim/):

* config: ``[federation.secure_aggregation]`` parses into :class:`SecAggConfig`; the federation
  config calls :func:`check_compatible` (mode, uplink) and ``SecAggConfig.validate(cohort size)``.
* gateway: at RoundStart, create ``SecAggServer(config, run_id=..., round_index=r, cohort=asked,
  numel=model size, verify=roster_verify, now_s=now)``; route the five client kinds to
  ``receive(sender, msg, now_s)``; map each ``Deliver`` to a Send; set a timer at ``deadline_s``
  and call ``tick(now_s)`` when it fires; when ``result`` is set, dequantise
  ``result.ring_sum`` (fixedpoint.dequantise_sum) for the sum of the inputs (SecAgg gives a sum:
  to weigh by samples, federation/secure.py has each client scale its update and append its weight
  as one more element, so the gateway learns only the total weight, and divides by it).
  ``refused`` and ``counters`` go to the status/report like every other Counter.
* client: on RoundStart create ``SecAggClient(..., cohort=asked, client_secret=32 secret bytes
  (os.urandom once per process in the daemon; keys are bound to run, round and attempt, so it may
  last), sign=identity.sign, verify=roster_verify, attempt=how many machines it started for this
  round before, revealed=one dict shared by those attempts)``, send ``start(now_s)``; after
  training, send
  ``provide_input(quantise(update), now_s)``; route the four gateway kinds to ``receive``.
  ``aborts`` and ``refused`` are its Counters.
* wire: ``messages.to_wire``/``from_wire`` give msgpack-able maps; the envelope signs them and
  proves the sender, which the gateway passes to ``receive``.

Threat model (t and k are per neighbourhood: a secret of client v is rebuilt from t of the shares
v gave its k neighbours; ``roster_floor`` is F, a number every client has from its own config).

* What the gateway learns, whatever it does: the sum over the survivors U3 (at least t + 1
  clients), who dropped at which round, and message sizes; each masked input is uniform in the
  ring to it. To unmask one survivor v it needs t shares of v's self-mask seed *and* t of v's mask
  key, for the same attempt at the same round.
* Why a gateway alone cannot get both: an honest neighbour reveals at most one of the two for v
  (the consistency rule, kept across every attempt at a round: client.py), and 2t > k (config.py
  refuses a fixed t that is not a strict majority of every k ``max_clients`` allows; clients check
  it again on their roster), so two groups of neighbours told different survivor sets cannot both
  reach t. Every attempt at a round (a gateway re-asking it) uses fresh keys, masks and noise
  (crypto.RoundSecrets' ``attempt``, counted by the client), so differencing two attempts or
  collecting one kind of share in each opens nothing; and a client that sent its masked input in
  one attempt takes no part in later ones (federation/secure.py), so one round releases its
  update once. Share indices are checked (server.py), so
  a forged index can neither hang the gateway nor slip a wrong secret into the sum.
* A gateway colluding with c clients: the gateway chooses whose adverts each client sees, but a
  client refuses a roster of fewer than F, so v's k and t are at least those of F clients. The
  colluders among v's neighbours hold v's two secrets outright when c >= t, that is at least
  ``threshold_for(F)`` (3 with the default F = 5). A gateway that also lies about who dropped needs
  fewer: v's two secrets open when c >= 2t - k, which with the automatic t (floor(k/2) + 1) is 1
  or 2 colluding neighbours of v. Against a lying gateway with up to c colluders, fix t >
  (k + c) / 2 at the largest k (Bonawitz et al.'s t > 2k/3 for c < k/3). In plain SecAgg every
  client is every client's neighbour; in SecAgg+ the graph follows a hash of the advertised keys,
  which a gateway can re-draw by leaving adverts out, so do not count on the graph to keep
  colluders apart from a hostile gateway.
* Colluding clients alone never see a masked input, so they learn nothing.
* A client that deals garbage or shares of a wrong secret, accuses falsely or reveals a share it
  was not dealt is proven so by its own signatures (blame.py), left out of the round, which ends
  over the honest survivors, and named. An accusation reveals the accuser's round cipher key: the
  gateway then holds one share of each of its neighbours' secrets, as if it had one more colluding
  neighbour; a colluder can cause that once per round it is asked into, until barred.
* Not covered: a client that masks a garbage *input* (it corrupts the sum undetectably: SecAgg
  hides inputs, it does not check them; grouped aggregation bounds it), and what the sums of
  several rounds over changing cohorts reveal by differencing (client-level DP is the defence).
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
