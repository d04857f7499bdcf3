"""Local training of one member: n steps (or e epochs) of a task on its shard.

The model's parameters and floating buffers (BatchNorm running statistics) are
views into ONE contiguous 1-D tensor: :attr:`Trainer.flat_params` is its first
part, :attr:`Trainer.flat_buffers` the rest; gradients live in
:attr:`Trainer.flat_grads`. A protocol that mixes or compresses these in place
changes the model itself, with no copy per step; the optimizer works on them too.

:attr:`Trainer.mixed` is what gossip mixes, sends and state-syncs: the whole
vector when ``TrainerConfig.buffers == "average"``, only ``flat_params`` when
``"local"``. Integer buffers (``num_batches_tracked``) always stay local.

Data order: each epoch visits the shard in a permutation keyed by (seed,
"member-<index>", epoch, "data-order"), so a resumed run continues exactly;
batches are ``batch_size`` consecutive positions (0: the whole shard). A task of Datasets
(``Task.lazy``) has each batch's samples fetched and collated as a DataLoader would
(``tasks.base.fetch``), the same order: memory is the shard's indices and one batch.

FedProx (Li et al. 2020): ``run_steps(n, proximal=(anchor, mu))`` adds the
gradient of ``mu/2 ||params - anchor||^2`` to every step's gradient before
clipping and the optimiser step; with ``mu = 0`` (or no anchor) the step is plain
SGD, bit for bit. Deterministic from the seed on CPU; on CUDA,
:meth:`Trainer.host_mixed` stages the mixed vector through a pinned host buffer.
A task that asks for autocast (``Task.autocast``) has its forward pass and loss run in
bf16 autocast; the flat vectors stay in the trainer's dtype. More: docs/design/training.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from peer.train.tasks.base import EVAL_BATCH, Task, autocast_to, fetch
from protocols.errors import HivemeshError
from protocols.federation.server_opt import proximal_gradient
from protocols.rng import derive_seed, torch_generator


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """How one member trains locally."""

    optimizer: Literal["sgd", "momentum", "adamw"] = "sgd"  # plain SGD: what the theory assumes
    lr: float = 0.05  # a safe rate for the small built-in tasks with SGD
    momentum: float = 0.9  # heavy-ball coefficient of "momentum" (Polyak; torch's SGD convention)
    adam_betas: tuple[float, ...] = (0.9, 0.999)  # AdamW's usual (beta1, beta2)
    adam_eps: float = 1e-8  # AdamW's usual epsilon
    weight_decay: float = 0.0  # off: protocols compare against undecayed theory
    batch_size: int = 32  # small batches: many cheap steps between gossip rounds; 0 = whole shard
    warmup_steps: int = 0  # linear warm-up from lr/warmup_steps to lr
    lr_decay: Literal["none", "cosine", "step"] = "none"  # constant lr unless asked
    # the horizon of "cosine"/"step" decay, in schedule steps ("step": x0.1 at 50% and 75%);
    # 0 in a federation: its rounds x a round's local steps; reaching 0 before the end warns once
    total_steps: int = 0
    grad_clip: float = 0.0  # max global gradient L2 norm; 0 = no clipping
    dtype: Literal["float32", "float64"] = "float32"  # float64 for exact checks against numpy
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when present, else CPU
    threads: int = 1  # torch CPU threads; 1 because several peers usually share a host; 0 = leave as is
    buffers: Literal["average", "local"] = "average"  # BatchNorm statistics: mixed like parameters, or kept

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "momentum", "adamw"):
            raise ValueError(f"optimizer must be sgd, momentum or adamw, not {self.optimizer!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, not {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), not {self.momentum}")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1), not {self.adam_betas}")
        if self.adam_eps <= 0:
            raise ValueError(f"adam_eps must be positive, not {self.adam_eps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, not {self.weight_decay}")
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be >= 0 (0 = whole shard), not {self.batch_size}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, not {self.warmup_steps}")
        if self.lr_decay not in ("none", "cosine", "step"):
            raise ValueError(f"lr_decay must be none, cosine or step, not {self.lr_decay!r}")
        if self.lr_decay != "none" and 0 < self.total_steps <= self.warmup_steps:
            raise ValueError(f"lr_decay={self.lr_decay!r} needs total_steps > warmup_steps "
                             f"(got total_steps={self.total_steps}, warmup_steps={self.warmup_steps})")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = off), not {self.grad_clip}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, not {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = leave torch's setting), not {self.threads}")
        if self.buffers not in ("average", "local"):
            raise ValueError(f"buffers must be average or local, not {self.buffers!r}")


def resolve_device(choice: str) -> torch.device:
    """"auto" -> CUDA when available, else CPU; "cuda" without a GPU is a user error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise HivemeshError("device = 'cuda' but torch sees no CUDA device (use 'auto' or 'cpu')")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def epoch_order(seed: int, member_index: int, epoch: int, shard_size: int) -> torch.Tensor:
    """The permutation of shard positions that member ``member_index`` visits in ``epoch`` (CPU int64)."""
    generator = torch_generator(seed, f"member-{member_index}", epoch, "data-order")
    return torch.randperm(shard_size, generator=generator)


@dataclass(frozen=True)
class SchedulePoint:
    """Where the next steps sit on the learning-rate schedule: the first one's schedule step, and
    the schedule's horizon (both in steps)."""

    step: int
    total_steps: int


def lr_at(config: TrainerConfig, step: int, total_steps: int = 0) -> float:
    """Learning rate of schedule step ``step`` (0-based): linear warm-up, then the decay schedule
    over ``total_steps`` steps (0: ``config.total_steps``)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_decay == "none":
        return config.lr
    horizon = total_steps or config.total_steps
    if horizon <= config.warmup_steps:
        raise ValueError(f"lr_decay={config.lr_decay!r} needs total_steps > warmup_steps "
                         f"(got total_steps={horizon}, warmup_steps={config.warmup_steps})")
    progress = min(1.0, (step - config.warmup_steps) / (horizon - config.warmup_steps))
    if config.lr_decay == "cosine":
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.lr * 0.1 ** ((progress >= 0.5) + (progress >= 0.75))


def flatten_into(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``tensors`` into ``flat`` end to end and re-point each at its slice (same autograd leaf)."""
    offset = 0
    for tensor in tensors:
        size = tensor.numel()
        flat[offset:offset + size].copy_(tensor.detach().reshape(-1))
        tensor.data = flat[offset:offset + size].view_as(tensor)
        offset += size
    assert offset == flat.numel()


class StepsStopped(Exception):
    """``run_steps`` ended by a stop before its steps were all made (a library member closed
    mid-round, peer/train/own.py): the round is not done, and is trained again after a restart."""


class HostStage:
    """Flat vectors (of at most ``numel`` elements) in host memory, ready to send: on CPU the vector
    itself (no copy); on CUDA a copy in one reused pinned buffer, complete when the call returns."""

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.numel, self.dtype = numel, dtype
        self._pinned: torch.Tensor | None = None

    def __call__(self, vector: torch.Tensor) -> torch.Tensor:
        if vector.device.type == "cpu":
            return vector
        if self._pinned is None:
            self._pinned = torch.empty(self.numel, dtype=self.dtype, pin_memory=True)
        staged = self._pinned[:vector.numel()]
        staged.copy_(vector, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(vector.device))
        done.synchronize()
        return staged


class FlatOptimizer:
    """SGD, heavy-ball momentum or AdamW on a flat parameter vector (torch.optim's formulas)."""

    def __init__(self, config: TrainerConfig, params: torch.Tensor) -> None:
        self.config = config
        self.steps = 0
        self.state: dict[str, torch.Tensor] = {}
        if config.optimizer == "momentum":
            self.state["momentum_buffer"] = torch.zeros_like(params)
        elif config.optimizer == "adamw":
            self.state["exp_avg"] = torch.zeros_like(params)
            self.state["exp_avg_sq"] = torch.zeros_like(params)
            self._denom = torch.empty_like(params)

    def apply(self, params: torch.Tensor, grads: torch.Tensor, lr: float) -> None:
        """One update of ``params`` in place; may modify ``grads``."""
        config = self.config
        self.steps += 1
        if config.optimizer == "adamw":
            beta1, beta2 = config.adam_betas
            if config.weight_decay:
                params.mul_(1.0 - lr * config.weight_decay)
            exp_avg, exp_avg_sq = self.state["exp_avg"], self.state["exp_avg_sq"]
            exp_avg.lerp_(grads, 1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1.0 - beta2)
            bias1 = 1.0 - beta1 ** self.steps
            bias2 = 1.0 - beta2 ** self.steps
            torch.sqrt(exp_avg_sq, out=self._denom)
            self._denom.div_(math.sqrt(bias2)).add_(config.adam_eps)
            params.addcdiv_(exp_avg, self._denom, value=-lr / bias1)
            return
        if config.weight_decay:
            grads.add_(params, alpha=config.weight_decay)
        if config.optimizer == "momentum":
            buffer = self.state["momentum_buffer"]
            buffer.mul_(config.momentum).add_(grads)
            params.add_(buffer, alpha=-lr)
        else:
            params.add_(grads, alpha=-lr)


class Trainer:
    """Trains ``task``'s model on the samples ``shard`` (indices into the task's training split).

    The initial model depends only on ``seed`` (all members start equal); the data
    order depends on ``(seed, member_index)``.
    """

    def __init__(self, task: Task, config: TrainerConfig, shard: np.ndarray, *, seed: int,
                 member_index: int) -> None:
        if config.threads > 0 and torch.get_num_threads() != config.threads:
            torch.set_num_threads(config.threads)
        shard = np.asarray(shard)
        if shard.ndim != 1 or len(shard) == 0 or shard.dtype.kind not in "iu":
            raise HivemeshError(f"member {member_index}: the shard must be a non-empty 1-D array of indices")
        if shard.min() < 0 or shard.max() >= task.n_train:
            raise HivemeshError(f"member {member_index}: shard indices must lie in [0, {task.n_train})")
        self.task = task
        self.config = config
        self.seed = seed
        self.member_index = member_index
        self.device = resolve_device(config.device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.shard = torch.from_numpy(shard.astype(np.int64)).to(self.device)
        self._x: torch.Tensor | None = None  # None (both): a lazy task, fetched per batch
        self._y: torch.Tensor | None = None
        if not task.lazy:
            self._x, self._y = task.data("train", self.dtype, self.device)
        self.autocast = task.autocast_dtype(self.device, self.dtype)  # None: the forward pass in self.dtype

        self.model: nn.Module = task.build_model(seed).to(device=self.device, dtype=self.dtype)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise HivemeshError(f"task {task.name!r}: the model has no trainable parameters")
        self.param_names = tuple(n for n, p in self.model.named_parameters() if p.requires_grad)
        self.param_shapes = tuple(tuple(p.shape) for p in params)
        float_buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        self.buffer_shapes = tuple(tuple(b.shape) for b in float_buffers)
        n_params = sum(p.numel() for p in params)
        # one allocation, so that "parameters and buffers" is a single vector a protocol can mix
        self._flat_all = torch.empty(n_params + sum(b.numel() for b in float_buffers),
                                     dtype=self.dtype, device=self.device)
        self.flat_params = self._flat_all[:n_params]
        self.flat_buffers = self._flat_all[n_params:]
        flatten_into(params, self.flat_params)
        flatten_into(float_buffers, self.flat_buffers)
        self.flat_grads = torch.zeros_like(self.flat_params)
        offset = 0
        for p in params:
            p.grad = self.flat_grads[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self._int_buffers = {name: b for name, b in self.model.named_buffers() if not b.is_floating_point()}

        self._optimizer = FlatOptimizer(config, self.flat_params)
        self.step = 0
        self.lr_zero_at: SchedulePoint | None = None   # the first step trained at lr 0, and its horizon
        self.last_lr: float | None = None       # the rate of the last step trained (None: none since start)
        self.last_schedule_step = -1            # that step's place on the schedule (-1: none since start)
        self.epoch = 0
        self.offset = 0
        self._order: torch.Tensor | None = None
        self._stage = HostStage(self._flat_all.numel(), self.dtype)

    # ------------------------------------------------------------------ properties

    @property
    def average_buffers(self) -> bool:
        """True when protocols should mix :attr:`flat_buffers` like the parameters."""
        return self.config.buffers == "average"

    @property
    def mixed(self) -> torch.Tensor:
        """The flat vector gossip mixes in place, sends and hands over in state sync: parameters,
        then floating buffers when they are averaged (a view; :attr:`flat_params` when "local")."""
        return self._flat_all if self.average_buffers else self.flat_params

    @property
    def mixed_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes laid end to end in :attr:`mixed` (for per-layer compressors such as PowerSGD)."""
        return self.param_shapes + self.buffer_shapes if self.average_buffers else self.param_shapes

    @property
    def batch_size(self) -> int:
        size = len(self.shard)
        return size if self.config.batch_size == 0 else min(self.config.batch_size, size)

    @property
    def steps_per_epoch(self) -> int:
        return -(-len(self.shard) // self.batch_size)

    @property
    def optimizer_state(self) -> dict[str, torch.Tensor]:
        """The optimizer's flat state tensors (live; e.g. "momentum_buffer")."""
        return self._optimizer.state

    # ------------------------------------------------------------------ training

    def batch_positions(self) -> torch.Tensor:
        """Shard positions of the next batch (without advancing), for callers reproducing the order."""
        order = self._epoch_order()
        return order[self.offset:self.offset + self.batch_size]

    def _epoch_order(self) -> torch.Tensor:
        if self._order is None:
            order = epoch_order(self.seed, self.member_index, self.epoch, len(self.shard))
            self._order = order.to(self.device)
        return self._order

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        positions = self.batch_positions()
        self.offset += len(positions)
        if self.offset >= len(self.shard):
            self.epoch += 1
            self.offset = 0
            self._order = None
        return self._samples(self.shard.index_select(0, positions))

    def _samples(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training samples ``indices``: rows of the task's tensors, or fetched from its Dataset."""
        if self._x is None or self._y is None:
            assert self.task.train_set is not None
            return fetch(self.task.train_set, indices.tolist(), self.dtype, self.device)
        return self._x.index_select(0, indices), self._y.index_select(0, indices)

    def _one_step(self, proximal: tuple[torch.Tensor, float] | None, lr: float) -> torch.Tensor:
        # Anything stochastic inside the model (dropout) draws from a per-step seed: resumable.
        seed = derive_seed(self.seed, f"member-{self.member_index}", self.step, "model-noise")
        if self.device.type == "cpu":
            # Same CPU state as torch.manual_seed, without its lazy CUDA seeding, which formats a
            # stack trace on every call while CUDA is uninitialised (~6 ms a step in the simulator).
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        x, y = self._next_batch()
        self.flat_grads.zero_()
        loss = self._loss(x, y)
        loss.backward()
        if proximal is not None:
            anchor, mu = proximal
            self.flat_grads.add_(proximal_gradient(self.flat_params, anchor, mu))
        if self.config.grad_clip > 0:
            norm = torch.linalg.vector_norm(self.flat_grads)
            self.flat_grads.mul_(torch.clamp(self.config.grad_clip / (norm + 1e-6), max=1.0))
        self._optimizer.apply(self.flat_params, self.flat_grads, lr)
        self.step += 1
        return loss.detach()

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast_to(self.device, self.autocast):
            return self.task.loss_fn(self.model(x), y)

    def run_steps(self, n: int, *, proximal: tuple[torch.Tensor | None, float] | None = None,
                  schedule: SchedulePoint | None = None) -> float:
        """Run ``n`` optimizer steps; the mean training loss of their batches (nan when n = 0).

        ``proximal = (anchor, mu)``: FedProx's term ``mu/2 ||params - anchor||^2`` joins the
        objective (its gradient is added to each step's); ``anchor`` is a flat vector like
        :attr:`flat_params`. The loss returned is the task's alone, comparable with and without it.
        ``schedule``: where these steps sit on the learning-rate schedule (a federation's global
        work: peer/train/federated.py); None: at :attr:`step`, over ``config.total_steps``.
        """
        if n < 0:
            raise ValueError(f"run_steps needs n >= 0, not {n}")
        if n == 0:
            return math.nan
        point = schedule or SchedulePoint(self.step, self.config.total_steps)
        pull = self._proximal(proximal)
        self.model.train()
        total = torch.zeros((), dtype=self.dtype, device=self.device)
        with torch.random.fork_rng(devices=[]):
            for i in range(n):
                lr = lr_at(self.config, point.step + i, point.total_steps)
                if lr == 0.0 and self.lr_zero_at is None:
                    self.lr_zero_at = SchedulePoint(point.step + i, point.total_steps)
                total += self._one_step(pull, lr)
                self.last_lr, self.last_schedule_step = lr, point.step + i
        return float(total) / n

    def warnings(self) -> list[str]:
        """What the trainer's owner should say once: a learning rate that reached 0 while the run
        still trains (each step after it changes nothing)."""
        if self.lr_zero_at is None:
            return []
        return [f"the learning rate reached 0 at step {self.lr_zero_at.step} of its schedule "
                f"(lr_decay {self.config.lr_decay!r} over total_steps = {self.lr_zero_at.total_steps}) "
                "before the run's end: the steps after it change nothing (raise network.trainer."
                "total_steps; in a federation, leave it out and the schedule spans the rounds)"]

    def _proximal(self, proximal: tuple[torch.Tensor | None, float] | None
                  ) -> tuple[torch.Tensor, float] | None:
        """``(anchor on this trainer's device and dtype, mu)``, or None when there is no pull."""
        if proximal is None:
            return None
        anchor, mu = proximal
        if not (mu >= 0 and math.isfinite(mu)):
            raise ValueError(f"the proximal weight mu must be a finite number >= 0, not {mu}")
        if anchor is None or mu == 0:
            return None
        if anchor.shape != self.flat_params.shape:
            raise ValueError(f"the proximal anchor has shape {tuple(anchor.shape)}, the parameters "
                             f"{tuple(self.flat_params.shape)}")
        return anchor.detach().to(device=self.device, dtype=self.dtype), float(mu)

    def run_epochs(self, e: int) -> float:
        """Run until ``e`` more epochs have completed (the first may be partial); mean loss."""
        target = self.epoch + e
        steps = 0
        total = 0.0
        while self.epoch < target:
            total += self.run_steps(1)
            steps += 1
        return total / steps if steps else math.nan

    def gradient(self) -> torch.Tensor:
        """Full-batch gradient of the mean loss over the whole shard at the current parameters (a copy).

        Buffers (BatchNorm statistics) are left as they were; the model's train/eval mode is kept.
        """
        saved_buffers = self.flat_buffers.clone()
        self.flat_grads.zero_()
        size = len(self.shard)
        for start in range(0, size, EVAL_BATCH):
            indices = self.shard[start:start + EVAL_BATCH]
            loss = self._loss(*self._samples(indices))
            (loss * (len(indices) / size)).backward()
        self.flat_buffers.copy_(saved_buffers)
        return self.flat_grads.clone()

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """The task's metrics on ``split`` ("test" or the whole "train" set), e.g. loss and accuracy."""
        metrics = self.task.evaluate(self.model, split=split)
        if self.task.reference_loss is not None:
            train = metrics if split == "train" else self.task.evaluate(self.model, split="train")
            train_loss = train["loss"]
            metrics["train_loss"] = train_loss
            metrics["optimality_gap"] = train_loss - self.task.reference_loss()
        return metrics

    # ------------------------------------------------------------------ sending

    def host_params(self) -> torch.Tensor:
        """The parameters in host memory, ready to send (see :meth:`host_mixed`)."""
        return self._host(self.flat_params)

    def host_mixed(self) -> torch.Tensor:
        """:attr:`mixed` in host memory, ready to send (a state-sync answer).

        CPU: the live vector itself (no copy; do not mix it while a send is in flight).
        CUDA: a copy in a pinned host buffer, complete when this returns (the copy is queued
        on the current stream after all work already queued there, then waited on). The
        buffer is reused by the next call: finish sending before calling again.
        """
        return self._host(self.mixed)

    def _host(self, vector: torch.Tensor) -> torch.Tensor:
        return self._stage(vector)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """``{"tensors": {name: tensor}, "meta": {json-able}}``: model, optimizer and data position.

        The tensors are the live ones (no copy): save them before training on.
        """
        tensors: dict[str, torch.Tensor] = {"params": self.flat_params}
        if self.flat_buffers.numel():
            tensors["buffers"] = self.flat_buffers
        for name, buffer in self._int_buffers.items():
            tensors[f"int_buffer.{name}"] = buffer
        for name, value in self._optimizer.state.items():
            tensors[f"optimizer.{name}"] = value
        meta = {"task": self.task.name, "step": self.step, "epoch": self.epoch, "offset": self.offset,
                "optimizer": self.config.optimizer, "optimizer_steps": self._optimizer.steps,
                "dtype": self.config.dtype, "n_params": self.flat_params.numel(),
                "shard_size": len(self.shard), "member_index": self.member_index}
        return {"tensors": tensors, "meta": meta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` in place (the flat tensors keep their identity)."""
        tensors: dict[str, torch.Tensor] = state["tensors"]
        meta: dict[str, Any] = state["meta"]
        expected = self.state_dict()
        if set(tensors) != set(expected["tensors"]):
            raise HivemeshError(f"trainer state has tensors {sorted(tensors)}, expected "
                                f"{sorted(expected['tensors'])} (different task or optimizer?)")
        for key in ("task", "optimizer", "n_params"):
            if meta.get(key) != expected["meta"][key]:
                raise HivemeshError(f"trainer state is for {key}={meta.get(key)!r}, "
                                    f"this trainer has {expected['meta'][key]!r}")
        for name, target in expected["tensors"].items():
            source = tensors[name]
            if source.shape != target.shape:
                raise HivemeshError(f"trainer state tensor {name!r} has shape {tuple(source.shape)}, "
                                    f"expected {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(source)
        self.step = int(meta["step"])
        self.epoch = int(meta["epoch"])
        self.offset = int(meta["offset"])
        if meta.get("shard_size") != len(self.shard):
            # the roster changed while it was away (shards are keyed by member name: a joiner took
            # some of its samples, a leaver's came to it): its place in the old shard's order means
            # nothing in the new one, so it goes on from the start of the next epoch
            self.epoch, self.offset = self.epoch + 1, 0
        self._optimizer.steps = int(meta["optimizer_steps"])
        self._order = None
