"""Every message kind hivemesh speaks, as frozen dataclasses (the body only).

A message says *what* is sent; the envelope (sender, recipients, run id,
epoch, sequence number, signature) is added by :mod:`protocols.codec` and is
invisible to the algorithms. A round-bearing gossip message also says which
roster version its sender applies to that round (``roster_version``): the
Node stamps it on what its machine sends and refuses a message whose version
differs from its own for that round (protocols/node/membership.py).
Tensors travel as raw frames; ``meta`` carries small scalars such as a
compressor's name and parameters. Field names are the
wire names, so renaming a field is a protocol change (bump PROTOCOL_VERSION).

Versions: a peer accepts every version from MIN_PROTOCOL_VERSION to
PROTOCOL_VERSION and speaks to each neighbour the highest one both accept
(protocols/wire.py), so a network is upgraded one member at a time. What each
version added is in FIELD_SINCE: a field introduced after the version spoken is
left out (the receiver takes its default), and a version-3 receiver, which
refuses fields it does not know, never sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

PROTOCOL_VERSION = 4  # 2: Heartbeat.finished; 3: roster_version in round-bearing messages;
#                       4: Heartbeat.roster_version
MIN_PROTOCOL_VERSION = 3  # the oldest version still spoken: a member one version behind interoperates

# (kind, field) -> the version that introduced it; encoded only for receivers of that version or later
FIELD_SINCE: Mapping[tuple[str, str], int] = {("heartbeat", "roster_version"): 4}

Scalar = int | float | str | bool
TensorMap = Mapping[str, torch.Tensor]
Meta = Mapping[str, Scalar]


def _no_tensors() -> dict[str, torch.Tensor]:
    return {}


def _no_meta() -> dict[str, Scalar]:
    return {}


@dataclass(frozen=True)
class ParamPush:
    """Gossip: the sender's (possibly compressed) parameters or update for ``round``.

    ``want_reply`` asks the receiver to answer with its own ParamPush for the
    same round (push-pull pairwise gossip).
    """

    KIND: ClassVar[str] = "param_push"
    round: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)
    want_reply: bool = False
    roster_version: int = 1  # the sender's roster version for ``round`` (the Node stamps and checks it)


@dataclass(frozen=True)
class ParamPull:
    """Gossip: ask a neighbour for its parameters of ``round`` (answered by ParamPush)."""

    KIND: ClassVar[str] = "param_pull"
    round: int
    roster_version: int = 1  # the sender's roster version for ``round``


@dataclass(frozen=True)
class StateSyncRequest:
    """A joiner (or a restarted peer) asks a neighbour for its current state."""

    KIND: ClassVar[str] = "state_sync_request"
    reason: str = "join"


@dataclass(frozen=True)
class StateSyncResponse:
    """The current parameters plus what the algorithm needs (e.g. CHOCO's public copies)."""

    KIND: ClassVar[str] = "state_sync_response"
    round: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)
    roster_version: int = 1  # the answerer's roster version for ``round``: a joiner adopts only its own


@dataclass(frozen=True)
class Heartbeat:
    """Liveness plus a little progress, so neighbours can show last-seen and latency.

    ``finished``: the sender has finished its run (sent during its finish grace), so its
    neighbours record it as finished, not down, once it goes silent; from an edge client that
    stops, its farewell: its gateway waits for it no more (``Node.farewell``). ``roster_version``: the
    newest roster version the sender knows, so a member that has not yet read a later roster
    file (a key rotated or revoked there) is told, by a neighbour that has."""

    KIND: ClassVar[str] = "heartbeat"
    step: int
    loss: float = float("nan")
    sent_at_s: float = 0.0
    finished: bool = False
    roster_version: int = 0  # (version 4) the sender's current roster version, 0: not told (version 3)


@dataclass(frozen=True)
class RoundStart:
    """FedAvg: the gateway's global model and the work asked of a sampled client.

    ``round``: the round (FedBuff: the model version). ``meta``: the downlink encoding of the
    model plus ``local_epochs``, ``local_steps`` (one of them > 0) and ``prox_mu``
    (protocols/federation). ``deadline_s``: seconds the round stays open from when it was
    sent (a duration: the two clocks are not compared)."""

    KIND: ClassVar[str] = "round_start"
    round: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)
    deadline_s: float = 0.0


@dataclass(frozen=True)
class ClientUpdate:
    """FedAvg: a client's (compressed) update after local training, weighted by ``num_samples``.

    The tensors are the delta (trained minus the model of ``round``), under the uplink's encoding;
    the server caps ``num_samples`` (protocols/federation/influence.py)."""

    KIND: ClassVar[str] = "client_update"
    round: int
    num_samples: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)


@dataclass(frozen=True)
class RoundResult:
    """FedAvg: the aggregated model of a finished round (sent with the final model when the
    federation ends; ``round``: the rounds or versions made)."""

    KIND: ClassVar[str] = "round_result"
    round: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)


@dataclass(frozen=True)
class SecAggMessage:
    """FedAvg with secure aggregation: one of protocols/secagg's nine messages, for ``round``.

    The body is msgpack of ``protocols.secagg.messages.to_wire`` in one uint8 tensor ``body``: a
    masked input weighs 4 bytes per parameter, so it travels as payload frames, not in the header
    (protocols/federation/secure.py wraps and unwraps it; untrusted bodies give data, not errors)."""

    KIND: ClassVar[str] = "secagg"
    round: int
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)


@dataclass(frozen=True)
class ErrorReply:
    """A refusal the receiver tells the sender about (e.g. ``config_mismatch``)."""

    KIND: ClassVar[str] = "error"
    code: str
    detail: str = ""


@dataclass(frozen=True)
class SettingsRefusal:
    """We refuse the recipient's messages: its run id is not ours. ``meta`` holds our shared settings,
    flattened (protocols/settings_diff.py: dotted key -> words), so that it can name the first key
    where we part. The one kind accepted whatever run id it carries (protocols/codec.py): its point
    is that the two differ; it is still signed by a roster member and addressed to the receiver,
    and it changes nothing but what the receiver says. ``tensors``: none (meta travels with them)."""

    KIND: ClassVar[str] = "settings_refusal"
    tensors: TensorMap = field(default_factory=_no_tensors)
    meta: Meta = field(default_factory=_no_meta)


Message = (
    ParamPush
    | ParamPull
    | StateSyncRequest
    | StateSyncResponse
    | Heartbeat
    | RoundStart
    | ClientUpdate
    | RoundResult
    | SecAggMessage
    | ErrorReply
    | SettingsRefusal
)

MESSAGE_TYPES: tuple[type, ...] = (
    ParamPush, ParamPull, StateSyncRequest, StateSyncResponse, Heartbeat,
    RoundStart, ClientUpdate, RoundResult, SecAggMessage, ErrorReply, SettingsRefusal,
)
KINDS: dict[str, type] = {cls.KIND: cls for cls in MESSAGE_TYPES}  # type: ignore[attr-defined]
