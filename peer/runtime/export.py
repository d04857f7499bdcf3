"""Take a trained model out of the network: latest checkpoint(s) -> the model's state dict -> safetensors.

An export is exactly what ``model.load_state_dict(load_file(path), strict=True)`` takes for the
task's model: every parameter and every persistent buffer (BatchNorm running statistics and
``num_batches_tracked`` included), in the dtype the peers trained in. A model rebuilt from
parameters alone would have running means 0 and variances 1, and score far below the peer.

The trainer state in a checkpoint holds them flat (peer/train/trainer.py, ``Trainer.state_dict``):
trainable parameters in ``model.parameters()`` order as ``params``, floating buffers in
``model.buffers()`` order as ``buffers``, integer buffers by name as ``int_buffer.<name>``.

Several peers: floating tensors are averaged (in float64, then cast back); integer buffers take
the largest value over the peers. For BatchNorm's ``num_batches_tracked`` that is the count of the
peer that has seen the most batches: a mean of counts need not be a whole count, and the maximum
does not depend on the order the peers are given in.

The safetensors metadata carries a small model card (strings only, as the format requires): see
:func:`model_card`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from peer.files.statefiles import CheckpointStore, read_status
from peer.runtime.peerconfig import PeerConfig, load_peer_config
from peer.train.tasks import Task, get_task
from protocols.errors import HivemeshError
from protocols.federation.server_base import SERVER_ROLE


@dataclass(frozen=True)
class Exported:
    tensors: int
    parameters: int  # trainable parameter values
    buffer_values: int  # values in buffers (BatchNorm statistics), 0 for models without any
    peers: int
    progress: tuple[str, ...]   # each peer's ``PeerModel.progress``


@dataclass(frozen=True)
class PeerModel:
    """One peer's latest checkpoint as the task's state dict, with what its status last reported."""

    name: str
    step: int
    state: dict[str, torch.Tensor]
    accuracy: float | None  # the peer's last test accuracy (None: never evaluated)
    eval_step: int | None  # the step that accuracy was measured at (a gateway's: its rounds closed)
    progress: str = ""     # "step 300", or a gateway's "round 10/10" (its FedAvg rounds closed)


def _latest(config: PeerConfig) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    state = CheckpointStore(config.data_dir, keep=config.checkpoint.keep).load_latest()
    if state is None:
        raise HivemeshError(f"{config.source}: peer {config.peer.name} has no checkpoint "
                            f"in {config.data_dir}")
    return state


def latest_trainer_state(config: PeerConfig) -> tuple[dict[str, torch.Tensor], int]:
    """The trainer tensors (flat params, buffers, optimizer) and step of a peer's latest checkpoint."""
    trainer_state = _latest(config)[0]
    return trainer_state["tensors"], int(trainer_state["meta"]["step"])


def progress_words(config: PeerConfig, step: int, protocol_state: Any) -> str:
    """How far a checkpoint is: ``step 300``, or a gateway's (which trains nothing) ``round 10/10``,
    its FedAvg rounds closed (FedBuff: model versions) as its status says them."""
    if config.federation is None:
        return f"step {step}"
    served = protocol_state[1].get(SERVER_ROLE) or {}
    closed = served.get("version", served.get("round", "-"))
    return f"round {closed}/{config.federation.rounds}"


def latest_params(config: PeerConfig) -> tuple[torch.Tensor, int]:
    """The flat parameters and step of a peer's latest checkpoint."""
    tensors, step = latest_trainer_state(config)
    return tensors["params"], step


def _copy_flat(flat: torch.Tensor, targets: Sequence[tuple[str, torch.Tensor]], what: str) -> None:
    total = sum(t.numel() for _, t in targets)
    if total != flat.numel():
        raise HivemeshError(f"checkpoint holds {flat.numel()} {what} values, the task's model has {total}")
    offset = 0
    for _, target in targets:
        target.copy_(flat[offset:offset + target.numel()].view_as(target))
        offset += target.numel()


def load_trainer_tensors(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Put a checkpoint's flat trainer tensors into ``model`` (already cast to their dtype), in place."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    floating = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
    integer = [(n, b) for n, b in model.named_buffers() if not b.is_floating_point()]
    if floating and "buffers" not in tensors:
        raise HivemeshError(f"the checkpoint has no buffers, but the task's model has "
                            f"{', '.join(n for n, _ in floating)}")
    missing = [n for n, _ in integer if f"int_buffer.{n}" not in tensors]
    if missing:
        raise HivemeshError(f"the checkpoint lacks the integer buffers {', '.join(missing)}")
    with torch.no_grad():
        _copy_flat(tensors["params"], trainable, "parameter")
        if floating:
            _copy_flat(tensors["buffers"], floating, "buffer")
        for name, buffer in integer:
            buffer.copy_(tensors[f"int_buffer.{name}"].view_as(buffer))


def model_state(task: Task, seed: int, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``task``'s model with a checkpoint's trainer tensors loaded, as its state dict (own copies)."""
    model = task.build_model(seed).to(dtype=tensors["params"].dtype)
    load_trainer_tensors(model, tensors)
    # clones: tied weights appear under two names and safetensors refuses shared memory
    return {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()}


def average_states(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Floating tensors: the mean (in float64, cast back); integer tensors: the maximum."""
    averaged = {}
    for name, first in states[0].items():
        stacked = torch.stack([state[name] for state in states])
        averaged[name] = (stacked.to(torch.float64).mean(dim=0).to(first.dtype) if first.is_floating_point()
                          else stacked.amax(dim=0))
    return averaged


def last_accuracy(data_dir: Path) -> tuple[float | None, int | None]:
    """A peer's last test accuracy and the step it was measured at, from its status (None: unknown)."""
    status = read_status(data_dir) or {}
    accuracy = status.get("accuracy")    # null in status.json until the peer's first evaluation
    if not (isinstance(accuracy, float | int) and math.isfinite(accuracy)):
        return None, None
    return float(accuracy), int(status["eval_step"])


def peer_model(config: PeerConfig) -> PeerModel:
    trainer_state, protocol_state, _ = _latest(config)
    tensors, step = trainer_state["tensors"], int(trainer_state["meta"]["step"])
    accuracy, eval_step = last_accuracy(config.data_dir)
    network = config.network
    task = get_task(network.task, **network.task_options)
    return PeerModel(name=config.peer.name, step=step, state=model_state(task, network.seed, tensors),
                     accuracy=accuracy, eval_step=eval_step,
                     progress=progress_words(config, step, protocol_state))


def model_card(config: PeerConfig, peers: Sequence[PeerModel], parameters: int) -> dict[str, str]:
    """The safetensors metadata: task, its options and seed, parameter count, the peers, their steps
    and last test accuracies (JSON where a value is not a plain string)."""
    network = config.network
    dtype = next(t.dtype for t in peers[0].state.values() if t.is_floating_point())
    card = {
        "format": "pt",
        "hivemesh_task": network.task,
        "hivemesh_task_options": json.dumps(network.task_options, sort_keys=True),
        "hivemesh_seed": str(network.seed),
        "hivemesh_parameters": str(parameters),
        "hivemesh_dtype": str(dtype).removeprefix("torch."),
        "hivemesh_peers": ",".join(p.name for p in peers),
        "hivemesh_steps": json.dumps({p.name: p.step for p in peers}),
        "hivemesh_progress": json.dumps({p.name: p.progress for p in peers}),
        "hivemesh_test_accuracy": json.dumps({p.name: {"accuracy": p.accuracy, "at_step": p.eval_step}
                                              for p in peers if p.accuracy is not None}),
    }
    if len(peers) > 1:
        card["hivemesh_averaging"] = "floating tensors: mean; integer buffers: max"
    return card


def export_model(config_paths: Sequence[str | Path], out: str | Path) -> Exported:
    """Average the peers' latest parameters and buffers and write them as ``out`` (safetensors)."""
    configs = [load_peer_config(path) for path in config_paths]
    tasks = {(c.network.task, json.dumps(c.network.task_options, sort_keys=True), c.network.seed)
             for c in configs}
    if len(tasks) > 1:
        raise HivemeshError("the peers given train different tasks; export them one at a time")
    peers = [peer_model(c) for c in configs]
    state = average_states([p.state for p in peers])
    network = configs[0].network
    model = get_task(network.task, **network.task_options).build_model(network.seed)
    parameters = sum(p.numel() for p in model.parameters())
    save_file(state, str(out), metadata=model_card(configs[0], peers, parameters))
    return Exported(tensors=len(state), parameters=parameters,
                    buffer_values=sum(b.numel() for b in model.buffers()),
                    peers=len(peers), progress=tuple(f"{p.name} at {p.progress}" for p in peers))
