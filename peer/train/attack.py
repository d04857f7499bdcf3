"""What an attacking federation client does to its trained model and its upload: one definition
for both drivers.

The simulator's attackers (a scenario's ``[federation] attack = {e003 = "signflip:10"}``,
sim/federation.py) and a real edge client under a test hook (peer/runtime/testhooks.py's
``signflip`` and ``attack`` actions, peer/runtime/edge.py) train honestly; then

- ``signflip:<scale>`` turns the trained model into ``anchor - scale * (trained - anchor)``
  before their FedAvg client takes the delta: the upload is ``-scale`` times the honest update;
- ``claim:<n>`` sends ``num_samples = n`` whatever the shard holds;
- ``norms:<factor>`` multiplies the upload's compression norms (its float tensors named
  ``.../norms``: qsgd's scale) by ``factor``, so the delta decodes ``factor`` times as long;
- ``value:<v>`` sets the first float of the upload's first float tensor to ``v`` (qsgd: its
  first norm, so that bucket decodes up to ``v``; identity: the delta's first coordinate);
- ``secagg:<behaviour>@<round>`` makes it the SecAgg insider of protocols/secagg/insider.py
  (``garbage_shares``, ``wrong_secret``, ``false_accusation``, ``extreme_input``) in federation
  round ``round``; without ``@<round>``, in every round.

A spec joins parts with commas: ``signflip:3,claim:1000000000``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from protocols.messages import ClientUpdate, Message
from protocols.secagg.insider import BEHAVIOURS


@dataclass(frozen=True)
class Attack:
    """One attacker's behaviour (every field's zero: honest)."""

    flip_scale: float = 0.0  # > 0: upload -flip_scale times the honest update
    claim_samples: int = 0  # > 0: claim this num_samples
    norm_factor: float = 0.0  # > 0: the upload's compression norms times this
    value: float = 0.0  # != 0: the upload's first float is this
    secagg: tuple[tuple[int, str], ...] = ()  # (round or -1: every round, SecAgg insider behaviour)

    @property
    def forges(self) -> bool:
        """Whether the upload itself is changed (not only the trained model)."""
        return bool(self.claim_samples or self.norm_factor or self.value)


def parse_attack(spec: str) -> Attack:
    """The attack of ``spec``: comma-separated ``signflip:<scale>``, ``claim:<n>``, ``norms:<factor>``,
    ``value:<v>``; an empty spec is honest."""
    attack = Attack()
    for part in spec.split(",") if spec.strip() else ():
        kind, _, text = part.strip().partition(":")
        if kind == "secagg":
            attack = dataclasses.replace(attack, secagg=(*attack.secagg, _secagg_part(spec, text)))
            continue
        try:
            number = float(text or "1")
        except ValueError:
            number = math.nan
        match kind:
            case "signflip" if 0 < number < math.inf:
                attack = dataclasses.replace(attack, flip_scale=number)
            case "claim" if 1 <= number < 2**63:
                attack = dataclasses.replace(attack, claim_samples=int(number))
            case "norms" if 0 < number < math.inf:
                attack = dataclasses.replace(attack, norm_factor=number)
            case "value" if math.isfinite(number) and number != 0:
                attack = dataclasses.replace(attack, value=number)
            case _:
                raise ValueError(f"attack {spec!r}: expected comma-separated 'signflip:<scale>' (scale > 0), "
                                 "'claim:<n>' (n >= 1), 'norms:<factor>' (> 0), 'value:<v>' (finite, not 0); "
                                 "e.g. 'signflip:10'")
    return attack


def _secagg_part(spec: str, text: str) -> tuple[int, str]:
    behaviour, at, round_text = text.partition("@")
    if behaviour not in BEHAVIOURS or (at and not round_text.isdigit()):
        raise ValueError(f"attack {spec!r}: expected 'secagg:<behaviour>[@<round>]', behaviour one of "
                         f"{BEHAVIOURS}, e.g. 'secagg:garbage_shares@2'")
    return (int(round_text) if at else -1), behaviour


def sign_flip(params: torch.Tensor, anchor: torch.Tensor, scale: float) -> None:
    """``params <- anchor - scale * (params - anchor)`` in place: the round's update, flipped and scaled."""
    params.copy_(anchor - scale * (params - anchor))


def forge(message: Message, attack: Attack) -> Message:
    """``message`` as the attacker sends it: a ``ClientUpdate`` with its claim, norms and value
    forged (a new message; the tensors are copies); any other message as it is."""
    if not isinstance(message, ClientUpdate) or not attack.forges:
        return message
    tensors = {key: tensor.clone() for key, tensor in message.tensors.items()}
    floats = [key for key in sorted(tensors) if tensors[key].is_floating_point()]
    if attack.norm_factor:
        for key in floats:
            if key.endswith("norms"):
                tensors[key] *= attack.norm_factor
    if attack.value and floats:
        tensors[floats[0]].view(-1)[0] = attack.value
    claim = attack.claim_samples or message.num_samples
    return dataclasses.replace(message, num_samples=claim, tensors=tensors)
