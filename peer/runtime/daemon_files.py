"""The daemon's checkpoint files: what one holds, how a restart restores it, what it is named by.

When one is due is the member's (protocols/node/member.py), or a gateway's
rounds (peer/runtime/gateway.py). A checkpoint holds the trainer's state, the
machine's (and a gateway's server's: peer/runtime/gateway.py), the endpoint's
replay windows and the epoch; peer/files/statefiles.py's ``CheckpointStore``
writes it whole or not at all. A save that fails (a full disk) is said once,
counted in the status, and the peer trains on.
"""

from __future__ import annotations

from peer.runtime.daemon_parts import Daemon
from peer.runtime.gateway import protocol_state, restore_server, round_words, rounds_closed


def work_done(daemon: Daemon) -> int:
    """What a checkpoint is named by: the trainer's steps, or on a gateway, which trains nothing,
    its rounds (``GatewayWork.rounds_done``)."""
    if daemon.gateway_work is not None:
        return daemon.gateway_work.rounds_done(daemon.machine.position[1])
    return int(daemon.trainer.step)


def progress(daemon: Daemon) -> int:
    """How far this member is, in its own unit: a peer's trainer steps, a gateway's FedAvg rounds
    closed (``gateway.rounds_closed``)."""
    if daemon.gateway_work is not None:
        return rounds_closed(daemon.gateway_work)
    return int(daemon.trainer.step)


def progress_words(daemon: Daemon) -> str:
    """``step 120`` (a peer), ``round 6/10`` (a gateway: what its checkpoint holds, its status shows)."""
    if daemon.gateway_work is not None:
        return round_words(daemon.gateway_work)
    return f"step {daemon.trainer.step}"


def restore(daemon: Daemon) -> bool:
    """The latest checkpoint loaded, if there is one (what a dead writer left was cleared first)."""
    for line in daemon.recovered:
        daemon.status.say(f"{daemon.name}: checkpoints: {line}")
    state = daemon.store.load_latest()
    if state is None:
        return False
    trainer_state, machine_state, extra = state
    daemon.trainer.load_state_dict(trainer_state)
    daemon.machine.restore_state(restore_server(daemon.gateway_work, machine_state, daemon.config.data_dir))
    if daemon.gateway_work is not None:
        daemon.gateway_work.restarted()
    # the machine reports counters and gauges only when they change: start from where they are
    daemon.host.metrics.update({k: float(v) for k, v in daemon.machine.counters.items()})
    daemon.host.metrics.update(daemon.machine.gauges())
    endpoint_state = extra.get("endpoint")
    if isinstance(endpoint_state, dict):
        daemon.endpoint.restore_state(endpoint_state)
    daemon.status.say(f"{daemon.name}: resumed from checkpoint at {progress_words(daemon)} "
                      f"(epoch {daemon.parts.epoch})")
    if daemon.gateway is not None:
        daemon.gateway.saves.saved(work_done(daemon), daemon.now())  # counts from what is on disk
    return True


def checkpoint(daemon: Daemon, *, final: bool) -> bool:
    """Write one; False when it could not be (a full disk: said when it starts failing and when it
    writes again, counted in the status; the older ones stay). No wait for sends in flight: a
    checkpoint only reads tensors (docs/design/daemon.md)."""
    store = daemon.store
    failing = store.error
    reason = store.save(daemon.trainer.state_dict(), protocol_state(daemon.machine, daemon.gateway_work),
                        {"endpoint": daemon.endpoint.export_state(), "final": final,
                         "epoch": daemon.parts.epoch}, step=work_done(daemon))
    if daemon.gateway is not None:
        daemon.gateway.saves.saved(work_done(daemon), daemon.now())  # a failure is tried an interval on
    if reason and reason != failing:
        daemon._warn(f"cannot checkpoint: {reason}")
    elif not reason and failing:
        daemon.status.say(f"{daemon.name}: checkpoint written again at {progress_words(daemon)}")
    return not reason
