"""Acceptance c of issue 28: one lifecycle, one interpreter; a host that grows its own copy fails here.

An AST scan of the host modules. The hosts ported onto protocols/node/member.py's ``Member`` and
protocols/node/host.py's ``Host`` (the simulator's gossip driver, the tests' driver, the daemon and
its port) may neither keep a timer heap nor decide what the lifecycle decides (the start wait, the
state sync's course, the stranded verdict, when a checkpoint is due, the fault schedule's work
points). A gateway's checkpoints by rounds are still its own (peer/runtime/gateway.py). The edge
client shares the timer table so far (its lifecycle is still its own): no heap there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ON_MEMBER = ("sim/gossip_driver.py", "tests/gossip_driver.py", "peer/runtime/daemon.py",
             "peer/runtime/daemon_port.py", "peer/runtime/daemon_status.py", "peer/runtime/daemon_parts.py",
             "peer/runtime/inbox.py", "peer/runtime/dial.py")
ON_TIMER_TABLE = ("peer/runtime/edge.py",)

# what Member decides: the Node's lifecycle calls and the schedule's, and the classes that hold them
LIFECYCLE_CALLS = {"start_wait", "judge", "begin_sync", "sync_timed_out", "should_save", "step_set",
                   "holding", "heals"}
LIFECYCLE_NAMES = {"CheckpointSchedule", "MemberFaults", "heapq"}
OWN_TIMERS = {"heappush", "heappop", "heapify"}


def findings(source: str, path: str, *, calls: set[str], names: set[str]) -> list[str]:
    """What in ``source`` calls ``calls`` or names ``names``, as "file:line: what" strings."""
    tree = ast.parse(source, path)
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            imported = {alias.name for alias in node.names} | ({module} if module else set())
            found += [f"{where}: imports {name}" for name in sorted(imported & names)]
        elif isinstance(node, ast.Name) and node.id in names:
            found.append(f"{where}: uses {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in calls:
            found.append(f"{where}: calls .{node.func.attr}()")
    return found


@pytest.mark.parametrize("path", ON_MEMBER)
def test_a_host_on_the_member_decides_nothing_of_the_lifecycle_and_keeps_no_timer_heap(path: str) -> None:
    source = (ROOT / path).read_text()
    assert findings(source, path, calls=LIFECYCLE_CALLS | OWN_TIMERS, names=LIFECYCLE_NAMES) == []


@pytest.mark.parametrize("path", ON_TIMER_TABLE)
def test_a_host_on_the_timer_table_keeps_no_timer_heap(path: str) -> None:
    assert findings((ROOT / path).read_text(), path, calls=OWN_TIMERS, names={"heapq"}) == []


def test_the_scan_finds_a_copied_rule() -> None:
    copied = "\n".join(("import heapq", "from protocols.node.checkpoints import CheckpointSchedule",
                         "why = node.judge(resumed=False, start_wait_over=True)",
                         "heapq.heappush(timers, (1.0, 0, 'k'))"))
    found = findings(copied, "copy.py", calls=LIFECYCLE_CALLS | OWN_TIMERS, names=LIFECYCLE_NAMES)
    assert sorted(found) == ["copy.py:1: imports heapq", "copy.py:2: imports CheckpointSchedule",
                             "copy.py:3: calls .judge()", "copy.py:4: calls .heappush()",
                             "copy.py:4: uses heapq"], found
