"""GossipConfig: one frozen, keyword-only description of a gossip run, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Algorithm = Literal["dpsgd", "local", "choco", "pushsum", "adpsgd"]
Outer = Literal["none", "diloco"]
Mixing = Literal["overlap", "after"]

MIXINGS: tuple[str, ...] = ("overlap", "after")

ALGORITHMS: tuple[str, ...] = ("dpsgd", "local", "choco", "pushsum", "adpsgd")

# Operators whose output is not a usable approximation of a whole parameter
# vector: only CHOCO (which compresses the *difference* to a public copy) may use them.
SPARSIFYING_OPERATORS: tuple[str, ...] = ("topk", "topk-approx", "randomk", "sign", "powersgd")


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    """What every peer of a gossip run must agree on (it is part of the run id).

    Steps are local optimiser steps; a *round* is one exchange with the
    neighbours (every ``local_steps`` steps). Times are seconds of the
    driver's clock (wall clock for the daemon, virtual for the simulator).
    """

    algorithm: Algorithm = "dpsgd"  # D-PSGD: the reference decentralised SGD (Lian et al. 2017)
    local_steps: int = 1  # H, steps between exchanges; D-PSGD is H = 1, local SGD H > 1
    mixing: Mixing = "overlap"  # "overlap": send before the steps (hides the exchange); "after": local SGD
    total_steps: int = 1000  # local steps per peer before the final gossip rounds
    duration_s: float = 0.0  # 0 = no limit; else stop training this long after Start (asynchronous runs)
    compression: str = "identity"  # protocols.compress spec; sparsifiers need algorithm = "choco"
    # CHOCO's gamma; 0 = chosen at start-up from W and the compressor (protocols/gossip/consensus_step.py)
    consensus_step: float = 0.0
    choco_full_start: bool = True  # CHOCO's round 0 is uncompressed: public copies start exact, not at 0
    deadline_s: float = 10.0  # how long a peer whose work is done waits for a missing neighbour
    max_rounds_ahead: int = 4  # messages for later rounds are buffered up to this far ahead (memory bound)
    # f, the lying in-neighbours a catch-up tolerates: f + 1 distinct ones claiming a far round make a peer
    # jump there; one alone moves it no further than its own pace since (catchup.py); -1 = 1; 0 trusts one
    byzantine_neighbours: int = -1
    final_gossip_rounds: int = 0  # gossip-only rounds after training that drive the peers to consensus
    outer: Outer = "none"  # "diloco": Nesterov outer step on the averaged pseudo-gradient
    outer_lr: float = 0.7  # DiLoCo's outer learning rate (Douillard et al. 2023)
    outer_momentum: float = 0.9  # DiLoCo's Nesterov momentum
    outer_every: int = 100  # local steps between outer steps; a multiple of local_steps
    norm_multiple: float = 10.0  # refuse updates over this x the other senders' median (robust.py); 0 = off
    # dpsgd and local: round messages carry the filter's far reports, and a far half they vouch for is
    # clipped to the filter's bound, not refused: a long split re-joins (robust.py). Off by default:
    # two insiders' far values vouch for each other (robust.py, "A split healed")
    far_reports: bool = False
    # ClippedGossip (He, Karimireddy & Jaggi 2022; dpsgd and local): each round the differences of the
    # farthest this many in-neighbours are clipped to the distance of the next one (mixing.py); 0 = off
    clip_neighbours: int = 0
    seed: int = 0  # root of the counter-based randomness (partner choice, stochastic compressors)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")
        if self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, not {self.local_steps}")
        if self.algorithm == "dpsgd" and self.local_steps != 1:
            raise ValueError("algorithm 'dpsgd' gossips after every step: local_steps must be 1 "
                             "(use algorithm 'local' for H > 1)")
        if self.mixing not in MIXINGS:
            raise ValueError(f"mixing must be one of {', '.join(MIXINGS)}, not {self.mixing!r}")
        if self.mixing == "after" and self.algorithm in ("choco", "adpsgd"):
            raise ValueError(f"mixing 'after' is for algorithms dpsgd, local and pushsum; {self.algorithm!r} "
                             "mixes as it goes (use mixing 'overlap')")
        if self.total_steps < 0:
            raise ValueError(f"total_steps must be >= 0, not {self.total_steps}")
        if self.duration_s < 0:
            raise ValueError(f"duration_s must be >= 0 (0 = no limit), not {self.duration_s}")
        if not self.compression.strip():
            raise ValueError("compression must be a spec such as 'identity' or 'topk:fraction=0.01'")
        operator = self.compression.split(":", 1)[0].strip()
        if operator in SPARSIFYING_OPERATORS and self.algorithm != "choco":
            raise ValueError(f"compression {operator!r} does not approximate a whole parameter vector; "
                             "use it with algorithm 'choco'")
        if not 0.0 <= self.consensus_step <= 1.0:
            raise ValueError(f"consensus_step must be in (0, 1] (0: chosen automatically), "
                             f"not {self.consensus_step}")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, not {self.deadline_s}")
        if self.max_rounds_ahead < 1:
            raise ValueError(f"max_rounds_ahead must be >= 1, not {self.max_rounds_ahead}")
        if self.byzantine_neighbours < -1:
            raise ValueError(f"byzantine_neighbours must be >= 0 (-1: chosen from the in-degree), "
                             f"not {self.byzantine_neighbours}")
        if self.final_gossip_rounds < 0:
            raise ValueError(f"final_gossip_rounds must be >= 0, not {self.final_gossip_rounds}")
        if self.outer not in ("none", "diloco"):
            raise ValueError(f"outer must be 'none' or 'diloco', not {self.outer!r}")
        if not self.outer_lr > 0:
            raise ValueError(f"outer_lr must be > 0, not {self.outer_lr}")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ValueError(f"outer_momentum must be in [0, 1), not {self.outer_momentum}")
        if self.outer == "diloco" and (self.outer_every < 1 or self.outer_every % self.local_steps):
            raise ValueError(f"outer_every ({self.outer_every}) must be a positive multiple of "
                             f"local_steps ({self.local_steps})")
        if self.norm_multiple < 0:
            raise ValueError(f"norm_multiple must be >= 0 (0 = off), not {self.norm_multiple}")
        if self.clip_neighbours < 0:
            raise ValueError(f"clip_neighbours must be >= 0 (0 = off), not {self.clip_neighbours}")
        if self.far_reports and self.algorithm not in ("dpsgd", "local"):
            raise ValueError(f"far_reports clips whole models' differences: algorithms dpsgd and local, "
                             f"not {self.algorithm!r}")
        if self.clip_neighbours and self.algorithm not in ("dpsgd", "local"):
            raise ValueError(f"clip_neighbours (ClippedGossip) clips whole models' differences: algorithms "
                             f"dpsgd and local, not {self.algorithm!r}")

    @property
    def compressed(self) -> bool:
        """True when messages go through a compression operator (anything but 'identity')."""
        return self.compression.strip() != "identity"
