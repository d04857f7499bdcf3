"""Secure aggregation in a FedAvg round: the gateway's and the client's side, for every driver.

protocols/secagg/ holds the five-round protocol as one machine per party per round; this module
is what a FedAvg server and client add around it (one implementation: the simulator and the
daemon both reach it through FedAvgServer / FedAvgClient, never directly).

* Wire: each secagg message travels as one :class:`protocols.messages.SecAggMessage` whose uint8
  tensor ``body`` is msgpack of ``secagg.messages.to_wire`` (:func:`wrap`, :func:`unwrap`; an
  untrusted body gives ``Malformed``, never an exception). The envelope proves the sender.
* Gateway (:class:`SecureServer`): at each round's open it says who was asked (RoundStart's meta
  ``secagg_cohort``: the client's ``cohort``) and starts a ``SecAggServer`` over them; the five
  client kinds go to it; its ``Deliver`` become Sends; one timer ``secagg/<round>`` follows its
  deadline. When it ends, :class:`SecureOutcome` says who survived and the mean update: the sum
  dequantised and divided by the number of survivors, **unweighted** (SecAgg sums; a weighted
  mean would need each client to scale its update and append its weight, not done here).
  ``round_timeout_s`` still bounds the whole round (the config checks it covers the five
  deadlines): a round it closes first is not aggregated.
* Client (:class:`SecureClient`): on RoundStart it advertises its keys (while it trains); after
  training it clips and quantises its delta (secagg.fixedpoint) and hands it to its machine,
  which sends the masked input once the shares have come.
* ``masking = false`` (:class:`SecureAggregationConfig`): the same clipping and quantisation,
  sent in the clear as a ClientUpdate of integers (as float32: exact for bits <= 24) and summed
  in the same ring: the baseline a masked run must equal bit for bit. The gateway reads every
  update then: it is for tests and comparisons, not privacy.

Distributed DP (distributed_dp.py; ``privacy`` set by the FedAvg server and client from the
federation config): the client's step between clipping and masking adds its noise share
(``distributed_dp.noised_input`` instead of ``quantise_update``), and the gateway divides the
decoded sum by ``divide_by``, the expected cohort ``q N``, instead of the survivors; masking off
accepts integers up to ``distributed_dp.plain_limit`` (the noise on top of ``L``).

Refusals and aborts of the secagg machines are added to the FedAvg server's / client's counters
(``secagg_refused_<reason>``, ``secagg_abort_<reason>``, ``secagg_<counter>``) when their round
ends or is replaced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgpack
import numpy as np
import torch

from protocols.compress import BadParts
from protocols.events import Action, Send, SetTimer
from protocols.federation import distributed_dp
from protocols.federation.privacy import DifferentialPrivacyConfig
from protocols.identity import load_public_key, verify_signature
from protocols.messages import ClientUpdate, Message, RoundStart, SecAggMessage
from protocols.roster import Roster
from protocols.secagg import SecAggClient, SecAggConfig, SecAggConfigError, SecAggServer
from protocols.secagg.fixedpoint import RING_MASK, dequantise_sum, levels, quantise, to_signed
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
from protocols.secagg.server import Deliver, ServerPhase

Sign = Callable[[bytes], bytes]
Verify = Callable[[str, bytes, bytes], bool]
COHORT_META = "secagg_cohort"  # RoundStart meta: the asked clients, comma-separated (names have no commas)
PLAIN_BITS_MAX = 24  # masking off: quantised integers travel as float32, exact up to 2^24
_CLIENT_KINDS = (AdvertiseKeys, ShareKeys, MaskedInput, ConsistencySignature, UnmaskShares)


@dataclass(frozen=True, kw_only=True)
class SecureAggregationConfig(SecAggConfig):
    """``[federation.secure_aggregation]``: protocols.secagg's settings, plus whether to mask."""

    masking: bool = True  # false: clip and quantise only, in the clear (a baseline; no privacy)

    def validate(self, num_clients: int | None = None) -> None:
        super().validate(num_clients)
        if not self.masking and self.bits > PLAIN_BITS_MAX:
            raise SecAggConfigError(f"secure_aggregation.bits must be <= {PLAIN_BITS_MAX} with masking = "
                                    f"false (integers travel as float32), not {self.bits}")

    def total_timeout_s(self) -> float:
        """The five rounds' deadlines together: the longest a masked round can take (s)."""
        return (self.advertise_timeout_s + self.share_timeout_s + self.masked_input_timeout_s
                + self.consistency_timeout_s + self.unmask_timeout_s)


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


def quantise_update(delta: torch.Tensor, config: SecAggConfig) -> np.ndarray:
    """A client's delta clipped and quantised into the ring (int64 in [0, 2^32))."""
    return quantise(delta.detach().to("cpu", torch.float64).numpy(), clip_value=config.clip_value,
                    bits=config.bits)


def mean_of_sum(ring_sum: np.ndarray, count: float, config: SecAggConfig, like: torch.Tensor) -> torch.Tensor:
    """The unweighted mean update of ``count`` clients from their sum in the ring, as ``like``
    (distributed DP: ``count`` is the expected cohort, not the survivors)."""
    total = dequantise_sum(ring_sum, clip_value=config.clip_value, bits=config.bits)
    return torch.from_numpy(total / count).to(like)


def _tally(counters: Counter[str], prefix: str, counts: Mapping[str, int]) -> None:
    for key, value in counts.items():
        counters[f"{prefix}{key}"] += value


# ------------------------------------------------------------------ the gateway's side


@dataclass(frozen=True)
class SecureOutcome:
    """How a masked round ended: the survivors and their mean update, or a failure."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    mean: torch.Tensor | None  # None: the round failed (``failure`` says why)
    failure: str = ""


class SecureServer:
    """The gateway's SecAgg per FedAvg round; ``verify`` checks a member's roster signature."""

    ACCEPTS: frozenset[type[Message]] = frozenset({SecAggMessage})

    def __init__(self, config: SecureAggregationConfig, *, run_id: str, verify: Verify,
                 like: torch.Tensor) -> None:
        self.config = config
        self.run_id = run_id
        self.verify = verify
        self.like = like  # the global model: its size and dtype
        self.round_index = -1
        self.machine: SecAggServer | None = None
        self.mean: torch.Tensor | None = None  # the last masked round's mean, until taken
        # distributed DP (distributed_dp.py; the FedAvg server sets both): the clients' noise
        # settings, and the open round's fixed denominator q N (None: divide by the survivors)
        self.privacy: DifferentialPrivacyConfig | None = None
        self.divide_by: float | None = None
        self.counters: Counter[str] = Counter()  # what the FedAvg server adds to its own (drain)
        # round -> [(phase, seconds it took)], in order: the time each of the five rounds cost
        self.phase_s: dict[int, list[tuple[str, float]]] = {}
        self._phase_began_s = 0.0

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
        """A round opens for ``asked``: RoundStart's extra meta, and the timer of its first deadline."""
        self._retire()
        self.round_index = round_index
        self.mean = None
        meta = {COHORT_META: ",".join(sorted(asked))}
        if not self.masking:
            return meta, []
        try:
            self.machine = SecAggServer(self.config, run_id=self.run_id, round_index=round_index,
                                        cohort=frozenset(asked), numel=self.like.numel(), verify=self.verify,
                                        now_s=now_s)
        except SecAggConfigError:  # too few or too many asked for the ring: round_timeout_s closes it
            self.counters["secagg_round_not_started"] += 1
            return meta, []
        self.phase_s[round_index] = []
        self._phase_began_s = now_s
        return meta, [SetTimer(self.timer_key(), self.machine.deadline_s)]

    def receive(self, sender: str, message: SecAggMessage,
                now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        inner = unwrap(message)
        if isinstance(inner, Malformed):
            self.counters["secagg_refused_malformed"] += 1
            return [], None
        if self.machine is None or message.round != self.round_index:
            self.counters["secagg_refused_no_round"] += 1
            return [], None
        if not isinstance(inner, _CLIENT_KINDS):
            self.counters["secagg_refused_wrong_kind"] += 1
            return [], None
        phase = self.machine.phase
        return self._after(phase, self.machine.receive(sender, inner, now_s), now_s)

    def tick(self, key: str, now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        if self.machine is None or key != self.timer_key():
            return [], None
        phase = self.machine.phase
        return self._after(phase, self.machine.tick(now_s), now_s)

    def _after(self, phase: ServerPhase, deliveries: list[Deliver],
               now_s: float) -> tuple[list[Action], SecureOutcome | None]:
        """``phase``: the machine's before the message or tick that gave ``deliveries``."""
        machine = self.machine
        assert machine is not None
        if machine.phase is not phase:  # ``phase`` closed: the time it took
            self.phase_s[self.round_index].append((phase.name.lower(), now_s - self._phase_began_s))
            self._phase_began_s = now_s
        actions: list[Action] = [Send((d.recipient,), wrap(self.round_index, d.message)) for d in deliveries]
        if not machine.finished:
            return [*actions, SetTimer(self.timer_key(), machine.deadline_s)], None
        result = machine.result
        self._retire()
        if result is None:
            return actions, SecureOutcome((), (), None, machine.failure)
        divisor = self.divide_by or len(result.survivors)
        self.mean = mean_of_sum(result.ring_sum, divisor, self.config, self.like)
        return actions, SecureOutcome(result.survivors, result.dropped, self.mean)

    def _retire(self) -> None:
        """The round's machine is done (or replaced): its counts go to ours."""
        if self.machine is not None:
            _tally(self.counters, "secagg_refused_", self.machine.refused)
            _tally(self.counters, "secagg_", self.machine.counters)
            self.machine = None

    def decode_update(self, update: ClientUpdate) -> torch.Tensor:
        """A plain ClientUpdate's quantised integers (masking off); BadParts when it must be refused."""
        if self.masking:
            raise BadParts("unmasked", "secure aggregation takes masked inputs only")
        values = update.tensors.get("q")
        if set(update.tensors) != {"q"} or values is None or values.dim() != 1 \
                or values.numel() != self.like.numel() or values.dtype != torch.float32:
            raise BadParts("shape", "expected one float32 vector 'q' of the model's size")
        limit = levels(self.config.bits) if self.privacy is None \
            else distributed_dp.plain_limit(self.privacy, self.config)  # the noise share on top
        if not bool(torch.isfinite(values).all()) or bool((values.abs() > limit).any()) \
                or not bool((values == values.round()).all()):
            raise BadParts("not_quantised", f"expected integers within +-{limit}")
        return values

    def aggregate(self, taken: Mapping[str, tuple[torch.Tensor, int]]) -> torch.Tensor:
        """The round's mean update: the masked round's, or (masking off) the ring sum of the
        taken integers, dequantised and divided by their number, exactly as a masked round does."""
        if self.masking:
            assert self.mean is not None, "a masked round aggregates only after its SecureOutcome"
            return self.mean
        total = np.zeros(self.like.numel(), dtype=np.int64)
        for name in sorted(taken):
            total = (total + taken[name][0].to(torch.int64).numpy()) & RING_MASK
        return mean_of_sum(total, self.divide_by or len(taken), self.config, self.like)


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
        self.machine: SecAggClient | None = None
        self.counters: Counter[str] = Counter()
        # distributed DP (distributed_dp.py): set by the FedAvg client from the federation config
        self.privacy: DifferentialPrivacyConfig | None = None

    def drain(self) -> Counter[str]:
        counts, self.counters = self.counters, Counter()
        return counts

    def start(self, start: RoundStart, now_s: float) -> list[Action]:
        """RoundStart taken: advertise this round's keys (masking on)."""
        self._retire()
        self.round_index = start.round
        if not self.config.masking:
            return []
        cohort = start.meta.get(COHORT_META)
        if not isinstance(cohort, str) or self.name not in cohort.split(","):
            self.counters["secagg_no_cohort"] += 1
            return []
        self.machine = SecAggClient(self.config, name=self.name, run_id=self.run_id, round_index=start.round,
                                    cohort=frozenset(cohort.split(",")), client_secret=self.client_secret,
                                    sign=self.sign, verify=self.verify)
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
            quantised = quantise_update(delta, self.config)
        else:  # distributed DP: clipped to C, quantised, plus this client's noise share
            noise = distributed_dp.noise_generator(self.client_secret, self.run_id, round_index)
            quantised = distributed_dp.noised_input(delta, self.privacy, self.config, noise)
        if not self.config.masking:
            signed = torch.from_numpy(to_signed(quantised)).to(torch.float32)
            return [Send((self.server,), ClientUpdate(round=round_index, num_samples=num_samples,
                                                      tensors={"q": signed}))]
        if self.machine is None or round_index != self.round_index:
            self.counters["secagg_no_round_to_upload"] += 1
            return []
        return self._send(self.machine.provide_input(quantised, now_s))

    def _send(self, messages: Sequence[SecAggWire]) -> list[Action]:
        for message in messages:  # what it sent (a status shows how far its round went)
            self.counters[f"secagg_sent_{type(message).__name__}"] += 1
        return [Send((self.server,), wrap(self.round_index, m)) for m in messages]

    def _retire(self) -> None:
        if self.machine is not None:
            _tally(self.counters, "secagg_abort_", self.machine.aborts)
            _tally(self.counters, "secagg_refused_", self.machine.refused)
            self.machine = None
