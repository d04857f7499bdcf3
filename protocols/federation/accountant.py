"""The privacy spent so far by DP-FedAvg rounds, as (epsilon, delta), from ``dp-accounting``.

Central DP: each round is one ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
(privacy.py), composed once per round closed by dp-accounting's RDP accountant.
One round's RDP is computed once and composed ``r`` times. dp-accounting is
imported when an accountant is made (about a second), not with this module; the
absl warnings for orders whose series does not converge are filtered, nothing else.

Distributed DP (under SecAgg) is :class:`DistributedRoundAccountant`: one round's
RDP is Kairouz, Liu and Steinke's bound (:func:`kls_epsilon`), Poisson sampling
Zhu and Wang's general amplification (:func:`poisson_subsampled_rdp`), both pure
functions here; composition and conversion are dp-accounting's. Of its figures,

- ``gateway_epsilon`` (``epsilon_vs_gateway_per_round``, not amplified) is a
  proven upper bound;
- ``epsilon`` (amplified by sampling) is an approximation, not a proven bound:
  an unsampled client adds no noise share either, so the released sums differ
  in variance, not by a shift alone.

Why each step holds or does not: docs/design/privacy.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

_UNCONVERGED = "failed to converge after"


class _DropUnconvergedOrders(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and _UNCONVERGED in record.getMessage())


def _quiet_unconverged_orders() -> None:
    """Install the filter on absl's logger once (idempotent: filters are compared by type)."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropUnconvergedOrders) for f in absl_logger.filters):
        absl_logger.addFilter(_DropUnconvergedOrders())


def epsilon_json(epsilon: float | None) -> float | str | None:
    """Epsilon as status files and reports write it: strict JSON has no infinity, and the null
    they write for other non-finite numbers would read as "unknown", not "no privacy"."""
    if epsilon is None or math.isfinite(epsilon):
        return epsilon
    return "inf"


def round_event(sampling_rate: float, noise_multiplier: float) -> Any:
    """One DP-FedAvg round: a Poisson-sampled Gaussian query (a ``dp_accounting.DpEvent``)."""
    import dp_accounting

    return dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))


class RoundAccountant:
    """(epsilon, delta) after any number of identical rounds of rate ``q`` and multiplier ``z``."""

    def __init__(self, sampling_rate: float, noise_multiplier: float, delta: float) -> None:
        self.sampling_rate = sampling_rate
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        from dp_accounting.rdp import rdp_privacy_accountant

        _quiet_unconverged_orders()
        one_round = rdp_privacy_accountant.RdpAccountant()
        one_round.compose(round_event(sampling_rate, noise_multiplier))
        self._orders = one_round.orders
        self._rdp = one_round.rdp

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``delta`` after ``rounds`` rounds (0: none spent; z = 0: infinite)."""
        if rounds < 0:
            raise ValueError(f"rounds must be >= 0, not {rounds}")
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf  # no noise: what dp-accounting reports too, without its arithmetic on inf
        from dp_accounting.rdp import rdp_privacy_accountant

        rdp_so_far = np.asarray(self._rdp, dtype=np.float64) * rounds
        epsilon, _ = rdp_privacy_accountant.compute_epsilon(self._orders, rdp_so_far, self.delta)
        return float(epsilon)


# ------------------------------------------------------------------ distributed DP (under SecAgg)

INTEGER_ORDERS: tuple[int, ...] = (*range(2, 64), 80, 96, 128, 192, 256, 512)


def kls_epsilon(*, sensitivity: float, share_stddev: float, summands: int, numel: int,
                tau_summands: int) -> float:
    """Kairouz, Liu and Steinke 2021 (Theorem 1): ``summands`` independent N_Z(0, s^2) per
    coordinate of ``numel``, summed, hide an integer shift of L2 norm ``sensitivity`` with
    Renyi divergence at most ``alpha eps^2 / 2`` at every order alpha (eps^2/2-concentrated DP),

        eps = min(sqrt(D^2 / (n s^2) + tau d / 2),  D / (sqrt(n) s) + tau sqrt(d)),
        tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k + 1)),

    for s >= 1/2. The first term is the Gaussian's (a sum of discrete Gaussians is not one);
    tau is what the sum lacks, vanishing once s is more than a few units. ``tau_summands`` >=
    ``summands`` makes tau an upper bound for any larger cohort (tau grows with n, the main
    term falls), so one eps covers every cohort of at least ``summands``. Infinite for s = 0."""
    if share_stddev == 0:
        return math.inf
    if share_stddev < 0.5:
        raise ValueError(f"the bound needs a share of at least 1/2 unit, not {share_stddev}")
    if summands < 1 or tau_summands < summands:
        raise ValueError(f"need 1 <= summands <= tau_summands, not {summands}, {tau_summands}")
    s2 = share_stddev ** 2
    tau = 10.0 * sum(math.exp(-2 * math.pi ** 2 * s2 * k / (k + 1)) for k in range(1, tau_summands))
    main = sensitivity / (math.sqrt(summands) * share_stddev)
    return min(math.sqrt(main ** 2 + tau * numel / 2), main + tau * math.sqrt(numel))


def poisson_subsampled_rdp(rdp: Callable[[int], float], rate: float, order: int) -> float:
    """Zhu and Wang 2019 ("Poisson Subsampled Renyi Differential Privacy", Theorem 6): the RDP at
    integer ``order`` >= 2 of any mechanism of RDP ``rdp(.)`` run on a Poisson sample of ``rate``,

        1/(a-1) log[(1-q)^(a-1) (a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^rdp(2)
                    + 3 sum_{l=3}^a C(a,l) q^l (1-q)^(a-l) e^((l-1) rdp(l))],

    an upper bound for every mechanism (the exact one dp-accounting computes exists for the
    Gaussian only). Never above ``rdp(order)`` itself (sampling never hurts: quasi-convexity)."""
    if order < 2:
        raise ValueError(f"the bound is for integer orders >= 2, not {order}")
    if rate >= 1.0:
        return rdp(order)
    a, q = order, rate
    log_q, log_1q = math.log(q), math.log1p(-q)
    terms = [(a - 1) * log_1q + math.log(a * q - q + 1),
             _log_comb(a, 2) + 2 * log_q + (a - 2) * log_1q + rdp(2)]
    terms += [math.log(3) + _log_comb(a, j) + j * log_q + (a - j) * log_1q + (j - 1) * rdp(j)
              for j in range(3, a + 1)]
    top = max(terms)
    bound = (top + math.log(sum(math.exp(t - top) for t in terms))) / (a - 1)
    return min(bound, rdp(order))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


class DistributedRoundAccountant:
    """(epsilon, delta) after rounds of distributed DP: each round a Poisson sample of ``rate``
    whose released sum hides any one client behind the distributed discrete Gaussian of the
    others (Kairouz et al.'s eps per round, :func:`kls_epsilon`), amplified by Zhu and Wang's
    general Poisson bound (:func:`poisson_subsampled_rdp`) at integer orders, composed by
    addition over rounds, turned into epsilon by dp-accounting's ``compute_epsilon``.

    ``gateway_epsilon``: the same without amplification, per round a client took part in: the
    gateway chooses the sample and sees who answers, so sampling hides nothing from it.

    Which is proven: ``gateway_epsilon`` is an upper bound (its neighbour replaces the client's
    update by zeros with its share still there, a pure shift of the others' noise, exactly what
    Kairouz et al.'s Theorem 1 bounds). ``epsilon`` is an approximation, not a proven bound: it
    applies the amplification to that same shift, as Kairouz et al.'s experiments do, whereas in
    the protocol a client that was not sampled adds no noise share either, so the two outcomes
    also differ in the noise's variance (and a released sum of d coordinates shows its variance
    well: roughly how many took part). Bounding that honestly means bounding the divergence
    between sums of n and n + 1 discrete Gaussian shares in d dimensions (or accounting the
    cohort size as released), neither of which this accountant does; the figure is labelled so
    in the status field and docs/privacy.md rather than dressed as a bound."""

    def __init__(self, sampling_rate: float, round_epsilon: float, delta: float) -> None:
        self.sampling_rate = sampling_rate
        self.round_epsilon = round_epsilon  # Kairouz et al.'s eps: RDP alpha eps^2 / 2 per round
        self.delta = delta
        from dp_accounting.rdp import rdp_privacy_accountant

        _quiet_unconverged_orders()
        # Zhu and Wang's bound holds at integer orders; unsampled, the curve holds at every order
        self._full_orders = tuple(rdp_privacy_accountant.RdpAccountant().orders)
        self._orders: tuple[float, ...] = INTEGER_ORDERS if sampling_rate < 1 else self._full_orders
        self._rdp = np.zeros(len(self._orders))
        if math.isfinite(round_epsilon):
            sampled = sampling_rate < 1
            self._rdp = np.array([poisson_subsampled_rdp(self._curve, sampling_rate, int(a)) if sampled
                                  else self._curve(a) for a in self._orders])

    def _curve(self, order: float) -> float:
        return order * self.round_epsilon ** 2 / 2

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``delta`` after ``rounds`` rounds (0: none spent; no noise: infinite)."""
        return self._epsilon(rounds, self._orders, self._rdp)

    def gateway_epsilon(self, participations: int) -> float:
        """Epsilon against the gateway after a client took part in ``participations`` rounds."""
        return self._epsilon(participations, self._full_orders,
                             np.array([self._curve(a) for a in self._full_orders]))

    def _epsilon(self, rounds: int, orders: tuple[float, ...], rdp: np.ndarray) -> float:
        if rounds < 0:
            raise ValueError(f"rounds must be >= 0, not {rounds}")
        if rounds == 0:
            return 0.0
        if not math.isfinite(self.round_epsilon):
            return math.inf
        from dp_accounting.rdp import rdp_privacy_accountant

        epsilon, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp * rounds, self.delta)
        return float(epsilon)
