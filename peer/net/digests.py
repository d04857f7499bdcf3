"""Payload digests on worker threads, and receive buffers that are reused: the wire's two driver hooks.

protocols/ is single-threaded and allocation-agnostic; an Endpoint takes
``digest=`` and ``allocate=`` from its driver (protocols/codec.py). The
daemon hands it these two:

* :class:`ThreadDigester` hashes a message's payload frames (4 MiB each) on a
  small thread pool. BLAKE3 releases the GIL, so on seal the frames hash in
  parallel, and on open the codec copies the frames into their tensors while
  the workers hash them; the caller then hashes what no worker has started
  (so one worker already makes two hashing threads). Small payloads are hashed inline (a thread hand-off
  costs more than hashing a few KiB). The digests are the same BLAKE3 as the
  serial default's, so peers with and without it interoperate.

* :class:`BufferPool` gathers multi-frame tensors into buffers it reuses:
  fresh memory page-faults on every 4 KiB, which made open of a 100 MB model
  cost about 3x a digest pass instead of 1.3x (bench/bench_wire.py).
  Ownership is decided by torch itself: a buffer is handed out again only
  when nothing but the pool holds its storage (no tensor, view, numpy array or
  memoryview made from it anywhere: a machine that buffers a message for a
  later round keeps its buffer out of the pool until it lets go). When every
  matching buffer is held, a fresh tensor is allocated, and kept if the pool
  has room. The pool is bounded in count and bytes and keeps only the sizes
  the model's messages have; a refused message lets its buffer go at once
  (protocols/assembly.py), so refusals never pin memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from protocols.codec import Frame, frame_digest

INLINE_BYTES = 1 << 20      # payloads below this are hashed on the caller's thread
# workers besides the caller, who hashes too: one per spare core, a few at most (2 cores here: 1)
DEFAULT_WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))


def _length(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


class ThreadDigester:
    """A :data:`protocols.codec.DigestStarter` hashing frames on ``workers`` threads. Close it when done."""

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, not {workers}")
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="digest")

    def __call__(self, frames: Sequence[Frame]) -> Callable[[], list[bytes]]:
        held = list(frames)
        if len(held) < 2 and sum(_length(f) for f in held) < INLINE_BYTES:
            digests = [frame_digest(frame) for frame in held]
            return lambda: digests
        futures: list[Future[bytes]] = [self._pool.submit(frame_digest, frame) for frame in held]

        def wait() -> list[bytes]:
            # the caller helps instead of idling: it hashes, from the back, the frames no worker
            # has started (the workers take them from the front)
            digests: list[bytes | None] = [None] * len(held)
            for index in reversed(range(len(held))):
                if futures[index].cancel():
                    digests[index] = frame_digest(held[index])
            return [digest if digest is not None else future.result()
                    for digest, future in zip(digests, futures, strict=True)]

        return wait

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _use_count(tensor: torch.Tensor) -> int | None:
    """How many references torch holds to ``tensor``'s storage (None if this torch cannot say)."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return None
    return int(counter(tensor.untyped_storage()._cdata))


class BufferPool:
    """Reused 1-D receive buffers: an ``allocate(dtype, numel)`` for an Endpoint.

    Bounded three ways, so that nobody can make it hold memory the run does not
    need: at most ``max_buffers`` buffers (all sizes together; size it to what
    the machine may hold at once, a few rounds' messages per in-neighbour, plus
    the one being gathered), at most ``max_bytes`` together, and only buffers
    of the ``sizes`` (dtype, numel) the model's messages have (None: any size).
    A request outside them gets a fresh tensor that the pool does not keep.
    ``reused``/``fresh`` count the allocations.
    """

    def __init__(self, max_buffers: int, *, max_bytes: int | None = None,
                 sizes: frozenset[tuple[torch.dtype, int]] | None = None) -> None:
        if max_buffers < 0:
            raise ValueError(f"max_buffers must be >= 0, not {max_buffers}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self.sizes = sizes
        self._buffers: list[torch.Tensor] = []
        probe = torch.empty(1)
        self._idle = _use_count(probe)     # the count of a tensor only one reference holds
        self.reused = 0
        self.fresh = 0

    def _free(self, buffer: torch.Tensor) -> bool:
        return self._idle is not None and _use_count(buffer) == self._idle

    def allocate(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        for buffer in self._buffers:
            if buffer.dtype == dtype and buffer.numel() == numel and self._free(buffer):
                self.reused += 1
                return buffer.view(numel)      # a new tensor on the storage: counted while it lives
        self.fresh += 1
        buffer = torch.empty(numel, dtype=dtype)
        if self._idle is None or not self.max_buffers or not self._may_keep(dtype, numel):
            return buffer
        nbytes = numel * dtype.itemsize
        while len(self._buffers) >= self.max_buffers or (
                self.max_bytes is not None and self.bytes + nbytes > self.max_bytes):
            # full: make room by dropping a free buffer, else do not keep this one
            spare = next((b for b in self._buffers if self._free(b)), None)
            if spare is None:
                return buffer
            self._buffers.remove(spare)
        self._buffers.append(buffer)
        return buffer.view(numel)

    def _may_keep(self, dtype: torch.dtype, numel: int) -> bool:
        if self.sizes is not None and (dtype, numel) not in self.sizes:
            return False
        return self.max_bytes is None or numel * dtype.itemsize <= self.max_bytes

    @property
    def bytes(self) -> int:
        """Bytes of the buffers the pool keeps."""
        return sum(b.numel() * b.element_size() for b in self._buffers)

    @property
    def held(self) -> int:
        """Buffers in the pool that something outside it still holds."""
        return sum(not self._free(b) for b in self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)
