"""Peers on separate hosts (issue 16, items 1 and 2): a ring trained across network namespaces, and a
host whose cable is pulled for a while, then plugged back.

Set up as an operator would: ``hivemesh init --hosts A,B,C,D`` writes one address
per member, and each host runs ``hivemesh peer --config NAME.toml`` (through ``ip
netns exec``, tests/_netns.py). 4 peers, D-PSGD on a ring, digits-mlp,
Dirichlet(0.5), 300 steps: the loopback process tests' run and bar.

The fault is placed on progress (every peer past ``CUT_STEP``) and lasts
``OUTAGE_S`` of wall clock, which is what a cable cut is; it is shorter than
the round deadline (10 s), so the ring waits for the cut host rather than
training on without it, and TCP delivers what was in flight once the cable is
back (measured: the whole ring stands still while the cable is out, and
moves again at TCP's next retransmission after it is back: 2.5 to 16 s seen, the backoff
doubling while the cable is out; reported as the recovery time). The
test checks that the cut really cut (the cut host stood still while its cable
was out, once the steps in flight had passed) and that it cost nothing at the
end: every peer exits 0 with accuracy >= 0.90 (0.94 measured, as on
loopback), and the consensus distance (max relative) is < 1e-2. About 80 s on
the shared 2-core machine, most of it four processes importing torch.

The simulator replays the fault (tests/_sim_predict.py ``predict_cable_out``:
the same cable out on the same progress, each step the run's own pre-fault step
time) and must give the same outcome: the cut host stands still, then every
member finishes at the bars. Its cable-back-to-moving time is recorded beside
the real one, not asserted: the simulator's link model delivers what a held
connection carried once ZeroMQ redials (5.6 s after the cut: 1.6 s after the
cable is back), where the real runs (16.1, 16.2 and 7.3 s here) showed the
silent connections closed (``closed_after_handshake``) and rounds waited to
their deadline (``missed_deadline``, 10 s): what a closed connection held was
lost.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _daemon_support import CEILING_S, consensus_max_relative
from _fault_report import record
from _hosts_support import (
    RssTrace,
    describe,
    final_params,
    init_network,
    start_peer,
    steps,
    wait_for_exit,
    wait_for_step,
)
from _netns import Hosts
from _sim_predict import pre_fault_step_s, predict_cable_out

from peer.files.statefiles import STATUS_FILE, read_status

pytestmark = [pytest.mark.hosts, pytest.mark.processes, pytest.mark.slow]

PEERS, STEPS, CUT_STEP, OUTAGE_S, SETTLE_S = 4, 300, 100, 4.0, 1.0
CUT = 2      # the host whose cable is pulled


def step_written_after(out: Path, name: str, wall_s: float) -> int:
    """``name``'s step from a status.json written after ``wall_s`` (``time.time()``; it is rewritten
    whole every ``status_interval_s``, 1 s)."""
    path = out / "data" / name / STATUS_FILE
    deadline = time.monotonic() + CEILING_S
    while path.stat().st_mtime <= wall_s:
        assert time.monotonic() < deadline, f"{name} wrote no status in {CEILING_S} s"
        time.sleep(0.05)
    return steps(out, [name])[name]


def test_a_ring_across_hosts_survives_a_pulled_cable(tmp_path: Path) -> None:
    out = tmp_path / "net"
    with Hosts(PEERS) as hosts:
        names = init_network(hosts, out, steps=STEPS)
        started = time.monotonic()
        processes = {name: start_peer(hosts, index, out, name) for index, name in enumerate(names)}
        rss = RssTrace(out, processes)

        wait_for_step(out, names, CUT_STEP, processes)
        at_cut = time.monotonic() - started
        step_s = pre_fault_step_s(out / "data", names)
        hosts.link_down(CUT)
        cut_s = time.monotonic()
        # the fault is a duration, a cable out for OUTAGE_S; its first SETTLE_S let the steps in flight
        # pass, then the cut host must stand still: its step from a status it wrote after those
        # (one written before them, late on a loaded machine, would count them as made while cut)
        time.sleep(SETTLE_S)
        settled = step_written_after(out, names[CUT], time.time())
        time.sleep(max(0.0, cut_s + OUTAGE_S - time.monotonic()))
        during = steps(out, names)[names[CUT]] - settled
        hosts.link_up(CUT)
        back = time.monotonic()
        stood = steps(out, names)[names[CUT]]
        while steps(out, names)[names[CUT]] < stood + 2 and time.monotonic() - back < CEILING_S \
                and processes[names[CUT]].poll() is None:
            time.sleep(0.05)
        moving_s = time.monotonic() - back   # cable back -> the cut host two steps further

        codes = wait_for_exit(processes)
        print(f"step {CUT_STEP} after {at_cut:.1f} s, finished after {time.monotonic() - started:.1f} s; "
              f"{names[CUT]} made {during} steps with its cable out")
        report = describe(out, names)

    assert codes == dict.fromkeys(names, 0), f"{codes}\n{report}"
    assert during <= 1, f"{names[CUT]} made {during} steps with its cable out: the cut did not cut\n{report}"
    for name in names:
        found = read_status(out / "data" / name)
        assert found is not None and found["step"] == STEPS, report
        assert found["accuracy"] >= 0.90, f"{name}: accuracy {found['accuracy']}\n{report}"
    assert consensus_max_relative(final_params(out, names)) < 1e-2, report

    # the simulator, the same fault on the same progress, each step the real run's pre-fault step time:
    # the same outcome (the cut host stands still, then every member finishes at the bars)
    predicted = predict_cable_out(out / "p00.toml", member=names[CUT], at_step=CUT_STEP, outage_s=OUTAGE_S,
                                  settle_s=SETTLE_S, step_s=step_s)
    seen = {name: (read_status(out / "data" / name) or {}) for name in names}
    print(f"real: {names[CUT]} 2 steps on {moving_s:.1f} s after its cable was back (missed deadlines "
          f"{ {n: s.get('metrics', {}).get('missed_deadline', 0) for n, s in seen.items()} }, connections "
          f"{ {n: s.get('transport_connections') for n, s in seen.items()} }); {predicted.summary}")
    assert predicted.during_steps <= 1, predicted.summary
    assert all(predicted.finished.values()), predicted.summary
    assert min(predicted.accuracy.values()) >= 0.90, predicted.summary
    assert predicted.consensus_max_relative < 1e-2, predicted.summary
    record("a host's cable out, then back", injected=1, survived=1, recovery_s=moving_s,
           predicted_s=predicted.moving_again_s,
           note="recovery: cable back to the cut host 2 steps on; "
                f"{OUTAGE_S:.0f} s out at step {CUT_STEP}; the cut host made {during} steps meanwhile "
                f"(simulator: {predicted.during_steps})")
    rss.check("ring")
