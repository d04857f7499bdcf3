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

A split healed. After a long partition the members along the cut each hear
near neighbours (their own half) and far ones (the other half): on a ring one
of each, and the far one is as far beyond the reference as an insider would
be. Nothing a member sees alone tells the two apart, and refused, the halves
never mix again. What tells them apart is elsewhere: after a split, honest
members all along the cut see a far neighbour; an insider makes only its own
neighbours see one, itself. So each round message carries its sender's
*report* (meta ``far/<member>``): the members its latest screen found far,
with their norms, and the entries its near senders reported to it (relayed up
to ``MAX_HOPS`` hops, ``MAX_ENTRIES`` at most), each with the path it came by:
who saw it, then each relay. A receiver adds the sender itself, the hop it saw.

A far candidate is then *clipped*, not refused, when an entry from a sender
that is itself near shows a far pair of other members: the far member is
neither the candidate's sender nor us, the path (with that sender) goes
through neither, and the pair is at least ``1 / multiple`` as far apart as
the candidate. It is mixed in its own direction at the plain bound
(``multiple`` times its reference: the largest norm the screen accepts), and
counted (``far_corroborated``); without such an entry it is refused as before.

Why one insider gains nothing:

* a clipped candidate is a value the insider could have sent itself (same
  direction, norm at the bound) and had accepted with no report at all, so
  whatever bounds the plain screen's effect bounds it with the reports: far
  values (constant, growing, sign-flipped, alternating, a far half's look)
  are refused or clipped and move honest members no farther than an honest
  run's own spread (tests/test_filter_rejoin.py, 300 rounds, three graphs);
* it cannot forge evidence for itself: an honest relay names the hop it heard
  an entry from, so an entry that went through the insider carries its name
  and vouches for nothing from it, nor does one about it. What is left was
  seen by an honest member about an honest member: a real far pair.

Why the halves re-join (measured, not proven): the far half pulls at the
bound, ``w * multiple * r`` a round (``w`` its weight, ``r`` our reference),
ten times what a neighbour at the reference pulls, and ``r`` grows as an edge
member is drawn from its own half, so they close faster and faster until
the far neighbour is within the bound and mixed in full (the toy: ring:8, a
4x4 torus and exponential:16, halves 2 x 5 apart, back to their pre-split
spread within 60 rounds; refused, never).
Honest runs without a split see no far member: no report, no byte added.

The limit, not new: the plain bound follows the distances it is measured
against. An insider that starts near and grows with them (each value just
under the bound) is never refused and drags its neighbours, then the rest,
away, with or without reports (no sooner with them: tests/test_filter_rejoin.py).
Bounding that needs a reference the honest distances do not feed (a frozen
quantile, the members' own training steps), at the price of refusals on
honest non-IID runs; not done.

Two insiders break it, which is why it is off by default (``far_reports``):
each one's far values are evidence for the other. An honest member refuses
the first and reports it far; that entry, about a member other than the
second and never through it, vouches for the second elsewhere, and back. Each
then pulls at the bound every round, as a creeping insider does. Measured: the
simulator's 4x4 torus with a sign-flip and a noise member
(tests/test_sim_gossip.py) refused 95 of their updates with the reports on,
over 500 with them off. Telling an honest far half from insiders that are far
needs evidence about the far member's values (that it agrees with its own
half), not only its distance; not done.

Only machines that can clip a candidate (D-PSGD and local SGD: ``CLIPS_FAR``)
send and use reports, and only with ``far_reports`` on; the others screen as
before. A member of an older version ignores the meta entries and sends none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Candidates smaller than this fraction of our parameters' norm (times ``multiple``) always pass.
# Honest neighbours' distances need not be alike: near consensus the disagreement left is a slow
# eigenvector of W, under which one neighbour can be many times farther than the others (13x
# on exponential:8 in the final gossip rounds), and those ratios do not shrink as the distances
# do. Such differences are 1e-6 of the parameters there; an insider that stays under the floor
# moves us by at most multiple * 1e-3 of our own norm per round, which mixing undoes.
FLOOR = 1e-3

REPORT_PREFIX = "far/"  # a round message's meta key per far member in its sender's report
MAX_HOPS = 16           # the longest path an entry travels (a ring of 32 split in two needs 15)
MAX_ENTRIES = 8         # entries in one report: one that holds is all a far candidate needs

# far member -> (distance, the path it came by: who saw it first, then each relay before the sender)
Report = dict[str, tuple[float, tuple[str, ...]]]


class NormFilter:
    """Screen over update norms against the other senders' latest norms; ``multiple = 0`` only
    rejects non-finite norms."""

    def __init__(self, multiple: float, owner: str = "") -> None:
        self.multiple = multiple
        self.owner = owner  # our own name: a report that we are far is never evidence for us
        self.latest: dict[str, float] = {}  # each sender's latest finite norm, accepted or refused
        self.far: dict[str, float] = {}  # who our latest screen found far, their norms: our report
        self.relayed: Report = {}  # the near senders' evidence our latest screen heard, to pass on
        self.corroborated = 0  # far candidates the latest screen accepted (clipped) on the reports
        self.factors: list[float] = []  # the latest screen's factor per candidate: 1 as is, 0 refused

    @property
    def history(self) -> list[float]:
        """The norms remembered (one per sender, sorted by sender)."""
        return [self.latest[s] for s in sorted(self.latest)]

    def screen(self, norms: Sequence[float], own_norm: float,
               scale: Callable[[], float] | None = None,
               senders: Sequence[str] | None = None,
               reports: Sequence[Report] | None = None) -> list[bool]:
        """Which of ``norms`` to accept (same order).

        ``senders``: who sent each norm; their finite norms become their latest (refused ones too).
        Without it the candidates are anonymous: each is judged against the other candidates and
        our own step, and nothing is remembered. ``scale``: the norm of our own parameters, the
        reference when nothing else gives one (called only then: it is a pass over memory).
        Without it, that reference is 0: only a zero difference passes. ``reports``: what each
        candidate's sender reported far in its own latest screen (:func:`read_report`), the
        evidence that lets a far candidate in (see the module docstring, "A split healed").
        """
        names = list(senders) if senders is not None else [f"#{i}" for i in range(len(norms))]
        if len(names) != len(norms) or (reports is not None and len(reports) != len(norms)):
            raise ValueError(f"{len(norms)} norms but {len(names)} senders "
                             f"and {'no' if reports is None else len(reports)} reports")
        finite = [math.isfinite(n) for n in norms]
        current = dict(self.latest)
        for name, norm, ok in zip(names, norms, finite, strict=True):
            if ok:
                current[name] = norm  # a sender with two candidates (a late one): the later speaks
        if self.multiple > 0:
            near = [ok and self._within(n, self._reference(current, name, own_norm, scale), scale)
                    for name, n, ok in zip(names, norms, finite, strict=True)]
        else:
            near = finite
        verdict = list(near)
        self.factors = [1.0 if plain else 0.0 for plain in near]
        self.corroborated = 0
        if self.multiple > 0 and reports is not None:
            for i, (name, norm, ok) in enumerate(zip(names, norms, finite, strict=True)):
                if ok and not near[i] and self._corroborated(name, norm, names, near, reports):
                    # clipped to the plain bound: what an insider could have sent and been accepted
                    radius = self._radius(self._reference(current, name, own_norm, scale), scale)
                    if 0 < radius < norm:
                        verdict[i], self.factors[i] = True, radius / norm
                        self.corroborated += 1
        if senders is not None:
            self.latest = current
            self.far = {name: norm for name, norm, ok, plain in zip(names, norms, finite, near, strict=True)
                        if ok and not plain}
            self.relayed = self._relay(names, near, reports) if reports is not None else {}
        return verdict

    def _evidence(self, names: Sequence[str], near: Sequence[bool],
                  reports: Sequence[Report]) -> list[tuple[str, float, tuple[str, ...]]]:
        """Every entry the near senders reported, as (far member, distance, full path): the
        path as they gave it, then the sender itself (the hop we saw). Loops through us are
        dropped."""
        found = []
        for reporter, plain, report in zip(names, near, reports, strict=True):
            if not plain:
                continue
            for member, (distance, path) in report.items():
                full = (*path, reporter)
                if member != self.owner and self.owner not in full and len(full) <= MAX_HOPS:
                    found.append((member, distance, full))
        return found

    def _corroborated(self, sender: str, norm: float, names: Sequence[str], near: Sequence[bool],
                      reports: Sequence[Report]) -> bool:
        """Whether an entry that never passed through ``sender`` shows a far pair of other
        members, at least ``1 / multiple`` as far apart as ``sender`` is from us."""
        return any(member != sender and sender not in path and norm <= self.multiple * distance
                   for member, distance, path in self._evidence(names, near, reports))

    def _relay(self, names: Sequence[str], near: Sequence[bool], reports: Sequence[Report]) -> Report:
        """What we pass on of the others' evidence: per far member the entry with the shortest
        path (then the farthest), at most ``MAX_ENTRIES`` of them, shortest first."""
        best: dict[str, tuple[float, tuple[str, ...]]] = {}
        for member, distance, path in self._evidence(names, near, reports):
            held = best.get(member)
            if held is None or (len(path), -distance, path) < (len(held[1]), -held[0], held[1]):
                best[member] = (distance, path)
        ranked = sorted(best.items(), key=lambda item: (len(item[1][1]), item[0]))
        return dict(ranked[:MAX_ENTRIES])

    def report(self) -> Report:
        """Our report for our next round message: who our latest screen found far (path: none,
        we saw it), then what we relay, at most ``MAX_ENTRIES`` in all."""
        own: Report = {member: (norm, ()) for member, norm in sorted(self.far.items())}
        relayed = [(m, entry) for m, entry in self.relayed.items() if m not in own]
        return dict([*own.items(), *relayed][:MAX_ENTRIES])

    def _radius(self, reference: float, scale: Callable[[], float] | None) -> float:
        """The largest norm :meth:`_within` accepts against ``reference``."""
        size = scale() if scale is not None else 0.0
        return self.multiple * max(reference, FLOOR * size if math.isfinite(size) else 0.0)

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

    def export_report(self) -> dict[str, list[list[Any]]]:
        """What our next report is made of (:meth:`report`), JSON-able."""
        return {"far": [[m, d] for m, d in sorted(self.far.items())],
                "relayed": [[m, d, list(path)] for m, (d, path) in self.relayed.items()]}

    def restore_report(self, saved: Mapping[str, Any]) -> None:
        """The report's parts from :meth:`export_report` (a checkpoint without them: none)."""
        self.far = {str(m): float(d) for m, d in saved.get("far", [])}
        self.relayed = {str(m): (float(d), tuple(str(h) for h in path))
                        for m, d, path in saved.get("relayed", [])}

    def restore(self, saved: Sequence[Any]) -> None:
        """The memory from :meth:`export`. A checkpoint of the old filter holds a list of anonymous
        norms: those are dropped (whose they were is unknown; the next round speaks for itself)."""
        self.latest = {str(item[0]): float(item[1]) for item in saved if isinstance(item, list | tuple)}



def report_meta(report: Report) -> dict[str, str]:
    """A report as a round message's meta entries: ``far/<member>`` -> ``"<distance> <path...>"``
    (member names hold no spaces: protocols/roster.py)."""
    return {f"{REPORT_PREFIX}{member}": " ".join([repr(float(distance)), *path])
            for member, (distance, path) in sorted(report.items())}


def read_report(meta: Mapping[str, object]) -> Report:
    """A sender's report from its message's meta. Malformed entries, and distances that are not
    positive and finite, are ignored: a report is evidence for a far candidate, never a reason
    to refuse one. At most ``MAX_ENTRIES`` are read, paths of at most ``MAX_HOPS``."""
    report: Report = {}
    for key, value in sorted(meta.items()):
        if not key.startswith(REPORT_PREFIX) or not isinstance(value, str) or len(report) >= MAX_ENTRIES:
            continue
        first, *path = value.split(" ")
        try:
            distance = float(first)
        except ValueError:
            continue
        if math.isfinite(distance) and distance > 0 and len(path) < MAX_HOPS and all(path):
            report[key[len(REPORT_PREFIX):]] = (distance, tuple(path))
    return report
