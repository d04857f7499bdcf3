"""The daemon's receive side: frames to the endpoint, complete messages queued for the loop.

Frames go to the endpoint in the order they arrive (it verifies a header, and
that it came on its sender's own connection, before it takes the frames it
announced, and hashes each as it arrives); the messages they complete wait in
a queue until the loop hands them to the member. So the transport may call
:meth:`Inbox.take_in` while it waits for our zero-copy sends (``while_waiting``):
no tensor changes then. Multi-frame tensors are gathered into a pool of reused
buffers of the one size a model-sized tensor has; one message carries at most a
model's worth at the widest any codec writes it, which bounds what a header may
announce and one sender's bytes in flight (docs/design/daemon.md).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable

import torch

from peer.net.digests import BufferPool, ThreadDigester
from peer.net.transport import Arrival, Transport
from protocols.assembly import AssemblyConfig, model_message_bytes
from protocols.wire import Endpoint, Opened, Rejection

Taken = tuple[Opened | Rejection, bytes | None]  # an opened message and the connection it came on


class Inbox:
    """Messages opened and not yet handed on, for one endpoint of a member mixing ``mixed``."""

    def __init__(self, endpoint: Endpoint, mixed: torch.Tensor, *, neighbours: int, digester: ThreadDigester,
                 now: Callable[[], float], transport: Callable[[], Transport | None]) -> None:
        # what a machine holds at once: about one message per neighbour for this round and the next
        pooled = 2 * neighbours + 2
        self.buffers = BufferPool(max_buffers=pooled, max_bytes=pooled * mixed.numel() * mixed.element_size(),
                                  sizes=frozenset({(mixed.dtype, mixed.numel())}))
        policy = endpoint.policy
        message_bytes = model_message_bytes(mixed.numel(), header_bytes=policy.max_header_bytes)
        endpoint.use(allocate=self.buffers.allocate, digest=digester,
                     policy=dataclasses.replace(policy, max_message_bytes=message_bytes,
                                                max_elements=min(policy.max_elements, message_bytes)),
                     assembly=AssemblyConfig(max_in_flight_bytes=2 * message_bytes))
        self.endpoint = endpoint
        self.now = now
        self.transport = transport
        self.queue: deque[Taken] = deque()
        # a wait reads on while the queue holds less than one sender's budget per neighbour
        self.queued_bytes_limit = 2 * message_bytes * max(1, neighbours)

    def take_in(self, arrivals: list[Arrival]) -> bool:
        """Feed frames to the endpoint and queue the messages they complete; whether it takes more."""
        transport = self.transport()
        assert transport is not None
        for arrival in arrivals:
            key = transport.connection_key(arrival.frame)
            if key is None:
                continue    # its key left the roster or cools down (counted by the transport)
            opened = self.endpoint.receive(arrival.connection, arrival.frame.buffer, now_s=self.now(),
                                           connection_key=key.decode() if key else None)
            if opened is not None:
                self.queue.append((opened, arrival.connection))
        queued = sum(o.wire_bytes for o, _ in self.queue if isinstance(o, Opened))
        return queued < self.queued_bytes_limit

    def poll(self, timeout_s: float) -> None:
        """Receive for up to ``timeout_s`` (at once when messages are queued); expired assemblies too."""
        transport = self.transport()
        assert transport is not None
        self.take_in(transport.poll(0.0 if self.queue else timeout_s))
        self.queue.extend((released, None) for released in self.endpoint.expire(self.now()))
        for connection in transport.closed_connections():     # released at once, not when idle
            released = self.endpoint.forget(connection)
            if released is not None:
                self.queue.append((released, None))

    def next(self) -> Taken | None:
        return self.queue.popleft() if self.queue else None
