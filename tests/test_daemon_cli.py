"""Acceptance (f) of the daemon: tried as a new user would, from `hivemesh init` to `hivemesh export`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _daemon_support import TEST_PEER_OPTIONS, log_tail, make_network, peers, status, wait_for_step
from safetensors.torch import load_file

from peer.cli import main
from peer.export import latest_params
from peer.peerconfig import load_peer_config
from peer.tasks import get_task

pytestmark = pytest.mark.processes


def _hivemesh() -> list[str]:
    script = Path(sys.executable).parent / "hivemesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "peer"]


@pytest.mark.slow
def test_init_then_peers_started_by_hand_then_status_and_export(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "net"
    # two peers keep the cost down: each is a fresh Python that imports torch (seconds here);
    # --curve: the traffic is also CurveZMQ-encrypted, with the roster's curve keys as allowlist
    assert main(["init", "--peers", "2", "--topology", "complete", "--out", str(out), "--steps", "40",
                 "--curve"]) == 0
    capsys.readouterr()
    peers = [subprocess.Popen([*_hivemesh(), "peer", "--config", str(out / f"p0{i}.toml")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        outputs = [peer.communicate(timeout=180)[0] for peer in peers]
    finally:
        for peer in peers:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
    assert [peer.returncode for peer in peers] == [0, 0], "\n".join(outputs)
    assert all("Traceback" not in output for output in outputs)
    assert "p00: finished step 40" in outputs[0]      # the console progress line
    assert "curve = true" in (out / "p00.toml").read_text()

    assert main(["status", "--config", str(out / "p01.toml"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "p01" and shown["state"] == "finished" and shown["step"] == 40
    assert set(shown["neighbours"]) == {"p00"} and shown["rejections"] == {}
    assert shown["bytes_sent"] > 0 and shown["bytes_received"] > 0 and not shown["running"]
    assert main(["status", "--config", str(out / "p01.toml")]) == 0
    text = capsys.readouterr().out
    assert "peer p01: finished" in text and "rejections: none" in text and "latency" in text

    model_path = tmp_path / "model.safetensors"
    configs = [str(out / f"p0{i}.toml") for i in range(2)]
    assert main(["export", "--config", configs[0], "--config", configs[1], "--out", str(model_path)]) == 0
    assert "averaged over 2 peers" in capsys.readouterr().out
    task = get_task("digits-mlp")
    model = task.build_model(0)
    model.load_state_dict(load_file(str(model_path)))
    assert task.evaluate(model, split="test")["accuracy"] > 0.5    # trained, not the initial model


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
