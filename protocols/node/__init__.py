"""The member around its algorithm: what the daemon and the simulator both decide, written once.

Pure, under the machines' sans-IO contract (no sockets, threads, clocks or
global RNG; time is the ``now`` handed in). :class:`Node` (node.py) is one
member around its machine, hosted by both drivers: it routes every verified
message by kind and holds the parts below.

* :class:`StateSync` (sync.py): answer or refuse a neighbour's state-sync request
  (rate-limited per requester), and check then adopt an answer, in one order;
* :class:`EarlyMessages` (early.py): messages heard before Start, capped per
  neighbour, newest kept, refusals counted by reason;
* :class:`NodeConfig` (config.py): their settings, one definition;
* :class:`Neighbourhood` (neighbours.py): the failure detector, up/down/finished
  per neighbour from what was heard and when;
* :func:`verdict` (liveness.py): whether a member can go on, from its neighbours'
  presence (up, down, finished, never heard), and the one line saying why not;
  :func:`start_wait`: when a member's wait for its neighbours before its first
  round is over, and how it starts.
* :class:`Membership` (membership.py): roster versions, the round each takes
  effect, the version stamped on and checked in round-bearing messages, and the
  ``Connect`` action that tells a driver whom to verify and exchange with.
* :class:`~protocols.node.member.Member` (member.py): the lifecycle around the Node (wait,
  sync, train, finished or stranded; work points, checkpoints due, the fault schedule), one
  ``handle(now, event) -> actions``; :class:`~protocols.node.host.Host` (host.py): the one
  interpreter of its actions (timer table, work queue, send counters) behind a host's port;
  :class:`~protocols.node.checkpoints.CheckpointSchedule` (checkpoints.py): when one is due.
* :class:`~protocols.node.schedule.Schedule` (schedule.py, tests only): faults keyed by
  rounds (hold, stop and restart, join, cut, a flood of sync requests) that both
  drivers honour, so one test can ask them for the same decisions.

The trainer step a catch-up implies is an action (``SetTrainerStep``,
protocols/events.py) emitted by the machine that skipped, and by
``StateSync.adopt``; drivers apply it, never decide it.
"""

from __future__ import annotations

from protocols.node.check import SyncOffer, check_sync_response
from protocols.node.config import NodeConfig
from protocols.node.early import EarlyMessages
from protocols.node.liveness import Presence, Verdict, Wait, reason, start_wait, verdict, waiting_line
from protocols.node.neighbours import Neighbour, Neighbourhood
from protocols.node.node import Node, NodeAction, Note
from protocols.node.sync import Adoption, StateSync

__all__ = ["Adoption", "EarlyMessages", "Neighbour", "Neighbourhood", "Node", "NodeAction", "NodeConfig",
           "Note", "Presence", "StateSync", "SyncOffer", "Verdict", "Wait", "check_sync_response", "reason",
           "start_wait", "verdict", "waiting_line"]
