"""Library mode: a hivemesh member inside the user's own training loop.

::

    import peer

    with peer.join("net/p00.toml", model, optimizer=opt, scheduler=sched) as m:
        for step in range(m.steps, total_steps):
            ...                      # forward, backward, opt.step(), sched.step(): the user's own
            m.step(loss)

:func:`join` hosts the member of a ``hivemesh init`` config the way ``hivemesh
peer`` does: the same daemon (peer/runtime/daemon.py: the lifecycle of
protocols/node/member.py, carried out through protocols/node/host.py's Host), on
a background thread, with the user's model as its trainer
(peer/train/own.py). Gossip, state sync, checkpoints and the status file run
beside the loop; the model is mixed only while the user's thread waits inside
:meth:`Member.step` at a round's end, so the user's optimizer is never raced.

A restart (after ``kill -9`` too) resumes from the member's latest checkpoint:
the model, the optimizer and the scheduler as they were, and :attr:`Member.steps`
says where the loop goes on. A gateway or edge client is not a library member.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from peer.files.console import ensure_logging
from peer.runtime.assemble import assemble
from peer.runtime.daemon import PeerDaemon
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import hooks_from_environment
from peer.train.own import Evaluate, OwnTrainer
from protocols.errors import HivemeshError


class Member:
    """One running member in this process (made by :func:`join`)."""

    def __init__(self, daemon: PeerDaemon, trainer: OwnTrainer) -> None:
        self._daemon, self._trainer = daemon, trainer
        self.name: str = daemon.name
        names = daemon.parts.topology.names
        self.rank: int = names.index(self.name)   # its place among the members' sorted names
        self.world_size: int = len(names)
        self.total_steps: int = daemon.config.gossip.total_steps
        self.exit_code: int | None = None   # the member's, once its run is over (0: finished or closed)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"hivemesh-{self.name}", daemon=True)

    def _run(self) -> None:
        try:
            self.exit_code = self._daemon.run()
        except BaseException as error:   # given to the user's thread at its next call
            self._error = error
        finally:
            self._trainer.end()

    def _start(self) -> None:
        self._thread.start()
        self._trainer.wait_turn()   # neighbours heard, a state sync adopted: the first round asked
        self._raise()

    @property
    def steps(self) -> int:
        """The optimizer steps this member has made: where a (resumed) loop goes on."""
        return self._trainer.step

    @property
    def done(self) -> bool:
        """Whether its run is over (finished, stranded or closed): :meth:`step` no longer waits."""
        return self._trainer.ended

    @property
    def state(self) -> str:
        """As ``hivemesh status`` shows it: waiting for neighbours, syncing, training, finished, ..."""
        return self._daemon.state

    def step(self, loss: float | torch.Tensor | None = None) -> None:
        """After each optimizer step (``loss``: its loss, for the status). At a round's end this
        waits while the member gossips and mixes; at the run's end, until its last checkpoint is
        written and its neighbours were told."""
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        self._trainer.user_step(value)
        self._raise()

    def close(self) -> int:
        """Checkpoint and leave (as SIGTERM stops ``hivemesh peer``); the member's exit code."""
        if self._thread.is_alive():
            self._daemon.stop("closed by its program")
            self._trainer.end()   # a round still waiting for the loop's steps ends with those made
            self._thread.join()
        self._raise()
        assert self.exit_code is not None
        return self.exit_code

    def __enter__(self) -> Member:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, HivemeshError):
                raise error
            raise HivemeshError(f"member {self.name} stopped: {type(error).__name__}: {error}") from error


def join(config: str | Path, model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None,
         scheduler: Any = None, evaluate: Evaluate | None = None) -> Member:
    """Start the member of ``config`` (a ``hivemesh init`` peer config) on ``model``, already on its
    device; return once it may train (its neighbours heard, a late joiner's state adopted) or its
    run is over. ``optimizer`` and ``scheduler``: checkpointed and restored with the model;
    ``evaluate(model) -> {"accuracy": ..., "loss": ...}``: what the status and the metrics log show
    (at ``[peer] eval_every_steps`` and at the end). Errors are one-line ``HivemeshError``. Test
    hooks come from the environment, as for ``hivemesh peer`` (peer/runtime/peerprocess.py)."""
    ensure_logging()
    peer_config = load_peer_config(config)
    if peer_config.federation is not None:
        raise HivemeshError(f"{peer_config.source}: a gateway's config: a library member is a gossip peer")
    trainer = OwnTrainer(model, optimizer=optimizer, scheduler=scheduler, evaluate=evaluate)
    parts = assemble(peer_config, make=lambda topology: trainer)
    daemon = PeerDaemon(peer_config, parts=parts, hooks=hooks_from_environment(), signals=False)
    member = Member(daemon, trainer)
    member._start()
    return member
