"""``hivemesh peer``'s process: load the config, run the daemon, turn its end into an exit code.

Test hooks (peer/runtime/testhooks.py) come from the environment here (and
for a library member, in peer/library.py), nowhere else in normal use; a
configuration error is one line on stderr and status 2.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Sequence

from peer.files.console import ensure_logging
from peer.runtime.daemon import PeerDaemon
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import (
    hooks_from_environment,
    params_writer_from_environment,
    protocol_version_from_environment,
    save_point_from_environment,
    schedule_from_environment,
)
from topology.errors import HivemeshError


def run_peer(config_path: str, *, quiet: bool = False, listen_fd: int | None = None,
             overrides: Sequence[str] = (), metrics_port: int | None = None) -> int:
    """Load the config, run the peer, return the exit code (errors as one line on stderr).

    ``quiet``: no progress line on the console, whatever the config says; ``listen_fd``: a socket
    bound to the peer's address (peer.runtime.launch); ``metrics_port``: instead of the config's
    ``[peer] metrics_port``. Test hooks come from the environment."""
    ensure_logging()
    # until the daemon's own handler is in place (it reads the roster then anyway), a `hivemesh roster
    # reload` must not kill a peer that is still starting (SIGHUP's default action)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = load_peer_config(config_path, overrides)   # overrides: `hivemesh peer --set`
        if metrics_port is not None:
            try:
                peer = dataclasses.replace(config.peer, metrics_port=metrics_port)
            except ValueError as error:
                raise HivemeshError(f"--metrics-port: {error}") from None
            config = dataclasses.replace(config, peer=peer)
        if quiet:
            config = dataclasses.replace(config, peer=dataclasses.replace(config.peer, progress=False))
        return PeerDaemon(config, listen_fd=listen_fd, hooks=hooks_from_environment(),
                          schedule_for=schedule_from_environment,
                          protocol_version=protocol_version_from_environment(),
                          at_save_point=save_point_from_environment(),
                          params_trace=params_writer_from_environment(config.peer.name)).run()
    except HivemeshError as error:
        print(f"hivemesh: error: {error}", file=sys.stderr, flush=True)
        return 2
