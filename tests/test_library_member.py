"""Library mode (issue 29, acceptance a): examples/own_loop.py, a plain torch loop with five added
lines, as four real member processes on configs ``hivemesh init`` wrote, against four ``hivemesh
peer`` processes on the same task in the same test.

The own loop trains with AdamW, OneCycleLR, gradient accumulation of 4 and bf16 autocast on the
CPU; the daemons with the config's SGD and cosine schedule. Each own-loop member finishes within 1
accuracy point of the daemons' mean, their final models agree (D-PSGD: the schedule ends at a
learning rate near 0, so the mixing contracts what is left), and one member, held with the others
by a test hook at a step after its checkpoints, is killed with SIGKILL, started again, resumes from its
checkpoint (its model, optimizer and scheduler), syncs with its neighbours (held there too) and
finishes with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _daemon_support import CEILING_S, TEST_PEER_OPTIONS, consensus_max_relative, set_peer_option
from torch import nn

import peer
from peer.cli.main import main
from peer.files.statefiles import read_status
from peer.runtime.export import latest_params
from peer.runtime.peerconfig import load_peer_config
from peer.runtime.testhooks import ENVIRONMENT_VARIABLE, Hook, hooks_json

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "own_loop.py"
ENVIRONMENT = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
NAMES = ("p00", "p01", "p02", "p03")
STEPS = 200
CHECKPOINT_EVERY = 20
HOLD_AT = 60            # the victim is held here (after its checkpoint at 40, before the one at 60)
ACCURACY_POINTS = 0.01
# the built-in trainer's nearest to the own loop (AdamW, OneCycleLR to 0.01 with 30% warm-up, 4 x 32)
DAEMON_TRAINER = {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.01, "warmup_steps": 60,
                  "lr_decay": "cosine", "batch_size": 128}
CONSENSUS = 1e-3


def make_network(out: Path, names: Sequence[str] = NAMES, steps: int = STEPS) -> None:
    """``hivemesh init`` as a user runs it, then the process tests' timings and checkpoint interval."""
    assert main(["init", "--peers", str(len(names)), "--out", str(out), "--steps", str(steps),
                 "--partition", "iid"]) == 0
    for name in names:
        config = out / f"{name}.toml"
        for key, value in {**TEST_PEER_OPTIONS, "status_interval_s": 0.2}.items():
            set_peer_option(config, key, str(value).lower() if isinstance(value, bool) else str(value))
        with config.open("a") as handle:
            handle.write(f"\n[checkpoint]\nevery_steps = {CHECKPOINT_EVERY}\n")


def start(out: Path, name: str, command: Sequence[str], hooks: Sequence[Hook] = (),
          log: str = "process.log") -> subprocess.Popen[bytes]:
    data = out / "data" / name
    data.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **ENVIRONMENT, ENVIRONMENT_VARIABLE: hooks_json(hooks)}
    with (data / log).open("ab") as handle:
        return subprocess.Popen(command, cwd=out, env=env, stdout=handle, stderr=subprocess.STDOUT)


def own_loop(out: Path, name: str, hooks: Sequence[Hook] = (),
             log: str = "process.log") -> subprocess.Popen[bytes]:
    command = [sys.executable, str(EXAMPLE), f"{name}.toml", "--steps", str(STEPS)]
    return start(out, name, command, hooks, log)


def daemon(out: Path, name: str) -> subprocess.Popen[bytes]:
    """``hivemesh peer``, its trainer set as close to the own loop's as the built-in one goes."""
    sets = [arg for key, value in DAEMON_TRAINER.items()
            for arg in ("--set", f"network.trainer.{key}={value}")]
    command = [sys.executable, "-m", "peer", "peer", "--config", f"{name}.toml", "--quiet", *sets]
    return start(out, name, command)


def logs(out: Path) -> str:
    return "\n".join(f"--- {path.relative_to(out)}\n" + "\n".join(path.read_text().splitlines()[-12:])
                     for path in sorted((out / "data").glob("*/*.log")))


def wait_until(what: str, ready: object, out: Path, processes: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """Poll ``ready()`` up to the ceiling; fails at once when a process exited."""
    deadline = time.monotonic() + CEILING_S
    while not ready():   # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {CEILING_S} s\n{logs(out)}"
        exited = {n: p.returncode for n, p in processes.items() if p.poll() is not None}
        assert not exited, f"{what}: exited {exited}\n{logs(out)}"
        time.sleep(0.05)


def finish(out: Path, processes: Mapping[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + CEILING_S
    for process in processes.values():
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    codes = {name: process.returncode for name, process in processes.items()}
    assert all(code == 0 for code in codes.values()), f"exit codes {codes}\n{logs(out)}"


def final(out: Path) -> tuple[dict[str, float], float]:
    """Each member's last evaluated test accuracy (its status file) and the final models' consensus."""
    accuracy = {name: float((read_status(out / "data" / name) or {})["accuracy"]) for name in NAMES}
    params = {name: latest_params(load_peer_config(out / f"{name}.toml"))[0].to(torch.float64)
              for name in NAMES}
    return accuracy, consensus_max_relative(params)


def test_own_loop_members_match_daemons_and_resume_after_kill(tmp_path: Path) -> None:
    daemons, library = tmp_path / "daemons", tmp_path / "library"
    make_network(daemons)
    make_network(library)

    processes = {name: daemon(daemons, name) for name in NAMES}
    finish(daemons, processes)
    daemon_accuracy, daemon_consensus = final(daemons)
    reference = sum(daemon_accuracy.values()) / len(NAMES)

    # every member holds at HOLD_AT until the gate opens; the victim is killed there and started again
    victim, gate = "p01", library / "gate"
    held = {name: library / f"held-{name}" for name in NAMES}
    processes = {name: own_loop(library, name, [Hook(at_step=HOLD_AT, action="hold", gate=str(gate),
                                                     mark=str(held[name]))]) for name in NAMES}
    wait_until(f"all held at step {HOLD_AT}", lambda: all(mark.exists() for mark in held.values()),
               library, processes)
    processes[victim].kill()    # SIGKILL: no checkpoint at exit, no goodbye
    assert processes[victim].wait(timeout=CEILING_S) == -9
    processes[victim] = own_loop(library, victim, log="restarted.log")
    restarted_log = library / "data" / victim / "restarted.log"
    wait_until(f"{victim} synced again", lambda: "synced from" in restarted_log.read_text(),
               library, processes)
    gate.touch()
    finish(library, processes)

    restarted = restarted_log.read_text()
    resumed_at = CHECKPOINT_EVERY * (HOLD_AT // CHECKPOINT_EVERY - 1)   # the last one before the hold
    assert f"resumed from checkpoint at step {resumed_at}" in restarted, logs(library)
    printed = {name: json.loads((library / "data" / name / ("restarted.log" if name == victim else
                                                            "process.log")).read_text().splitlines()[-1])
               for name in NAMES}
    library_accuracy, library_consensus = final(library)
    for name in NAMES:   # the loop's own evaluation of its model is what the status shows
        assert printed[name]["accuracy"] == pytest.approx(library_accuracy[name]), name
    print(f"daemons {daemon_accuracy} consensus {daemon_consensus:.2e}; "
          f"own loop {library_accuracy} consensus {library_consensus:.2e}")
    for name, accuracy in library_accuracy.items():
        assert abs(accuracy - reference) <= ACCURACY_POINTS, (name, accuracy, reference, daemon_accuracy)
    assert library_consensus < CONSENSUS, (library_consensus, daemon_consensus)
    assert daemon_consensus < CONSENSUS, daemon_consensus


def in_threads(work: Callable[[str], object], names: Sequence[str]) -> dict[str, object]:
    """``work(name)`` for every member at once (``join`` waits for the neighbours); what each returned."""
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = work(name)
        except BaseException as error:   # given to the test's thread
            results[name] = error

    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=CEILING_S)
    assert all(not thread.is_alive() for thread in threads), f"members still running: {results}"
    errors = {name: result for name, result in results.items() if isinstance(result, BaseException)}
    assert not errors, errors
    return results


def test_two_members_in_one_process_close_rejoin_and_finish(tmp_path: Path) -> None:
    """``close()`` mid-run checkpoints and leaves (the status says stopped); ``join`` again resumes
    at that step with the optimizer's state, and the round it closed in is trained again (the
    member's steps and its machine's rounds stay one count); the run then finishes (``done``, exit
    0) at exactly its total."""
    names, total, first = ("p00", "p01"), 30, 10
    make_network(tmp_path, names, steps=total)
    for name in names:   # both restarted at once: each asks the other, which is syncing too (no answer)
        set_peer_option(tmp_path / f"{name}.toml", "sync_timeout_s", "1.0")
        set_peer_option(tmp_path / f"{name}.toml", "sync_attempts", "1")

    def member(name: str, until: int) -> tuple[int, int, bool, int, int]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        with peer.join(tmp_path / f"{name}.toml", model, optimizer=optimizer) as m:
            started, adam_steps = m.steps, len(optimizer.state)
            while m.steps < until:
                generator = torch.Generator().manual_seed(m.steps)
                x, y = torch.randn(8, 4, generator=generator), torch.randint(2, (8,), generator=generator)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                m.step(loss)
            done = m.done
        assert m.exit_code is not None
        return started, m.steps, done, m.exit_code, adam_steps

    stopped = in_threads(lambda name: member(name, first), names)
    for name in names:
        assert stopped[name] == (0, first, False, 0, 0), stopped
        found = read_status(tmp_path / "data" / name) or {}
        assert (found.get("state"), found.get("step")) == ("stopped", first), found
    finished = in_threads(lambda name: member(name, total), names)
    for name in names:
        # resumed at the step it closed at, the optimizer's moments restored (2 parameters' state)
        assert finished[name] == (first, total, True, 0, 2), finished
        found = read_status(tmp_path / "data" / name) or {}
        assert (found.get("state"), found.get("step")) == ("finished", total), found
        assert latest_params(load_peer_config(tmp_path / f"{name}.toml"))[1] == total
