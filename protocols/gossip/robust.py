"""The insider filter: updates that are not finite, or far larger than their neighbours', are not mixed.

The statistic. Each candidate's norm (a neighbour's difference to us, or its
compressed update) is compared with ``multiple`` times a reference built from
evidence the candidate does not control: the *other* senders' latest norms
(this round's where they sent one, else the last one heard from them) and our
own step's norm (when we took a step: a gossip-only round has none), taking
the upper median of those, and never less than our own step's norm. Each
sender has one vote, its latest, so a sender cannot
outvote the others by sending more often, and it never votes for itself:
with one candidate (AD-PSGD's exchanges, a round machine with one
in-neighbour, or the only message in by the deadline) a median that counted
it would be half its own norm, and any finite update would pass.

Why not a running history (what this filter used to keep): on non-IID data
the distance between honest neighbours changes with the run (it grows from 0
when peers start equal, it shrinks as the learning rate decays), and a history
of older, smaller norms refused honest updates by the thousand. This round's
neighbours move with the run, so comparing a neighbour with its peers of the
same round refuses only what is far larger than what the others send *now*.
An honest run therefore sees no refusal unless one neighbour is more than
``multiple`` times as far from us as the upper median of the others (and as
our own step).

Warm-up and sole senders. When no other sender gives evidence (nobody
else heard yet, or a sole in-neighbour, as on a directed ring), or all of it
is 0, the reference is at least ``scale``, the norm of our own parameters (our
own step alone says nothing about how far apart honest members start): a first update may move us at most
``multiple`` times as far as our parameters are from the origin, and honest
peers that start apart (different initialisations) are still heard. The
own-step floor keeps a run of zero differences (peers that start equal) from
making every later update look infinitely large.

Rejoining. A refused norm still becomes its sender's latest: refusals count.
So a member that comes back far from neighbours that agree with one another
is never locked out:

* its own filter judges each neighbour against the *others*, which are just
  as far: it accepts them from the first round in which more than half of
  its in-neighbours' latest norms are the new, far ones (a round machine: the
  first round back, where all of them arrive; AD-PSGD: once it has heard from
  more than half of its neighbours since coming back);
* so it mixes, and its distance ``D`` to its neighbours shrinks by at least
  the factor ``rho = 1 - (weight it gives the accepted neighbours)`` per
  round (its self weight ``W_ii`` when all are accepted; 1/2 per AD-PSGD
  exchange);
* its neighbours refuse it only while ``D > multiple * r`` (``r``: their own
  reference), hence for at most ``ceil(log(D / (multiple * r)) / log(1 / rho))``
  rounds after the first one back. On a ring with Metropolis weights
  (``rho = 1/3``) and ``multiple = 10``, a member that comes back 300 times
  farther away than its neighbours' reference is heard again within 4 rounds
  (tests/test_filter.py freezes one for a third of a run).

An insider is still refused: its norm never enters its own reference, and
with an honest majority among a peer's in-neighbours the upper median of the
others is an honest norm, however large the insider's own latest is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

# Candidates smaller than this fraction of our parameters' norm (times ``multiple``) always pass.
# Honest neighbours' distances need not be alike: near consensus the disagreement left is a slow
# eigenvector of W, under which one neighbour can be many times farther than the others (13x
# on exponential:8 in the final gossip rounds), and those ratios do not shrink as the distances
# do. Such differences are 1e-6 of the parameters there; an insider that stays under the floor
# moves us by at most multiple * 1e-3 of our own norm per round, which mixing undoes.
FLOOR = 1e-3


class NormFilter:
    """Screen over update norms against the other senders' latest norms; ``multiple = 0`` only
    rejects non-finite norms."""

    def __init__(self, multiple: float) -> None:
        self.multiple = multiple
        self.latest: dict[str, float] = {}  # each sender's latest finite norm, accepted or refused

    @property
    def history(self) -> list[float]:
        """The norms remembered (one per sender, sorted by sender)."""
        return [self.latest[s] for s in sorted(self.latest)]

    def screen(self, norms: Sequence[float], own_norm: float,
               scale: Callable[[], float] | None = None,
               senders: Sequence[str] | None = None) -> list[bool]:
        """Which of ``norms`` to accept (same order).

        ``senders``: who sent each norm; their finite norms become their latest (refused ones too).
        Without it the candidates are anonymous: each is judged against the other candidates and
        our own step, and nothing is remembered. ``scale``: the norm of our own parameters, the
        reference when nothing else gives one (called only then: it is a pass over memory).
        Without it, that reference is 0: only a zero difference passes.
        """
        names = list(senders) if senders is not None else [f"#{i}" for i in range(len(norms))]
        if len(names) != len(norms):
            raise ValueError(f"{len(norms)} norms but {len(names)} senders")
        finite = [math.isfinite(n) for n in norms]
        current = dict(self.latest)
        for name, norm, ok in zip(names, norms, finite, strict=True):
            if ok:
                current[name] = norm  # a sender with two candidates (a late one): the later speaks
        if self.multiple > 0:
            verdict = [ok and self._within(n, self._reference(current, name, own_norm, scale), scale)
                       for name, n, ok in zip(names, norms, finite, strict=True)]
        else:
            verdict = finite
        if senders is not None:
            self.latest = current
        return verdict

    def _within(self, norm: float, reference: float, scale: Callable[[], float] | None) -> bool:
        """``norm`` within ``multiple`` times the reference, or too small to matter: below
        ``multiple * FLOOR`` times our own parameters' norm (asked only then)."""
        if norm <= self.multiple * reference:
            return True
        size = scale() if scale is not None else 0.0
        return math.isfinite(size) and norm <= self.multiple * FLOOR * size

    @staticmethod
    def _reference(current: dict[str, float], sender: str, own_norm: float,
                   scale: Callable[[], float] | None) -> float:
        """The reference for a candidate of ``sender``: what the others and our own step say."""
        own = own_norm if math.isfinite(own_norm) else 0.0
        sample = [n for name, n in current.items() if name != sender]
        # our step votes only when we took one: a gossip-only round's 0 would drag the median down
        votes = [*sample, own] if own > 0 else sample
        reference = max(statistics.median_high(votes), own) if votes else own
        if (sample and reference > 0) or scale is None:
            return reference
        # no other sender to compare with (a sole in-neighbour, or nothing heard yet): our own step
        # says nothing about how far apart honest members may start, so the bound is our own size
        fallback = scale()
        return max(reference, fallback) if math.isfinite(fallback) else reference

    def export(self) -> list[list[Any]]:
        """The memory as JSON-able ``[sender, norm]`` pairs, sorted by sender."""
        return [[s, self.latest[s]] for s in sorted(self.latest)]

    def restore(self, saved: Sequence[Any]) -> None:
        """The memory from :meth:`export`. A checkpoint of the old filter holds a list of anonymous
        norms: those are dropped (whose they were is unknown; the next round speaks for itself)."""
        self.latest = {str(item[0]): float(item[1]) for item in saved if isinstance(item, list | tuple)}
