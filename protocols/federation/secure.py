"""Secure aggregation in a FedAvg round: the gateway's and the client's side, for every driver.

protocols/secagg/ holds the five-round protocol; this module is what a FedAvg
server and client add around it (the simulator and the daemon both reach it
through FedAvgServer / FedAvgClient, never directly).

* Wire: each secagg message is one :class:`protocols.messages.SecAggMessage` whose
  uint8 ``body`` is msgpack (:func:`wrap`, :func:`unwrap`: untrusted bytes give
  ``Malformed``, never an exception).
* Gateway (:class:`SecureServer`): says who was asked (meta ``secagg_cohort``),
  runs a ``SecAggServer`` over them on one timer ``secagg/<round>``, and ends
  with a :class:`SecureOutcome` (survivors, mean update) and a
  :class:`PhaseCost` per phase (``secagg_phases`` in the round's report).
* Client (:class:`SecureClient`): advertises keys while it trains, then weighs
  (``w = min(num_samples, weight_cap_samples)``), clips to ``[-c, c]``, scales
  by ``w / W``, quantises and appends ``w``; the gateway divides the sum by the
  summed weight (:func:`mean_of_sum`; a sum outside ``[n, n W]``: ``bad_weight_sum``).
* ``masking = false``: the same integers in the clear, a baseline a masked run
  equals bit for bit; no privacy.
* Distributed DP (distributed_dp.py): the client adds its noise share before
  masking, weighs 1, and the gateway divides by the expected cohort ``q N``.
* Blame (protocols/secagg/blame.py): clients proven to have cheated are named in the
  round's ``blamed``, and after ``blame_limit`` offences asked into no later round.
* Groups (grouped.py, ``groups > 1``): SecAgg per group of at least ``min_group``, the
  group means combined by ``group_aggregator``, so one extreme input spoils one group.

Refusals and aborts are counted ``secagg_refused_<reason>``, ``secagg_abort_<reason>``.
The arithmetic and its error bound: docs/design/secagg.md.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

from protocols.compress import BadParts
from protocols.events import Action, Send, SetTimer
from protocols.federation import distributed_dp
from protocols.federation.grouped import (
    combine_group_means,
    decode_groups,
    draw_groups,
    encode_groups,
)
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.federation.secure_config import SecureAggregationConfig
from protocols.identity import load_public_key, verify_signature
from protocols.messages import ClientUpdate, Message, RoundStart, SecAggMessage
from protocols.roster import Roster
from protocols.secagg import SecAggClient, SecAggConfigError, SecAggServer
from protocols.secagg.fixedpoint import RING_MASK, dequantise_sum, levels, quantise, to_signed
from protocols.secagg.insider import client_class, extreme_input
from protocols.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    Malformed,
    MaskedInput,
    ShareKeys,
    UnmaskShares,
    from_wire,
    to_wire,
)
from protocols.secagg.messages import Message as SecAggWire
from protocols.secagg.server import Deliver, SecAggResult, ServerPhase

Sign = Callable[[bytes], bytes]
Verify = Callable[[str, bytes, bytes], bool]
COHORT_META = "secagg_cohort"  # RoundStart meta: the asked clients, comma-separated (names have no commas)
_CLIENT_KINDS = (AdvertiseKeys, ShareKeys, MaskedInput, ConsistencySignature, UnmaskShares)


def roster_verify(roster: Callable[[], Roster]) -> Verify:
    """SecAgg's signature check for real processes: ``member``'s Ed25519 key on the roster
    ``roster()`` returns now (a roster reloaded while running is seen at the next check)."""
    def verify(member: str, signature: bytes, data: bytes) -> bool:
        entry = roster().get(member)
        return entry is not None and verify_signature(load_public_key(entry.public_key), signature, data)
    return verify


# ------------------------------------------------------------------ wire


def wrap(round_index: int, message: SecAggWire) -> SecAggMessage:
    """``message`` of federation round ``round_index`` as the message kind the envelope carries."""
    body = bytearray(msgpack.packb(to_wire(message), use_bin_type=True))
    return SecAggMessage(round=round_index, tensors={"body": torch.frombuffer(body, dtype=torch.uint8)})


def unwrap(message: SecAggMessage) -> SecAggWire | Malformed:
    """The secagg message inside, or Malformed(reason); never raises."""
    body = message.tensors.get("body")
    if set(message.tensors) != {"body"} or body is None or body.dtype != torch.uint8 or body.dim() != 1:
        return Malformed("body: not one uint8 vector")
    try:
        obj = msgpack.unpackb(body.numpy().tobytes(), raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several kinds on hostile bytes: all are "not msgpack"
        return Malformed("body: not msgpack")
    inner = from_wire(obj)
    if not isinstance(inner, Malformed) and inner.round_index != message.round:
        return Malformed("round: body and envelope disagree")
    return inner


def ring_weight(num_samples: int, config: SecureAggregationConfig) -> int:
    """A client's weight in the ring: its sample count capped at ``weight_cap_samples`` (>= 1)."""
    return max(1, min(num_samples, config.weight_cap_samples))


def quantise_update(delta: torch.Tensor, weight: int, config: SecureAggregationConfig) -> np.ndarray:
    """What a client puts in the ring (int64 in [0, 2^32)), ``numel + 1`` elements: its delta clipped
    per coordinate, scaled by ``weight / weight_cap_samples`` and quantised; then ``weight`` itself."""
    scaled = quantise(delta.detach().to("cpu", torch.float64).numpy(), clip_value=config.clip_value,
                      bits=config.bits, scale=weight / config.weight_cap_samples)
    return np.append(scaled, np.int64(weight))


def mean_of_sum(ring_sum: np.ndarray, count: int, config: SecureAggregationConfig, like: torch.Tensor,
                divide_by: float | None = None) -> torch.Tensor | None:
    """The weighted mean update of ``count`` clients from their sum in the ring, as ``like``: the
    summed scaled updates times ``weight_cap_samples`` over the summed weight (the last element).
    None when that summed weight is not one ``count`` clients can have sent, [count, count W]: a
    client put something else in its weight's place, and the sum means nothing.

    Distributed DP (``divide_by``, the expected cohort q N): every client weighs 1 and its update is
    not scaled, so the summed weight must be ``count`` and the sum is divided by ``divide_by``."""
    total_weight = int(to_signed(ring_sum[-1:])[0])
    cap = 1 if divide_by is not None else config.weight_cap_samples
    if not count <= total_weight <= count * cap:
        return None
    total = dequantise_sum(ring_sum[:-1], clip_value=config.clip_value, bits=config.bits)
    if divide_by is not None:
        return torch.from_numpy(total / divide_by).to(like)
    return torch.from_numpy(total * cap / total_weight).to(like)  # cap 1: total / count, as unweighted


def _phase_name(phase: ServerPhase) -> str:
    return phase.name.lower()


def _tally(counters: Counter[str], prefix: str, counts: Mapping[str, int]) -> None:
    for key, value in counts.items():
        counters[f"{prefix}{key}"] += value


# ------------------------------------------------------------------ the gateway's side


@dataclass
class PhaseCost:
    """What one of a round's five SecAgg phases cost at the gateway. Time is from the ``now`` values
    the gateway was given (from the phase's start to the message or deadline that closed it); bytes
    are the secagg bodies (the envelope's header and signature are the driver's, so both drivers
    count the same), received while the phase was open, sent when it closed (its answer: the key
    roster, the forwarded shares, the survivor set, the proofs)."""

    duration_s: float = 0.0  # 0 while open (a FedAvg round closed by its own deadline leaves one open)
    messages_received: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0


def body_bytes(message: SecAggMessage) -> int:
    """The bytes of a secagg message's body (what the phases count)."""
    body = message.tensors.get("body")
    return 0 if body is None else body.numel() * body.element_size()


@dataclass(frozen=True)
class SecureOutcome:
    """How a masked round ended: the survivors and their mean update, or a failure."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    mean: torch.Tensor | None  # None: the round failed (``failure`` says why)
    failure: str = ""
    blamed: tuple[tuple[str, str], ...] = ()  # (culprit, offence) proven this round (secagg/blame.py)


class SecureServer:
    """The gateway's SecAgg per FedAvg round, one machine per group (grouped.py: one group unless
    ``groups`` > 1); ``verify`` checks a member's roster signature."""

    ACCEPTS: frozenset[type[Message]] = frozenset({SecAggMessage})

    def __init__(self, config: SecureAggregationConfig, *, run_id: str, verify: Verify,
                 like: torch.Tensor) -> None:
        self.config = config
        self.run_id = run_id
        self.verify = verify
        self.like = like  # the global model: its size and dtype
        self.round_index = -1
        self.machines: dict[int, SecAggServer] = {}  # the open round's, by group (until each ends)
        self.group_of: dict[str, int] = {}  # the open round's asked client -> its group
        self.results: dict[int, SecAggResult | str] = {}  # group -> its sum, or why it failed
        self.mean: torch.Tensor | None = None  # the last masked round's mean, until taken
        # distributed DP (distributed_dp.py; the FedAvg server sets both): the clients' noise
        # settings, and the open round's fixed denominator q N (None: divide by the survivors)
        self.privacy: DifferentialPrivacyConfig | None = None
        self.divide_by: float | None = None
        self.counters: Counter[str] = Counter()  # what the FedAvg server adds to its own (drain)
        # the round's phase name -> its cost, in the order the phases ran (until the next round
        # opens): over all groups, messages and bytes added, a duration the longest group's
        self.costs: dict[str, PhaseCost] = {}
        self._phase_began_s: dict[int, float] = {}
        self.offences: Counter[str] = Counter()  # client -> rounds it was blamed in, over the run
        self.blamed: dict[str, str] = {}  # the latest round's culprits -> offence

    @property
    def masking(self) -> bool:
        return self.config.masking

    def timer_key(self) -> str:
        return f"secagg/{self.round_index}"

    def owns(self, key: str) -> bool:
        return key.startswith("secagg/")

    def drain(self) -> Counter[str]:
        """The counts added since the last call (the FedAvg server's ``counters`` take them)."""
        counts, self.counters = self.counters, Counter()
        return counts

    def open(self, round_index: int, asked: Sequence[str],
             now_s: float) -> tuple[dict[str, str], list[Action]]:
        """A round opens for ``asked``: RoundStart's extra meta (the groups), and the timer of its
        first deadline."""
        self._retire()
        self.round_index = round_index
        self.mean = None
        self.costs = {}
        self.blamed = {}
        self.results = {}
        groups = draw_groups(asked, groups=self.config.groups, min_group=self.config.min_group,
                             run_id=self.run_id, round_index=round_index)
        self.group_of = {name: index for index, group in enumerate(groups) for name in group}
        meta = {COHORT_META: encode_groups(groups)}
        if not self.masking:
            return meta, []
        for index, group in enumerate(groups):
            try:
                self.machines[index] = SecAggServer(
                    self.config, run_id=self.run_id, round_index=round_index, cohort=frozenset(group),
                    numel=self.like.numel() + 1, verify=self.verify, now_s=now_s)  # + the weight
            except SecAggConfigError:  # too few or too many asked for the ring: round_timeout_s closes it
                self.counters["secagg_round_not_started"] += 1
                self.machines = {}
                return meta, []
            self._phase_began_s[index] = now_s
        self._cost(ServerPhase.ADVERTISE)
        return meta, [self._timer()]

    def _timer(self) -> SetTimer:
        return SetTimer(self.timer_key(), min(machine.deadline_s for machine in self.machines.values()))

    def receive(self, sender: str, message: SecAggMessage,
                now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        inner = unwrap(message)
        if isinstance(inner, Malformed):
            self.counters["secagg_refused_malformed"] += 1
            return [], None
        if self.machines and message.round == self.round_index and sender not in self.group_of:
            self.counters["secagg_refused_unknown_sender"] += 1  # not asked into this round
            return [], None
        machine = self.machines.get(self.group_of.get(sender, -1))
        if machine is None or message.round != self.round_index:
            self.counters["secagg_refused_no_round"] += 1
            return [], None
        if not isinstance(inner, _CLIENT_KINDS):
            self.counters["secagg_refused_wrong_kind"] += 1
            return [], None
        group = self.group_of[sender]
        phase = machine.phase
        cost = self._cost(phase)
        cost.messages_received += 1
        cost.bytes_received += body_bytes(message)
        sends = self._after(group, phase, machine.receive(sender, inner, now_s), now_s)
        return self._outcome(sends)

    def tick(self, key: str, now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        if not self.machines or key != self.timer_key():
            return [], None
        sends: list[Action] = []
        for group, machine in sorted(self.machines.items()):
            sends += self._after(group, machine.phase, machine.tick(now_s), now_s)
        return self._outcome(sends)

    def gone(self, client: str, now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        """``client`` said it leaves: its group's phases wait for it no more (SecAggServer.gone)."""
        group = self.group_of.get(client, -1)
        machine = self.machines.get(group)
        if machine is None:
            return [], None
        return self._outcome(self._after(group, machine.phase, machine.gone(client, now_s), now_s))

    def _after(self, group: int, phase: ServerPhase, deliveries: list[Deliver], now_s: float) -> list[Action]:
        """Group ``group``'s sends; ``phase``: its machine's before the message or tick that gave
        ``deliveries``. A machine that ended leaves ``machines`` for ``results``."""
        machine = self.machines[group]
        cost = self._cost(phase)
        sends = [Send((d.recipient,), wrap(self.round_index, d.message)) for d in deliveries]
        for send in sends:  # ``phase``'s answer
            assert isinstance(send.message, SecAggMessage)
            cost.messages_sent += 1
            cost.bytes_sent += body_bytes(send.message)
        if machine.phase is not phase:  # ``phase`` closed: the time it took; the next one begins
            cost.duration_s = max(cost.duration_s, now_s - self._phase_began_s[group])
            self._phase_began_s[group] = now_s
            if not machine.finished:
                self._cost(machine.phase)
        if machine.finished:
            self.results[group] = machine.result if machine.result is not None else machine.failure
            self._retire_machine(machine)
            del self.machines[group]
        return list(sends)

    def _outcome(self, sends: list[Action]) -> tuple[list[Action], SecureOutcome | None]:
        """The sends, the timer of the next deadline, and the outcome once every group ended."""
        if self.machines:
            return [*sends, self._timer()], None
        if not self.results:  # no round open (ended already)
            return sends, None
        blamed = tuple(self.blamed.items())
        means: list[torch.Tensor] = []
        survivors: list[str] = []
        failures: list[str] = []
        for _, result in sorted(self.results.items()):
            if isinstance(result, str):
                failures.append(result)
                continue
            mean = mean_of_sum(result.ring_sum, len(result.survivors), self.config, self.like, self.divide_by)
            if mean is None:  # a client put something else than its weight in the last element
                self.counters["secagg_bad_weight_sum"] += 1
                failures.append("bad_weight_sum")
                continue
            means.append(mean)
            survivors += result.survivors
        self.results = {}
        if not means:
            return sends, SecureOutcome((), (), None, failures[0], blamed)
        self.counters["secagg_groups_summed"] += len(means)
        self.counters["secagg_groups_failed"] += len(failures)
        self.mean = combine_group_means(means, self.config.group_aggregator, self.config.group_trim_beta)
        dropped = tuple(sorted(set(self.group_of) - set(survivors)))
        return sends, SecureOutcome(tuple(sorted(survivors)), dropped, self.mean, blamed=blamed)

    def barred(self) -> frozenset[str]:
        """The clients blamed in ``blame_limit`` rounds or more: asked into no later round."""
        limit = self.config.blame_limit
        return frozenset(name for name, count in self.offences.items() if limit and count >= limit)

    def _cost(self, phase: ServerPhase) -> PhaseCost:
        return self.costs.setdefault(_phase_name(phase), PhaseCost())

    def status(self) -> dict[str, Any]:
        """The latest round's SecAgg now (for the gateway's status): its phase (the least advanced
        group's; "none" when no machine runs: masking off, or the round ended), its phases' costs
        so far, its culprits, and the offences counted over the run."""
        phases = [machine.phase for machine in self.machines.values()]
        phase = _phase_name(min(phases, key=lambda p: p.value)) if phases else "none"
        return {"round": self.round_index, "phase": phase, "phases": self.phase_costs(self.round_index),
                "blamed": dict(self.blamed), "offences": dict(sorted(self.offences.items())),
                "barred": sorted(self.barred())}

    def phase_costs(self, round_index: int) -> list[dict[str, Any]]:
        """Round ``round_index``'s phase costs as plain data, in the order the phases ran (a list:
        JSON files may sort an object's keys), each ``{"phase": name, **PhaseCost}``; [] when it
        ran no SecAgg (masking off, not started) or is not the latest round."""
        if round_index != self.round_index:
            return []
        return [{"phase": phase, **dataclasses.asdict(cost)} for phase, cost in self.costs.items()]

    def _retire(self) -> None:
        """The round's machines are done (or replaced): their counts go to ours."""
        for machine in self.machines.values():
            self._retire_machine(machine)
        self.machines = {}

    def _retire_machine(self, machine: SecAggServer) -> None:
        _tally(self.counters, "secagg_refused_", machine.refused)
        _tally(self.counters, "secagg_", machine.counters)
        self.blamed.update(machine.blamed)
        self.offences.update(machine.blamed.keys())

    def decode_update(self, update: ClientUpdate) -> torch.Tensor:
        """A plain ClientUpdate's quantised integers and weight (masking off: the model's size plus
        one); BadParts when it must be refused."""
        if self.masking:
            raise BadParts("unmasked", "secure aggregation takes masked inputs only")
        values = update.tensors.get("q")
        if set(update.tensors) != {"q"} or values is None or values.dim() != 1 \
                or values.numel() != self.like.numel() + 1 or values.dtype != torch.float32:
            raise BadParts("shape", "expected one float32 vector 'q' of the model's size plus its weight")
        limit = levels(self.config.bits) if self.privacy is None \
            else distributed_dp.plain_limit(self.privacy, self.config)  # the noise share on top
        if not bool(torch.isfinite(values).all()) or bool((values[:-1].abs() > limit).any()) \
                or not bool((values == values.round()).all()):
            raise BadParts("not_quantised", f"expected integers within +-{limit}")
        weight_max = 1 if self.privacy is not None else self.config.weight_cap_samples  # DP: all weigh 1
        if not 1 <= float(values[-1]) <= weight_max:
            raise BadParts("bad_weight", f"expected a weight in [1, {weight_max}]")
        return values

    def aggregate(self, taken: Mapping[str, tuple[torch.Tensor, int]]) -> torch.Tensor:
        """The round's mean update: the masked round's, or (masking off) the ring sum of the taken
        integers and weights, decoded exactly as a masked round's (:func:`mean_of_sum`)."""
        if self.masking:
            assert self.mean is not None, "a masked round aggregates only after its SecureOutcome"
            return self.mean
        total = np.zeros(self.like.numel() + 1, dtype=np.int64)
        for name in sorted(taken):
            total = (total + taken[name][0].to(torch.int64).numpy()) & RING_MASK
        mean = mean_of_sum(total, len(taken), self.config, self.like, self.divide_by)
        assert mean is not None, "decode_update checked every weight"
        return mean


# ------------------------------------------------------------------ the client's side


class SecureClient:
    """A client's SecAgg per FedAvg round: ``client_secret`` (32 secret bytes, bound per round),
    ``sign`` with its roster key, ``verify`` others' roster signatures."""

    ACCEPTS: frozenset[type[Message]] = frozenset({SecAggMessage})

    def __init__(self, config: SecureAggregationConfig, *, name: str, server: str, run_id: str,
                 client_secret: bytes, sign: Sign, verify: Verify) -> None:
        self.config = config
        self.name = name
        self.server = server
        self.run_id = run_id
        self.client_secret = client_secret
        self.sign = sign
        self.verify = verify
        self.round_index = -1
        self.attempt = -1  # machines started for round_index, minus one: every one gets fresh secrets
        self.revealed: dict[str, str] = {}  # round_index's reveals over all its attempts (peer -> kind)
        self.input_sent = False  # whether an attempt at round_index sent its masked input
        self.machine: SecAggClient | None = None
        self.counters: Counter[str] = Counter()
        # distributed DP (distributed_dp.py): set by the FedAvg client from the federation config
        self.privacy: DifferentialPrivacyConfig | None = None
        # round (-1: every round) -> a dishonest behaviour (secagg/insider.py) in that round: set
        # only by a test's hook or a simulated attacker; empty for every honest client
        self.insider: dict[int, str] = {}

    def drain(self) -> Counter[str]:
        counts, self.counters = self.counters, Counter()
        return counts

    def start(self, start: RoundStart, now_s: float) -> list[Action]:
        """RoundStart taken: advertise this round's keys (masking on). The same round asked again
        (a gateway restored from a checkpoint re-asks its open round; a hostile one may do it at
        will) is a new attempt: new keys, masks and noise, and the reveals of the earlier attempts
        still bind (secagg/client.py's consistency rule). Once an attempt sent its masked input, the
        round is over for this client: a second masked input of the same round would be a second
        release of its update (its DP noise is accounted once per round), so later attempts get
        nothing. An older round is refused."""
        if start.round < self.round_index:
            self.counters["secagg_refused_old_round"] += 1
            return []
        self._retire()
        if start.round == self.round_index:
            self.attempt += 1
            self.counters["secagg_round_restarted"] += 1
        else:
            self.round_index, self.attempt, self.revealed, self.input_sent = start.round, 0, {}, False
        if not self.config.masking:
            return []
        if self.input_sent:
            self.counters["secagg_refused_round_already_input"] += 1
            return []
        cohort = start.meta.get(COHORT_META)
        groups = decode_groups(cohort) if isinstance(cohort, str) else ()
        mine = next((group for group in groups if self.name in group), None)
        if mine is None:
            self.counters["secagg_no_cohort"] += 1
            return []
        drawn = draw_groups([name for group in groups for name in group], groups=self.config.groups,
                            min_group=self.config.min_group, run_id=self.run_id, round_index=start.round)
        if groups != drawn:  # a gateway packing a client's group (with colluders, or to shrink it)
            self.counters["secagg_refused_bad_groups"] += 1
            return []
        machine = client_class(self._behaviour(start.round))
        self.machine = machine(self.config, name=self.name, run_id=self.run_id, round_index=start.round,
                                    cohort=frozenset(mine), client_secret=self.client_secret,
                                    sign=self.sign, verify=self.verify, attempt=self.attempt,
                                    revealed=self.revealed)
        return self._send(self.machine.start(now_s))

    def receive(self, message: SecAggMessage, now_s: float) -> list[Action]:
        inner = unwrap(message)
        if isinstance(inner, Malformed):
            self.counters["secagg_refused_malformed"] += 1
            return []
        if self.machine is None or message.round != self.round_index:
            self.counters["secagg_refused_no_round"] += 1
            return []
        if isinstance(inner, _CLIENT_KINDS):
            self.counters["secagg_refused_wrong_kind"] += 1
            return []
        return self._send(self.machine.receive(inner, now_s))

    def upload(self, round_index: int, delta: torch.Tensor, num_samples: int, now_s: float) -> list[Action]:
        """After training: the masked input (when the shares are in), or a plain quantised update."""
        if self.privacy is None:
            quantised = quantise_update(delta, ring_weight(num_samples, self.config), self.config)
        else:  # distributed DP: clipped to C, quantised, plus this client's noise share; weight 1
            noise = distributed_dp.noise_generator(self.client_secret, self.run_id, round_index,
                                                   attempt=max(self.attempt, 0))
            quantised = np.append(distributed_dp.noised_input(delta, self.privacy, self.config, noise),
                                  np.int64(1))
        if self._behaviour(round_index) == "extreme_input":  # a test's or a simulated insider
            quantised = extreme_input(quantised)
        if not self.config.masking:
            signed = torch.from_numpy(to_signed(quantised)).to(torch.float32)
            return [Send((self.server,), ClientUpdate(round=round_index, num_samples=num_samples,
                                                      tensors={"q": signed}))]
        if self.machine is None or round_index != self.round_index:
            self.counters["secagg_no_round_to_upload"] += 1
            return []
        return self._send(self.machine.provide_input(quantised, now_s))

    def _behaviour(self, round_index: int) -> str:
        """This client's insider behaviour in ``round_index`` (``insider``; -1: every round)."""
        return self.insider.get(round_index, self.insider.get(-1, ""))

    def _send(self, messages: Sequence[SecAggWire]) -> list[Action]:
        for message in messages:  # what it sent (a status shows how far its round went)
            self.counters[f"secagg_sent_{type(message).__name__}"] += 1
            self.input_sent |= isinstance(message, MaskedInput)
        return [Send((self.server,), wrap(self.round_index, m)) for m in messages]

    def _retire(self) -> None:
        if self.machine is not None:
            _tally(self.counters, "secagg_abort_", self.machine.aborts)
            _tally(self.counters, "secagg_refused_", self.machine.refused)
            self.machine = None
