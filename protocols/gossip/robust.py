"""The insider filter: updates that are not finite, or far larger than their neighbours', are not mixed.

The statistic: each candidate's norm (a neighbour's difference to us, or its
compressed update) is compared with ``multiple`` times a reference built from
evidence the candidate does not control: the upper median of the *other*
senders' latest norms (one vote each, its latest; never its own) and of our own
step's norm, never less than our own step's norm, and at least ``scale`` (the
norm of our own parameters) when no other sender gives evidence. A refused norm
still becomes its sender's latest, so a member that comes back far from
neighbours that agree is heard again within a bounded number of rounds.

Far reports (``far_reports``, off by default; only machines that can clip,
``CLIPS_FAR``: D-PSGD and local SGD): each round message carries its sender's
report (meta ``far/<member>``, relayed up to ``MAX_HOPS`` hops, ``MAX_ENTRIES``
at most); a far candidate that a near sender's entry shows to be one of a far
pair of other members is clipped to the bound (``far_corroborated``) instead of
refused. A member of an older version ignores the entries and sends none.

Invariants: a non-finite update is never mixed; one insider among an honest
majority of in-neighbours is refused or clipped, whatever it reports. Known
limits: an insider that grows with the distances it is judged against, and two
insiders with reports on. Why, with the rejoin bound and the measurements:
docs/design/insider-filter.md.
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
        evidence that lets a far candidate in (docs/design/insider-filter.md, "A split healed").
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
