"""Push-sum / Stochastic Gradient Push (Kempe et al. 2003; Assran et al. 2019).

For directed and time-varying graphs: W_t only needs to be column-stochastic.
Each peer holds a weight ``w`` and the de-biased parameters ``z`` (the
trainer's parameters); its push-sum numerator is ``x = w z``. Round ``t``:

  send (z, W_ki w) to each live out-neighbour k;  keep w <- (W_ii + shares of down neighbours) w
  H local steps on z                              delta = z_after - z_before
  z <- (w z_before + sum_j w_j z_j) / (w + sum_j w_j) + delta;   w += sum_j w_j

which is the push-sum recursion ``x <- P x + w' delta`` on ``x``: the local
step moves the de-biased value by exactly what the trainer did (with every
w = 1, as on a one-peer exponential graph, this is ``x <- P x + delta``). Messages carry
``z`` and a weight share rather than the numerator share ``W_ki x``, and the
mix is computed with the normalised coefficients ``w_j / (w + sum w_j)``, so
nothing depends on the scale of the weights: a network that lost mass
(messages lost, a member absent, updates rejected) shrinks every ``w`` alike
and changes nothing else. (Dividing a numerator by a shrinking ``w``, and
adding unscaled steps to it, amplified each step by ``1 / w`` and went to NaN.)

The total mass (sum of every w, in flight included) stays n: with dyadic
weights (1/2, 1/4, ...) the float sums are exact. A neighbour known to be down
gets no share (its share stays here, as the deadline rule keeps a missing
neighbour's weight), and a message that arrives after its round closed is
added at the next mix rather than dropped, whatever its age (see rounds.py), so
mass is only lost to the network and to rejected updates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import groupby
from typing import Any

import torch

from protocols.compress import BadParts
from protocols.events import Send
from protocols.gossip.admission import Lateness
from protocols.gossip.rounds import Candidate, RoundMachine
from protocols.messages import ParamPush, Scalar

WEIGHT = "w"  # the meta key of the push-sum weight share
# A share is part of one member's weight, which is part of the network's mass: n at the start,
# plus 1 for each member that rejoins (join_at). Twice n leaves room for that churn; a larger
# share is forged, and would both take the average over and, added twice, overflow the sums.
MASS_SLACK = 2.0


def weight_share(meta: Mapping[str, Scalar], limit: float) -> float | None:
    """The message's weight share when it is a finite number in (0, limit], else None."""
    w = meta.get(WEIGHT)
    if isinstance(w, bool) or not isinstance(w, int | float):
        return None
    try:
        share = float(w)
    except OverflowError:  # an int past float range
        return None
    return share if 0 < share <= limit else None  # (NaN fails both comparisons)


class PushSum(RoundMachine):
    LATENESS = Lateness.ANY_AGE  # a weight share is mass whenever it is added

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.weight = 1.0
        self.before: torch.Tensor | None = None  # z at the start of the round
        self.max_share = MASS_SLACK * len(self.topology.names)

    def _graph_changed(self) -> None:
        self.max_share = MASS_SLACK * len(self.topology.names)  # the union of both sides of a change

    @property
    def mass(self) -> float:
        """This peer's push-sum weight plus the weight in messages it holds but has not mixed yet."""
        held = [self.weight]
        for box in self.inbox.values():
            held += [weight_share(m.meta, self.max_share) or 0.0 for m in box.values()]
        held += [weight_share(m.meta, self.max_share) or 0.0 for _, m in self.late]
        return math.fsum(held)  # (a forged share is not mass: it will be rejected at the mix)

    def _round_messages(self, t: int) -> list[Send]:
        self.before = self.params.detach().clone()
        out = self.topology.out_neighbours(self.name, t)
        # non-finite parameters (a diverged trainer): nothing goes out, and the weight stays here
        sendable = self._sendable(self.params)
        shares = {k: share for k, share in out.items() if k not in self.down and sendable}
        sends: list[Send] = []
        if shares:
            tensors, meta, _ = self.payload.encode(self.params, t)
            by_weight = sorted(shares.items(), key=lambda item: (item[1], item[0]))
            for share, group in groupby(by_weight, key=lambda item: item[1]):
                recipients = tuple(sorted(k for k, _ in group))
                meta_w: dict[str, Scalar] = {**meta, WEIGHT: share * self.weight}
                sends.append(Send(recipients, ParamPush(round=t, tensors=tensors, meta=meta_w)))
        # a down neighbour's share stays here (mass is not sent into the void)
        keep = math.fsum([self.topology.self_weight(self.name, t)]
                         + [share for k, share in out.items() if k not in shares])
        self.weight *= keep
        return sends

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        assert self.before is not None
        w_j = weight_share(message.meta, self.max_share)
        if w_j is None:
            raise BadParts("bad_weight", repr(message.meta.get(WEIGHT))[:40])
        z_j = self.payload.decode(message.tensors, message.meta)
        return (z_j, w_j), self._distance(z_j, self.before)

    def _own_norm(self) -> float:
        assert self.before is not None
        return self._distance(self.params, self.before)

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        assert self.before is not None
        total = math.fsum([self.weight] + [w_j for _, _, (_, w_j) in accepted])
        if accepted:
            # z <- (w z_before + sum w_j z_j) / total + delta, with z = z_before + delta now:
            # coefficients in [0, 1] whatever the scale of w
            self.params.add_(self.before, alpha=self.weight / total - 1.0)
            for _, _, (z_j, w_j) in accepted:
                self.params.add_(z_j, alpha=w_j / total)
        self.weight = total
        self.before = None

    def _joined(self) -> None:
        # a member that (re)joins brings weight 1, like every member at the start
        self.weight = 1.0
        self.before = None

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if self.before is not None:
            tensors["pushsum/before"] = self.before.clone()
        meta["pushsum_weight"] = self.weight

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.before = self._own_copy(tensors.get("pushsum/before"))
        self.weight = float(meta["pushsum_weight"])
