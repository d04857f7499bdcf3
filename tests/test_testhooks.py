"""The test hooks a peer honours (peer.runtime.testhooks): when they fire, what they hold, what they
refuse."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from peer.runtime.testhooks import (
    ENVIRONMENT_VARIABLE,
    PARAMS_VARIABLE,
    PROTOCOL_VARIABLE,
    SAVE_VARIABLE,
    SCHEDULE_VARIABLE,
    Hook,
    Hooks,
    hooks_from_environment,
    hooks_json,
    params_writer_from_environment,
    parse_hooks,
    protocol_version_from_environment,
    save_point_from_environment,
    schedule_from_environment,
)
from peer.train.attack import Attack, parse_attack, sign_flip
from protocols.errors import HivemeshError


def test_a_hold_fires_at_its_step_marks_it_and_lasts_until_the_gate_exists(tmp_path: Path) -> None:
    gate, mark = tmp_path / "gate", tmp_path / "mark"
    hooks = Hooks([Hook(at_step=5, action="hold", gate=str(gate), mark=str(mark))])
    assert [hooks.holds(step) for step in range(5)] == [False] * 5
    assert not mark.exists()
    assert hooks.holds(5) and hooks.holds(5) and mark.exists()
    gate.touch()
    assert not hooks.holds(5)
    assert not hooks.holds(6)       # fired once: passing the step again holds nothing


def test_hooks_fire_in_step_order_and_a_later_one_due_at_the_same_step_follows(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    hooks = Hooks([Hook(at_step=9, action="hold", gate=str(second), mark=str(tmp_path / "m9")),
                   Hook(at_step=3, action="hold", gate=str(first), mark=str(tmp_path / "m3"))])
    assert hooks.holds(10)           # a jump past both steps: the earlier hook holds first
    assert (tmp_path / "m3").exists() and not (tmp_path / "m9").exists()
    first.touch()
    assert hooks.holds(10) and (tmp_path / "m9").exists()
    second.touch()
    assert not hooks.holds(10)


def test_a_stop_hook_sends_sigterm_to_its_own_process(tmp_path: Path) -> None:
    import signal

    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        hooks = Hooks([Hook(at_step=2, action="stop", mark=str(tmp_path / "stopped"))])
        assert not hooks.holds(1) and received == []
        assert not hooks.holds(2)
        assert received == [signal.SIGTERM] and (tmp_path / "stopped").exists()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_hooks_travel_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = (Hook(at_step=1, action="kill", mark="/tmp/x"), Hook(at_step=2, action="hold", gate="/tmp/g"))
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, hooks_json(hooks))
    assert hooks_from_environment() == hooks
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    assert ENVIRONMENT_VARIABLE not in os.environ and hooks_from_environment() == ()


@pytest.mark.parametrize("text", ['{"at_step": 1}', "[1]", '[{"at_step": 1, "action": "explode"}]',
                                  '[{"at_step": 1, "action": "hold"}]', '[{"at_step": -1, "action": "kill"}]',
                                  '[{"at_step": 1, "action": "kill", "when": 3}]', "not json"])
def test_a_malformed_hook_is_a_clear_error(text: str) -> None:
    with pytest.raises(HivemeshError, match=ENVIRONMENT_VARIABLE):
        parse_hooks(text)



READERS = {ENVIRONMENT_VARIABLE: hooks_from_environment,
           PROTOCOL_VARIABLE: protocol_version_from_environment,
           SAVE_VARIABLE: save_point_from_environment,
           SCHEDULE_VARIABLE: lambda: schedule_from_environment("p00"),
           PARAMS_VARIABLE: lambda: params_writer_from_environment("p00")}


@pytest.mark.parametrize("variable", sorted(READERS))
@pytest.mark.parametrize(("text", "said"), [("{not json", "not JSON: '{not json'"), ('"text"', ""),
                                            ("{}", ""), ("[{}]", "")])
def test_every_reader_gives_nothing_unset_and_names_its_variable_when_malformed(
        monkeypatch: pytest.MonkeyPatch, variable: str, text: str, said: str) -> None:
    monkeypatch.delenv(variable, raising=False)
    assert not READERS[variable]()
    monkeypatch.setenv(variable, "")
    assert not READERS[variable]()
    monkeypatch.setenv(variable, text)
    with pytest.raises(HivemeshError, match=f"^{variable}: ") as raised:
        READERS[variable]()
    assert said in str(raised.value)


def test_a_protocol_version_is_an_integer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROTOCOL_VARIABLE, "3")
    assert protocol_version_from_environment() == 3
    for text in ("3.5", "true", '"3"'):
        monkeypatch.setenv(PROTOCOL_VARIABLE, text)
        with pytest.raises(HivemeshError, match=f"{PROTOCOL_VARIABLE}: .* is not an integer"):
            protocol_version_from_environment()


def test_a_schedule_without_its_faults_says_which_key(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(SCHEDULE_VARIABLE, json.dumps({"progress": str(tmp_path)}))
    with pytest.raises(HivemeshError, match=f"{SCHEDULE_VARIABLE}: key 'faults' missing or unknown"):
        schedule_from_environment("p00")


def test_signflip_and_pace_hooks_turn_an_edge_into_an_attacker_or_a_slow_device() -> None:
    hooks = Hooks([Hook(at_step=3, action="signflip", scale=10.0),
                   Hook(at_step=0, action="pace", seconds=0.05)])
    assert not hooks.holds(0)
    assert hooks.step_pace_s == 0.05 and hooks.attack == Attack()
    assert not hooks.holds(3) and hooks.attack == Attack(flip_scale=10.0)
    both = (Hook(at_step=1, action="signflip", scale=2.5), Hook(at_step=2, action="attack", spec="claim:5"))
    assert parse_hooks(hooks_json(both)) == both      # every field crosses the environment
    attack = Hooks(both)
    assert not attack.holds(2) and attack.attack == Attack(claim_samples=5)
    for bad in ({"action": "signflip"}, {"action": "pace"}, {"action": "pace", "seconds": -1.0}):
        with pytest.raises(HivemeshError):
            parse_hooks(json.dumps([{"at_step": 0, **bad}]))


def test_the_attack_is_the_honest_update_flipped_and_scaled() -> None:
    anchor, trained = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([1.5, -2.0, 0.0])
    sign_flip(trained, anchor, 10.0)
    assert torch.equal(trained - anchor, torch.tensor([-5.0, 0.0, 5.0]))
    assert parse_attack("signflip:10") == Attack(flip_scale=10.0)
    with pytest.raises(ValueError, match="signflip"):
        parse_attack("signflip:0")
