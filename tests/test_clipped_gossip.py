"""ClippedGossip (He, Karimireddy & Jaggi 2022), ``clip_neighbours``: the maths, the setting's checks,
and issue 14's acceptance (c) in the simulator: 8 peers on exponential:8, one Byzantine member
sending its model plus large noise or sign-flipped; with clipping the honest peers stay within
3 points of a clean run, with plain D-PSGD (no filter) they collapse."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from test_sim_gossip import gossip_scenario

from protocols.gossip import GossipConfig
from protocols.gossip.mixing import clip_radius, clipped_gossip
from sim.run import run_scenario


def test_the_radius_is_the_next_farthest_neighbours_distance() -> None:
    assert clip_radius([1.0, 5.0, 2.0, 9.0], 1) == 5.0
    assert clip_radius([1.0, 5.0, 2.0, 9.0], 2) == 2.0
    assert clip_radius([3.0, 7.0], 2) == 3.0          # no more candidates than clipped: the nearest
    assert clip_radius([], 1) == 0.0


def test_the_farthest_difference_is_clipped_to_the_radius_and_the_others_are_untouched() -> None:
    sent = torch.zeros(3)
    near, middle, far = torch.tensor([1.0, 0, 0]), torch.tensor([0, 2.0, 0]), torch.tensor([0, 0, -100.0])
    out, clipped = clipped_gossip(sent, [(0.25, near), (0.25, far), (0.25, middle)], 1)
    assert clipped == 1
    assert [w for w, _ in out] == [0.25, 0.25, 0.25]
    assert torch.equal(out[0][1], near) and torch.equal(out[2][1], middle)
    assert torch.allclose(out[1][1], torch.tensor([0, 0, -2.0]))   # the direction kept, its length 2


def test_the_setting_is_checked() -> None:
    assert GossipConfig(clip_neighbours=1).clip_neighbours == 1
    with pytest.raises(ValueError, match="clip_neighbours must be >= 0"):
        GossipConfig(clip_neighbours=-1)
    with pytest.raises(ValueError, match="dpsgd and local, not 'choco'"):
        GossipConfig(algorithm="choco", clip_neighbours=1)


@functools.cache
def honest_accuracies(seed: int, behaviour: str, clip: int) -> list[float]:
    attack: dict[str, Any] = {"noise_scale": 10.0} if behaviour == "noise" else {"sign_flip_scale": 1.0}
    result = run_scenario(gossip_scenario(
        graph={"spec": "exponential:8"}, steps=120, duration_s=60.0, eval_every_s=5.0, seed=seed,
        nodes={"step_time_ms": 20.0, "neighbour_timeout_s": 1.0,
               "behaviour": {} if behaviour == "honest" else {"p05": behaviour}},
        faults={"attack": attack},
        algorithm={"algorithm": "dpsgd", "deadline_s": 0.5, "norm_multiple": 0.0, "clip_neighbours": clip}))
    assert all(p["finished"] for p in result.peers.values())
    return [p["final_accuracy"] for p in result.peers.values() if p["behaviour"] == "honest"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("behaviour", ["noise", "sign-flip"])
def test_one_byzantine_member_is_held_off_by_clipping_and_ruins_plain_gossip(seed: int,
                                                                              behaviour: str) -> None:
    clean = honest_accuracies(seed, "honest", 0)
    clipped = honest_accuracies(seed, behaviour, 1)
    plain = honest_accuracies(seed, behaviour, 0)
    assert min(clean) > 0.9, clean                                   # the bar means something
    assert min(clipped) >= sum(clean) / len(clean) - 0.03, (clipped, clean)
    assert max(plain) < 0.5, plain                                    # the attack is real
    assert min(honest_accuracies(seed, "honest", 1)) >= min(clean) - 0.03   # little cost when honest
