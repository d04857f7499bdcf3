"""A federation across hosts (issue 16, items 2, 3 and 4): a gateway on one host, 10 edge clients on
five others; the gateway is killed (``kill -9``) mid-run and restarted on its host, and an 11th edge
client joins the running federation through a roster update.

Set up as an operator would: ``hivemesh init --gateways 1 --edges 10 --hosts GW`` writes
the gateway's address (edge clients dial out and have none), the federation's tables are
tuned in every file alike (the loopback federation tests' run: 30 rounds of 5 of 10 clients,
2 local epochs, digits-mlp on Dirichlet(0.3) shards, bar 0.90), the gateway runs
``hivemesh peer --config gw0.toml`` on host 0 and each edge ``hivemesh edge --config
eNNN.toml`` on hosts 1-5, two a host (through ``ip netns exec``, tests/_netns.py).

Faults, placed on progress (the gateway's ``rounds.jsonl``):
- once ``JOIN_AFTER`` rounds closed, ``hivemesh keygen`` and ``hivemesh roster add e010 --role
  edge --effective-round R``, ``hivemesh roster reload`` of the gateway, e010's config a copy of
  e009's with its name, and at once ``hivemesh edge`` on host 5, before round R (a test hook
  holds the gateway before round R - 1 until e010 has connected, so it dials before its round
  on every machine): the running gateway (which names no clients: it serves the roster's)
  admits e010's key as soon as it reads the roster (e010 connects, its heartbeats counted
  ``client_not_served_yet``), and serves it from round R on; e010 must be taken in a round >= R.
  Had e010 dialled before the gateway read the file, its refused handshake would be redialed
  after a short backoff (peer/net/dial.py);
- once ``KILL_AFTER`` rounds closed (and more than a checkpoint interval past R), ``kill -9`` of
  the gateway, then, once e010 is up, the same command again on its host. The edge clients
  carry on (ZeroMQ redials; their ``gateway_timeout_s``, 120 s, is far longer than the
  restart) and none exits but with 0; the gateway resumes from its checkpoint, written every
  round (what ``init`` writes for a gateway), so it closes again at most one round it had
  closed before (its lost rounds, the report's "steps lost").

At the end every process exited 0, the gateway closed every round 0-29 and its global model
meets the loopback bar (>= 0.90).

The simulator replays the kill (tests/_sim_predict.py, issue 16 item 5) on this run's files: the
gateway killed once its machine did as many rounds as it had closed here, down as long plus a
modelled process start, a client's step calibrated from the real pre-fault rounds' length. It
must lose at most the interval, close those rounds again, close every round and meet the bar; its
time from the restart to the first round closed is the report's simulator column (not asserted:
the real one is mostly the gateway importing torch).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from _daemon_support import json_lines
from _fault_report import record
from _hosts_support import ENVIRONMENT, PORT, RssTrace, wait_for_exit
from _hosts_support import wait_until as shared_wait_until
from _netns import Hosts
from _sim_predict import predict_gateway_kill

from peer.cli.main import main
from peer.files import tomlout
from peer.files.statefiles import read_status
from peer.runtime.netinit import GATEWAY_CHECKPOINT_ROUNDS
from peer.runtime.testhooks import ENVIRONMENT_VARIABLE, Hook, hooks_json

pytestmark = [pytest.mark.hosts, pytest.mark.processes, pytest.mark.slow]

HOSTS, EDGES, ROUNDS = 6, 10, 30
JOIN_AFTER = 2             # e010 is added once this many rounds closed
EFFECTIVE = JOIN_AFTER + 2  # ... from this round on; the gateway holds before the one before until e010 is in
KILL_AFTER = 8             # the gateway is killed once this many rounds closed
CHECKPOINT_ROUNDS = GATEWAY_CHECKPOINT_ROUNDS   # the gateway's interval in what init writes (rounds)
CEILING_S = 240.0          # no healthy run comes near it
GATEWAY, JOINER = "gw0", "e010"
# the loopback federation tests' run (tests/_federation_support.py), the same in every file
FEDERATION = {"fraction": 0.5, "min_clients": 5, "local_epochs": 2, "max_samples": 1000,
              "round_timeout_s": 30.0}
TRAINER = {"optimizer": "sgd", "lr": 0.1, "batch_size": 32, "lr_decay": "none"}
GATEWAY_SETS = {"peer.progress": "false", "peer.eval_every_steps": 0, "peer.heartbeat_interval_s": 0.5,
                "peer.neighbour_timeout_s": 30.0, "peer.start_timeout_s": 120.0, "peer.finish_grace_s": 2.0,
                "peer.status_interval_s": 0.2}
EDGE_OPTIONS = {"progress": False, "heartbeat_interval_s": 0.5, "neighbour_timeout_s": 30.0,
                "gateway_timeout_s": 120.0}


def edge_host(index: int) -> int:
    """Edge client ``index``'s host: 1-5, two a host (host 0 is the gateway's)."""
    return 1 + index % (HOSTS - 1)


def tune(path: Path, section: str | None = None) -> None:
    """The operator's edit of one config file: the run's [network] trainer and [federation] keys in
    the shared federation.toml (every member includes it: they are the run id), an edge's [edge]
    options in its own file."""
    table = tomllib.loads(path.read_text())
    if section == "edge":
        table["edge"] = {**table["edge"], **EDGE_OPTIONS}
    else:
        table["network"]["trainer"] = {**table["network"]["trainer"], **TRAINER}
        table["federation"] = {**table["federation"], **FEDERATION}
    path.write_text(tomlout.dumps(table))


def gateway_command(out: Path) -> list[str]:
    sets = [arg for key, value in GATEWAY_SETS.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "peer", "peer", "--config", str(out / f"{GATEWAY}.toml"), "--quiet", *sets]


def edge_command(out: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "peer", "edge", "--config", str(out / f"{name}.toml"), "--quiet"]


def start(hosts: Hosts, host: int, out: Path, name: str, argv: list[str],
          hooks: list[Hook] | None = None) -> subprocess.Popen[bytes]:
    data = out / "data" / name
    data.mkdir(parents=True, exist_ok=True)
    log = data / "peer.log"
    with log.open("a") as handle:
        handle.write(f"--- started on host {host}\n")
    return hosts.popen(host, argv, log=log, env={**os.environ, **ENVIRONMENT,
                                                 ENVIRONMENT_VARIABLE: hooks_json(hooks or [])}, cwd=out)


def status_of(out: Path, name: str) -> dict[str, Any]:
    return read_status(out / "data" / name) or {}


def rounds(out: Path) -> list[dict[str, Any]]:
    """The gateway's closed rounds, in the order written (``rounds.jsonl``; a line being written is
    not read)."""
    return json_lines(out / "data" / GATEWAY / "rounds.jsonl")


def wait_until(what: str, condition: Any, out: Path, processes: dict[str, subprocess.Popen[bytes]]) -> None:
    shared_wait_until(what, condition, processes, lambda: story(out, processes))


def story(out: Path, names: Any) -> str:
    parts = []
    for name in names:
        found = read_status(out / "data" / name) or {}
        log = out / "data" / name / "peer.log"
        tail = "\n".join(log.read_text().splitlines()[-6:]) if log.exists() else "(no log)"
        fed = found.get("federation", {})
        parts.append(f"{name}: state {found.get('state')} round {fed.get('round', found.get('round'))} "
                     f"counters {fed.get('counters')} rejections {found.get('rejections')}\n{tail}")
    return "\n".join(parts)


def test_a_federation_across_hosts_survives_a_gateway_kill_and_takes_a_new_edge(tmp_path: Path) -> None:
    out = tmp_path / "fed"
    edges = [f"e{i:03d}" for i in range(EDGES)]
    with Hosts(HOSTS) as hosts:
        # Prepare: the operator's commands
        assert main(["init", "--gateways", "1", "--edges", str(EDGES), "--rounds", str(ROUNDS),
                     "--out", str(out), "--hosts", hosts.addresses[0], "--base-port", str(PORT),
                     "--seed", "3", "--alpha", "0.3"]) == 0
        tune(out / "federation.toml")
        for name in edges:
            tune(out / f"{name}.toml", "edge")
        began = time.monotonic()
        # the gateway holds before round EFFECTIVE - 1 until the joiner has connected (a test hook; a
        # gateway's hooks count its rounds): the joiner dials before its round on any machine
        joiner_in = tmp_path / "joiner-in"
        processes = {GATEWAY: start(hosts, 0, out, GATEWAY, gateway_command(out),
                                    [Hook(at_step=EFFECTIVE - 1, action="hold", gate=str(joiner_in))])}
        processes |= {name: start(hosts, edge_host(i), out, name, edge_command(out, name))
                      for i, name in enumerate(edges)}
        rss = RssTrace(out, processes)

        # Execute 1: an 11th edge client joins the running federation by a roster update, from a
        # round the gateway has yet to reach, and its device starts
        wait_until(f"{JOIN_AFTER} rounds closed", lambda: len(rounds(out)) >= JOIN_AFTER, out, processes)
        effective = EFFECTIVE
        assert main(["keygen", "--out", str(out / "keys" / f"{JOINER}.key")]) == 0
        assert main(["roster", "add", JOINER, "--roster", str(out / "roster.toml"), "--key",
                     str(out / "keys" / f"{JOINER}.key"), "--role", "edge",
                     "--effective-round", str(effective)]) == 0
        config = (out / f"{edges[-1]}.toml").read_text().replace(edges[-1], JOINER)
        (out / f"{JOINER}.toml").write_text(config)
        assert main(["roster", "reload", "--config", str(out / f"{GATEWAY}.toml")]) == 0
        processes[JOINER] = start(hosts, HOSTS - 1, out, JOINER, edge_command(out, JOINER))   # at once
        wait_until(f"{JOINER} connected before round {EFFECTIVE}",
                   lambda: status_of(out, JOINER).get("handshakes", 0) >= 1, out, processes)
        wait_until(f"{JOINER}'s heartbeats heard before its round",
                   lambda: status_of(out, GATEWAY).get("rejections", {}).get("client_not_served_yet", 0) >= 1,
                   out, processes)
        before_round = len(rounds(out))     # rounds closed while it was connected but not served
        refused_early = status_of(out, JOINER).get("handshake_refused", {})
        joiner_in.touch()

        # Execute 2: kill -9 the gateway once KILL_AFTER rounds closed; start it again on its host
        # once the joiner is up (its import of torch takes longer than the rounds left would)
        # (past the joiner's round by more than a checkpoint interval: the restarted gateway reads the
        # new roster at start and serves e010 from its first round)
        kill_after = max(KILL_AFTER, effective + CHECKPOINT_ROUNDS + 1)
        wait_until(f"{kill_after} rounds closed", lambda: len(rounds(out)) >= kill_after, out, processes)
        processes[GATEWAY].send_signal(signal.SIGKILL)
        processes[GATEWAY].wait(timeout=30)
        reached = max(row["round"] for row in rounds(out)) + 1     # rounds the killed gateway had closed
        written = len(rounds(out))
        killed_at = time.monotonic()
        others = {name: process for name, process in processes.items() if name != GATEWAY}
        wait_until(f"{JOINER} up", lambda: read_status(out / "data" / JOINER) is not None, out, others)
        processes[GATEWAY] = start(hosts, 0, out, GATEWAY, gateway_command(out))
        restarted_at = time.monotonic()
        wait_until("the restarted gateway closed a round", lambda: len(rounds(out)) > written, out, processes)
        recovery_s = time.monotonic() - restarted_at     # the fault is over once it is started again
        down_s = restarted_at - killed_at
        again = [row["round"] for row in rounds(out)[written:]]

        codes = wait_for_exit(processes)
        took_s = time.monotonic() - began
        report = story(out, processes)
        log = (out / "data" / GATEWAY / "peer.log").read_text()

    # Assert
    closed = rounds(out)
    by_round = {row["round"]: row for row in closed}
    repeated = len(closed) - len(by_round)
    resumed = re.search(r"resumed from checkpoint at round (\d+)/", log)
    print(f"\n{JOINER} added from round {effective}; gateway killed after {reached} rounds, down "
          f"{down_s:.1f} s, then {recovery_s:.1f} s to its first round closed again ({again[:3]}...), "
          f"{repeated} rounds closed twice; {resumed and resumed[0]}; whole run {took_s:.1f} s")
    assert codes == dict.fromkeys(processes, 0), f"{codes}\n{report}"
    assert sorted(by_round) == list(range(ROUNDS)), report
    assert resumed is not None, log
    lost = reached - min(again)     # rounds closed again: what the kill cost
    assert 0 <= lost <= CHECKPOINT_ROUNDS and repeated == lost, (reached, again, repeated)
    assert int(resumed[1]) == min(again), (resumed[0], again)
    joined = [index for index, row in by_round.items() if JOINER in row["taken"]]
    assert before_round < effective, (before_round, effective)     # it was in before its round
    assert joined and min(joined) >= effective, (joined, report)
    gateway = read_status(out / "data" / GATEWAY) or {}
    assert gateway["accuracy"] >= 0.90, report
    # the simulator: the same kill (at the rounds it had closed, down as long) on the files of this run
    predicted = predict_gateway_kill(out / f"{GATEWAY}.toml", [out / f"{n}.toml" for n in [*edges, JOINER]],
                                     reached=reached, down_s=down_s, pre_fault=closed[:written],
                                     options={k.removeprefix("peer."): v for k, v in GATEWAY_SETS.items()})
    print(predicted.summary)
    record("gateway kill -9 + restart under 10 edges", injected=1, survived=1, steps_lost=[lost],
           recovery_s=recovery_s, predicted_s=predicted.recovery_s,
           note=f"rounds lost <= checkpoint interval ({CHECKPOINT_ROUNDS}); recovery: restart to its first "
                "round closed, torch import included (simulator: a process start modelled as 1 s; lost "
                f"{predicted.rounds_lost})")
    record("edge added while running", injected=1, survived=1,
           note=f"{JOINER} connected before its round {effective} (refused handshakes "
                f"{sum(refused_early.values())}), taken in {len(joined)} of rounds {effective}-{ROUNDS - 1}")
    # the simulator's outcome is the real one's: at most the interval lost and closed again, every
    # round closed, the bar met (its e010 is a client from round 0: the replay has no roster versions)
    assert 0 <= predicted.rounds_lost <= CHECKPOINT_ROUNDS, predicted.summary
    assert predicted.rounds_closed_again == predicted.rounds_lost, predicted.summary
    assert predicted.closed == tuple(range(ROUNDS)) and predicted.accuracy >= 0.90, predicted.summary
    rss.check("federation")
