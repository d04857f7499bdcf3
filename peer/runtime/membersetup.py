"""The daemon's member, assembled: its Node around the machine, and the lifecycle around the Node.

The Node is the simulator's (protocols/node/node.py): a state-sync answer
carries what the machine mixes, copied to the host (it may be sent while mixing
goes on), and the trainer's step; early messages are held per neighbour for
the rounds the machine buffers. The Member (protocols/node/member.py) writes a
jump at once and nothing at launch (a process that finds no checkpoint starts
fresh); under a test's fault schedule it reads the other members' rounds and
its own fired faults from the schedule's files. A gateway trains nothing: its
checkpoints count its rounds (peer/runtime/gateway.py), not the member's steps.
"""

from __future__ import annotations

from peer.runtime.assemble import Parts, gateway_serving
from peer.runtime.daemon_parts import NeighbourInfo
from peer.runtime.peerconfig import PeerConfig
from peer.runtime.testhooks import ScheduleFiles
from protocols.federation.server_base import SERVER_ROLE
from protocols.node import Node
from protocols.node import member as lifecycle


def member_node(config: PeerConfig, parts: Parts) -> Node[NeighbourInfo]:
    trainer, gateway = parts.trainer, parts.server is not None
    node: Node[NeighbourInfo] = Node(
        parts.name, parts.machine, neighbours={n: NeighbourInfo() for n in parts.neighbours},
        config=config.peer.node_config(),
        early_per_neighbour=config.gossip.max_rounds_ahead + 1,  # the machine buffers that many rounds
        answer_source=lambda: (trainer.host_mixed().detach().clone(), trainer.step),
        roles={SERVER_ROLE: parts.server} if gateway else None, clients=parts.clients,
        serving=gateway_serving(config, parts.name) if gateway else None)
    node.set_membership(parts.roster, parts.topology)
    return node


def daemon_member(node: Node[NeighbourInfo], config: PeerConfig, *, faults: ScheduleFiles | None,
                  gateway: bool) -> lifecycle.Member[NeighbourInfo]:
    gossip = config.gossip
    ahead = lifecycle.ahead_steps(max_rounds_ahead=gossip.max_rounds_ahead, local_steps=gossip.local_steps,
                                  scheduled=faults is not None)
    member_config = lifecycle.MemberConfig(ahead_steps=ahead, checkpoint=config.checkpoint,
                                           keeps_checkpoints=not gateway, checkpoint_at_launch=False,
                                           checkpoint_jumps_at_once=True, work_is_steps=not gateway)
    if faults is None:
        return lifecycle.Member(node, member_config)
    files = faults.faults
    return lifecycle.Member(node, member_config, schedule=files.schedule, fired=files.fired,
                            reached=files.reached, reached_round=files.reached(node.name))
