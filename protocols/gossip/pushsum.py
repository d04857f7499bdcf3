"""Push-sum / Stochastic Gradient Push (Kempe et al. 2003; Assran et al. 2019).

For directed and time-varying graphs: W_t only needs to be column-stochastic.
Each peer holds a numerator ``x`` and a weight ``w``; the trainer's parameters
are the de-biased ``z = x / w``. Round ``t``:

  send (W_ki x, W_ki w) to each out-neighbour k;  keep x <- W_ii x, w <- W_ii w
  H local steps on z                              delta = z_after - z_before
  x += sum of received numerators + delta;  w += sum of received weights;  z = x / w

The total mass (sum of every w, in flight included) stays n: with dyadic
weights (1/2, 1/4, ...) the float sums are exact. A message that arrives
after its round closed is added at the next mix rather than dropped, so mass
is only lost to a rejected update.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any

import torch

from protocols.compress import BadParts
from protocols.events import Send
from protocols.gossip.rounds import Candidate, RoundMachine
from protocols.messages import ParamPush, Scalar

WEIGHT = "w"  # the meta key of the push-sum weight share


class PushSum(RoundMachine):
    KEEPS_LATE = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.numerator = self.params.detach().clone()
        self.weight = 1.0
        self.before: torch.Tensor | None = None  # z at the start of the round

    @property
    def mass(self) -> float:
        """This peer's push-sum weight plus the weight in messages it holds but has not mixed yet."""
        held = [self.weight]
        for box in self.inbox.values():
            held += [float(m.meta.get(WEIGHT, 0.0)) for m in box.values()]
        held += [float(m.meta.get(WEIGHT, 0.0)) for _, m in self.late]
        return math.fsum(held)

    def _round_messages(self, t: int) -> list[Send]:
        self.before = self.params.detach().clone()
        shares = self.topology.out_neighbours(self.name, t)
        sends: list[Send] = []
        by_weight = sorted(shares.items(), key=lambda item: (item[1], item[0]))
        for share, group in groupby(by_weight, key=lambda item: item[1]):
            recipients = tuple(sorted(k for k, _ in group))
            tensors, meta, _ = self.payload.encode(self.numerator * share, t)
            meta_w: dict[str, Scalar] = {**meta, WEIGHT: share * self.weight}
            sends.append(Send(recipients, ParamPush(round=t, tensors=tensors, meta=meta_w)))
        keep = self.topology.self_weight(self.name, t)
        self.numerator.mul_(keep)
        self.weight *= keep
        return sends

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        assert self.before is not None
        w_j = message.meta.get(WEIGHT)
        if isinstance(w_j, bool) or not isinstance(w_j, int | float) or not (math.isfinite(w_j) and w_j > 0):
            raise BadParts("bad_weight", repr(w_j))
        x_j = self.payload.decode(message.tensors, message.meta)
        return (x_j, float(w_j)), self._distance(x_j / w_j, self.before)

    def _own_norm(self) -> float:
        assert self.before is not None
        return self._distance(self.params, self.before)

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        assert self.before is not None
        for _, _, (x_j, w_j) in accepted:
            self.numerator.add_(x_j)
            self.weight += w_j
        self.numerator.add_(self.params - self.before)
        self.params.copy_(self.numerator / self.weight)
        self.before = None

    def _params_replaced(self) -> None:
        self.numerator.copy_(self.params * self.weight)

    def _joined(self) -> None:
        # a member that (re)joins brings weight 1, like every member at the start
        self.weight = 1.0
        self.numerator.copy_(self.params)
        self.before = None

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        tensors["pushsum/numerator"] = self.numerator.clone()
        if self.before is not None:
            tensors["pushsum/before"] = self.before.clone()
        meta["pushsum_weight"] = self.weight

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.numerator.copy_(tensors["pushsum/numerator"])
        self.before = self._own_copy(tensors.get("pushsum/before"))
        self.weight = float(meta["pushsum_weight"])
