"""FedAvg rounds between gossip rounds on a gateway: one rule for the daemon and the simulator.

A gateway's Node holds a gossip machine (over the gateways' graph) and the
FedAvg server as a role, both on one flat vector. The gossip machine runs
with ``mixing = "after"``: each of its rounds is *work*, then an exchange and
a mix. On a gateway the work of every ``gossip_rounds``-th gossip round is one
FedAvg round (the server is resumed and the work is done when it closes); the
work of the others is nothing. So the sequence is a FedAvg round, then
``gossip_rounds`` exchanges, the last one's result being what the next FedAvg
round sends its clients. ``gossip_rounds = 0``: no gossip (each gateway is its
own graph, every round's work a FedAvg round).
"""

from __future__ import annotations


def fedavg_round_due(gossip_round: int, gossip_rounds: int) -> bool:
    """Whether the work of gossip round ``gossip_round`` (0-based) is a FedAvg round."""
    if gossip_round < 0:
        raise ValueError(f"gossip_round must be >= 0, not {gossip_round}")
    return gossip_rounds <= 1 or gossip_round % gossip_rounds == 0


def gossip_total_rounds(fedavg_rounds: int, gossip_rounds: int) -> int:
    """The gossip machine's rounds (its ``total_steps`` at one step per round): ``gossip_rounds``
    per FedAvg round (one when there is no gossip)."""
    return fedavg_rounds * max(1, gossip_rounds)
