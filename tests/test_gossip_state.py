"""Acceptance g: restore-then-continue equals never-stopped, for every algorithm.

A run is paused at arbitrary events, every machine and worker is exported,
rebuilt from scratch and restored (meta through JSON, tensors copied), and
the run goes on: the final parameters and counters must equal, bit for bit,
those of the run that never stopped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import safetensors.torch
import torch
from gossip_driver import Driver, QuadraticWorker, digits_network

from protocols.events import Start, StartWork, WorkDone
from protocols.gossip import GossipConfig, make_machine
from protocols.gossip.base import Phase
from topology import build

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dpsgd": ("ring:5", {"algorithm": "dpsgd", "total_steps": 12, "final_gossip_rounds": 3}),
    "local": ("ring:5", {"algorithm": "local", "local_steps": 3, "total_steps": 12,
                         "final_gossip_rounds": 2}),
    "choco": ("ring:5", {"algorithm": "choco", "compression": "topk:fraction=0.3", "consensus_step": 0.4,
                         "total_steps": 12}),
    "pushsum": ("directed-exponential:6", {"algorithm": "pushsum", "total_steps": 12,
                                           "final_gossip_rounds": 2}),
    "adpsgd": ("ring:5", {"algorithm": "adpsgd", "total_steps": 12, "final_gossip_rounds": 3}),
    "choco+powersgd": ("ring:5", {"algorithm": "choco", "compression": "powersgd:rank=1",
                                  "consensus_step": 0.4, "total_steps": 12}),
    "choco+qsgd": ("ring:5", {"algorithm": "choco", "compression": "qsgd:bits=2", "consensus_step": 0.4,
                              "total_steps": 12}),
    "dpsgd+fp16": ("ring:5", {"algorithm": "dpsgd", "compression": "fp16", "total_steps": 12}),
    "dpsgd+after": ("ring:5", {"algorithm": "dpsgd", "mixing": "after", "total_steps": 12,
                               "final_gossip_rounds": 3}),
    "local+after": ("ring:5", {"algorithm": "local", "mixing": "after", "local_steps": 3, "total_steps": 13,
                               "final_gossip_rounds": 2}),
    "pushsum+after": ("directed-exponential:6", {"algorithm": "pushsum", "mixing": "after", "total_steps": 12,
                                                 "final_gossip_rounds": 2}),
    "local+after+diloco": ("ring:5", {"algorithm": "local", "mixing": "after", "local_steps": 2,
                                      "total_steps": 12, "outer": "diloco", "outer_every": 4}),
    "local+diloco": ("ring:5", {"algorithm": "local", "local_steps": 2, "total_steps": 12, "outer": "diloco",
                                "outer_every": 4}),
}


SHAPES = ((2, 3), (1,))  # a "model" of one 2x3 matrix and a bias: PowerSGD compresses the matrix


def _fresh(spec: str, options: dict[str, Any]) -> tuple[dict[str, QuadraticWorker], dict[str, Any]]:
    topology = build(spec)
    generator = torch.Generator().manual_seed(5)
    targets = torch.randn(len(topology.names), 7, generator=generator, dtype=torch.float64)
    workers = {n: QuadraticWorker(torch.zeros(7, dtype=torch.float64), targets[i], lr=0.3)
               for i, n in enumerate(topology.names)}
    config = GossipConfig(**options)
    machines = {n: make_machine(config, name=n, topology=topology, params=workers[n].flat_params, seed=3,
                                shapes=SHAPES) for n in topology.names}
    return workers, machines


def _driver(workers: dict[str, QuadraticWorker], machines: dict[str, Any]) -> Driver:
    names = sorted(workers)
    step_time_s = {n: 1.0 + 0.5 * (i % 3) for i, n in enumerate(names)}  # unequal: messages cross
    return Driver(machines, workers, step_time_s=step_time_s, latency_s=0.3)


def _through_a_checkpoint(state: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> Any:
    tensors, meta = state
    return {k: v.clone() for k, v in tensors.items()}, json.loads(json.dumps(meta))


@pytest.mark.parametrize("case", sorted(CASES))
def test_g_restore_then_continue_equals_never_stopped(case: str) -> None:
    spec, options = CASES[case]
    # never stopped
    workers, machines = _fresh(spec, options)
    reference = _driver(workers, machines)
    reference.start()
    assert reference.run()
    # stopped twice, everything rebuilt from its exported state each time
    workers, machines = _fresh(spec, options)
    driver = _driver(workers, machines)
    driver.start()
    pauses = 0
    while not driver.run(pause_after=17):
        pauses += 1
        new_workers, new_machines = _fresh(spec, options)
        for name in sorted(workers):
            new_workers[name].load_state_dict(driver.workers[name].state_dict())  # type: ignore[attr-defined]
            new_machines[name].restore_state(_through_a_checkpoint(driver.machines[name].export_state()))
        driver.workers, driver.machines = dict(new_workers), dict(new_machines)
    assert pauses >= 3
    assert driver.finished == reference.finished == set(workers)
    for name in sorted(workers):
        assert torch.equal(driver.workers[name].flat_params, reference.workers[name].flat_params), name
        assert driver.machines[name].counters == reference.machines[name].counters
        assert driver.machines[name].export_state()[1] == reference.machines[name].export_state()[1], name
    assert driver.metrics == reference.metrics


def test_g_a_real_trainer_and_machine_checkpoint_through_safetensors_and_continue(tmp_path: Any) -> None:
    config = GossipConfig(algorithm="dpsgd", total_steps=6, final_gossip_rounds=1)
    reference = digits_network(config, "ring:4", n=4).run()
    net = digits_network(config, "ring:4", n=4)
    net.driver.start()
    assert not net.driver.run(pause_after=13)
    fresh = digits_network(config, "ring:4", n=4)
    for name in net.names:
        tensors, meta = net.machines[name].export_state()
        path = tmp_path / f"{name}.safetensors"
        safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        restored = (safetensors.torch.load_file(str(path)), json.loads(json.dumps(meta)))
        fresh.trainers[name].load_state_dict(net.trainers[name].state_dict())
        fresh.machines[name].restore_state(restored)
    net.driver.workers, net.driver.machines = dict(fresh.trainers), dict(fresh.machines)
    assert net.driver.run()
    for name in net.names:
        assert torch.equal(fresh.trainers[name].flat_params, reference.trainers[name].flat_params)


@pytest.mark.parametrize("case", sorted(CASES))
def test_g_restored_with_its_work_asked_but_not_done_asks_for_it_again_at_start(case: str) -> None:
    # A daemon's checkpoint may be written between StartWork and WorkDone (a periodic one while the
    # work is queued, one at once after a step jump, a SIGTERM's): the trainer is saved as it was
    # before the work. Restarted without adopting a neighbour's state, the machine must ask for
    # that work again, or the member waits forever for a WorkDone nobody will send.
    spec, options = CASES[case]
    _, machines = _fresh(spec, options)
    name = sorted(machines)[0]
    first = [a for a in machines[name].handle(Start(), 0.0) if isinstance(a, StartWork)]
    assert len(first) == 1 and machines[name].phase is Phase.WORKING
    state = _through_a_checkpoint(machines[name].export_state())
    _, restored = _fresh(spec, options)
    restored[name].restore_state(state)
    again = [a for a in restored[name].handle(Start(), 5.0) if isinstance(a, StartWork)]
    assert again == first
    assert restored[name].counters["restarted"] == 1
    restored[name].handle(WorkDone(first[0].steps, 0.0), 6.0)
    assert restored[name].counters["unexpected_event"] == 0  # the WorkDone was the one it waited for


@pytest.mark.parametrize("case", sorted(CASES))
def test_g_restored_with_its_work_done_asks_for_none_at_start(case: str) -> None:
    # restored while waiting for its neighbours (the work done and counted): nothing is trained twice
    spec, options = CASES[case]
    _, machines = _fresh(spec, options)
    name = sorted(machines)[0]
    steps = next(a.steps for a in machines[name].handle(Start(), 0.0) if isinstance(a, StartWork))
    machines[name].handle(WorkDone(steps, 0.0), 1.0)
    if machines[name].phase is not Phase.WAITING:   # (an algorithm that never waits: nothing to check)
        return
    _, restored = _fresh(spec, options)
    restored[name].restore_state(_through_a_checkpoint(machines[name].export_state()))
    at = restored[name].position[0]
    asked = [a for a in restored[name].handle(Start(), 5.0) if isinstance(a, StartWork)]
    assert not asked or restored[name].position[0] > at   # (adpsgd gives its exchange up: a new round)
