"""``hivemesh eval``: rebuild an export's model from its model card and score it on the task's test split.

The card (written by :func:`peer.runtime.export.model_card`) names the task, its options and
seed; the model is built from them, cast to the export's dtype, loaded strictly
(every parameter and buffer, nothing extra) and evaluated with the task's own
evaluation, the one a peer's status reports, so the two agree.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocols.errors import HivemeshError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="test accuracy and loss of an exported model (hivemesh export)",
        description="Rebuild the task's model from the export's model card (task, options, seed), "
                    "load the safetensors file into it strictly and report its test accuracy and loss, "
                    "measured as a peer's status measures them.")
    parser.add_argument("--model", required=True, metavar="MODEL.safetensors",
                        help="a file written by hivemesh export")
    parser.add_argument("--task", metavar="NAME",
                        help="the task the model must be for (checked against the card; for a file "
                             "without a card, the built-in task to load it into)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class Card:
    """What the model card says is needed to rebuild the model."""

    task: str
    task_options: dict[str, Any]
    seed: int


def read_card(path: Path, task: str | None) -> Card:
    """The export's card (or ``task`` with no options for a file without one); one-line errors."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise HivemeshError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HivemeshError(f"{path}: not a safetensors file ({reason})") from None
    if "hivemesh_task" not in metadata:
        if task is None:
            raise HivemeshError(f"{path}: not a hivemesh export (no model card in its metadata); "
                                "give --task NAME to load it into that task's model")
        return Card(task=task, task_options={}, seed=0)
    if task is not None and task != metadata["hivemesh_task"]:
        raise HivemeshError(f"{path}: exported from task {metadata['hivemesh_task']!r}, not {task!r}")
    try:
        options = json.loads(metadata.get("hivemesh_task_options", "{}"))
        seed = int(metadata.get("hivemesh_seed", "0"))
    except ValueError:
        raise HivemeshError(f"{path}: corrupt model card (task options or seed)") from None
    if not isinstance(options, dict):
        raise HivemeshError(f"{path}: corrupt model card (task options are not a table)")
    return Card(task=metadata["hivemesh_task"], task_options=options, seed=seed)


def evaluate_export(path: str | Path) -> dict[str, Any]:
    """``{"model", "task", "task_options", **test metrics}`` of the export at ``path`` (no --task check)."""
    return _evaluate(Path(path), None)


def _evaluate(path: Path, task_name: str | None) -> dict[str, Any]:
    from safetensors.torch import load_file

    from peer.train.tasks import get_task

    card = read_card(path, task_name)
    state = load_file(str(path))
    task = get_task(card.task, **card.task_options)
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
    model = task.build_model(card.seed)
    if dtype is not None:
        model = model.to(dtype=dtype)     # the peers' dtype (float64 runs stay float64)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        summary = " ".join(str(error).split())
        raise HivemeshError(f"{path}: does not fit task {card.task!r}'s model: {summary[:300]}") from None
    metrics = task.evaluate(model, split="test")
    return {"model": str(path), "task": card.task, "task_options": card.task_options,
            **{key: float(value) for key, value in metrics.items()}}


def run(args: argparse.Namespace) -> int:
    result = _evaluate(Path(args.model), args.task)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    scores = ", ".join(f"{key} {result[key]:.6f}" for key in ("accuracy", "loss") if key in result)
    print(f"{result['model']}: task {result['task']}: test {scores}")
    return 0
