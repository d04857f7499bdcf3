"""Issue 30 acceptance (b), the fast half: ``hivemesh status``'s text of representative statuses (as
the daemon and the edge client write them: JSON, so a missing number is null) carries no Python
repr; the checker that tests/conftest.py applies after every process test finds one where there is
one. The slow half is that check itself, over what the process tests' peers say and write."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from _operator_text import repr_leaks, status_texts

from peer.cli.status import render

NOW = time.time()
CLIENT = {"bytes_received": 236037, "bytes_sent": 930705, "last_contact_s": 0.05, "unreachable": 0,
          "up": True}
GATEWAY: dict[str, Any] = {
    "name": "gw0", "state": "training", "waiting_for": "", "epoch": 0, "step": 0, "steps_done": 0,
    "loss": None, "accuracy": 0.9389, "test_loss": 0.2638, "eval_step": 37, "consensus_max_relative": None,
    "bytes_sent": 7678312, "bytes_received": 1931860, "payload_bytes_sent": 0, "curve": True,
    "neighbours": {},
    "metrics": {"fedavg.aggregations": 37.0, "fedavg.round": 37.0}, "rejections": {}, "internal_errors": {},
    "transport_refused": {}, "stranded": "", "updated_at": NOW, "pid": 1,
    "federation": {"mode": "fedbuff", "phase": "running", "round": 37, "rounds_closed": 37, "buffered": 3,
                   "registered": ["e000", "e001"], "training": {"e000": 37, "e001": 36},
                   "counters": {"aggregations": 37, "updates_taken": 188},
                   "clients": {"e000": CLIENT, "e001": dict(CLIENT, last_contact_s=None, up=False)},
                   "last_rounds": [{"at_s": 10.46, "version": 37, "contributors": ["e001", "e006"],
                                    "staleness": [4, 2], "weights": [0.45, 0.58], "update_norm": 0.055,
                                    "bounds": {"bounded": {}, "norm_bound": 0.286, "samples_cap": 284}}]}}
SYNC_FINISHED = dict(GATEWAY, state="finished", federation={
    "mode": "sync", "phase": "finished", "round": 10, "rounds_closed": 10, "asked": [], "wanted": 0,
    "taken": [], "registered": [], "counters": {"closed_by_quota": 10}, "clients": {"e000": CLIENT},
    "last_rounds": [{"round": 9, "opened_at_s": 1.0, "closed_at_s": 2.0, "closed_by": "quota",
                     "asked": ["e000"], "taken": ["e000"], "missing": [], "late": [], "refused": [],
                     "aggregated": True, "update_norm": 0.1, "epsilon": None, "clip_norm": 0.0,
                     "secagg_phases": [], "bounds": {}, "blamed": {}}],
    "privacy": {"mechanism": "central", "epsilon": "inf", "delta": 1e-5, "rounds_accounted": 10,
                "noise_multiplier": 0.0, "sampling_rate": 0.5, "clip_norm": 1.0}})
EDGE: dict[str, Any] = {
    "name": "e000", "role": "edge", "state": "waiting for a round",
    "waiting_for": "registered; not sampled yet (fraction 0.5)", "epoch": 0, "gateway": "gw0",
    "gateway_address": "tcp://127.0.0.1:7001", "gateway_up": True, "round": -1, "rounds_trained": 0,
    "updates_sent": 0, "unsent": {}, "step": 0, "loss": None, "num_samples": 146, "bytes_sent": 0,
    "bytes_received": 0, "client": {}, "rejections": {}, "internal_errors": {}, "updated_at": NOW, "pid": 1}
PEER: dict[str, Any] = {
    "name": "p00", "state": "waiting", "waiting_for": "waiting for p01 (0/1 up)", "epoch": 1, "step": 12,
    "steps_done": 12, "loss": None, "accuracy": None, "test_loss": None, "eval_step": -1,
    "consensus_max_relative": None, "bytes_sent": 10, "bytes_received": 0, "payload_bytes_sent": 0,
    "metrics": {}, "rejections": {"config_mismatch": 2}, "internal_errors": {}, "stranded": "",
    "neighbours": {"p01": {"up": False, "presence": "down", "finished": False, "last_seen_s": None,
                           "latency_ms": None, "step": -1}}, "updated_at": NOW, "pid": 1}
STATUSES = {"a FedBuff gateway": GATEWAY, "a finished sync gateway with DP": SYNC_FINISHED,
            "an edge before its first round": EDGE, "a peer waiting for a neighbour never heard": PEER}


@pytest.mark.parametrize("what", list(STATUSES))
def test_status_text_is_words(what: str) -> None:
    # Prepare
    status = copy.deepcopy(STATUSES[what])
    # Execute: in detail and as a table, running and not
    text = status_texts([status])
    # Assert
    assert not repr_leaks(text), "\n".join(repr_leaks(text))
    assert text.count(f" {status['name']}") >= 2     # the detail and the table were both rendered


def test_fedbuff_last_aggregation_in_words() -> None:
    # Execute
    text = render(dict(copy.deepcopy(GATEWAY), running=True, age_s=0.5))
    # Assert: its model version and contributors, not a sync round's "None: by None"
    assert "last aggregation: model version 37 from 2 updates (e001, e006), staleness up to 4" in text
    assert "edge client" not in text


def test_an_edges_wait_heads_its_status_while_it_runs() -> None:
    # Execute
    text = render(dict(copy.deepcopy(EDGE), running=True, age_s=0.5))
    # Assert
    assert text.splitlines()[0].startswith("edge client e000: registered; not sampled yet (fraction 0.5)")


@pytest.mark.parametrize("line", ["last closed round None: by None", "counters {'heartbeat': 3}",
                                  "unsent ['heartbeat', 'round_start']", "roles ('gateway',)", "Counter()}"])
def test_the_checker_finds_a_repr(line: str) -> None:
    assert repr_leaks(f"2026-12-05T12:00:00.000+00:00 e000: {line}")


@pytest.mark.parametrize("line", ["e00.toml: key 'edge.curve': the gateway 'gw0' has no curve_key",
                                  "e000: gave up; unsent: heartbeat 3; rejected: none",
                                  "p00 refused messages from p05: config_mismatch (run id ab != cd)"])
def test_the_checker_passes_words(line: str) -> None:
    assert not repr_leaks(line)
