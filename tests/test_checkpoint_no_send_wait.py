"""A checkpoint does not wait for the sends in flight (a gateway checkpoints every round; waiting
held its loop up to the round deadline while RoundStart replies drained to slow edges): it only
reads tensors, on the loop's thread, so nothing a send shares is written meanwhile. Driven on the
daemon's own method with stand-ins for its parts (no sockets)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from peer.runtime.daemon import PeerDaemon


class SlowSends:
    """A transport with a send in flight that would take long to drain: waiting on it is the bug."""

    def pending_sends(self) -> int:
        return 1

    def wait_sent(self, timeout_s: float | None = None) -> None:
        raise AssertionError("the checkpoint waited for a send in flight")


class Store:
    def __init__(self) -> None:
        self.error: str | None = None
        self.saved: list[tuple[dict[str, Any], int]] = []

    def save(self, trainer_state: dict[str, Any], protocol_state: Any, extra: dict[str, Any], *,
             step: int) -> str | None:
        self.saved.append((trainer_state, step))
        return None


def test_a_checkpoint_is_written_while_a_send_is_still_in_flight() -> None:
    # Prepare: a daemon's parts as _checkpoint reads them, one send still pending
    store = Store()
    params = torch.arange(4.0)
    daemon: Any = SimpleNamespace(
        transport=SlowSends(), store=store, parts=SimpleNamespace(epoch=3),
        trainer=SimpleNamespace(step=7, state_dict=lambda: {"params": params}),
        endpoint=SimpleNamespace(export_state=lambda: {}), gateway=None, gateway_work=None,
        machine=SimpleNamespace(export_state=lambda: ({}, {})), _work_done=lambda: 7, now=lambda: 1.5,
        _warn=print)
    daemon._wait_sent = lambda: PeerDaemon._wait_sent(daemon)
    # Execute
    written = PeerDaemon._checkpoint(daemon, final=False)
    # Assert: written at once, the send left in flight (not waited for, not abandoned)
    assert written and store.saved == [({"params": params}, 7)]
