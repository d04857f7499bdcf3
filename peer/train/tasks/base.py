"""What a training task is: a seeded model builder, a fixed train/test split, a loss, an evaluation.

A :class:`Task` holds its data once; every trainer in the process (the
simulator runs hundreds) indexes into the same tensors, and casts to another
dtype or device are cached on the task, so memory does not grow with peers.

A task may hold map-style ``torch.utils.data.Dataset``s instead (``train_set``/``test_set``,
"lazy"): nothing is loaded up front; a trainer fetches its batches sample by sample
(:func:`fetch`), so memory does not grow with the dataset's size.

A task may ask for bf16 autocast (``Task.autocast``): the trainer runs the forward pass
and loss under it, parameters, gradients and optimizer state stay float32, so what
gossip sends and checkpoints hold does not change.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from protocols.errors import HivemeshError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
EvaluateFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], dict[str, float]]

EVAL_BATCH = 1024  # test-set forward passes in chunks of this many samples: bounded memory
# "off": float32 throughout; "auto": bf16 autocast on a CUDA device with bf16; "bf16": also on a
# CPU, where whether it pays depends on the CPU and the shape (bench/bench_gpt.py), so it is opt-in
AUTOCAST_MODES = ("off", "auto", "bf16")


class TaskError(HivemeshError, ValueError):
    """An unknown task name, a bad task option, or a custom task that does not load."""


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's global CPU generator inside the block only (module inits draw from it)."""
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only (models are built on CPU): torch.manual_seed would also queue
        # a lazy CUDA seeding, which is slow while CUDA is uninitialised.
        torch.default_generator.manual_seed(seed)
        yield


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequences (batch, time, vocab) are flattened to characters."""
    if output.dim() == 3:
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return nn.functional.cross_entropy(output, target)


def classification_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                           loss_fn: LossFn = cross_entropy, *, batch: int = EVAL_BATCH) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` on ``(x, y)``, in chunks of ``batch`` samples, in eval mode,
    without grad."""
    was_training = model.training
    model.eval()
    total_loss = 0.0
    correct = 0
    count = 0
    with torch.no_grad():
        for start in range(0, len(x), batch):
            xb, yb = x[start:start + batch], y[start:start + batch]
            out = model(xb)
            items = yb.numel()
            total_loss += float(loss_fn(out, yb)) * items
            if out.dim() >= 2 and out.shape[-1] > 1:
                correct += int((out.argmax(dim=-1) == yb).sum())
            else:  # one logit: binary
                correct += int(((out.reshape(yb.shape) > 0).to(yb.dtype) == yb).sum())
            count += items
    model.train(was_training)
    return {"loss": total_loss / max(count, 1), "accuracy": correct / max(count, 1)}


def _lazy_metrics(model: nn.Module, dataset: Dataset[Any], loss_fn: LossFn, dtype: torch.dtype,
                  device: torch.device) -> dict[str, float]:
    """:func:`classification_metrics` over a lazy ``dataset``, :data:`EVAL_BATCH` samples at a time."""
    sums = {"loss": 0.0, "accuracy": 0.0}
    count = 0
    for start in range(0, len(dataset), EVAL_BATCH):  # type: ignore[arg-type]
        x, y = fetch(dataset, range(start, min(start + EVAL_BATCH, len(dataset))), dtype, device)  # type: ignore[arg-type]
        batch = classification_metrics(model, x, y, loss_fn)
        for key in sums:
            sums[key] += batch[key] * y.numel()
        count += y.numel()
        del x, y
    return {key: value / max(count, 1) for key, value in sums.items()}


def fetch(dataset: Dataset[Any], indices: Any, dtype: torch.dtype,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples ``indices`` of a map-style ``dataset`` of ``(input, target)`` pairs, collated as a
    DataLoader would (``default_collate``), floating inputs in ``dtype``, on ``device``."""
    x, y = default_collate([dataset[int(i)] for i in indices])
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    return (x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype),
            y.to(device=device, dtype=dtype if y.is_floating_point() else y.dtype))


def autocast_to(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Autocast to ``dtype`` on ``device`` inside the block; None: none (not even a disabled one)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@functools.cache
def _cuda_bf16() -> bool:
    return torch.cuda.is_bf16_supported()


def moved(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` on ``device``, contiguous; but a view with overlapping rows over one
    contiguous vector (a text's windows) stays a view, of the moved vector: not a copy per window."""
    base = tensor._base
    if base is None or tensor.is_contiguous() or not base.is_contiguous() or base.storage_offset():
        return tensor.to(device=device, dtype=dtype).contiguous()
    return base.to(device=device, dtype=dtype).as_strided(tensor.shape, tensor.stride(),
                                                          tensor.storage_offset())


@dataclass(frozen=True, kw_only=True, eq=False)
class Task:
    """A named learning problem with a fixed train/test split.

    ``build_model(seed)`` must return the same initial model for the same seed.
    ``train_x/train_y/test_x/test_y`` are CPU tensors; floating inputs are cast to the
    trainer's dtype (cached here). Or ``train_set/test_set`` are map-style Datasets of
    ``(input, target)`` (a lazy task; the tensors are then left empty). ``labels`` (int64 numpy,
    one per training sample) drive label-skew partitioning: a lazy task's come from its training
    Dataset's ``labels()`` method, and without one it can only be partitioned ``iid``.
    ``reference_loss`` (optional) gives the optimum of the full training loss, for convex tasks.
    """

    name: str
    build_model: Callable[[int], nn.Module]
    train_x: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    train_y: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    test_x: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    test_y: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    train_set: Dataset[Any] | None = None  # a lazy task's data instead of the four tensors
    test_set: Dataset[Any] | None = None
    loss_fn: LossFn = cross_entropy
    evaluate_fn: EvaluateFn | None = None  # None: loss and accuracy of classification_metrics
    bar: Mapping[str, float] = field(default_factory=dict)  # the quality bar, e.g. {"accuracy": 0.95}
    reference_loss: Callable[[], float] | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    autocast: str = "off"  # one of AUTOCAST_MODES: see autocast_dtype
    _cast_cache: dict[tuple[str, str, str], torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if (self.train_set is None) != (self.test_set is None):
            raise TaskError(f"task {self.name!r}: give both a train and a test Dataset, or neither")
        if self.lazy:
            if len(self.train_x) or len(self.test_x):
                raise TaskError(f"task {self.name!r}: give Datasets or tensors, not both")
            if self.evaluate_fn is not None:
                raise TaskError(f"task {self.name!r}: an 'evaluate' function takes whole tensors: "
                                "a task of Datasets is evaluated by loss and accuracy")
            if self.n_train == 0:
                raise TaskError(f"task {self.name!r}: no training samples")
            return
        if len(self.train_x) != len(self.train_y) or len(self.test_x) != len(self.test_y):
            raise TaskError(f"task {self.name!r}: inputs and targets differ in length")
        if len(self.train_x) == 0:
            raise TaskError(f"task {self.name!r}: no training samples")
        if self.autocast not in AUTOCAST_MODES:
            raise TaskError(f"task {self.name!r}: autocast must be one of {', '.join(AUTOCAST_MODES)}, "
                            f"not {self.autocast!r}")

    @property
    def lazy(self) -> bool:
        """True for a task of Datasets (fetched per batch), False for one of whole tensors."""
        return self.train_set is not None

    @property
    def n_train(self) -> int:
        return len(self.train_set) if self.train_set is not None else len(self.train_x)  # type: ignore[arg-type]

    @property
    def labels(self) -> np.ndarray:
        """One int label per training sample (the last target position for sequences)."""
        if self.train_set is not None:
            labels = getattr(self.train_set, "labels", None)
            if not callable(labels):
                raise TaskError(f"task {self.name!r}: this partition scheme needs every training label: "
                                "give the training Dataset a labels() method, or use scheme 'iid'")
            values = np.asarray(labels(), dtype=np.int64)
            if values.shape != (self.n_train,):
                raise TaskError(f"task {self.name!r}: labels() gave {values.size} labels for "
                                f"{self.n_train} training samples")
            return values
        y = self.train_y
        if y.dim() > 1:
            y = y[:, -1]
        return y.to(torch.int64).numpy()

    def data(self, split: str, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of ``split`` ("train"/"test") with floating tensors in ``dtype``, on ``device``.

        Cast copies are made once per process and shared by every trainer.
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', not {split!r}")
        if self.lazy:
            raise TaskError(f"task {self.name!r} holds Datasets, not whole tensors: fetch batches of it")
        return (self._cast(split, "x", dtype, device), self._cast(split, "y", dtype, device))

    def _cast(self, split: str, part: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        tensor: torch.Tensor = getattr(self, f"{split}_{part}")
        target_dtype = dtype if tensor.is_floating_point() else tensor.dtype
        if tensor.dtype == target_dtype and tensor.device == device:
            return tensor
        key = (f"{split}_{part}", str(target_dtype), str(device))
        if key not in self._cast_cache:
            self._cast_cache[key] = moved(tensor, device, target_dtype)
        return self._cast_cache[key]

    def autocast_dtype(self, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
        """The dtype to autocast a ``dtype`` model's forward pass to on ``device``; None: no autocast
        (and always None for float64, which asks for exact arithmetic)."""
        if self.autocast == "off" or dtype != torch.float32:
            return None
        if self.autocast == "auto" and not (device.type == "cuda" and _cuda_bf16()):
            return None
        return torch.bfloat16

    def evaluate(self, model: nn.Module, *, split: str = "test") -> dict[str, float]:
        """Metrics of ``model`` on a split (loss always; accuracy for classifiers), under the
        task's autocast."""
        param = next(iter(model.parameters()))
        with autocast_to(param.device, self.autocast_dtype(param.device, param.dtype)):
            if self.lazy:
                dataset = self.train_set if split == "train" else self.test_set
                assert dataset is not None
                return _lazy_metrics(model, dataset, self.loss_fn, param.dtype, param.device)
            x, y = self.data(split, param.dtype, param.device)
            if self.evaluate_fn is not None:
                return dict(self.evaluate_fn(model, x, y))
            return classification_metrics(model, x, y, self.loss_fn)

    def meets_bar(self, metrics: Mapping[str, float]) -> bool:
        """True when every bar metric is reached ("...loss"/"...gap" keys: at most; others: at least)."""
        for key, target in self.bar.items():
            value = metrics.get(key, math.nan)
            ok = value <= target if key.endswith(("loss", "gap")) else value >= target
            if not ok:
                return False
        return True
