"""What an attacking federation client does to its trained model: one definition for both drivers.

The simulator's attackers (a scenario's ``[federation] attack = {e003 = "signflip:10"}``,
sim/federation.py) and a real edge client under a test hook (peer/runtime/testhooks.py's
``signflip`` action, peer/runtime/edge.py) train honestly, then turn the trained model into
``anchor - scale * (trained - anchor)`` before their FedAvg client takes the delta: the upload
is ``-scale`` times the honest update (acceptance (d) of issue 12: sign-flipped, scaled by 10).
"""

from __future__ import annotations

import math

import torch


def parse_attack(spec: str) -> float:
    """``signflip:<scale>``: the client uploads ``-scale`` times its honest update. The scale."""
    kind, _, scale_text = spec.strip().partition(":")
    try:
        scale = float(scale_text or "1")
    except ValueError:
        scale = -1.0
    if kind != "signflip" or not 0 < scale < math.inf:
        raise ValueError(f"attack {spec!r}: expected 'signflip:<scale>' (scale > 0), e.g. 'signflip:10'")
    return scale


def sign_flip(params: torch.Tensor, anchor: torch.Tensor, scale: float) -> None:
    """``params <- anchor - scale * (params - anchor)`` in place: the round's update, flipped and scaled."""
    params.copy_(anchor - scale * (params - anchor))
