"""A refusal for settings (issue 30, item 1): a member refused for its run id is sent the refuser's
settings (messages.SettingsRefusal), the one kind accepted whatever run id it carries, and names the
first key where the two part; at most once per interval per member. The process tests:
tests/test_console_mismatch.py (two peers), tests/test_federation_file_processes.py (gateway, edge)."""

from __future__ import annotations

import pytest
from wire_helpers import make_network

from peer.runtime.refusals import SettingsRefusals, heard
from protocols.messages import Heartbeat, SettingsRefusal
from protocols.settings_diff import MismatchAnswers, flatten, refusal_line
from protocols.wire import Endpoint, Opened, Rejection

OURS = {"network": {"seed": 0, "trainer": {"lr": 0.1}}, "federation": {"fraction": 0.3, "rounds": 3}}
THEIRS = {"network": {"seed": 0, "trainer": {"lr": 0.1}}, "federation": {"fraction": 0.5, "rounds": 3}}


def test_a_refusal_is_accepted_across_run_ids_and_nothing_else_is() -> None:
    # Prepare: the gateway "gate" on another run id than the edge client "phone"
    net = make_network()
    gate = Endpoint(net.identities["gate"], net.roster, b"\x01" * 32, 1)
    phone = net.endpoint("phone")
    # Execute / Assert: its refusal gets through, its heartbeat does not
    opened = phone.open(gate.seal(["phone"], SettingsRefusal(meta=flatten(THEIRS))))
    assert isinstance(opened, Opened) and isinstance(opened.message, SettingsRefusal)
    assert opened.message.meta["federation.fraction"] == "0.5"
    refused = phone.open(gate.seal(["phone"], Heartbeat(step=1)))
    assert isinstance(refused, Rejection) and refused.reason == "config_mismatch"
    # every other check still holds: addressed to someone else, or from a role that may not send it
    assert isinstance(net.endpoint("bob").open(gate.seal(["phone"], SettingsRefusal())), Rejection)
    edge = Endpoint(net.identities["phone"], net.roster, b"\x02" * 32, 1)
    wrong = net.endpoint("gate").open(edge.seal(["gate"], SettingsRefusal()))
    assert isinstance(wrong, Rejection) and wrong.reason == "wrong_role"


def test_the_refused_member_names_the_first_differing_key_theirs_first() -> None:
    line = refusal_line("gw0", OURS, flatten(THEIRS))
    assert line == "gw0 refuses us: [federation] differs (fraction 0.5 at gw0 != 0.3 here)"
    nested = {**THEIRS, "network": {"seed": 0, "trainer": {"lr": 0.2}}}
    lr = refusal_line("gw0", THEIRS, flatten(nested))
    assert lr.endswith("[network] differs (trainer.lr 0.2 at gw0 != 0.1 here)")
    # a key only one side has is unset on the other; a hostile sender's words are shown, never run
    task = refusal_line("p01", {"network": {}}, {"network.task": '"x"'})
    assert task.endswith('(task "x" at p01 != unset here)')
    assert "another version" in refusal_line("gw0", THEIRS, flatten(THEIRS))
    hostile = heard("gw0", OURS, SettingsRefusal(meta={"federation.fraction": 7}))
    assert hostile.endswith("(fraction 7 at gw0 != 0.3 here)")


def test_a_refused_member_is_answered_at_most_once_per_interval() -> None:
    answers = MismatchAnswers(interval_s=30.0)
    assert [answers.due("e000", t) for t in (0.0, 1.0, 29.9, 30.0, 31.0)] == [True, False, False, True, False]
    assert answers.due("e001", 1.0)         # each member on its own clock
    with pytest.raises(ValueError, match="interval_s"):
        MismatchAnswers(interval_s=0.0)


def test_the_answer_is_sealed_for_the_refused_sender_only_for_a_run_id_mismatch() -> None:
    net = make_network()
    refusals = SettingsRefusals(net.endpoint("gate"), THEIRS, interval_s=30.0)
    assert refusals.answer(Rejection("bad_signature", "", "phone"), 0.0) is None
    assert refusals.answer(Rejection("config_mismatch", "", ""), 0.0) is None      # no sender to name
    frames = refusals.answer(Rejection("config_mismatch", "", "phone"), 0.0)
    assert frames is not None and refusals.answer(Rejection("config_mismatch", "", "phone"), 5.0) is None
    assert refusals.answered == 1


def test_a_refusals_words_reach_the_console_as_one_short_printable_line() -> None:
    # a member's settings are its words: a newline or a terminal escape in them is not passed on
    theirs = {"federation.fraction": "0.3\n[gw0] all good\x1b[2J", "federation.rounds": "9" * 500}
    line = refusal_line("gw0", {"federation": {"fraction": 0.5, "rounds": 10}}, theirs)
    assert "\n" not in line and "\x1b" not in line and line.isprintable()
    assert line.startswith("gw0 refuses us: [federation] differs (fraction 0.3?[gw0] all good?[2J at gw0")
    long = refusal_line("gw0", {"federation": {"rounds": 10}}, {"federation.rounds": "9" * 500})
    assert len(long) < 200 and "..." in long
