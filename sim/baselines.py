"""Synchronous data-parallel baselines in the same engine, with the same trainers and links.

So one scenario file answers "gossip or all-reduce on my network?". Every
round each member runs ``local_steps`` real SGD steps (modelled time, the
slowest member sets the pace), then the models are averaged exactly:

* ``allreduce``: a ring all-reduce over the members in sorted order
  (reduce-scatter then all-gather): ``2 (n - 1)`` steps, each moving a chunk
  of ``C`` bytes (``B / n`` of parameters in an envelope) over every ring
  link ``names[i] -> names[i + 1]``; a member forwards a chunk when it has
  received the previous one. On equal links a round's communication takes
  ``2 (n - 1) (L + 8 C / R)``: each member sends ``2 (n - 1) C`` bytes.
* ``parameter-server``: every member uploads its model (``B`` bytes with its envelope) through
  the server's one link (a FIFO queue: ``n B`` bytes in), the server
  averages when all have arrived and sends the model back through the same
  link (``n B`` bytes out). A round takes at least ``2 n 8 B / R_server``.

Bytes are counted as gossip counts them: each chunk or model is one message
with its envelope (header and signature,
:func:`protocols.compress.accounting.message_bytes`), so a byte column
compares like with like. All-reduce chunks pass the members' NICs
(sim/network.py); the parameter server's one link is its NIC.
The baselines model a healthy network: loss, jitter, partitions, churn and
attackers are for the gossip driver (a synchronous collective stalls on
them; that is a known property, not a simulation).
"""

from __future__ import annotations

import time

import torch

from peer.train.trainer import Trainer
from protocols.compress.accounting import message_bytes
from protocols.gossip.payload import RAW
from protocols.messages import ParamPush
from sim.network import FifoLink, LinkSpec
from sim.node import work_seconds
from sim.world import Progress, Recorder, ScenarioResult, World, new_result

SERVER = "server"


class BaselineRun:
    def __init__(self, world: World, progress: Progress | None = None) -> None:
        self.world = world
        self.scenario = world.scenario
        self.engine = world.engine
        assert world.network is not None
        self.network = world.network
        self.kind = self.scenario.baseline.kind
        self.local_steps = self.scenario.baseline.local_steps
        names = world.names
        trainer = world.trainers[names[0]]
        # what gossip would move too: the parameters, and the buffers when they are averaged
        numel, dtype = trainer.mixed.numel(), trainer.mixed.dtype
        self.model_bytes = envelope_bytes(numel, dtype)           # one model, as a gossip message
        self.chunk_bytes = envelope_bytes(-(-numel // len(names)), dtype)  # one all-reduce chunk
        self.bytes_sent = dict.fromkeys(names, 0)
        self.server_bytes_sent = 0
        self.rounds = 0
        self.work_index = 0
        self.result = new_result(world, self.kind)
        self.recorder = Recorder(world, self.result, running=lambda _: True,
                                 bytes_sent=self._total_bytes, progress=progress)
        default = self.scenario.links
        self.server_spec = LinkSpec(
            latency_ms=(default.latency_ms if self.scenario.baseline.server_latency_ms < 0
                        else self.scenario.baseline.server_latency_ms),
            bandwidth_mbps=self.scenario.baseline.server_bandwidth_mbps or default.bandwidth_mbps)

    def _total_bytes(self) -> int:
        return sum(self.bytes_sent[n] for n in self.world.names) + self.server_bytes_sent

    def max_rounds(self) -> int | None:
        return -(-self.scenario.steps // self.local_steps) if self.scenario.steps else None

    # ------------------------------------------------------------ rounds

    def run(self) -> ScenarioResult:
        started = time.perf_counter()  # wall time for the progress line only
        self.engine.at(0.0, lambda: self._round_start({n: 0.0 for n in self.world.names}))
        self.recorder.start()
        self.engine.run(until_s=self.scenario.duration_s)
        self.recorder.evaluate()
        self._finish(time.perf_counter() - started)
        return self.result

    def _round_start(self, ready_s: dict[str, float]) -> None:
        """Schedule the end of a round: modelled compute (the slowest member), then communication."""
        limit = self.max_rounds()
        if limit is not None and self.rounds >= limit:
            self.engine.stop()
            return
        done_s = {}
        for name in self.world.names:
            done_s[name] = ready_s[name] + work_seconds(
                self.scenario, self.world.speeds[name], name, self.work_index, self.local_steps)
        self.work_index += 1
        if self.kind == "allreduce":
            finish_s = self.ring_allreduce(max(done_s.values()))
        else:
            finish_s = self.parameter_server(done_s)
        end_s = max(finish_s.values())
        self.engine.at(end_s, lambda: self._round_end(finish_s))

    def _round_end(self, finish_s: dict[str, float]) -> None:
        # The maths of the whole round happens at its end, so an evaluation in between sees the
        # last averaged model (what a synchronous job would checkpoint), not half a round.
        for name in self.world.names:
            self.world.trainers[name].run_steps(self.local_steps)
        average_models([self.world.trainers[n] for n in self.world.names])
        self.rounds += 1
        self._round_start(finish_s)

    # ------------------------------------------------------------ communication models

    def ring_allreduce(self, start_s: float) -> dict[str, float]:
        """When each member holds the reduced model, for a round starting at ``start_s``."""
        names = self.world.names
        n = len(names)
        if n == 1:
            return {names[0]: start_s}
        chunk = self.chunk_bytes
        have_s = [start_s] * n  # when member i holds what it must forward next
        for _ in range(2 * (n - 1)):
            arrivals = [self.network.arrival_s(names[i], names[(i + 1) % n], chunk, have_s[i])
                        for i in range(n)]
            have_s = [arrivals[(i - 1) % n] for i in range(n)]
            for name in names:
                self.bytes_sent[name] += chunk
        return {names[i]: have_s[i] for i in range(n)}

    def parameter_server(self, done_s: dict[str, float]) -> dict[str, float]:
        """Uploads queue through the server's link in, the average goes back out the same way."""
        inbound = self._server_link("*", SERVER)
        outbound = self._server_link(SERVER, "*")
        arrived = []
        for name in sorted(done_s, key=lambda n: (done_s[n], n)):
            arrived.append(inbound.send(self.model_bytes, done_s[name]))
            self.bytes_sent[name] += self.model_bytes
        averaged_s = max(arrived)
        finish_s = {}
        for name in self.world.names:
            finish_s[name] = outbound.send(self.model_bytes, averaged_s)
            self.server_bytes_sent += self.model_bytes
        return finish_s

    def _server_link(self, src: str, dst: str) -> FifoLink:
        return self.network.link(src, dst, self.server_spec)

    # ------------------------------------------------------------ result

    def _finish(self, wall_s: float) -> None:
        result = self.result
        result.simulated_time_s = self.engine.now_s
        result.events_run = self.engine.events_run
        result.wall_s = wall_s
        for name in self.world.names:
            metrics = self.recorder.final_peer_metrics(name)
            result.peers[name] = {
                "behaviour": "honest", "running": True, "finished": True,
                "steps": self.world.trainers[name].step, "restarts": 0,
                "warnings": self.world.trainers[name].warnings(),
                "final_loss": metrics.get("loss"), "final_accuracy": metrics.get("accuracy"),
                "bytes_sent": self.bytes_sent[name], "payload_bytes_sent": self.bytes_sent[name],
                "messages_sent": 0, "rejections": {}, "metrics": {},
            }
        if self.kind == "parameter-server":
            result.peers[SERVER] = {"behaviour": "server", "bytes_sent": self.server_bytes_sent,
                                    "payload_bytes_sent": self.server_bytes_sent}
        result.metrics = {"rounds": float(self.rounds), "model_bytes": float(self.model_bytes)}
        result.links = self.network.traffic()


def envelope_bytes(numel: int, dtype: torch.dtype) -> int:
    """Wire bytes of a message carrying ``numel`` raw values, as gossip's D-PSGD sends them."""
    tensor = torch.empty(numel, dtype=dtype, device="meta")   # sizes only: nothing allocated
    return message_bytes(ParamPush(round=0, tensors={RAW: tensor}))


def average_models(trainers: list[Trainer]) -> None:
    """Exact average of what gossip would mix (parameters, and buffers when averaged), summed in the
    given order."""
    _average_in_place([t.mixed for t in trainers])


def _average_in_place(tensors: list[torch.Tensor]) -> None:
    """Each of ``tensors`` becomes their mean (summed in the given order)."""
    mean = torch.zeros_like(tensors[0])
    for tensor in tensors:
        mean.add_(tensor)
    mean.div_(len(tensors))
    for tensor in tensors:
        tensor.copy_(mean)


def run_baseline(world: World, progress: Progress | None = None) -> ScenarioResult:
    return BaselineRun(world, progress).run()
