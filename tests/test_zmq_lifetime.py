"""ZeroMQ contexts and transports end when their owner says so, and a dropped one cannot hang.

The hang this guards against (peer/net/contexts.py): a context garbage-collected together with
its open sockets terminated while they were still open and waited for ever, inside whatever
import happened to trigger the collection. The cases that could hang run in a child process with
a time limit, so that a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from peer.net.contexts import dropped_unterminated, new_context, next_serial, open_contexts, terminate
from peer.net.dial import DialTransport
from peer.net.transport import CurveKeys, Transport, TransportError, listener_address, reserve_listeners

ROOT = Path(__file__).resolve().parent.parent
CHILD_LIMIT_S = 60.0    # far beyond what the child needs (well under a second): only a hang reaches it
HANG_PROOF_S = 5.0      # the unguarded control: it never returns, so any bound proves it

# A context and an open socket to an address of ours (which never answers), left behind by a
# failed assertion: the exception's traceback holds the frame, the frame the exception, so they
# are garbage together, as after a failed test (test_daemon_outsider's, once). Then a collection.
# MAKE names the context's factory.
CYCLE = """
import gc, socket, threading, zmq
from peer.net.contexts import dropped_unterminated, new_context
from peer.net.dial import DialTransport
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen(1)
address = "tcp://127.0.0.1:%d" % listener.getsockname()[1]
gc.disable()
def drop():
    context = MAKE()
    sock = context.socket(zmq.DEALER)
    sock.connect(address)
    sock.send(b"queued", flags=zmq.NOBLOCK)
    dial = DialTransport(address)       # an edge client's transport, never closed
    try:
        assert sock.poll(10), "no answer"
    except AssertionError as failure:
        kept = failure      # the traceback's frame holds it: a cycle
drop()
gc.collect()
for thread in threading.enumerate():
    if thread.name == "hivemesh-dropped-context":
        thread.join(20)
        assert not thread.is_alive(), "a dropped context's termination did not end"
print("collected", len(dropped_unterminated()))
"""


def _run_child(make: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", CYCLE.replace("MAKE", make)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.processes
def test_contexts_dropped_open_with_their_sockets_are_collected_without_hanging() -> None:
    done = _run_child("new_context", CHILD_LIMIT_S)
    assert done.returncode == 0, done.stderr
    # our context and the dial transport's: each terminated by its finaliser, each noted
    assert done.stdout.split() == ["collected", "2"], done.stdout


@pytest.mark.processes
def test_a_plain_pyzmq_context_dropped_the_same_way_hangs() -> None:
    """The control: what the test above would do without peer/net/contexts.py (pyzmq 27, libzmq
    4.3.5). Should pyzmq ever fix its finaliser, this fails and the guard can be revisited."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run_child("zmq.Context", HANG_PROOF_S)


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def _no_zap_threads() -> int:
    # pyzmq's ZAP thread has no name of its own: it is the one Thread subclass of zmq.auth
    return sum(type(t).__module__ == "zmq.auth.thread" for t in threading.enumerate())


def test_a_transport_that_fails_part_way_closes_what_it_opened() -> None:
    """A neighbour without a CURVE key fails the constructor after the inbox, its monitor thread and
    the ZAP thread are up: all of them go, and the context is terminated, before it raises."""
    since = next_serial()
    monitors, zap = len(_threads("hivemesh-monitor")), _no_zap_threads()
    public, secret = zmq.curve_keypair()
    (listener,) = reserve_listeners(1)
    with pytest.raises(TransportError, match="no CurveZMQ public key"):
        Transport(listen=listener_address(listener), neighbours={"m": "tcp://127.0.0.1:9"},
                  listen_fd=listener.detach(),
                  curve=CurveKeys(public_key=public, secret_key=secret, server_keys={}))
    assert len(_threads("hivemesh-monitor")) == monitors
    assert _no_zap_threads() == zap
    assert open_contexts(since) == [] and dropped_unterminated(since) == []


def test_a_transport_that_cannot_bind_closes_what_it_opened() -> None:
    since = next_serial()
    public, secret = zmq.curve_keypair()
    (taken,) = reserve_listeners(1)
    try:
        with pytest.raises(TransportError, match="cannot listen"):
            Transport(listen=listener_address(taken), neighbours={},
                      curve=CurveKeys(public_key=public, secret_key=secret, server_keys={}))
    finally:
        taken.close()
    assert open_contexts(since) == [] and dropped_unterminated(since) == []


def test_close_ends_every_thread_and_the_context_and_may_be_called_twice() -> None:
    since = next_serial()
    public, secret = zmq.curve_keypair()
    (listener,) = reserve_listeners(1)
    monitors, zap = len(_threads("hivemesh-monitor")), _no_zap_threads()
    with Transport(listen=listener_address(listener), neighbours={}, listen_fd=listener.detach(),
                   curve=CurveKeys(public_key=public, secret_key=secret, server_keys={})) as transport:
        assert len(open_contexts(since)) == 1
        assert len(_threads("hivemesh-monitor")) == monitors + 1 and _no_zap_threads() == zap + 1
    transport.close()
    assert len(_threads("hivemesh-monitor")) == monitors and _no_zap_threads() == zap
    assert open_contexts(since) == []
    dial = DialTransport("tcp://127.0.0.1:9")
    dial.close()
    dial.close()
    assert open_contexts(since) == [] and dropped_unterminated(since) == []


def test_the_registry_names_where_a_context_still_open_was_made() -> None:
    """What the suite's guard (tests/conftest.py) reports for a leak: the line that made it.
    (A context collected unterminated is noted the same way: the child process above counts them.)"""
    since = next_serial()
    kept = new_context()
    line = sys._getframe().f_lineno - 1
    try:
        assert [made.site for made in open_contexts(since)] == [f"{__file__}:{line} in {_this()}"]
    finally:
        kept.term()
    assert open_contexts(since) == [] and dropped_unterminated(since) == []


def _this() -> str:
    return sys._getframe(1).f_code.co_name


def test_terminate_gives_up_waiting_and_leaves_the_rest_to_a_thread() -> None:
    """A socket left open holds zmq_ctx_term for ever: ``terminate`` returns (False, with a warning)
    after its wait; the termination ends as soon as the socket is closed."""
    context = new_context()
    forgotten = context.socket(zmq.DEALER)
    with pytest.warns(ResourceWarning, match="still terminating"):
        assert terminate(context, wait_s=0.2) is False
    assert not context.closed
    forgotten.close()
    ending = [t for t in threading.enumerate() if t.name == "hivemesh-term"]
    for thread in ending:
        thread.join(CHILD_LIMIT_S)
    assert context.closed
    assert terminate(new_context()) is True
