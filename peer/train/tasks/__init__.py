"""Training tasks by name: built-ins, or a user's ``module:function``.

``get_task(name, **options)`` returns a :class:`Task`, cached per process (the
simulator's hundreds of peers share one copy of the data):

- ``digits-mlp``: 64-128-10 MLP on scikit-learn's digits; bar: test accuracy >= 0.95.
- ``digits-cnn``: small CNN with BatchNorm on the same images; bar: >= 0.97.
- ``logreg``: generated logistic regression (options ``n_samples``, ``n_features``,
  ``n_classes``, ``binary``, ``test_samples``, ``data_seed``); bar: full training
  loss within 1e-3 of the float64 optimum.
- ``charlm``: tiny character-level transformer (options ``path`` to a UTF-8 text,
  default the text shipped in ``peer/train/data/``, ``context``, ``width``, ``layers``,
  ``heads``); bar: test loss at least 0.5 nats/char below the text's unigram entropy.
- ``gpt``: a GPT-2-shaped decoder-only transformer on a file's bytes (options ``path``, ``layers``,
  ``width``, ``heads``, ``context``, ``vocab``, ``stride``, ``autocast`` "auto"/"bf16"/"off"); default
  2 x 128, up to GPT-2 small's shape (12 x 768, 12 heads, context 1024, vocab 50257: 124M
  parameters, ids past 255 unused); bar: as charlm's, in nats/byte.
- ``package.module:function`` or ``path/to/file.py:function``: a custom task (in a
  config file, a relative file path is taken from that file's folder: :func:`resolve_task_paths`). The
  function is called with the options as keyword arguments and returns a Task, or
  a mapping ``{"model": build(seed) -> nn.Module, "train": (x, y), "test": (x, y),
  "loss": fn (optional, default cross-entropy), "evaluate": fn(model, x, y) -> dict
  (optional)}``; ``train``/``test`` may be map-style ``torch.utils.data.Dataset``s of
  ``(input, target)`` instead, fetched per batch (then no ``evaluate``). See ``examples/custom_task.py``
  and docs/operations.md#tasks.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from peer.files.paths import from_folder
from peer.train.tasks.base import Task, TaskError, classification_metrics, cross_entropy, seeded

__all__ = ["BUILTIN_TASKS", "Task", "TaskError", "classification_metrics", "cross_entropy",
           "get_task", "load_function", "resolve_task_paths", "seeded"]

BUILTIN_TASKS = ("digits-mlp", "digits-cnn", "logreg", "charlm", "gpt")

# Built-in tasks' options that name files (a custom task's options are passed as written).
_FILE_OPTIONS: dict[str, tuple[str, ...]] = {"charlm": ("path",), "gpt": ("path",)}

_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], Task] = {}


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def get_task(name: str, **options: Any) -> Task:
    """The task called ``name`` built with ``options``; the same object for the same arguments."""
    key = (name, tuple(sorted((k, _freeze(v)) for k, v in options.items())))
    if key not in _CACHE:
        _CACHE[key] = _build(name, options)
    return _CACHE[key]


def _build(name: str, options: dict[str, Any]) -> Task:
    builder = _builtin(name)
    if builder is None:
        if ":" not in name:
            raise TaskError(f"unknown task {name!r}: expected one of {', '.join(BUILTIN_TASKS)} "
                            "or 'module:function' / 'path/to/file.py:function'")
        builder = load_function(name)
    try:
        made = builder(**options)
    except TypeError as error:
        raise TaskError(f"task {name!r}: bad options {sorted(options)}: {error}") from None
    return _as_task(name, made)


def _is_task_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part


def resolve_task_paths(name: str, options: Mapping[str, Any], base: Path) -> tuple[str, dict[str, Any]]:
    """``name`` and ``options`` with relative file paths taken against ``base`` (a config's folder).

    A ``path/to/file.py:function`` task gets its file resolved; a module or built-in name is kept.
    Built-in options that name files (``charlm``'s and ``gpt``'s ``path``) are resolved too.
    """
    module_part, colon, function_name = name.rpartition(":")
    if colon and _builtin(name) is None and _is_task_file(module_part):
        name = f"{from_folder(base, module_part)}:{function_name}"
    resolved = dict(options)
    for key in _FILE_OPTIONS.get(name, ()):
        if isinstance(resolved.get(key), str) and resolved[key]:
            resolved[key] = from_folder(base, resolved[key])
    return name, resolved


def _builtin(name: str) -> Callable[..., Any] | None:
    if name == "digits-mlp":
        from peer.train.tasks.digits import digits_mlp
        return digits_mlp
    if name == "digits-cnn":
        from peer.train.tasks.digits import digits_cnn
        return digits_cnn
    if name == "logreg":
        from peer.train.tasks.logreg import logreg
        return logreg
    if name == "charlm":
        from peer.train.tasks.charlm import charlm
        return charlm
    if name == "gpt":
        from peer.train.tasks.gpt import gpt
        return gpt
    return None


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` (module on sys.path) or ``file.py:function`` (by path)."""
    module_part, _, function_name = spec.rpartition(":")
    if not module_part or not function_name:
        raise TaskError(f"custom task {spec!r}: expected 'module:function'")
    try:
        if _is_task_file(module_part):
            path = Path(module_part)
            if not path.is_file():
                raise TaskError(f"custom task {spec!r}: no such file {path}")
            digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
            module_name = f"hivemesh_custom_task_{digest}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            if module_spec is None or module_spec.loader is None:
                raise TaskError(f"custom task {spec!r}: cannot load {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_part)
    except ImportError as error:
        raise TaskError(f"custom task {spec!r}: cannot import {module_part!r}: {error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TaskError(f"custom task {spec!r}: {module_part!r} has no function {function_name!r}")
    return function


def _as_task(name: str, made: Any) -> Task:
    if isinstance(made, Task):
        return made
    if isinstance(made, Mapping):
        missing = sorted({"model", "train", "test"} - set(made))
        if missing:
            raise TaskError(f"task {name!r}: the returned mapping lacks {', '.join(missing)}")
        build = made["model"]
        if isinstance(build, nn.Module):
            raise TaskError(f"task {name!r}: 'model' must be a function seed -> nn.Module, not a module")
        common = {"name": name, "build_model": build, "loss_fn": made.get("loss", cross_entropy),
                  "evaluate_fn": made.get("evaluate"), "bar": dict(made.get("bar", {}))}
        if isinstance(made["train"], Dataset) or isinstance(made["test"], Dataset):
            if not (isinstance(made["train"], Dataset) and isinstance(made["test"], Dataset)):
                raise TaskError(f"task {name!r}: 'train' and 'test' must both be Datasets or both (x, y)")
            return Task(train_set=made["train"], test_set=made["test"], **common)
        (train_x, train_y), (test_x, test_y) = made["train"], made["test"]
        return Task(name=name, build_model=build, train_x=train_x, train_y=train_y,
                    test_x=test_x, test_y=test_y, loss_fn=made.get("loss", cross_entropy),
                    evaluate_fn=made.get("evaluate"), bar=dict(made.get("bar", {})))
    raise TaskError(f"task {name!r}: the function returned {type(made).__name__}, "
                    "expected a Task or a mapping with model, train, test")
