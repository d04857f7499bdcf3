"""CHOCO-SGD (Koloskova et al. 2019): compressed gossip through public copies.

Every peer keeps ``x_hat_i``, the public copy of itself that its neighbours
also hold, and ``s_i = sum_j W_ij x_hat_j`` (itself included), so memory is two
vectors whatever the degree. Round ``t``:

  q_i = C(x_i - x_hat_i)           sent to the neighbours; x_hat_i += q_i; s_i += W_ii q_i
  H local steps                    x_i <- x_i - lr g
  s_i += sum_j W_ij q_j            for every received q_j (sorted by sender)
  x_i += gamma (s_i - x_hat_i)     the consensus step

The compression error stays in ``x_i - x_hat_i`` and is sent later (error
feedback by construction). ``choco_full_start`` sends round 0 uncompressed. A
late ``q_j`` is still added at the next mix. The ``s_i`` form needs a static
graph, and CHOCO does not catch up after a partition (``CATCHES_UP`` is false):
a lost ``q_j`` leaves a view of ``x_hat_j`` wrong for good.

``consensus_step = 0`` (the default) takes gamma from consensus_step.py. A guard
halves it once the median norm of ``x - x_hat`` over a window grows
``GUARD_GROWTH`` times past its smallest since the last change
(``consensus_step_reduced``); every message carries the sender's step and a
member mixes with the smallest it has heard (``consensus_step_adopted``), never
below ``2**-GUARD_MAX_HALVINGS`` of its start. Non-finite parameters are counted
(``nonfinite_params``) and never sent. Why: docs/design/gossip-algorithms.md.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import torch

from protocols.errors import HivemeshError
from protocols.events import Send
from protocols.gossip.admission import Lateness
from protocols.gossip.consensus_step import ConsensusStepChoice, choose_consensus_step
from protocols.gossip.rounds import Candidate, RoundMachine
from protocols.messages import ParamPush
from topology.membership import GraphView

GUARD_WINDOW = 10          # rounds per median of ||x - x_hat||
GUARD_WARMUP_WINDOWS = 5   # windows ignored after the start or a change of step (x_hat is catching up)
GUARD_GROWTH = 4.0         # a window this many times the smallest since the last change: halve the step
GUARD_MAX_HALVINGS = 10    # the step never falls below 2**-10 of where it started
STEP_KEY = "gamma"         # the sender's consensus step, in every CHOCO message's meta


def mixing_matrix(topology: GraphView) -> np.ndarray:
    """W_0 as a dense matrix over the topology's names (every member builds the same one)."""
    index = {name: i for i, name in enumerate(topology.names)}
    mixing = np.zeros((len(index), len(index)))
    for name, i in index.items():
        mixing[i, i] = topology.self_weight(name, 0)
        for other, weight in topology.in_neighbours(name, 0).items():
            mixing[i, index[other]] = weight
    return mixing


class Choco(RoundMachine):
    LATENESS = Lateness.RECENT  # q's lost to a closed round would leave the views x_hat_j wrong
    JOINABLE = False  # a joiner's public copy and its neighbours' views of it would disagree
    SUGGESTED_COMPRESSION = "topk:fraction=0.01"  # CHOCO's point: exact gossip needs no public copies
    CATCHES_UP = False  # views of x_hat_j missing q's lost in a partition must not be re-mixed: see below

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.topology.directed or self.topology.period != 1:
            raise ValueError("algorithm 'choco' needs a static undirected graph (symmetric W, period 1)")
        self.x_hat = torch.zeros_like(self.params)
        self.neighbour_sum = torch.zeros_like(self.params)  # s_i = sum_j W_ij x_hat_j, self included
        self.own_q_norm = 0.0
        self.choice: ConsensusStepChoice | None = None
        if self.config.consensus_step > 0:
            self.initial_step = self.config.consensus_step
        else:
            self.choice = choose_consensus_step(mixing_matrix(self.topology), self.config.compression,
                                                seed=self.seed)
            self.initial_step = self.choice.gamma
        self.step = self.initial_step
        self.corrections: list[float] = []   # ||x - x_hat|| of this guard window's rounds
        self.windows_seen = 0                # windows since the start or the last change of step
        self.smallest_window = math.inf      # smallest window median since the warm-up

    def _graph_changed(self) -> None:
        # x_hat_j views and the consensus step were made for one static graph: a joiner's public copy
        # would start from zero in its neighbours' sums while its own starts elsewhere
        raise HivemeshError("algorithm 'choco' cannot change membership while running (its public "
                            "copies belong to one graph): restart the run with the new roster")

    def notes(self) -> list[str]:
        if self.choice is not None:
            return [f"CHOCO {self.choice.describe()}"]
        return [f"CHOCO consensus_step {self.step:g} (set in the config)"]

    def gauges(self) -> dict[str, float]:
        return {"consensus_step": self.step}

    def warnings(self) -> list[str]:
        warnings = super().warnings()
        if self.step < self.initial_step:
            warnings.append(f"CHOCO consensus step lowered from {self.initial_step:.4g} to {self.step:.4g} "
                            f"(guard halvings here: {self.counters['consensus_step_reduced']}, adopted from "
                            f"a neighbour: {self.counters['consensus_step_adopted']})")
        return warnings

    @property
    def floor_step(self) -> float:
        return self.initial_step * 2.0**-GUARD_MAX_HALVINGS

    def _guard(self, correction: float) -> None:
        """Watch ||x - x_hat||: halve the step when it runs away (see the module docstring)."""
        self.corrections.append(correction)
        if len(self.corrections) < GUARD_WINDOW:
            return
        median = statistics.median(self.corrections)
        self.corrections = []
        self.windows_seen += 1
        if self.windows_seen <= GUARD_WARMUP_WINDOWS:
            return
        if median > GUARD_GROWTH * self.smallest_window and self.step / 2 >= self.floor_step:
            self._change_step(self.step / 2)
            self._count("consensus_step_reduced")
        else:
            self.smallest_window = min(self.smallest_window, median)

    def _change_step(self, step: float) -> None:
        self.step = step
        self.windows_seen = 0
        self.smallest_window = math.inf
    def _raw(self, t: int) -> bool:
        return t == 0 and self.config.choco_full_start

    def _round_messages(self, t: int) -> list[Send]:
        difference = self.params - self.x_hat
        if not self._sendable(difference):    # finite parameters, but x - x_hat overflowed
            return []
        correction = self._distance(difference)
        self._guard(correction)
        tensors, meta, q = self.payload.encode(difference, t, raw=self._raw(t))
        meta[STEP_KEY] = self.step
        self.x_hat.add_(q)
        self.neighbour_sum.add_(q, alpha=self.topology.self_weight(self.name, t))
        self.own_q_norm = self._distance(q)
        recipients = tuple(sorted(self.topology.out_neighbours(self.name, t)))
        return [Send(recipients, ParamPush(round=t, tensors=tensors, meta=meta))] if recipients else []

    def _decode(self, sender: str, message: ParamPush) -> tuple[Any, float]:
        q_j = self.payload.decode(message.tensors, message.meta, raw=self._raw(message.round))
        step = message.meta.get(STEP_KEY)
        heard = float(step) if isinstance(step, float | int) and not isinstance(step, bool) else math.inf
        return (q_j, heard), self._distance(q_j)

    def _own_norm(self) -> float:
        return self.own_q_norm

    def _mix(self, t: int, accepted: list[Candidate]) -> None:
        heard = self.step
        for sender, r, (q_j, step_j) in accepted:
            self.neighbour_sum.add_(q_j, alpha=self.topology.in_neighbours(self.name, r)[sender])
            heard = min(heard, step_j)
        if heard < self.step:      # a neighbour reduced its step: use the smallest, within bounds
            self._change_step(max(heard, self.floor_step))
            self._count("consensus_step_adopted")
        self.params.add_(self.neighbour_sum - self.x_hat, alpha=self.step)

    def _export_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        tensors["choco/x_hat"] = self.x_hat.clone()
        tensors["choco/neighbour_sum"] = self.neighbour_sum.clone()
        meta["choco_own_q_norm"] = self.own_q_norm
        meta["choco_guard"] = {"step": self.step, "initial_step": self.initial_step,
                               "corrections": list(self.corrections), "windows_seen": self.windows_seen,
                               "smallest_window": self.smallest_window if math.isfinite(self.smallest_window)
                               else None}

    def _restore_extra(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.x_hat.copy_(tensors["choco/x_hat"])
        self.neighbour_sum.copy_(tensors["choco/neighbour_sum"])
        self.own_q_norm = float(meta["choco_own_q_norm"])
        guard = meta.get("choco_guard")
        if isinstance(guard, dict):     # checkpoints written before the guard have none
            self.step = float(guard["step"])
            self.initial_step = float(guard["initial_step"])
            self.corrections = [float(c) for c in guard["corrections"]]
            self.windows_seen = int(guard["windows_seen"])
            smallest = guard["smallest_window"]
            self.smallest_window = math.inf if smallest is None else float(smallest)
