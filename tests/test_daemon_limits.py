"""What a neighbour can make the daemon keep or do is bounded, and every refusal counted (no sockets:
a real daemon's dispatch is driven directly, its transport replaced by a recorder)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch

from peer.runtime.daemon import PeerDaemon
from peer.runtime.links import CLOCK_SKEW_MS, MAX_LATENCY_MS, heartbeat_latency_ms
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import PeerSection, load_peer_config
from protocols.events import Send, TimerFired
from protocols.messages import Heartbeat, Message, ParamPush, StateSyncRequest, StateSyncResponse
from protocols.node import Adoption
from protocols.node.member import SYNC_TIMER, Launch, Phase
from protocols.wire import Opened
from tests._daemon_support import make_network

torch.set_num_threads(1)


class RecordingTransport:
    """Stands in for peer.net.transport.Transport: every send to a reachable neighbour succeeds and is
    remembered (all are reachable unless the test says otherwise)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_sent_to: dict[str, int] = {}
        self.abandoned: dict[str, int] = {}
        self.hostile: Counter[str] = Counter()      # multipart arrivals (none here)
        self.refused: dict[str, int] = {}
        self.redialed: dict[str, int] = {}
        self.handshake_refused: dict[str, int] = {}
        self.connections: dict[str, int] = {}
        self.unreachable: set[str] = set()

    def send(self, recipient: str, frames: Any) -> bool:
        if recipient in self.unreachable:
            return False
        self.sent.append(recipient)
        return True

    def pending_sends(self) -> bool:
        return False

    def dial_down(self) -> dict[str, tuple[float, str]]:
        return {name: (0.0, "no route") for name in sorted(self.unreachable)}

    def wait_sent(self, timeout_s: float | None = None) -> bool:
        return True


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> NetworkFiles:
    return make_network(tmp_path_factory.mktemp("limits"), peers=4, steps=20)


@pytest.fixture
def fresh(network: NetworkFiles) -> Iterator[PeerDaemon]:
    """A new daemon for each test (no state carried from one test to the next), its transport a recorder,
    its member launched as a late joiner: it waits for its neighbours, then asks their state."""
    found = PeerDaemon(load_peer_config(network.configs["p00"]))
    found.transport = RecordingTransport()  # type: ignore[assignment]
    launch(found, sync=True)
    yield found
    found.parts.lock.release()      # the next test's daemon takes the same data directory


def launch(daemon: PeerDaemon, *, sync: bool, resumed: bool = False) -> None:
    """The member's process is up (``sync``: it asks its neighbours' state once it heard them;
    ``resumed``: from its checkpoint); the recorder forgets its first heartbeats."""
    daemon._feed(Launch(step=daemon.trainer.step, sync=sync, resumed=resumed, stamp_s=time.time()))
    cast(RecordingTransport, daemon.transport).sent.clear()


def deliver(daemon: PeerDaemon, sender: str, message: Message) -> None:
    daemon._dispatch(Opened(sender=sender, message=message, epoch=1, seq=0))


def test_the_daemon_under_test_has_two_ring_neighbours(fresh: PeerDaemon) -> None:
    assert sorted(fresh.neighbours) == ["p01", "p03"]


def test_early_messages_are_capped_per_neighbour_keeping_the_newest(fresh: PeerDaemon) -> None:
    cap = fresh.config.gossip.max_rounds_ahead + 1
    for r in range(1000):
        deliver(fresh, "p01", ParamPush(round=r))
    deliver(fresh, "p03", ParamPush(round=0))
    kept = [cast(ParamPush, message).round for message in fresh.node.early.held("p01")]
    assert kept == list(range(1000 - cap, 1000))
    assert len(fresh.node.early.held("p03")) == 1      # one neighbour's flood does not crowd out another
    assert fresh._snapshot()["rejections"]["early_overflow"] == 1000 - cap


def test_early_messages_from_non_neighbours_are_dropped_and_counted(fresh: PeerDaemon) -> None:
    for r in range(50):
        deliver(fresh, "p02", ParamPush(round=r))
    assert fresh.node.early.held("p02") == []
    assert fresh._snapshot()["rejections"]["early_not_neighbour"] == 50


def test_a_neighbour_heard_is_up_only_once_we_can_reach_it(fresh: PeerDaemon) -> None:
    # Its connection to us may be made before ours to it (it has just started): a round message
    # resent on NeighbourUp over a connection not yet made would be lost.
    transport: RecordingTransport = fresh.transport  # type: ignore[assignment]
    transport.unreachable.add("p01")
    deliver(fresh, "p01", Heartbeat(step=0, loss=0.0, sent_at_s=0.0))
    assert not fresh.neighbours["p01"].up and transport.sent == []
    transport.unreachable.clear()
    deliver(fresh, "p01", Heartbeat(step=0, loss=0.0, sent_at_s=0.0))
    assert fresh.neighbours["p01"].up and transport.sent == ["p01"]     # the heartbeat that tried


def test_state_sync_requests_are_answered_at_most_once_per_interval(network: NetworkFiles) -> None:
    fresh = PeerDaemon(load_peer_config(network.configs["p00"]))
    fresh.transport = RecordingTransport()  # type: ignore[assignment]
    try:
        for info in fresh.neighbours.values():
            info.up = True      # heard and reachable: it starts at once, and sends below are answers only
        launch(fresh, sync=False)
        assert fresh.member.phase is Phase.TRAINING
        for name in ("p01", "p03"):   # heard: up for its machine too (which resends them its round)
            deliver(fresh, name, Heartbeat(step=0, loss=0.0, sent_at_s=time.time()))
        fresh.transport.sent.clear()  # type: ignore[attr-defined]  # its first round's messages
        fresh.host.counters.messages_by_kind.clear()
        answered_at_most_once_per_interval(fresh)
    finally:
        fresh.parts.lock.release()


def answered_at_most_once_per_interval(fresh: PeerDaemon) -> None:
    sent = fresh.host.counters.messages_by_kind
    answers: list[str] = []     # the recipients of answers and refusals (its machine resends rounds too)
    port_send = fresh.host.port.send

    def send(action: Send) -> None:
        if action.message.KIND in ("state_sync_response", "error"):
            answers.extend(action.recipients)
        port_send(action)

    fresh.host.port.send = send  # type: ignore[method-assign]
    for _ in range(20):
        deliver(fresh, "p01", StateSyncRequest())
    deliver(fresh, "p03", StateSyncRequest())     # another requester has its own allowance
    # one answer each (the whole model); every refusal is a small "sync_refused" reply, so the
    # asker's sync does not wait for us
    assert sent["state_sync_response"] == 2 and sent["error"] == 19
    assert answers == ["p01"] * 20 + ["p03"]
    assert fresh._snapshot()["rejections"]["sync_request_too_often"] == 19
    fresh._t0 -= fresh.config.peer.sync_answer_interval_s     # the daemon's clock: the interval passes
    deliver(fresh, "p01", StateSyncRequest())
    assert sent["state_sync_response"] == 3
    deliver(fresh, "p02", StateSyncRequest())     # not a neighbour: never answered, nor told
    assert sent["state_sync_response"] == 3 and sent["error"] == 19 and answers[-1] == "p01"
    assert fresh._snapshot()["rejections"]["sync_request_not_neighbour"] == 1
    assert fresh._snapshot()["sync_answers_sent"] == 3


def sync_answer(numel: int, *, value: float = 0.5) -> StateSyncResponse:
    return StateSyncResponse(round=0, tensors={"params": torch.full((numel,), value)},
                             meta={"round": 0, "steps_done": 0})


def test_an_unusable_sync_answer_is_counted_and_the_wait_goes_on(fresh: PeerDaemon) -> None:
    numel = fresh.trainer.flat_params.numel()
    fresh.neighbours["p01"].up = fresh.neighbours["p03"].up = True   # both asked and up: both awaited
    fresh._beat()                                                   # the wait is over: it asks both
    assert fresh.member.phase is Phase.SYNCING and fresh.node.syncing
    deliver(fresh, "p01", sync_answer(numel + 1))
    assert fresh.node.syncing and fresh.node.adoption is None      # p03 has not answered yet
    assert fresh.node.sync.rejected["sync_answer_wrong_length"] == 1
    deliver(fresh, "p01", sync_answer(numel))   # one answer per neighbour and attempt: this one is late
    assert fresh.node.syncing and fresh._snapshot()["rejections"]["sync_answer_late"] == 1
    deliver(fresh, "p03", sync_answer(numel, value=math.nan))
    assert fresh.node.sync.rejected["sync_answer_nonfinite"] == 1
    assert fresh.node.syncing and fresh.node.adoption is None      # no usable answer: the wait goes on
    fresh._feed(TimerFired(SYNC_TIMER))                            # the next attempt
    deliver(fresh, "p03", sync_answer(numel))
    assert fresh.node.syncing                                      # p01, up, is waited for
    deliver(fresh, "p01", sync_answer(numel))
    assert not fresh.node.syncing and fresh.node.adoption is Adoption.ADOPTED
    assert torch.equal(fresh.trainer.flat_params.detach(), torch.full((numel,), 0.5))
    deliver(fresh, "p01", sync_answer(numel))   # an answer after we adopted: counted, not taken
    assert fresh._snapshot()["rejections"]["sync_answer_late"] == 2


@pytest.mark.parametrize("sent_at_s", [-math.inf, math.inf, math.nan, 1e300, -1e300, 10**400, 0.0])
def test_an_absurd_heartbeat_stamp_leaves_the_latency_alone(fresh: PeerDaemon, sent_at_s: float) -> None:
    info = fresh.neighbours["p01"]
    info.latency_ms = 12.5
    deliver(fresh, "p01", Heartbeat(step=3, sent_at_s=sent_at_s))
    assert info.latency_ms == 12.5
    assert info.step == 3
    assert fresh.counters.rejected["heartbeat_bad_latency"] == 1


def test_heartbeat_latency_is_the_stamps_age_within_bounds() -> None:
    assert heartbeat_latency_ms(99.5, 100.0) == 500.0
    assert heartbeat_latency_ms(100.0, 100.0) == 0.0
    assert heartbeat_latency_ms(100.5, 100.0) == 0.0   # another host's clock, a bit ahead
    assert heartbeat_latency_ms(100.0 + CLOCK_SKEW_MS / 1000 + 1, 100.0) is None   # from the future
    assert heartbeat_latency_ms(100.0 - MAX_LATENCY_MS / 1000 - 1, 100.0) is None


def test_a_negative_sync_answer_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="sync_answer_interval_s"):
        PeerSection(name="p00", key="k", roster="r", data_dir="d", sync_answer_interval_s=-1.0)
