import json
import math
import os
import pickle
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from peer.train import checkpoint
from peer.train.checkpoint import CheckpointError, load_latest, save
from peer.train.tasks import get_task
from peer.train.trainer import Trainer, TrainerConfig
from protocols.node.checkpoints import CheckpointConfig, CheckpointSchedule

torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _trainer_resume_child import make_trainer, protocol_state  # noqa: E402


def small_trainer(steps: int = 0) -> Trainer:
    task = get_task("logreg", n_samples=120, n_features=4, n_classes=3)
    config = TrainerConfig(optimizer="momentum", lr=0.1, batch_size=16, device="cpu")
    trainer = Trainer(task, config, np.arange(60), seed=2, member_index=1)
    trainer.run_steps(steps)
    return trainer


@pytest.mark.processes
@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, str(HERE / "_trainer_resume_child.py"), str(tmp_path)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert child.returncode == -signal.SIGKILL, child.stderr

    straight = make_trainer()
    straight.run_steps(20)
    assert (straight.epoch, straight.offset) == (2, 40)  # the resumed half crosses an epoch boundary

    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 10 and loaded.skipped == ()
    assert loaded.extra == {"writer": "child"}
    tensors, meta = loaded.protocol_state
    assert meta == {"round": 7, "phase": "mixing"}
    assert torch.equal(tensors["public"], protocol_state()[0]["public"])
    resumed = make_trainer()
    resumed.load_state_dict(loaded.trainer_state)
    assert (resumed.epoch, resumed.offset) == (1, 20)  # killed mid-epoch
    resumed.run_steps(10)

    assert resumed.step == straight.step == 20
    assert (resumed.epoch, resumed.offset) == (straight.epoch, straight.offset)
    for name, tensor in straight.state_dict()["tensors"].items():
        assert torch.equal(resumed.state_dict()["tensors"][name], tensor), name


def two_checkpoints(directory: Path) -> Trainer:
    trainer = small_trainer(5)
    save(directory, trainer.state_dict(), ({"w": torch.ones(3)}, {"r": 1}), keep=5)
    trainer.run_steps(5)
    save(directory, trainer.state_dict(), ({"w": torch.full((3,), 2.0)}, {"r": 2}), keep=5)
    return trainer


def tensor_data_offset(path: Path) -> int:
    header_bytes = int.from_bytes(path.read_bytes()[:8], "little")
    return 8 + header_bytes


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    trainer = two_checkpoints(tmp_path)
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 10
    assert loaded.protocol_state[1] == {"r": 2}
    fresh = small_trainer()
    fresh.load_state_dict(loaded.trainer_state)
    assert torch.equal(fresh.flat_params, trainer.flat_params) and fresh.step == 10
    assert torch.equal(fresh.optimizer_state["momentum_buffer"], trainer.optimizer_state["momentum_buffer"])


def test_truncated_newest_falls_back_to_previous(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    newest = tmp_path / "ckpt-000000000010" / "trainer.safetensors"
    newest.write_bytes(newest.read_bytes()[:-7])
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 5 and loaded.protocol_state[1] == {"r": 1}
    assert len(loaded.skipped) == 1 and "truncated" in loaded.skipped[0][1]


@pytest.mark.parametrize("target", ["trainer.safetensors", "protocol.safetensors"])
def test_one_flipped_byte_in_tensor_data_falls_back_to_previous(tmp_path: Path, target: str) -> None:
    two_checkpoints(tmp_path)
    path = tmp_path / "ckpt-000000000010" / target
    data = bytearray(path.read_bytes())
    start = tensor_data_offset(path)
    assert start < len(data)
    data[start + (len(data) - start) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 5
    assert "digest mismatch" in loaded.skipped[0][1]


def test_edited_manifest_is_detected(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    path = tmp_path / "ckpt-000000000010" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["trainer_meta"]["step"] = 11
    path.write_text(json.dumps(manifest))
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 5 and "manifest" in loaded.skipped[0][1]


def test_all_corrupt_is_an_error_not_a_silent_fresh_start(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    for name in ("ckpt-000000000005", "ckpt-000000000010"):
        (tmp_path / name / "manifest.json").write_text("{")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_latest(tmp_path)
    assert load_latest(tmp_path / "empty") is None


def test_retention_and_leftover_temporaries(tmp_path: Path) -> None:
    trainer = small_trainer()
    (tmp_path / ".tmp-ckpt-000000000099-1").mkdir(parents=True)  # a crashed writer's leftovers
    for _ in range(4):
        trainer.run_steps(2)
        save(tmp_path, trainer.state_dict(), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000000006", "ckpt-000000000008"]
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.protocol_state is None
    # Saving the same step again replaces it atomically.
    save(tmp_path, trainer.state_dict(), extra={"final": True}, keep=2)
    again = load_latest(tmp_path)
    assert again is not None and again.step == 8 and again.extra == {"final": True}


def test_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two_checkpoints(tmp_path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    loaded = load_latest(tmp_path)
    assert loaded is not None and loaded.step == 10


def test_non_json_metadata_is_refused_before_writing(tmp_path: Path) -> None:
    trainer = small_trainer()
    with pytest.raises(checkpoint.MetadataError, match="JSON"):
        save(tmp_path, trainer.state_dict(), ({}, {"bad": {1, 2}}))
    assert checkpoint.list_checkpoints(tmp_path) == []


def test_non_finite_metadata_is_strict_json_and_reads_back_as_it_was(tmp_path: Path) -> None:
    # Prepare: an overflow's infinities and a NaN in the protocol slot's metadata, nested
    trainer = small_trainer()
    meta = {"step_norm": math.inf, "rows": [1.0, -math.inf, {"loss": math.nan}], "kept": None,
            "by_round": {3: {"norm": math.inf}}}
    counted: Counter[str] = Counter()
    # Execute
    path = save(tmp_path, trainer.state_dict(), ({}, meta), nonfinite=counted)
    loaded = load_latest(tmp_path)
    # Assert: the manifest is strict JSON; each number is back, each counted by its path
    json.loads((path / checkpoint.MANIFEST_FILE).read_text(), parse_constant=pytest.fail)
    assert loaded is not None
    restored = loaded.protocol_state[1]
    assert restored["step_norm"] == math.inf and restored["rows"][:2] == [1.0, -math.inf]
    assert math.isnan(restored["rows"][2]["loss"]) and restored["kept"] is None
    assert restored["by_round"] == {"3": {"norm": math.inf}}     # a key as JSON writes it
    assert counted == {"protocol_meta.step_norm": 1, "protocol_meta.rows.1": 1,
                       "protocol_meta.rows.2.loss": 1, "protocol_meta.by_round.3.norm": 1}


def test_schedule_by_steps_and_seconds() -> None:
    steps = CheckpointSchedule(CheckpointConfig(every_steps=10))
    assert not steps.should_save(0, 0.0)
    assert not steps.should_save(9, 100.0)
    assert steps.should_save(10, 100.0)
    steps.saved(10, 100.0)
    assert not steps.should_save(19, 1e6) and steps.should_save(20, 1e6)
    timed = CheckpointSchedule(CheckpointConfig(every_steps=0, every_s=30.0))
    assert not timed.should_save(0, 5.0)
    assert not timed.should_save(1000, 34.9) and timed.should_save(1000, 35.0)
    with pytest.raises(ValueError, match="keep"):
        CheckpointConfig(keep=0)
