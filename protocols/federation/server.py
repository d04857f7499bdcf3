"""The synchronous FedAvg server (McMahan et al. 2017) as a pure Role: rounds, sampling, deadlines.

A gateway's Node hosts it beside its gossip machine (routing ``ClientUpdate`` to
it, prefixing its timer keys and metrics with the role's name). It owns no tensor:
``params``, the global model it updates in place, is the gossip machine's. A round:

1. *Open* (at ``Start`` and after each close, once ``min_registered`` clients are
   registered): ask ``n = ceil(m (1 + over_selection))`` clients, ``m =
   max(min_clients, ceil(fraction * registered))``, by a counter-based draw
   (common.sample); send each a ``RoundStart``; set the deadline timer.
2. *Collect* the first ``m`` valid updates.
3. *Close* at the ``m``-th update (``quota``) or the deadline: with at least
   ``min_updates``, the bounded aggregate (common.combine, influence.py) goes
   through the server optimiser into ``params``; else ``rounds_failed``. The
   round's :class:`RoundReport` is kept in ``reports``.
4. After ``rounds`` rounds every registered client gets a ``RoundResult``, then
   ``Finished``; a later client gets it at most once per ``round_timeout_s``.

With ``differential_privacy`` on, clients are drawn by Poisson sampling and every
round releases a noised aggregate (privacy.py; distributed with SecAgg:
distributed_dp.py). ``pause_between_rounds``: the phase is ``PAUSED`` after each
close until :meth:`FedAvgServer.resume`. Every refused update is counted
``refused_<reason>`` (``not_sampled``, ``duplicate``, ``bad_update``,
``late``, ``wrong_round``, ...). The verdict table: docs/design/federation.md.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import torch

from protocols.compress import BadParts
from protocols.events import (
    Action,
    CancelTimer,
    Event,
    Finished,
    Metric,
    Received,
    Send,
    SetTimer,
    TimerFired,
)
from protocols.federation import client_metrics, distributed_dp, privacy
from protocols.federation.accountant import DistributedRoundAccountant, RoundAccountant, epsilon_json
from protocols.federation.common import sample
from protocols.federation.config import FederationConfig
from protocols.federation.secure import SecureOutcome, SecureServer
from protocols.federation.server_base import FederationServer
from protocols.federation.server_opt import server_step
from protocols.messages import ClientUpdate, Message, RoundStart, SecAggMessage
from protocols.rng import torch_generator


class ServerPhase(Enum):
    IDLE = "idle"  # before Start
    WAITING = "waiting"  # fewer than min_registered clients registered: no round open
    OPEN = "open"  # a round is collecting updates (its deadline timer is set)
    PAUSED = "paused"  # pause_between_rounds: a round closed, resume() opens the next
    FINISHED = "finished"


@dataclass(frozen=True)
class RoundReport:
    """What happened in one round, failures included (the gateway's status shows it)."""

    round: int
    opened_at_s: float
    closed_at_s: float
    closed_by: str  # "quota": m updates taken; "deadline": the timer fired first
    asked: tuple[str, ...]  # the clients sampled (n, over-selection included)
    taken: tuple[str, ...]  # the clients whose updates were aggregated (at most m)
    missing: tuple[str, ...]  # asked, but no update taken by the close
    late: tuple[str, ...]  # of the missing, those whose update came after the close
    refused: tuple[tuple[str, int], ...]  # refusals while the round was open, by reason (sorted)
    aggregated: bool  # False: fewer than min_updates taken; the model did not change
    update_norm: float  # L2 norm of the aggregate delta (0 when not aggregated)
    epsilon: float | None = None  # DP on: the privacy spent after this round (at the configured delta)
    clip_norm: float = 0.0  # DP on: the clip norm C this round's updates were clipped to
    # SecAgg on (masking): per phase, in the order they ran, its name ("phase"), duration_s, and the
    # messages and bytes each way at the gateway (secure.PhaseCost); [] otherwise
    secagg_phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # the influence bounds the updates met (influence.Bounds.report: samples_cap, norm_bound, and
    # bounded, by reason); {} where the gateway applied none (DP and SecAgg bound each client their
    # own way, and a round not aggregated applied nothing)
    bounds: dict[str, Any] = dataclasses.field(default_factory=dict)
    # SecAgg on: the clients proven to have cheated in this round's SecAgg (secagg/blame.py), by
    # offence; they are out of ``taken``, and barred from later rounds after ``blame_limit`` rounds
    blamed: dict[str, str] = dataclasses.field(default_factory=dict)
    # the clients' fit metrics (client_metrics.py): each one's mean over the updates taken that carry
    # it, weighted by num_samples; {} when none carried any (SecAgg's updates carry none)
    client_metrics: dict[str, float] = dataclasses.field(default_factory=dict)


def report_row(report: Any) -> dict[str, Any]:
    """A round's report (a RoundReport, or FedBuff's BufferReport) as plain data for status files
    and ``rounds.jsonl``: an infinite epsilon (DP without noise) is written "inf"
    (accountant.epsilon_json), not lost as a null."""
    row = dataclasses.asdict(report)
    if "epsilon" in row:
        row["epsilon"] = epsilon_json(row["epsilon"])
    return row


class FedAvgServer(FederationServer):
    """The synchronous FedAvg server for clients ``clients`` (roster names; more may ``register``)."""

    MODE = "sync"

    def __init__(self, config: FederationConfig, *, name: str, params: torch.Tensor,
                 clients: Sequence[str] = (), pause_between_rounds: bool = False,
                 shapes: Sequence[tuple[int, ...]] | None = None, secret_seed: int | None = None,
                 secure: SecureServer | None = None) -> None:
        """``secret_seed``: the root of the DP draws (who is asked, the noise), known to this gateway
        only; needed when ``config.differential_privacy`` is set (the config's ``seed`` is every
        client's, and would let them subtract the noise). ``secure``: the gateway's side of secure
        aggregation (protocols/federation/secure.py), needed when ``config.secure_aggregation`` is set."""
        super().__init__(config, name=name, params=params, clients=clients, shapes=shapes,
                         other="FedBuffServer")
        self.pause_between_rounds = pause_between_rounds
        self.phase = ServerPhase.IDLE
        self.round = 0
        self.reports: dict[int, RoundReport] = {}
        # the open round (set by _open_round)
        self.wanted = 0
        self.asked: tuple[str, ...] = ()
        self.taken: dict[str, tuple[torch.Tensor, int]] = {}
        self.taken_metrics: dict[str, tuple[dict[str, float], int]] = {}   # (fit's metrics, num_samples)
        self.refused_now: Counter[str] = Counter()
        self.left_now: set[str] = set()  # the open round's asked clients that said they leave
        self.opened_at_s = 0.0
        # differential privacy (None: off)
        self.privacy = config.differential_privacy
        self.accountant: RoundAccountant | DistributedRoundAccountant | None = None
        self.dp_clip_norm = 0.0  # C for the next round closed (adaptive clipping moves it)
        self.expected = 0.0  # the open round's expected cohort q N: the mean's fixed denominator
        if self.privacy is not None:
            if secret_seed is None:
                raise ValueError("differential privacy needs the gateway's secret_seed: the federation's "
                                 "seed is shared with every client")
            self.secret_seed = secret_seed
            self.dp_clip_norm = self.privacy.clip_norm
            if config.secure_aggregation is None:
                self.accountant = RoundAccountant(self.privacy.sampling_rate, self.privacy.noise_multiplier,
                                                  self.privacy.delta)
            else:  # distributed DP: the clients' discrete noise shares (distributed_dp.py)
                self.accountant = DistributedRoundAccountant(
                    self.privacy.sampling_rate,
                    distributed_dp.round_epsilon(self.privacy, config.secure_aggregation, params.numel()),
                    self.privacy.delta)
        # secure aggregation (None: off): the hooks below hand it the round's open, its messages and
        # timers, the updates' decoding and the aggregate; the logic is protocols/federation/secure.py
        if (config.secure_aggregation is None) != (secure is None):
            raise ValueError("federation.secure_aggregation needs the server's secure side (secure=, a "
                             "SecureServer) and secure= needs it: this driver does not wire it")
        self.secure = secure
        if secure is not None:
            secure.privacy = self.privacy

    @property
    def finished(self) -> bool:
        return self.phase is ServerPhase.FINISHED

    @property
    def accepts(self) -> frozenset[type[Message]]:
        return self.ACCEPTS if self.secure is None else self.ACCEPTS | self.secure.ACCEPTS

    # ------------------------------------------------------------ membership

    def resume(self, now: float) -> list[Action]:
        """After a pause between rounds: open the next round with what ``params`` holds now."""
        if self.phase is not ServerPhase.PAUSED:
            return []
        return self._try_open(now)

    def status(self) -> dict[str, Any]:
        status = super().status()
        if self.privacy is not None:
            status["privacy"] = self.privacy_status()
        return status

    def _phase_name(self) -> str:
        return self.phase.value

    def _round_now(self) -> int:
        return self.round

    def _extra_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"asked": list(self.asked), "wanted": self.wanted,
                                  "taken": sorted(self.taken),
                                  # registered clients a round opens with (the wait of phase "waiting")
                                  "needed": max(self.config.min_clients, self.config.min_registered)}
        if self.secure is not None:  # the open round's SecAgg phase, and what its phases cost so far
            status["secagg"] = self.secure.status()
        return status

    def epsilon(self) -> float | None:
        """The privacy spent by the rounds closed so far (None: DP off; inf: no noise)."""
        return None if self.accountant is None else self.accountant.epsilon(self.round)

    def privacy_status(self) -> dict[str, Any]:
        """DP's numbers now (JSON-able: an infinite epsilon is the string "inf"); {} when off."""
        epsilon = self.epsilon()
        if self.privacy is None or epsilon is None:
            return {}
        dp = self.privacy
        status = {"epsilon": epsilon_json(epsilon), "delta": dp.delta,
                  "noise_multiplier": dp.noise_multiplier, "sampling_rate": dp.sampling_rate,
                  "clip_norm": self.dp_clip_norm, "rounds_accounted": self.round,
                  "mechanism": "central" if self.secure is None else "distributed"}
        if isinstance(self.accountant, DistributedRoundAccountant):  # the gateway sees who takes part
            status["epsilon_vs_gateway_per_round"] = epsilon_json(self.accountant.gateway_epsilon(1))
        return status

    # ------------------------------------------------------------ events

    def _dispatch(self, event: Event, now: float) -> list[Action]:
        match event:  # secure aggregation's messages and timers (the rest: server_base.py)
            case Received(sender=sender, message=SecAggMessage() as message) if self.secure is not None:
                self.last_contact_s[sender] = now
                return self._secure_step(*self.secure.receive(sender, message, now), now)
            case TimerFired(key=key) if self.secure is not None and self.secure.owns(key):
                return self._secure_step(*self.secure.tick(key, now), now)
        return super()._dispatch(event, now)

    def _start(self, now: float) -> list[Action]:
        return self._try_open(now) if self.phase is ServerPhase.IDLE else []

    def _registered(self, now: float) -> list[Action]:
        return self._try_open(now) if self.phase is ServerPhase.WAITING else []

    def _timer(self, key: str, now: float) -> list[Action]:
        if self.phase is ServerPhase.OPEN and key == self._timer_key():
            return self._close(now, "deadline")
        return []

    def _timer_key(self) -> str:
        return f"deadline/{self.round}"

    # ------------------------------------------------------------ a round

    def _try_open(self, now: float) -> list[Action]:
        needed = max(self.config.min_clients, self.config.min_registered)
        if len(self.registered) < needed:
            self.phase = ServerPhase.WAITING
            return []
        self._open_round(now)
        if self.privacy is not None and not self.asked:  # nobody drawn: the noise alone is released
            return [Metric("round", float(self.round)), Metric("asked", 0.0), *self._close(now, "empty")]
        self.phase = ServerPhase.OPEN
        model = self._model_message()
        secure_meta, secure_actions = self.secure.open(self.round, self.asked, now) if self.secure \
            else ({}, [])
        sends: list[Action] = []
        if model is not None:
            start = RoundStart(round=self.round, tensors=model[0],
                               meta={**model[1], **self.config.local_work(), **secure_meta},
                               deadline_s=self.config.round_timeout_s)
            sends.append(Send(self.asked, start))
        return [*sends, SetTimer(self._timer_key(), now + self.config.round_timeout_s),
                *secure_actions, Metric("round", float(self.round)), Metric("asked", float(len(self.asked)))]

    def _open_round(self, now: float) -> None:
        registered = len(self._eligible())
        if self.privacy is not None:  # Poisson: all of those drawn are wanted
            rate = self.privacy.sampling_rate
            self.asked = privacy.poisson_sample(self.secret_seed, self.round, self._eligible(), rate)
            self.wanted = len(self.asked)
            self.expected = rate * registered
            if self.secure is not None:  # distributed DP: the sum over q N, as central DP's
                self.secure.divide_by = max(self.expected, 1e-12)
        else:
            self.wanted = self.config.clients_per_round(registered)
            asking = self.config.asked_per_round(registered)
            self.asked = sample(self.config.seed, self.round, self._eligible(), asking)
        self.taken, self.taken_metrics = {}, {}
        self.left_now = set()
        self.refused_now = Counter()
        self.opened_at_s = now

    def _eligible(self) -> set[str]:
        """The registered clients a round may ask: all, but those SecAgg barred for their offences."""
        return self.registered - self.secure.barred() if self.secure is not None else self.registered

    def _update(self, sender: str, update: ClientUpdate, now: float) -> list[Action]:
        if self.phase is not ServerPhase.OPEN or update.round != self.round:
            self._after_close(sender, update.round)
            return []
        if sender not in self.asked:
            return self._refuse_open("not_sampled")
        if sender in self.taken:
            return self._refuse_open("duplicate")
        if self._bad_num_samples(update):
            return self._refuse_open("bad_num_samples")
        delta = self._decode(update)
        if delta is None:
            return self._refuse_open("bad_update")
        self.taken[sender] = (delta, update.num_samples)
        self.counters["updates_taken"] += 1
        metrics, dropped = client_metrics.from_meta(update.meta)
        self.taken_metrics[sender] = (metrics, update.num_samples)
        if dropped:
            self.counters["client_metrics_dropped"] += dropped
        if len(self.taken) >= self.wanted:
            return [CancelTimer(self._timer_key()), *self._close(now, "quota")]
        return []

    def _left(self, client: str, now: float) -> list[Action]:
        """An asked client that left is waited for no more: with SecAgg its phases close once the
        rest answered; else the round closes (``answered``) once every other asked client's update
        is in, rather than at its deadline (``left``: none is, all asked left)."""
        if self.phase is not ServerPhase.OPEN or client not in self.asked or client in self.taken:
            return []
        self.left_now.add(client)
        if self.secure is not None and self.secure.machines:
            return self._secure_step(*self.secure.gone(client, now), now)
        if set(self.asked) <= set(self.taken) | self.left_now:
            return [CancelTimer(self._timer_key()), *self._close(now, "answered" if self.taken else "left")]
        return []

    def _refuse_open(self, reason: str) -> list[Action]:
        self._refuse(reason)
        self.refused_now[reason] += 1
        return []

    def _after_close(self, sender: str, round_index: int) -> None:
        """An update for a round not open: late (or surplus) from one we asked, else the wrong round."""
        report = self.reports.get(round_index)
        if report is not None and sender in report.missing and sender not in report.late:
            self._refuse("late" if report.closed_by == "deadline" else "surplus")
            self.reports[round_index] = replace(report, late=(*report.late, sender))
            return
        self._refuse("wrong_round")

    def _close(self, now: float, closed_by: str, blamed: dict[str, str] | None = None) -> list[Action]:
        aggregated = len(self.taken) >= self.config.min_updates or self.privacy is not None
        norm = 0.0
        clip_norm = self.dp_clip_norm
        bounds: dict[str, Any] = {}
        if aggregated:
            if self.secure is not None and self.taken:  # distributed DP too: the clients noised it
                delta = self.secure.aggregate(self.taken)
            elif self.privacy is not None:  # central DP, or a DP round SecAgg could not sum: noise alone
                delta = self._private_mean()
            elif self.secure is not None:  # the clients clipped and capped their own: only a sum is seen
                delta = self.secure.aggregate(self.taken)
            else:
                combined = self._combine(self.taken)
                delta, bounds = combined.delta, combined.bounds.report()
            norm = float(torch.linalg.vector_norm(delta))
            new, self.opt_state = server_step(self.params, delta, self.opt_state, self.config.server_opt)
            self.params.copy_(new)
            self.counters["rounds_aggregated"] += 1
        else:
            self.counters["rounds_failed"] += 1
        taken = tuple(sorted(self.taken))
        missing = tuple(c for c in self.asked if c not in self.taken)
        self.reports[self.round] = RoundReport(
            round=self.round, opened_at_s=self.opened_at_s, closed_at_s=now, closed_by=closed_by,
            asked=self.asked, taken=taken, missing=missing, late=(),
            refused=tuple(sorted(self.refused_now.items())), aggregated=aggregated, update_norm=norm,
            epsilon=None if self.accountant is None else self.accountant.epsilon(self.round + 1),
            clip_norm=clip_norm,
            secagg_phases=self.secure.phase_costs(self.round) if self.secure is not None else [],
            bounds=bounds, blamed=dict(blamed or {}),
            client_metrics=client_metrics.weighted_means(self.taken_metrics[c] for c in taken
                                                         if c in self.taken_metrics))
        self.counters[f"closed_by_{closed_by}"] += 1
        self.taken, self.taken_metrics = {}, {}
        self.round += 1
        # "round" is the rounds closed (the index of the next round), as at each opening and in status()
        actions: list[Action] = [Metric("taken", float(len(taken))), Metric("round", float(self.round))]
        if self.round >= self.config.rounds:
            self.phase = ServerPhase.FINISHED
            model = self._model_message()
            return [*actions, *(self._finish(now, *model) if model is not None else []), Finished()]
        if self.pause_between_rounds:
            self.phase = ServerPhase.PAUSED
            return actions
        return [*actions, *self._try_open(now)]

    def _decode(self, update: ClientUpdate) -> torch.Tensor | None:
        """Secure aggregation on: what its secure side takes (masking off: quantised integers;
        masking on: none, BadParts ``unmasked``), else the uplink's decoding (server_base.py)."""
        if self.secure is None:
            return super()._decode(update)
        try:
            return self.secure.decode_update(update)
        except BadParts as error:
            self.counters[f"refused_bad_update_{error.reason}"] += 1
            return None

    def _secure_step(self, actions: list[Action], outcome: SecureOutcome | None, now: float) -> list[Action]:
        """SecAgg's sends and timer; when its round ended, the FedAvg round closes with it (the
        survivors are ``taken``; a failed SecAgg round is not aggregated)."""
        assert self.secure is not None
        self.counters.update(self.secure.drain())
        if outcome is None or self.phase is not ServerPhase.OPEN:
            return actions
        self.taken = {} if outcome.mean is None else {name: (outcome.mean, 1) for name in outcome.survivors}
        closed_by = "secagg" if outcome.mean is not None else f"secagg_failed_{outcome.failure}"
        return [*actions, CancelTimer(self._timer_key()), *self._close(now, closed_by, dict(outcome.blamed))]

    def _private_mean(self) -> torch.Tensor:
        """DP-FedAvg's aggregate of the taken updates (privacy.py), and the next clip norm."""
        assert self.privacy is not None
        dp = self.privacy
        clipped, covered = [], 0
        for name in sorted(self.taken):
            update, within = privacy.clip(self.taken[name][0], self.dp_clip_norm)
            clipped.append(update)
            covered += within
        expected = max(self.expected, 1e-12)  # q N > 0 whenever a round opened (N >= min_clients)
        stddev = dp.update_noise_multiplier() * self.dp_clip_norm / expected
        noise = torch_generator(self.secret_seed, self.name, self.round, "dp-noise")
        delta = privacy.noised_mean(clipped, like=self.params, expected=expected, stddev=stddev,
                                    generator=noise)
        if dp.adaptive:
            count = privacy.noised_centred_count(covered, len(clipped), dp.count_noise_stddev,
                                                 torch_generator(self.secret_seed, self.name, self.round,
                                                                 "dp-count"))
            self.dp_clip_norm = privacy.next_clip_norm(self.dp_clip_norm, count, expected, dp.target_quantile,
                                                       dp.clip_learning_rate)
        self.counters["dp_updates_clipped"] += len(clipped) - covered
        return delta

    # ------------------------------------------------------------ checkpoints

    def _export_meta(self) -> dict[str, Any]:
        """The round (a round open at the export is asked again after a restore: same round, same
        draw, so no half round is kept) and, with DP, adaptive clipping's C (epsilon follows from
        the round)."""
        meta: dict[str, Any] = {"round": self.round}
        if self.privacy is not None:
            meta["dp_clip_norm"] = self.dp_clip_norm
        if self.secure is not None and self.secure.offences:  # a restart does not pardon
            meta["secagg_offences"] = dict(self.secure.offences)
        return meta

    def _restore_meta(self, meta: dict[str, Any], *, finished: bool) -> None:
        self.round = int(meta["round"])
        self.phase = ServerPhase.FINISHED if finished else ServerPhase.IDLE
        if self.privacy is not None and "dp_clip_norm" in meta:
            self.dp_clip_norm = float(meta["dp_clip_norm"])
        offences = meta.get("secagg_offences")
        if self.secure is not None and isinstance(offences, dict):
            self.secure.offences.update({str(name): int(count) for name, count in offences.items()})
