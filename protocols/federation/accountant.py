"""The privacy spent so far by DP-FedAvg rounds, as (epsilon, delta), from ``dp-accounting``.

Each round is one ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (protocols/federation/
privacy.py says why adaptive clipping's count query is inside that ``z``), composed once per
round closed. The accountant is dp-accounting's RDP accountant (Mironov 2017; Mironov, Talwar
and Zhang 2019 for the sampled Gaussian), not one written here.

Why the RDP of one round is computed once: RDP composes by addition, so ``r`` rounds are ``r``
times one round's RDP, exactly what ``RdpAccountant.compose(event, r)`` computes. One round's
RDP costs about 0.15 s here (a series per order), the conversion to epsilon well under a
millisecond, and a gateway reports epsilon after every round.

dp-accounting logs an absl warning for every fractional order whose series does not converge
(and leaves that order out, which only makes epsilon the bound from the other orders); the
filter below drops exactly those lines and nothing else.

dp-accounting is imported when an accountant is made, not with this module: it takes about a
second to import here, and every gateway and edge client imports protocols.federation.
"""

from __future__ import annotations

import logging
import math
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
