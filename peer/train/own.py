"""The daemon's trainer over the user's own model: the user's loop does the steps (peer/library.py).

:class:`OwnTrainer` is what peer/runtime/daemon.py reads of a trainer (``step``,
``run_steps``, ``mixed``, ``flat_params``, ``host_mixed``, ``evaluate``,
``state_dict``), over a ``torch.nn.Module`` the user built, trains and keeps.
Its trainable parameters become views into one flat vector, as the built-in
trainer's do (peer/train/trainer.py), so gossip mixes the user's model in place.

The turn is handed over, never shared. ``run_steps(n)`` (the daemon's worker
thread) lets the user's loop make ``n`` steps and waits for them; each
``user_step`` (the user's thread, after an optimizer step) counts one, and the
round's last one waits there until the daemon asks for the next round's steps.
Everything the daemon does to the model (mixing, a state sync adopted, a
checkpoint, an evaluation) happens while the user's thread waits in
``user_step`` (or in ``join``, before the first round).

A checkpoint holds the parameters, every buffer of the model, and the user's
optimizer and learning-rate scheduler: their tensors as tensors, the rest as the
manifest's JSON (peer/train/checkpoint.py: safetensors, nothing unpickled).
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from peer.train.trainer import HostStage, StepsStopped, flatten_into
from protocols.errors import HivemeshError

Evaluate = Callable[[nn.Module], dict[str, float]]
TASK = "own"   # a checkpoint's task: the user's model, not a built-in task


class OwnTrainer:
    """``model``'s trainable parameters as one flat vector the member gossips; ``optimizer`` and
    ``scheduler`` (torch.optim's, optional) are checkpointed and restored with it; ``evaluate(model)``
    gives the metrics the status shows (``accuracy``, ``loss``)."""

    def __init__(self, model: nn.Module, *, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, evaluate: Evaluate | None = None) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise HivemeshError("the model has no trainable parameters")
        kinds = {(p.device, p.dtype) for p in params}
        if len(kinds) > 1:
            raise HivemeshError("the model's trainable parameters must share one device and dtype "
                                f"(found {len(kinds)}: move it with model.to(...) before joining)")
        self.device, self.dtype = params[0].device, params[0].dtype
        if not self.dtype.is_floating_point:
            raise HivemeshError(f"the model's parameters are {self.dtype}, not floating point")
        self.model, self.optimizer, self.scheduler, self._evaluate = model, optimizer, scheduler, evaluate
        self.param_shapes = tuple(tuple(p.shape) for p in params)
        self.flat_params = torch.empty(sum(p.numel() for p in params), dtype=self.dtype, device=self.device)
        flatten_into(params, self.flat_params)   # the same Parameter objects: the optimizer keeps them
        self._stage = HostStage(self.flat_params.numel(), self.dtype)
        self._step = 0
        self._turn = threading.Condition()
        self._allowed = 0      # steps the user's loop may still make in this round
        self._losses: list[float] = []
        self._ended = False
        state = self.state_dict()   # what cannot be checkpointed is said now, not at the first save
        _json_or_error(state["meta"])

    # ------------------------------------------------------------------ what gossip mixes

    @property
    def mixed(self) -> torch.Tensor:
        return self.flat_params   # buffers (BatchNorm statistics) stay each member's own

    @property
    def mixed_shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.param_shapes

    def host_mixed(self) -> torch.Tensor:
        return self._stage(self.flat_params)

    # ------------------------------------------------------------------ the step and its turn

    @property
    def step(self) -> int:
        """The optimizer steps the member has made (the user's, counted by ``user_step``)."""
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        """The network moved this member to ``step`` (a state sync, a catch-up): a scheduler follows
        a forward jump, so the learning rate is the one of the step it trains next."""
        if self.scheduler is not None and step > self._step:
            with warnings.catch_warnings():   # "scheduler.step() before optimizer.step()": on purpose
                warnings.simplefilter("ignore")
                for _ in range(step - self._step):
                    try:
                        self.scheduler.step()
                    except ValueError:   # past its end (OneCycleLR counts its steps)
                        break
        self._step = step

    def run_steps(self, n: int) -> float:
        """The daemon's worker: the user's loop makes ``n`` steps; their mean loss (nan: none given).
        StepsStopped when the run ends first (``close`` mid-round: the round is not done)."""
        with self._turn:
            if self._ended:
                raise StepsStopped
            self._allowed, self._losses = n, []
            self._turn.notify_all()
            while self._allowed and not self._ended:
                self._turn.wait()
            stopped, self._allowed = self._allowed > 0, 0
            losses = self._losses
        if stopped:
            raise StepsStopped
        return sum(losses) / len(losses) if losses else math.nan

    def user_step(self, loss: float | None) -> None:
        """The user's thread, after one optimizer step: counted; the round's last waits for the next."""
        with self._turn:
            if self._ended:
                return
            self._allowed -= 1
            self._step += 1
            if loss is not None:
                self._losses.append(loss)
            if self._allowed == 0:
                self._turn.notify_all()
            while self._allowed == 0 and not self._ended:
                self._turn.wait()

    def wait_turn(self) -> None:
        """The user's thread: wait until the member asks for steps (or its run is over)."""
        with self._turn:
            while self._allowed == 0 and not self._ended:
                self._turn.wait()

    def end(self) -> None:
        """The run is over (finished, stranded, closed or failed): no step waits any more."""
        with self._turn:
            self._ended = True
            self._turn.notify_all()

    @property
    def ended(self) -> bool:
        return self._ended

    # ------------------------------------------------------------------ what the daemon shows

    def evaluate(self) -> dict[str, float]:
        return {} if self._evaluate is None else {k: float(v) for k, v in self._evaluate(self.model).items()}

    def warnings(self) -> list[str]:
        return []

    @property
    def last_lr(self) -> float | None:
        """The learning rate the user's optimizer is set to (its first parameter group's; None: no
        optimizer given), as the status shows a built-in trainer's."""
        return None if self.optimizer is None else float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """``{"tensors", "meta"}`` as peer/train/checkpoint.py stores it: live tensors (no copy)."""
        tensors: dict[str, torch.Tensor] = {"params": self.flat_params}
        for name, buffer in self.model.named_buffers():
            tensors[f"buffer.{name}"] = buffer
        meta: dict[str, Any] = {"task": TASK, "step": self._step, "n_params": self.flat_params.numel(),
                                "optimizer": "none", "scheduler": None}
        if self.optimizer is not None:
            state = self.optimizer.state_dict()
            scalars: dict[str, dict[str, Any]] = {}
            for index, values in state["state"].items():
                for key, value in values.items():
                    if isinstance(value, torch.Tensor):
                        tensors[f"optimizer.{index}.{key}"] = value
                    else:
                        scalars.setdefault(str(index), {})[key] = value
            meta["optimizer"] = type(self.optimizer).__name__
            meta["optimizer_scalars"] = scalars
            meta["param_groups"] = _plain(state["param_groups"])
        if self.scheduler is not None:
            meta["scheduler"] = _plain(self.scheduler.state_dict())
        return {"tensors": tensors, "meta": meta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A :meth:`state_dict` back in place (the model's tensors keep their identity)."""
        tensors: dict[str, torch.Tensor] = state["tensors"]
        meta: dict[str, Any] = state["meta"]
        expected = self.state_dict()
        for key in ("task", "optimizer", "n_params"):
            if meta.get(key) != expected["meta"][key]:
                raise HivemeshError(f"the checkpoint is for {key} {meta.get(key)}, this member's is "
                                    f"{expected['meta'][key]} (another model or optimizer?)")
        with torch.no_grad():
            for name, target in expected["tensors"].items():
                if not name.startswith("optimizer.") and name in tensors:
                    target.copy_(tensors[name])
        if self.optimizer is not None:
            by_index: dict[int, dict[str, Any]] = {}
            for name, tensor in tensors.items():
                if name.startswith("optimizer."):
                    index, key = name.removeprefix("optimizer.").split(".", 1)
                    by_index.setdefault(int(index), {})[key] = tensor
            for index, values in meta.get("optimizer_scalars", {}).items():
                by_index.setdefault(int(index), {}).update(values)
            groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
                      for group in meta["param_groups"]]   # betas are a tuple again
            self.optimizer.load_state_dict({"state": by_index, "param_groups": groups})
        if self.scheduler is not None and meta.get("scheduler") is not None:
            self.scheduler.load_state_dict(meta["scheduler"])
        self._step = int(meta["step"])


def _plain(value: Any) -> Any:
    """Tuples as lists, for the manifest's JSON (what is not JSON is found by :func:`_json_or_error`)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _json_or_error(meta: dict[str, Any]) -> None:
    try:
        json.dumps(meta, allow_nan=True)
    except (TypeError, ValueError) as error:
        raise HivemeshError(f"the optimizer's or scheduler's state cannot be checkpointed: {error}") from None
