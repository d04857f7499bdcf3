"""Work lost to a kill is bounded by the checkpoint interval, measured against the step the killed
process had reached (issue 16: a restarted peer that adopted a neighbour's state wrote no
checkpoint of it, and its schedule's first decision only set a baseline, so a kill soon after
lost the whole jump: 1,100-1,300 steps with a checkpoint every step).

A real daemon's pieces are driven in-process (its transport a recorder, as in
test_daemon_limits.py): a state sync adopted from both neighbours, training, periodic saves
as the loop makes them, then a new daemon on the same data folder, as after ``kill -9``.
"""

from __future__ import annotations

import pytest
import torch

from peer.runtime.daemon import PeerDaemon
from peer.runtime.netinit import NetworkFiles
from peer.runtime.peerconfig import load_peer_config
from protocols.messages import StateSyncResponse
from protocols.node import Adoption
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule
from protocols.node.member import WorkPoint
from tests._daemon_support import make_network
from tests.test_daemon_limits import RecordingTransport, deliver, launch

torch.set_num_threads(1)

JUMP = 1300     # the step a state sync moves a restarted peer to


def test_the_schedule_counts_from_the_step_on_disk() -> None:
    schedule = CheckpointSchedule(CheckpointConfig(every_steps=10))
    schedule.saved(100, 0.0)                         # resumed from step 100
    assert not schedule.should_save(109, 1.0) and schedule.should_save(110, 1.0)
    schedule.saved(110, 1.0)
    assert schedule.should_save(JUMP, 1.0)           # a jump: due at once, not a baseline
    fresh = CheckpointSchedule(CheckpointConfig(every_steps=10), start_step=0)
    assert fresh.should_save(10, 0.0)                # the very first decision saves by the interval


def test_a_step_set_forward_makes_a_checkpoint_due_at_once_whatever_the_interval() -> None:
    # the daemon and the simulator both ask here (one rule): a jump shorter than the interval too
    schedule = CheckpointSchedule(CheckpointConfig(every_steps=100, every_s=60.0), start_step=50)
    assert not schedule.should_save(52, 0.0)
    schedule.step_set(52, 52)                        # the same step: no jump
    schedule.step_set(52, 40)                        # backwards (never asked of it): no jump either
    assert not schedule.jumped and not schedule.should_save(52, 1.0)
    schedule.step_set(52, 60)
    assert schedule.jumped and schedule.should_save(60, 1.0)
    schedule.saved(60, 1.0)
    assert not schedule.jumped and not schedule.should_save(61, 2.0)


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> NetworkFiles:
    return make_network(tmp_path_factory.mktemp("lost"), peers=4, steps=2 * JUMP,
                        sections={"checkpoint": {"every_steps": 5, "keep": 1}})


def daemon(network: NetworkFiles) -> PeerDaemon:
    found = PeerDaemon(load_peer_config(network.configs["p00"]))
    found.transport = RecordingTransport()  # type: ignore[assignment]
    return found


def test_an_adopted_state_sync_is_checkpointed_at_once_and_counts_from_there(network: NetworkFiles) -> None:
    """Lost work: a state sync that moves the step far ahead is written at once, and a restart's
    interval counts from the step it resumed, not from its first decision."""
    every = 5
    peer = daemon(network)
    try:
        launch(peer, sync=True)
        for name in ("p01", "p03"):
            peer.neighbours[name].up = True
        peer._beat()        # both heard: it asks them
        local = peer.config.gossip.local_steps
        for name in ("p01", "p03"):
            answer = StateSyncResponse(round=JUMP // local, tensors={"params": peer.trainer.mixed.clone()},
                                       meta={"round": JUMP // local, "steps_done": JUMP})
            deliver(peer, name, answer)
        assert peer.node.adoption is Adoption.ADOPTED and peer.trainer.step == JUMP
        assert peer._snapshot()["checkpoint_step"] == JUMP      # before any training or periodic save
        reached = JUMP
        for _ in range(every + 2):     # trains on; its checkpoints, as its work points make them
            peer._feed(WorkPoint(1))
            peer.trainer.run_steps(1)
            reached = peer.trainer.step
    finally:
        peer.parts.lock.release()
    again = daemon(network)           # the process killed at `reached` (nothing more written)
    try:
        assert again._restore()
        assert again.trainer.step > JUMP and reached - again.trainer.step <= every
        resumed = again.trainer.step
        launch(again, sync=False, resumed=True)
        assert not again.member.saves.should_save(resumed + every - 1, again.now())
        assert again.member.saves.should_save(resumed + every, again.now())    # its first decision counts
    finally:
        again.parts.lock.release()
