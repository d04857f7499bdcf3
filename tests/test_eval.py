"""``hivemesh eval`` without processes: an export's model rebuilt from its card scores what its trainer did.

The real path (peers, checkpoint, ``hivemesh export``, the peer's status) is in
tests/test_daemon_cli.py; here the export is written from a trainer in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from peer.cli.eval import evaluate_export
from peer.cli.main import main
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig


def _trained(dtype: str = "float32") -> Trainer:
    trainer = Trainer(get_task("digits-cnn"), TrainerConfig(dtype=dtype, batch_size=16, device="cpu"),
                      np.arange(300), seed=0, member_index=0)
    trainer.run_steps(5)
    return trainer


def _export(trainer: Trainer, path: Path, *, card: bool = True) -> Path:
    """What ``hivemesh export`` writes for one peer: the state dict, and the card's rebuild keys."""
    state = {name: t.detach().contiguous().clone() for name, t in trainer.model.state_dict().items()}
    metadata = {"format": "pt"}
    if card:
        metadata |= {"hivemesh_task": "digits-cnn", "hivemesh_task_options": "{}", "hivemesh_seed": "0"}
    save_file(state, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_export_scores_exactly_what_its_trainer_scores(tmp_path: Path, dtype: str) -> None:
    trainer = _trained(dtype)
    expected = trainer.evaluate()
    found = evaluate_export(_export(trainer, tmp_path / "model.safetensors"))
    assert found["task"] == "digits-cnn" and found["task_options"] == {}
    assert found["accuracy"] == expected["accuracy"] and found["loss"] == expected["loss"]
    # control: the same parameters with a fresh model's statistics score otherwise
    with torch.no_grad():
        trainer.flat_buffers.copy_(Trainer(trainer.task, trainer.config, np.arange(300), seed=0,
                                           member_index=0).flat_buffers)
    assert evaluate_export(_export(trainer, tmp_path / "stale.safetensors"))["loss"] != found["loss"]


def test_the_command_prints_one_line_or_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trained()
    expected = trainer.evaluate()
    path = _export(trainer, tmp_path / "model.safetensors")
    assert main(["eval", "--model", str(path)]) == 0
    line = capsys.readouterr().out
    assert line == (f"{path}: task digits-cnn: test accuracy {expected['accuracy']:.6f}, "
                    f"loss {expected['loss']:.6f}\n")
    assert main(["eval", "--model", str(path), "--task", "digits-cnn", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["accuracy"] == expected["accuracy"] and shown["model"] == str(path)


def test_a_file_without_a_card_loads_only_into_a_named_task(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trained()
    path = _export(trainer, tmp_path / "bare.safetensors", card=False)
    assert main(["eval", "--model", str(path)]) == 2
    assert "not a hivemesh export" in capsys.readouterr().err
    assert main(["eval", "--model", str(path), "--task", "digits-cnn", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == trainer.evaluate()["accuracy"]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


def test_unusable_files_give_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trained()
    good = _export(trainer, tmp_path / "model.safetensors")
    assert "no such file" in _one_line_error(["eval", "--model", str(tmp_path / "missing.safetensors")],
                                             capsys)
    text = tmp_path / "notes.safetensors"
    text.write_text("not a model\n")
    assert "not a safetensors file" in _one_line_error(["eval", "--model", str(text)], capsys)
    mismatch = _one_line_error(["eval", "--model", str(good), "--task", "digits-mlp"], capsys)
    assert "exported from task 'digits-cnn', not 'digits-mlp'" in mismatch
    # a card that names the wrong model: the strict load names what does not fit
    save_file({"w": torch.zeros(3)}, str(tmp_path / "other.safetensors"),
              metadata={"hivemesh_task": "digits-cnn", "hivemesh_task_options": "{}", "hivemesh_seed": "0"})
    assert "does not fit task 'digits-cnn'" in _one_line_error(
        ["eval", "--model", str(tmp_path / "other.safetensors")], capsys)
