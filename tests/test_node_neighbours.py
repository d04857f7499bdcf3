"""The failure detector both drivers host (protocols/node/neighbours.py): up, down, finished, absent."""

from __future__ import annotations

from protocols.node import Neighbour, Neighbourhood, Presence


def _hood(timeout_s: float = 5.0) -> Neighbourhood[Neighbour]:
    return Neighbourhood({name: Neighbour() for name in ("p03", "p01")}, timeout_s=timeout_s)


def test_a_neighbour_comes_up_once_when_heard_and_reachable() -> None:
    hood = _hood()
    assert hood.names() == ("p01", "p03")
    assert hood.presence() == {"p01": Presence.NEVER_HEARD, "p03": Presence.NEVER_HEARD}
    assert not hood.heard("p01", 1.0, reachable=False)  # heard but not reachable yet: not up
    assert hood["p01"].last_seen == 1.0 and not hood["p01"].up
    assert hood.heard("p01", 1.5)                         # up now: the caller feeds NeighbourUp
    assert not hood.heard("p01", 2.0)                     # already up: nothing new
    assert not hood.heard("p99", 2.0)                     # not a neighbour: ignored
    assert "p99" not in hood
    assert hood.absent() == ["p03"] and not hood.all_up()


def test_silence_past_the_timeout_is_down_once_and_a_finished_one_is_finished() -> None:
    hood = _hood(timeout_s=5.0)
    hood.heard("p01", 0.0)
    hood.heard("p03", 0.0)
    hood.beat("p03", step=40, finished=True)
    assert hood.expire(5.0) == []                         # not past the timeout yet
    hood.heard("p01", 4.0)
    assert hood.expire(5.5) == ["p03"]                    # p01 was heard at 4.0
    assert hood.expire(6.0) == []                         # down once
    assert hood.presence() == {"p01": Presence.UP, "p03": Presence.FINISHED}
    assert hood["p03"].step == 40
    assert hood.expire(9.5) == ["p01"]
    assert hood.presence()["p01"] is Presence.DOWN
    assert hood.heard("p01", 10.0)                        # back: up again


def test_a_goodbye_is_down_at_once() -> None:
    hood = _hood()
    hood.heard("p01", 0.0)
    assert hood.goodbye("p01")
    assert not hood.goodbye("p01")                        # told once
    assert not hood.goodbye("p03")                        # never up: nothing to tell
    assert hood.absent() == ["p01", "p03"]
