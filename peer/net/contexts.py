"""Every ZeroMQ context hivemesh creates, made so that dropping one can never hang the process.

pyzmq's ``Context.__del__`` terminates a context whose sockets may still be open
(garbage together, in a cycle), and ``zmq_ctx_term`` then waits for them with no
timeout. A context from :func:`new_context` (every transport's, every test's):

- when it is garbage-collected unterminated, terminates itself on a thread of its
  own, so nothing waits for it;
- gives every new socket ``LINGER`` 0, so a socket closed with messages queued
  never holds the termination up;
- is terminated by its owner through :func:`terminate`, which waits a bounded time;
- is listed while open (:func:`open_contexts`), and one dropped unterminated leaves
  a note of where it was made (:func:`dropped_unterminated`), which the test suite's
  guard turns into a failure. Every transport terminates its own context in
  ``close``, so in a running peer these lists stay empty.

The registry is module state on purpose: like pyzmq's ``Context.instance``, it
describes the process (which contexts exist), not any one component. Why a
dropped context hung: docs/design/transport.md.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass, field

import zmq
from zmq.sugar import context as pyzmq_context

_HERE = "/peer/net/"    # frames of this package are skipped when naming where a context was made
TERM_WAIT_S = 10.0      # terminate(): how long a transport's close waits for its context to end
DROPPED_NOTES = 100     # notes of dropped contexts kept (a leak repeated in a loop stays readable)


@dataclass(frozen=True)
class Made:
    """Where a context was made: its serial number (in order of creation) and the call site."""

    serial: int
    site: str       # "file:line in function": the first frame outside peer/net and pyzmq


class OwnedContext(zmq.Context):
    """A ZeroMQ context that cannot hang its finaliser (see the module doc)."""

    made: Made | None = None     # (declared here: pyzmq takes other attribute names for options)

    def __init__(self) -> None:
        super().__init__()
        self.setsockopt(zmq.LINGER, 0)          # a context option: the default of each new socket
        self.made = _registry.add(self)

    def __del__(self) -> None:
        made = self.made     # (None: __init__ failed, nothing was opened)
        if made is None or self._shadow or self.closed or getattr(pyzmq_context, "_exiting", False):
            return
        _registry.dropped(made)
        # The thread holds this context (revived, as Python allows a finaliser to): its sockets are
        # finalised by this same collection, and the termination ends once the last one closed.
        # (RuntimeError: the interpreter is shutting down; the process is ending anyway)
        with contextlib.suppress(RuntimeError):
            threading.Thread(target=self.term, name="hivemesh-dropped-context", daemon=True).start()


def new_context() -> zmq.Context:
    """A fresh context for one owner, who terminates it (:func:`terminate`) when done with it."""
    return OwnedContext()


def terminate(context: zmq.Context, wait_s: float = TERM_WAIT_S) -> bool:
    """Terminate ``context`` after its owner closed every socket of it, waiting at most ``wait_s``:
    True when it ended. libzmq can still be tearing a closed socket down (its connections, a ZAP
    exchange); a termination that takes longer goes on in a daemon thread, with a warning, so that
    closing a transport never hangs its caller (an open context is what the test guard reports)."""
    ending = threading.Thread(target=context.term, name="hivemesh-term", daemon=True)
    ending.start()
    ending.join(wait_s)
    if ending.is_alive():
        warnings.warn(f"a ZeroMQ context still terminating after {wait_s} s (left to a thread)",
                      ResourceWarning, stacklevel=2)
        return False
    return True


def next_serial() -> int:
    """The serial number the next context gets: where a test's own contexts begin."""
    return _registry.next_serial


def open_contexts(since: int = 0) -> list[Made]:
    """Contexts made by :func:`new_context` (serial ``since`` or later) not terminated yet."""
    return [made for made, context in _registry.live() if made.serial >= since and not context.closed]


def dropped_unterminated(since: int = 0) -> list[Made]:
    """Contexts (serial ``since`` or later) garbage-collected without being terminated (their
    finaliser terminated them)."""
    return [made for made in _registry.dropped_notes() if made.serial >= since]


@dataclass
class _Registry:
    # re-entrant: a collection (a dropped context's finaliser) may start while this thread holds it
    lock: threading.RLock = field(default_factory=threading.RLock)
    next_serial: int = 0
    contexts: weakref.WeakValueDictionary[int, OwnedContext] = field(
        default_factory=weakref.WeakValueDictionary)
    notes: list[Made] = field(default_factory=list)

    def add(self, context: OwnedContext) -> Made:
        with self.lock:
            made = Made(self.next_serial, _call_site())
            self.next_serial += 1
            self.contexts[made.serial] = context
        return made

    def dropped(self, made: Made) -> None:
        with self.lock:
            self.notes.append(made)
            del self.notes[:-DROPPED_NOTES]

    def live(self) -> list[tuple[Made, OwnedContext]]:
        with self.lock:
            return [(context.made, context) for context in self.contexts.values() if context.made]

    def dropped_notes(self) -> list[Made]:
        with self.lock:
            return list(self.notes)


def _call_site() -> str:
    frame = sys._getframe(1)
    while frame.f_back is not None and (_HERE in frame.f_code.co_filename.replace("\\", "/")
                                        or "/zmq/" in frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


_registry = _Registry()
