"""Acceptance (f) of the daemon: tried as a new user would, from `hivemesh init` to `hivemesh export`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _daemon_support import (
    CEILING_S,
    TEST_PEER_OPTIONS,
    HandRun,
    log_tail,
    make_network,
    peers,
    retry_if_port_taken,
    status,
    wait_for_step,
)
from _operator_text import assert_operator_text
from safetensors import safe_open
from safetensors.torch import load_file

from peer.cli.main import main
from peer.files.statefiles import CheckpointStore, read_status
from peer.runtime.assemble import make_trainer
from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from peer.train.tasks import get_task

pytestmark = pytest.mark.processes

STEPS = 20  # of the network made by `hivemesh init` (the BatchNorm statistics have moved well off 0/1)


def _hivemesh() -> list[str]:
    script = Path(sys.executable).parent / "hivemesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "peer"]


@pytest.mark.slow
def test_init_then_peers_started_by_hand_then_status_and_export(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    def attempt(index: int) -> HandRun:
        out = tmp_path / f"net{index}"
        # two peers and 20 steps keep the cost down: each is a fresh Python that imports torch (seconds);
        # digits-cnn has BatchNorm, so the export must carry buffers, not parameters alone;
        # --curve: the traffic is also CurveZMQ-encrypted, with the roster's curve keys as allowlist
        assert main(["init", "--peers", "2", "--topology", "complete", "--out", str(out), "--task",
                     "digits-cnn", "--steps", str(STEPS), "--curve"]) == 0
        capsys.readouterr()
        started = [subprocess.Popen([*_hivemesh(), "peer", "--config", str(out / f"p0{i}.toml")],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for i in range(2)]
        try:
            outputs = [peer.communicate(timeout=CEILING_S)[0] for peer in started]
        finally:
            for peer in started:
                if peer.poll() is None:
                    peer.kill()
                    peer.wait()
        return HandRun(out, [peer.returncode for peer in started], outputs)

    run = retry_if_port_taken(attempt)
    out, outputs = run.out, run.outputs
    assert list(run.codes) == [0, 0], "\n".join(outputs)
    assert all("Traceback" not in output for output in outputs)
    for index, output in enumerate(outputs):
        assert_operator_text(output, where=f"p0{index}'s console")
    # the console progress line (not a terminal: timestamped lines), its final state once
    assert outputs[0].count(f" p00 {STEPS}/{STEPS} steps  finished ") == 1, outputs[0]
    assert "curve = true" in (out / "p00.toml").read_text()

    assert main(["status", "--config", str(out / "p01.toml"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "p01" and shown["state"] == "finished" and shown["step"] == STEPS
    assert set(shown["neighbours"]) == {"p00"} and shown["rejections"] == {}
    assert shown["bytes_sent"] > 0 and shown["bytes_received"] > 0 and not shown["running"]
    assert main(["status", "--config", str(out / "p01.toml")]) == 0
    text = capsys.readouterr().out
    assert "peer p01: finished" in text and "rejections: none" in text and "latency" in text
    assert_operator_text(text, where="hivemesh status")

    configs = [out / f"p0{i}.toml" for i in range(2)]
    checkpoints = [_checkpoint_as_model_state(config, index) for index, config in enumerate(configs)]
    for index, config in enumerate(configs):
        path = tmp_path / f"p0{index}.safetensors"
        assert main(["export", "--config", str(config), "--out", str(path)]) == 0
        assert f"averaged over 1 peer: p0{index} at step {STEPS})" in capsys.readouterr().out
        _assert_bitwise_equal(load_file(str(path)), checkpoints[index])
        found = _status_of(config)
        assert found["eval_step"] == STEPS     # the final evaluation, of the model the checkpoint holds
        assert abs(_plain_torch_accuracy(path) - found["accuracy"]) <= 1e-6
        assert main(["eval", "--model", str(path), "--json"]) == 0     # the card rebuilds the model
        evaluated = json.loads(capsys.readouterr().out)
        assert evaluated["task"] == "digits-cnn"
        assert abs(evaluated["accuracy"] - found["accuracy"]) <= 1e-6
        assert abs(evaluated["loss"] - found["test_loss"]) <= 1e-6
        card = _card(path)
        assert card["hivemesh_task"] == "digits-cnn" and json.loads(card["hivemesh_task_options"]) == {}
        assert json.loads(card["hivemesh_test_accuracy"]) == {
            f"p0{index}": {"accuracy": found["accuracy"], "at_step": STEPS}}

    averaged_path = tmp_path / "model.safetensors"
    assert main(["export", "--config", str(configs[0]), "--config", str(configs[1]),
                 "--out", str(averaged_path)]) == 0
    assert "averaged over 2 peers" in capsys.readouterr().out
    _assert_bitwise_equal(load_file(str(averaged_path)), _mean_by_hand(checkpoints))
    card = _card(averaged_path)
    model = get_task("digits-cnn").build_model(0)
    assert card["hivemesh_parameters"] == str(sum(p.numel() for p in model.parameters()))
    assert card["hivemesh_peers"] == "p00,p01" and json.loads(card["hivemesh_steps"]) == {"p00": STEPS,
                                                                                          "p01": STEPS}


def _status_of(config: Path) -> dict[str, Any]:
    found = read_status(load_peer_config(config).data_dir)
    assert found is not None
    return found


def _checkpoint_as_model_state(config_path: Path, index: int) -> dict[str, torch.Tensor]:
    """The latest checkpoint loaded into the peer's own Trainer (its flat layout, not export's), as the
    model's state dict: what the export must equal."""
    config = load_peer_config(config_path)
    loaded = CheckpointStore(config.data_dir, keep=config.checkpoint.keep).load_latest()
    assert loaded is not None
    trainer = make_trainer(config)
    trainer.load_state_dict(loaded[0])
    state = {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}
    # trained statistics, so an export that drops the buffers cannot pass
    assert not torch.equal(state["features.1.running_var"], torch.ones(16))
    assert int(state["features.1.num_batches_tracked"]) == STEPS
    return state


def _assert_bitwise_equal(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(found) == sorted(expected)
    for name, tensor in expected.items():
        assert found[name].dtype == tensor.dtype, name
        assert torch.equal(found[name], tensor), f"{name} differs from the checkpoint"


def _mean_by_hand(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Floating tensors averaged in float64 and cast back; integer buffers: the larger count."""
    mean = {}
    for name, first in states[0].items():
        second = states[1][name]
        mean[name] = (((first.double() + second.double()) / 2).to(first.dtype) if first.is_floating_point()
                      else torch.maximum(first, second))
    return mean


def _plain_torch_accuracy(path: Path) -> float:
    """The README's way: build the task's model, load the export strictly, evaluate with plain torch."""
    task = get_task("digits-cnn")
    model = task.build_model(0)
    model.load_state_dict(load_file(str(path)), strict=True)
    model.eval()
    with torch.no_grad():
        predicted = model(task.test_x).argmax(dim=1)
    return float((predicted == task.test_y).sum()) / len(task.test_y)


def _card(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        metadata: dict[str, str] = handle.metadata()
    return metadata


def test_config_mistakes_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = make_network(tmp_path / "net", peers=3, steps=10)
    assert main(["peer", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.toml: no such file" in err

    config = files.configs["p00"]
    text = config.read_text()
    config.write_text(text.replace("[network.trainer]\n", "[network.trainer]\nlearning_rate = 1\n", 1))
    assert main(["peer", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key 'network.trainer.learning_rate'" in err

    (files.out / "keys" / "p01.key").unlink()
    assert main(["peer", "--config", str(files.configs["p01"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "p01.key: no such key file" in err and "Traceback" not in err


def test_unreachable_neighbours_are_warned_counted_and_left_out(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=3, steps=5, gossip={"deadline_s": 0.3},
                         peer_options={**TEST_PEER_OPTIONS, "start_timeout_s": 1.0})
    with peers(files, ["p00"]) as processes:   # p01 and p02 never start
        processes.start("p00")
        assert processes.wait(120)
        assert processes.exitcodes() == {"p00": 0}
    log = log_tail(files, "p00", 50)
    assert "warning: neighbours not heard within 1 s: p01, p02" in log and "Traceback" not in log
    found = status(files, "p00")
    assert found["state"] == "finished" and found["step"] == 5
    assert found["unreachable"]["p01"] >= 5 and found["unreachable"]["p02"] >= 5   # every round's push
    assert found["neighbours"]["p01"]["up"] is False
    assert torch.isfinite(torch.tensor(found["loss"]))


def test_sigterm_writes_a_checkpoint_and_exits_0(tmp_path: Path) -> None:
    files = make_network(tmp_path / "net", peers=3, steps=100_000,
                         sections={"checkpoint": {"every_steps": 0}})
    with peers(files) as processes:
        processes.start_all()
        wait_for_step(files, list(files.configs), 20)
        for name in files.configs:
            processes.terminate(name)
        assert processes.wait(60)
        assert processes.exitcodes() == {name: 0 for name in files.configs}
    for name, path in files.configs.items():
        found = status(files, name)
        assert found["state"] == "stopped" and found["step"] >= 20
        params, step = latest_params(load_peer_config(path))   # only the stop wrote one (every_steps = 0)
        assert step == found["step"] and torch.isfinite(params).all()
        assert "SIGTERM: checkpoint written at step" in log_tail(files, name)
