"""The FedAvg client driven by hand: the work it asks for, the update it uploads, error feedback
kept across rounds (sampled or not), downlink compression, refusals and the end."""

from __future__ import annotations

import pytest
import torch

from protocols.events import Action, Finished, Received, Send, Start, StartWork, WorkDone
from protocols.federation import ClientPhase, FedAvgClient, FedAvgServer, FederationConfig
from protocols.federation.common import payload
from protocols.gossip.payload import Payload
from protocols.messages import ClientUpdate, RoundResult, RoundStart
from protocols.rng import torch_generator

NUMEL = 1000


def client(**overrides: object) -> FedAvgClient:
    return FedAvgClient(FederationConfig(**overrides), name="edge", server="gw",  # type: ignore[arg-type]
                        params=torch.zeros(NUMEL), num_samples=50, steps_per_epoch=4)


def start(round_index: int, model: torch.Tensor, **meta: int | float) -> RoundStart:
    work: dict[str, int | float] = {"local_epochs": 1, "local_steps": 0, "prox_mu": 0.0}
    work.update(meta)
    return RoundStart(round=round_index, tensors={"x": model.clone()}, meta=work, deadline_s=10.0)


def uploaded(actions: list[Action]) -> ClientUpdate:
    (send,) = [a for a in actions if isinstance(a, Send)]
    assert send.recipients == ("gw",) and isinstance(send.message, ClientUpdate)
    return send.message


def decoder(config: FederationConfig) -> Payload:
    return payload(config.uplink, torch.zeros(NUMEL), seed=config.seed, name="gw", shapes=None)


def random_vector(step: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch_generator(0, "edge", step, "test"))


def test_round_start_sets_the_model_and_asks_for_the_work() -> None:
    c = client()
    model = random_vector(0)
    assert StartWork(4) in c.handle(Received("gw", start(0, model)), 0.0)  # 1 epoch x 4 steps
    assert torch.equal(c.params, model) and c.phase is ClientPhase.TRAINING
    c.handle(WorkDone(steps=4, loss=0.1), 1.0)
    assert StartWork(7) in c.handle(Received("gw", start(1, model, local_epochs=0, local_steps=7)), 2.0)
    c.handle(WorkDone(steps=7, loss=0.1), 3.0)
    assert StartWork(12) in c.handle(Received("gw", start(2, model, local_epochs=3)), 4.0)


def test_work_done_uploads_the_delta() -> None:
    # Prepare: an uncompressed uplink, so the upload is the delta exactly
    c = client(uplink="identity")
    model = random_vector(0)
    c.handle(Received("gw", start(3, model)), 0.0)
    trained = random_vector(1)
    c.params.copy_(trained)  # what the trainer does in place
    # Execute
    update = uploaded(c.handle(WorkDone(steps=4, loss=0.5), 1.0))
    # Assert
    assert update.round == 3 and update.num_samples == 50
    decoded = decoder(FederationConfig(uplink="identity")).decode(update.tensors, update.meta)
    assert torch.equal(decoded, trained - model)
    assert c.phase is ClientPhase.IDLE


def test_error_feedback_loses_nothing_across_rounds_it_skips() -> None:
    # Prepare: a coarse uplink so each upload drops a visible part
    config = FederationConfig(uplink="qsgd:bits=2,bucket=64")
    c = FedAvgClient(config, name="edge", server="gw", params=torch.zeros(NUMEL), num_samples=50,
                     steps_per_epoch=4)
    dec = decoder(config)
    deltas, sent = [], []
    # Execute: sampled in rounds 0 and 3, not in 1 and 2
    for round_index in (0, 3):
        model = random_vector(10 + round_index)
        c.handle(Received("gw", start(round_index, model)), float(round_index))
        delta = random_vector(20 + round_index)
        c.params.add_(delta)
        update = uploaded(c.handle(WorkDone(steps=4, loss=0.1), round_index + 0.5))
        deltas.append(delta)
        sent.append(dec.decode(update.tensors, update.meta))
        if round_index == 0:
            residual_after_first = c.feedback.residual().clone()  # type: ignore[union-attr]
    # Assert: the first round's residual was not lost in the rounds the client sat out: sent plus
    # what is still owed equals everything trained
    assert float(torch.linalg.vector_norm(residual_after_first)) > 0.1
    owed = c.feedback.residual()
    assert owed is not None
    assert torch.allclose(sent[0] + sent[1] + owed, deltas[0] + deltas[1], atol=1e-5)
    # and the second upload carried the first's residual
    assert not torch.allclose(sent[1] + owed, deltas[1], atol=1e-3)


def test_error_feedback_survives_a_restart() -> None:
    config = FederationConfig(uplink="qsgd:bits=2,bucket=64")
    c = FedAvgClient(config, name="edge", server="gw", params=torch.zeros(NUMEL), num_samples=5,
                     steps_per_epoch=1)
    c.handle(Received("gw", start(0, random_vector(0))), 0.0)
    c.params.add_(random_vector(1))
    c.handle(WorkDone(steps=1, loss=0.0), 1.0)
    restarted = FedAvgClient(config, name="edge", server="gw", params=torch.zeros(NUMEL), num_samples=5,
                             steps_per_epoch=1)
    restarted.restore_state(c.export_state())
    assert torch.equal(restarted.feedback.residual(), c.feedback.residual())  # type: ignore[arg-type]
    assert restarted.round == 0


def test_downlink_compression_starts_from_what_was_sent() -> None:
    config = FederationConfig(downlink="fp16", uplink="identity")
    c = FedAvgClient(config, name="edge", server="gw", params=torch.zeros(NUMEL), num_samples=5,
                     steps_per_epoch=1)
    model = random_vector(0) * 1.001
    encoder = payload("fp16", model, seed=0, name="gw", shapes=None)
    tensors, meta, as_sent = encoder.encode(model, 0)
    c.handle(Received("gw", RoundStart(round=0, tensors=tensors, meta={**meta, **config.local_work()})), 0.0)
    assert torch.equal(c.params, as_sent) and not torch.equal(c.params, model)
    c.params.add_(1.0)
    update = uploaded(c.handle(WorkDone(steps=1, loss=0.0), 1.0))
    assert torch.allclose(update.tensors["x"], torch.ones(NUMEL))  # the delta from what it started from


def test_refusals_and_a_round_start_while_training_waits() -> None:
    c = client(uplink="identity")
    c.handle(Received("mallory", start(0, random_vector(0))), 0.0)
    assert c.counters["refused_not_server"] == 1 and c.phase is ClientPhase.IDLE
    c.handle(Received("gw", start(5, random_vector(0))), 0.0)
    c.handle(Received("gw", start(6, random_vector(1))), 0.5)  # the next round while training
    assert c.counters["round_start_while_training"] == 1
    actions = c.handle(WorkDone(steps=4, loss=0.0), 1.0)
    assert uploaded(actions).round == 5 and StartWork(4) in actions and c.round == 6
    c.handle(WorkDone(steps=4, loss=0.0), 2.0)
    c.handle(Received("gw", start(4, random_vector(2))), 3.0)
    c.handle(Received("gw", start(7, random_vector(2), local_epochs=-1)), 3.0)
    broken = RoundStart(round=8, tensors={"x": torch.zeros(3)}, meta={"local_epochs": 1})
    c.handle(Received("gw", broken), 3.0)
    assert c.counters["refused_old_round"] == 1 and c.counters["refused_bad_work"] == 1
    assert c.counters["refused_bad_model"] == 1 and c.counters["refused_bad_model_wrong_length"] == 1
    assert c.phase is ClientPhase.IDLE


def test_round_result_ends_the_client_with_the_final_model() -> None:
    c = client()
    final = random_vector(5)
    actions = c.handle(Received("gw", RoundResult(round=30, tensors={"x": final})), 0.0)
    assert actions[0] == Finished() and torch.equal(c.params, final) and c.phase is ClientPhase.FINISHED
    c.handle(Received("gw", start(31, final)), 1.0)
    assert c.counters["refused_after_finish"] == 1


def test_the_end_heard_while_training_waits_for_the_work() -> None:
    c = client(uplink="identity")
    c.handle(Received("gw", start(0, random_vector(0))), 0.0)
    final = random_vector(5)
    assert c.handle(Received("gw", RoundResult(round=1, tensors={"x": final})), 0.5) == []
    assert c.phase is ClientPhase.TRAINING  # the trainer still holds params
    c.params.add_(1.0)
    actions = c.handle(WorkDone(steps=4, loss=0.0), 1.0)
    assert uploaded(actions).round == 0 and Finished() in actions
    assert torch.equal(c.params, final) and c.phase is ClientPhase.FINISHED


@pytest.mark.parametrize("spec", ["identity", "fp16", "bf16", "qsgd:bits=4", "topk:fraction=0.1",
                                  "randomk:fraction=0.1", "sign", "powersgd:rank=2"])
def test_any_compression_operator_round_trips_to_the_server(spec: str) -> None:
    # Prepare: a server and a client of one federation with the uplink ``spec``
    config = FederationConfig(uplink=spec, fraction=1.0, min_clients=1, rounds=1)
    shapes = ((10, 100),)
    server = FedAvgServer(config, name="gw", params=torch.zeros(NUMEL), clients=("edge",), shapes=shapes)
    c = FedAvgClient(config, name="edge", server="gw", params=torch.zeros(NUMEL), num_samples=5,
                     steps_per_epoch=1, shapes=shapes)
    (send,) = [a for a in server.handle(Start(), 0.0) if isinstance(a, Send)]
    c.handle(Received("gw", send.message), 0.1)
    c.params.add_(random_vector(3))
    # Execute
    server.handle(Received("edge", uploaded(c.handle(WorkDone(steps=1, loss=0.0), 0.2))), 0.3)
    # Assert: taken, and the model moved towards the client's delta by what the operator kept
    assert server.counters["updates_taken"] == 1 and server.counters["refused_update"] == 0
    owed = c.feedback.residual()
    kept = random_vector(3) - (owed if owed is not None else torch.zeros(NUMEL))
    assert torch.allclose(server.params, kept, atol=1e-5)


@pytest.mark.parametrize("mode", ["sync", "fedbuff"])
def test_a_round_asked_again_is_trained_again_but_counted_once(mode: str) -> None:
    # Prepare: rounds 0 and 1, then round 1 again (a restarted gateway asks the round it was at)
    c = client(uplink="identity", mode=mode, rounds=3)
    # Execute
    for round_index in (0, 1, 1):
        assert StartWork(4) in c.handle(Received("gw", start(round_index, random_vector(round_index))), 0.0)
        uploaded(c.handle(WorkDone(steps=4, loss=0.0), 1.0))
    # Assert: sync: two rounds trained, one again, an upload for each training; FedBuff's dispatches
    # at one model version are each new work
    trained, again = (2, 1) if mode == "sync" else (3, 0)
    assert (c.counters["rounds_trained"], c.counters["rounds_retrained"]) == (trained, again)
    assert c.counters["updates_sent"] == trained + again == 3
