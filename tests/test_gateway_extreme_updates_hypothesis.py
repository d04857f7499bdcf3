"""Accepted-but-extreme updates leave a gateway usable (issue 32, item 1), over every uplink
compressor: each compressor's norms and scales (or its values, where it has none) times factors
up to 1e38 (kept finite in their dtype: up to float32's 3.4e38), and sample claims up to 2^63, as
an insider may send without any bound set; through every downlink, aggregator and server
optimiser, with and without a clip norm, with the influence bounds on (init's multiples) and off.

The gateway is the daemon's composition of real protocol objects (its gossip machine on the
interleaving's schedule, the FedAvg server as the Node's ``fedavg`` role, GatewayWork between
them), driven through ``Node.receive`` as the daemon drives it. Each example runs one round
through aggregation, writes a real checkpoint (the daemon's own ``_protocol_state``), restores it
into a fresh gateway (``_restore_server``), writes status.json and rounds.jsonl, and asserts: no
handling raised (no ``internal_error``), the files are strict JSON, the restore is exact, and the
restored gateway's next round aggregates.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from peer.files.statefiles import CheckpointStore, StatusWriter
from peer.runtime.gateway import ROUNDS_FILE, protocol_state, restore_server
from peer.runtime.peerconfig import PeerFederationSection
from protocols.events import Metric, StartWork, TimerFired, WorkDone
from protocols.federation import FedAvgServer, ServerOptConfig, make_server
from protocols.federation.config import AGGREGATORS
from protocols.federation.interleave import GatewayWork
from protocols.federation.server import report_row
from protocols.federation.server_opt import SERVER_OPTIMIZERS
from protocols.gossip import GossipConfig, make_machine
from protocols.messages import ClientUpdate, Heartbeat
from protocols.node import Neighbour, Node, NodeConfig
from tests.test_gateway_extreme_update import strict_json
from topology import build

torch.set_num_threads(1)

D = 48  # the global model's length (powersgd makes it one near-square matrix)
EDGES = tuple(f"e{i:02d}" for i in range(6))
SPECS = ("identity", "fp16", "bf16", "qsgd:bits=8,bucket=16", "qsgd:bits=4,bucket=0", "topk:fraction=0.25",
         "topk-approx:fraction=0.25", "randomk:fraction=0.25", "sign", "powersgd:rank=2")  # every operator
SCALED_META = ("q/norm", "q/scale")  # a compressor's norm or scale, as a number in the meta
SCALED_TENSORS = ("q/norms", "x", "q/values", "q/p", "q/q")  # norms per bucket, or the values themselves


@dataclass
class Gateway:
    """One gateway's protocol objects, on one shared parameter vector, as the daemon holds them."""

    node: Node[Neighbour]
    server: FedAvgServer
    work: GatewayWork
    metrics: dict[str, float] = field(default_factory=dict)

    def carry_out(self, actions: list[Any], now: float) -> None:
        """The daemon's loop, for what matters here: work, metrics, and WorkDone once a round closed."""
        for action in actions:
            if isinstance(action, StartWork):
                begun, done = self.work.begin(now, self.node.machine.position[0])
                self.carry_out(self.node.role_actions("fedavg", begun), now)
                if done:
                    self.carry_out(self.node.handle(WorkDone(action.steps, 0.0), now), now)
            elif isinstance(action, Metric):
                self.metrics[action.name] = action.value
        if self.work.closed():
            self.carry_out(self.node.handle(WorkDone(1, 0.0), now), now)

    def hear_edges(self, now: float) -> None:
        for name in EDGES:
            self.carry_out(self.node.receive(name, Heartbeat(step=0, loss=0.0), now), now)


def gateway(config: PeerFederationSection) -> Gateway:
    params = torch.zeros(D)
    gossip = config.gateway_gossip(GossipConfig())
    machine = make_machine(gossip, name="gw0", topology=build("complete:1", ("gw0",)), params=params)
    server = make_server(config, name="gw0", params=params, pause_between_rounds=True)
    assert isinstance(server, FedAvgServer)
    node: Node[Neighbour] = Node("gw0", machine, neighbours={}, config=NodeConfig(), early_per_neighbour=2,
                                 answer_source=lambda: (params.clone(), 0), roles={"fedavg": server},
                                 clients=EDGES)
    return Gateway(node, server, GatewayWork(server, gossip_rounds=config.gossip_rounds))


def extreme(tensors: dict[str, torch.Tensor], meta: dict[str, Any], factor: float
            ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The update's norms and scales (or its float values) times ``factor``, kept finite in their dtype."""
    scaled = {}
    for name, tensor in tensors.items():
        if name in SCALED_TENSORS and tensor.is_floating_point():
            largest = torch.finfo(tensor.dtype).max
            tensor = (tensor.double() * factor).clamp(-largest, largest).to(tensor.dtype)
        scaled[name] = tensor
    largest = torch.finfo(torch.float32).max
    return scaled, {k: max(-largest, min(largest, v * factor)) if k in SCALED_META else v
                    for k, v in meta.items()}


def run_round(gw: Gateway, now: float, *, factors: list[float], num_samples: list[int],
              delta: torch.Tensor) -> None:
    """The open round's asked edges each send ``delta`` encoded by the uplink, the i-th scaled by
    ``factors[i]`` and claiming ``num_samples[i]`` samples (1 and 10 past their ends); the round's
    deadline fires if the updates taken did not close it (one refused: not finite)."""
    server = gw.server
    assert server.phase.value == "open", server.phase
    round_index = server.round
    for index, name in enumerate(server.asked):
        tensors, meta, _ = server.uplink.encode(delta, round_index)
        tensors, meta = extreme(tensors, dict(meta), factors[index] if index < len(factors) else 1.0)
        claimed = num_samples[index] if index < len(num_samples) else 10
        update = ClientUpdate(round=round_index, num_samples=claimed, tensors=tensors, meta=meta)
        gw.carry_out(gw.node.receive(name, update, now), now)
    if server.round == round_index:
        deadline = now + server.config.round_timeout_s
        gw.carry_out(gw.node.handle(TimerFired(f"fedavg/deadline/{round_index}"), deadline), deadline)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


FACTORS = st.one_of(st.sampled_from([1e30, -1e30, 1e37, 1e38, -1e38, 3.4e38]),
                    st.floats(min_value=-1e38, max_value=1e38, allow_nan=False))
SAMPLES = st.one_of(st.integers(min_value=1, max_value=2**63), st.sampled_from([2**63, 2**63 - 1, 1]))
VALUES = st.one_of(st.sampled_from([1.0, -0.5]), st.floats(min_value=-1.0, max_value=1.0))  # x factor


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.sampled_from(SPECS), downlink=st.sampled_from(SPECS),
       aggregator=st.sampled_from(("fedavg", "fedavg", *AGGREGATORS)),
       server_opt=st.sampled_from(SERVER_OPTIMIZERS), clip_norm=st.sampled_from([0.0, 0.0, 1.0]),
       bounds=st.sampled_from([0.0, 0.0, 2.0]),
       factors=st.lists(FACTORS, min_size=1, max_size=3), num_samples=st.lists(SAMPLES, max_size=3),
       values=st.lists(VALUES, min_size=1, max_size=4))
# the crash found from outside (init's defaults: qsgd uplink, identity downlink; one edge's norms x 1e30),
# and a global model a lossy downlink cannot carry (its norm past float32: the encoder refused it)
# (the influence bounds off, as before they were on by default; the third: on, at init's multiples)
@example(spec="qsgd:bits=8", downlink="identity", aggregator="fedavg", server_opt="fedavg", clip_norm=0.0,
         bounds=0.0, factors=[1e30], num_samples=[], values=[1e-3])
@example(spec="identity", downlink="sign", aggregator="fedavg", server_opt="fedavg", clip_norm=0.0,
         bounds=0.0, factors=[1e38, 1e38, 1e38], num_samples=[2**63], values=[1.0])
@example(spec="qsgd:bits=8", downlink="identity", aggregator="fedavg", server_opt="fedavg", clip_norm=0.0,
         bounds=2.0, factors=[1e38, 1e30], num_samples=[2**63, 1], values=[1.0])
def test_extreme_updates_leave_the_gateway_usable(spec: str, downlink: str, aggregator: str, server_opt: str,
                                                  clip_norm: float, bounds: float, factors: list[float],
                                                  num_samples: list[int], values: list[float]) -> None:
    # Prepare: hivemesh init's federation (fraction 0.5 of 6, min 2) on this uplink, edges heard
    config = PeerFederationSection(rounds=4, fraction=0.5, min_clients=2, round_timeout_s=30.0, uplink=spec,
                               downlink=downlink, aggregator=aggregator,  # type: ignore[arg-type]
                               server_opt=ServerOptConfig(name=server_opt),  # type: ignore[arg-type]
                               clip_norm=clip_norm, samples_multiple=bounds, norm_multiple=bounds)
    gw = gateway(config)
    gw.hear_edges(0.0)
    gw.carry_out(gw.node.start(0.1), 0.1)
    delta = torch.tensor(values * (D // len(values) + 1))[:D]
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder)
        store, status = CheckpointStore(data_dir, keep=1), StatusWriter(data_dir, name="gw0", progress=False)
        # Execute: round 0 with the extreme updates, then what the daemon writes after it
        run_round(gw, 1.0, factors=factors, num_samples=num_samples, delta=delta)
        state = protocol_state(gw.node.machine, gw.work)
        trainer_state = {"tensors": {"mixed": gw.server.params}, "meta": {"step": 0}}
        failed = store.save(trainer_state, state, {"epoch": 1}, step=1)
        reports = [report_row(gw.server.reports[r]) for r in sorted(gw.server.reports)]
        for row in reports:
            status.append_line(ROUNDS_FILE, row)
        status.write({"federation": {**gw.server.status(), "last_rounds": reports},
                      "metrics": gw.metrics, "warnings": gw.node.machine.warnings(),
                      "rejections": dict(gw.node.all_rejections())}, now=1.0, interval_s=1.0)
        loaded = store.load_latest()
        # Assert: nothing raised in handling; round 0 closed and aggregated; the files are strict JSON
        assert gw.node.all_rejections().get("internal_error", 0) == 0, gw.node.internal_errors
        assert 0 in gw.server.reports
        assert failed == "" and loaded is not None
        assert strict_json((data_dir / "status.json").read_text())["federation"]["round"] == 1
        rounds = (data_dir / ROUNDS_FILE).read_text().splitlines()
        assert [strict_json(line)["round"] for line in rounds] == [0]
        # Execute: a fresh gateway restored from the checkpoint, as a restarted daemon
        again = gateway(config)
        machine_state = restore_server(again.work, loaded[1], data_dir)
        again.node.machine.restore_state(machine_state)
        again.work.restarted()
        again.server.forget_registrations()
    # Assert: the restore is exact (the overflow's infinities included)
    assert same(again.server.params, gw.server.params)
    again_meta, meta = again.node.machine.export_state()[1], gw.node.machine.export_state()[1]
    assert again.node.machine.position == gw.node.machine.position
    assert json.dumps(again_meta, sort_keys=True) == json.dumps(meta, sort_keys=True)
    # Execute: its next round, honest
    again.hear_edges(2.0)
    again.carry_out(again.node.start(2.1), 2.1)
    run_round(again, 3.0, factors=[], num_samples=[], delta=torch.full((D,), 0.01))
    # Assert: it aggregates
    assert again.node.all_rejections().get("internal_error", 0) == 0, again.node.internal_errors
    assert 1 in again.server.reports and again.server.reports[1].aggregated

