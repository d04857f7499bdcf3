"""An edge client's own training data (``[edge] data``), read once at start and never sent anywhere.

Formats (the file's suffix decides):

* ``.npz``: arrays ``x`` and ``y`` (``numpy.load`` with ``allow_pickle=False``: no code runs);
* ``.safetensors``: tensors ``x`` and ``y``;
* ``.csv``: a header line, numeric columns; the one named ``label_column`` is ``y``, the rest ``x``;
* ``module:function``: a Python function of no arguments returning ``(x, y)`` tensors or arrays
  (the module is imported from ``sys.path``: the operator's own code, like a config's task file).

``x`` is float (cast to the trainer's dtype later), ``y`` integer class labels, one per row: the
task's model decides what fits (``digits-mlp`` wants 64 features and 10 classes). The task's test
split stays the task's, so a gateway and its clients evaluate alike.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from protocols.errors import HivemeshError


def load_local_data(spec: str, *, label_column: str = "label") -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` from ``spec`` (a path or ``module:function``); HivemeshError naming what is wrong."""
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix in (".npz", ".safetensors", ".csv"):
        if not path.is_file():
            raise HivemeshError(f"no data file {path}")
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                x, y = _pair({name: arrays[name] for name in arrays.files}, path)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            x, y = _pair(load_file(str(path)), path)
        else:
            x, y = _csv(path, label_column)
    elif ":" in spec:
        module_name, _, function_name = spec.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
            x, y = function()
        except (ImportError, AttributeError, TypeError, ValueError) as error:
            raise HivemeshError(f"data {spec!r}: {error}") from None
    else:
        raise HivemeshError(f"data {spec!r}: expected a .npz, .safetensors or .csv file, or module:function")
    return _checked(torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x),
                    torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y), spec)


def _pair(tensors: Mapping[str, object], path: Path) -> tuple[object, object]:
    missing = [name for name in ("x", "y") if name not in tensors]
    if missing:
        raise HivemeshError(f"{path}: no array named {' or '.join(missing)} "
                            f"(has {', '.join(sorted(tensors))})")
    return tensors["x"], tensors["y"]


def _csv(path: Path, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    header = path.read_text().splitlines()[0].split(",") if path.stat().st_size else []
    names = [name.strip() for name in header]
    if label_column not in names:
        raise HivemeshError(f"{path}: no column {label_column!r} in the header ({', '.join(names)})")
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    except ValueError as error:
        raise HivemeshError(f"{path}: {error}") from None
    label = names.index(label_column)
    return np.delete(table, label, axis=1), table[:, label]


def _checked(x: torch.Tensor, y: torch.Tensor, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    if len(x) != len(y) or len(x) == 0:
        raise HivemeshError(f"data {spec!r}: x and y must have the same, non-zero number of rows "
                            f"({len(x)} and {len(y)})")
    if y.is_floating_point() and not torch.equal(y, y.round()):
        raise HivemeshError(f"data {spec!r}: y must hold integer class labels")
    return x.float(), y.long()
