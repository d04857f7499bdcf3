"""The built-in ``gpt`` task: GPT-2's shape and parameter count, training, bf16 autocast, user files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from peer.cli.main import main
from peer.runtime.export import model_state
from peer.train.tasks import TaskError, get_task, resolve_task_paths
from peer.train.tasks.base import autocast_to, moved
from peer.train.tasks.gpt import GPT
from peer.train.trainer import Trainer, TrainerConfig
from sim.run import run_scenario
from sim.scenario import scenario_from_dict

torch.set_num_threads(1)

SMALL = {"layers": 1, "width": 32, "heads": 2, "context": 16}  # a few milliseconds a step


def gpt2_parameters(*, layers: int, width: int, context: int, vocab: int) -> int:
    """GPT-2's count: embeddings (read-out tied), per block two LayerNorms (4w), qkv (3w^2 + 3w),
    attention projection (w^2 + w) and MLP (8w^2 + 5w); a final LayerNorm (2w)."""
    w = width
    block = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (8 * w * w + 5 * w)
    return vocab * width + context * width + layers * block + 2 * width


def trainer_for(task_name: str = "gpt", config: TrainerConfig | None = None, **options: object) -> Trainer:
    task = get_task(task_name, **options)
    config = config or TrainerConfig(optimizer="adamw", lr=3e-3, device="cpu")
    return Trainer(task, config, np.arange(task.n_train), seed=0, member_index=0)


def test_gpt2_small_shape_has_124m_parameters() -> None:
    # On the meta device: the shape without its 500 MB.
    with torch.device("meta"):
        model = GPT(vocab=50257, context=1024, width=768, layers=12, heads=12)

    count = sum(p.numel() for p in model.parameters())

    assert count == gpt2_parameters(layers=12, width=768, context=1024, vocab=50257) == 124_439_808
    assert model.head.weight is model.token.weight


def test_a_built_task_model_has_the_formula_count_and_starts_the_same_for_a_seed() -> None:
    task = get_task("gpt", layers=2, width=64, heads=4, context=32, vocab=300)

    a, b, c = task.build_model(5), task.build_model(5), task.build_model(6)

    expected = gpt2_parameters(layers=2, width=64, context=32, vocab=300)
    assert sum(p.numel() for p in a.parameters()) == expected
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


@pytest.mark.slow
def test_two_layers_train_below_the_unigram_entropy() -> None:
    trainer = trainer_for()  # the defaults: 2 layers x 128 on the shipped text
    start = trainer.evaluate()["loss"]

    trainer.run_steps(60)
    metrics = trainer.evaluate()

    entropy = trainer.task.info["unigram_entropy"]
    assert start > entropy + 1.0  # the initial model is worse than counting bytes
    assert metrics["loss"] <= entropy - 0.2, (start, metrics, entropy)


def test_bf16_autocast_runs_on_cpu_and_parameters_stay_float32() -> None:
    trainer = trainer_for(autocast="bf16", **SMALL)
    before = trainer.flat_params.clone()

    losses = [trainer.run_steps(1) for _ in range(3)]

    assert trainer.autocast == torch.bfloat16
    assert all(np.isfinite(losses)) and not torch.equal(before, trainer.flat_params)
    assert trainer.flat_params.dtype == trainer.flat_grads.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(t.dtype == torch.float32 for t in trainer.optimizer_state.values())
    with autocast_to(trainer.device, trainer.autocast):
        logits = trainer.model(trainer.task.train_x[:2])
    assert logits.dtype == torch.bfloat16
    assert np.isfinite(trainer.evaluate()["loss"])


def test_autocast_auto_is_float32_on_cpu_and_float64_is_never_autocast() -> None:
    task = get_task("gpt", autocast="bf16", **SMALL)

    assert get_task("gpt", **SMALL).autocast_dtype(torch.device("cpu"), torch.float32) is None
    assert task.autocast_dtype(torch.device("cpu"), torch.float32) == torch.bfloat16
    assert task.autocast_dtype(torch.device("cpu"), torch.float64) is None


def test_a_user_file_is_read_as_bytes_into_window_views(tmp_path: Path) -> None:
    text = tmp_path / "any.bin"
    data = bytes(range(256)) * 4 + "héllo wörld ".encode() * 40
    text.write_bytes(data)

    task = get_task("gpt", path=str(text), **SMALL)

    assert task.info["bytes"] == len(data)
    assert task.train_x.dtype == torch.uint8 and tuple(task.train_x.shape)[1] == 16
    assert torch.equal(task.train_x[0, 1:], task.train_y[0, :-1])
    assert bytes(task.train_x[1].tolist()) == data[2:18]  # stride context // 8 = 2
    assert task.train_x.untyped_storage().nbytes() == len(data)  # views of the bytes: no copy per window
    assert np.isfinite(trainer_for(path=str(text), **SMALL).run_steps(2))


def test_moving_window_views_moves_the_bytes_once() -> None:
    ids = torch.arange(100, dtype=torch.uint8)
    windows = ids[:90].as_strided((40, 8), (2, 1))

    wide = moved(windows, torch.device("cpu"), torch.int64)

    assert wide.dtype == torch.int64 and torch.equal(wide, windows.long())
    assert wide.untyped_storage().nbytes() == 100 * 8


def test_a_missing_or_short_file_is_a_task_error(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such text"):
        get_task("gpt", path=str(tmp_path / "missing.txt"))
    (tmp_path / "short.txt").write_text("tiny" * 50)
    with pytest.raises(TaskError, match=r"too short .* about 660 bytes"):
        get_task("gpt", path=str(tmp_path / "short.txt"), context=64)


@pytest.mark.parametrize(("options", "needle"), [
    ({"width": 130, "heads": 4}, "multiple of heads"), ({"vocab": 100}, "vocab must be at least 256"),
    ({"autocast": "fp8"}, "autocast must be one of off, auto, bf16"), ({"layers": 0}, "layers"),
    ({"depth": 3}, "bad options"),
])
def test_bad_options_are_task_errors(options: dict, needle: str) -> None:
    with pytest.raises(TaskError, match=needle):
        get_task("gpt", **options)


def test_a_config_relative_path_is_taken_from_the_config_folder(tmp_path: Path) -> None:
    name, options = resolve_task_paths("gpt", {"path": "data/t.txt", "layers": 2}, tmp_path)

    assert name == "gpt" and options == {"path": str(tmp_path / "data" / "t.txt"), "layers": 2}


@pytest.mark.slow
def test_four_simulated_peers_gossip_a_gpt_and_its_loss_falls() -> None:
    scenario = scenario_from_dict({
        "seed": 1, "duration_s": 2.0, "eval_every_s": 1.0, "graph": {"spec": "ring:4"},
        "links": {"latency_ms": 5.0, "bandwidth_mbps": 1000.0}, "nodes": {"step_time_ms": 50.0},
        "algorithm": {"algorithm": "dpsgd", "deadline_s": 0.5}, "partition": {"scheme": "iid"},
        "task": {"name": "gpt", "options": SMALL}, "trainer": {"optimizer": "adamw", "lr": 0.01},
    })

    result = run_scenario(scenario)

    losses = [point.mean_loss for point in result.trace]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses
    assert result.trace[-1].running == 4


def test_init_writes_a_gpt_network_and_config_check_names_a_bad_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "net"
    assert main(["init", "--peers", "2", "--task", "gpt", "--out", str(out), "--steps", "20"]) == 0
    config = str(out / "p00.toml")

    assert main(["config", "check", config]) == 0
    good = capsys.readouterr().out
    assert main(["config", "check", config, "--set", 'network.task_options={autocast="fp8"}']) == 2

    assert "task 'gpt'" in good
    assert "key 'network.task': gpt: autocast must be one of" in capsys.readouterr().err


def test_a_trained_gpt_exports_with_its_tied_embedding_and_loads_strictly(tmp_path: Path) -> None:
    trainer = trainer_for(autocast="bf16", **SMALL)
    trainer.run_steps(3)
    state = model_state(trainer.task, 0, trainer.state_dict()["tensors"])
    save_file(state, str(tmp_path / "model.safetensors"))

    fresh = trainer.task.build_model(0)
    fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")), strict=True)

    x = trainer.task.test_x[:2]
    assert torch.equal(fresh(x), trainer.model(x))
    assert fresh.head.weight is fresh.token.weight
