"""A gateway's RoundStart may still be queued for a slow edge when a ClientUpdate closes the round
and the server writes the new global model into ``params`` in place (``params.copy_``: on a
gateway that is ``trainer.mixed``, which its gossip machine shares). The daemon does not wait for
its sends before a role's message (``Node.may_write_params``), so what the RoundStart carries must
never share storage with ``params``: it is encoded afresh (``Payload.encode``), whatever the
downlink codec. Pure: no sockets, no clock."""

from __future__ import annotations

import pytest
import torch

from protocols.events import Received, Send, Start
from protocols.federation import FedAvgServer, FederationConfig
from protocols.messages import ClientUpdate, RoundStart

DOWNLINKS = ("identity", "fp16", "bf16", "topk:fraction=0.5", "qsgd:bits=4,bucket=16", "sign")


@pytest.mark.parametrize("downlink", DOWNLINKS)
def test_a_queued_round_start_is_not_changed_when_the_round_closes(downlink: str) -> None:
    # Prepare: a round open for two clients, the RoundStart "still queued" (its tensors held)
    params = torch.linspace(-1.0, 1.0, 64)
    cfg = FederationConfig(fraction=1.0, min_clients=2, min_updates=1, rounds=3, round_timeout_s=10.0,
                           uplink="identity", downlink=downlink)
    server = FedAvgServer(cfg, name="gw", params=params, clients=("c0", "c1"))
    (start,) = [a.message for a in server.handle(Start(), 0.0)
                if isinstance(a, Send) and isinstance(a.message, RoundStart)]
    assert isinstance(start, RoundStart)
    queued = {k: t.clone() for k, t in start.tensors.items()}
    params_storage = params.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() != params_storage for t in start.tensors.values())
    before = params.clone()
    # Execute: both updates arrive; the second closes the round and writes params in place
    for client in ("c0", "c1"):
        server.handle(Received(client, ClientUpdate(round=0, num_samples=10,
                                                    tensors={"x": torch.full((64,), 0.5)})), 1.0)
    # Assert: the round closed and moved params, and the queued RoundStart's bytes are as sealed
    assert server.reports[0].aggregated and not torch.equal(params, before)
    for key, tensor in start.tensors.items():
        assert torch.equal(tensor, queued[key]), f"{downlink}: RoundStart tensor {key!r} changed"
