"""Flakiness gate: run the real-process tests N times and report every test that ever failed.

A test that fails once in ten runs blocks one landing in ten at random. This
runs ``python -m pytest -m processes`` (or the marker expression given) N
times, each in a fresh process with no cache, reads each run's JUnit XML
report, and prints one row per test: runs, failures (errors in set-up or
tear-down count as failures) and skips. It exits 1 if any test failed in
any run, or if a run ended without a report or with pytest's usage or
internal-error codes; 0 otherwise. Every run is made, even after a failure,
so that the counts are complete.

``--load N`` runs N CPU-bound processes beside the tests for the whole gate, as
a CI machine or a user's machine is busy with other work: a test that passes
only on an idle machine fails here. The gate before a stop is ``--runs 10
--load 2`` on the 2-core development machine.

Run:  .venv/bin/python bench/flaky.py --runs 10 [--load N] [-k EXPR] [-m MARKEXPR] [PATH ...] [-- PYTEST ARGS]
e.g.  .venv/bin/python bench/flaky.py --runs 3 --load 2 tests/test_daemon_churn.py
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pytest's exit codes that still mean "the tests ran": all passed, some failed
RAN = (0, 1)
NO_TESTS = 5
MESSAGE_CHARS = 2000    # of each failure's message, printed under the table
# a CPU-bound process of the load; its last argument names it in ps and /proc
BURNER = [sys.executable, "-c", "while True: pass", "hivemesh-flaky-load"]


@dataclass
class Tally:
    """Per test id: how many runs reported it, failed it and skipped it."""

    runs: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    skips: Counter[str] = field(default_factory=Counter)
    broken_runs: list[str] = field(default_factory=list)   # runs without a usable report
    reasons: list[str] = field(default_factory=list)       # "run N, test: message" per failure
    run_s: list[float] = field(default_factory=list)       # each run's wall time

    def add_report(self, report: Path, run: int = 0) -> None:
        outcomes: dict[str, str] = {}
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            test_id = node_id(case.get("classname", ""), case.get("name", ""))
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            outcome = ("failed" if failure is not None
                       else "skipped" if case.find("skipped") is not None else "passed")
            if failure is not None:     # what a flaky failure said is what finds its cause
                message = (failure.get("message") or failure.text or "").strip()
                self.reasons.append(f"run {run}, {test_id}: {message[:MESSAGE_CHARS]}")
            # a test with a failing call and an erroring tear-down may appear twice: failed wins
            if outcomes.get(test_id) != "failed":
                outcomes[test_id] = outcome
        for test_id, outcome in outcomes.items():
            self.runs[test_id] += 1
            self.failures[test_id] += outcome == "failed"
            self.skips[test_id] += outcome == "skipped"

    def failed(self) -> bool:
        return bool(self.broken_runs) or any(self.failures.values())


def node_id(classname: str, name: str) -> str:
    """pytest's node id back from JUnit's dotted classname: tests.test_x.TestY -> tests/test_x.py::TestY."""
    parts = classname.split(".") if classname else []
    classes = []
    while parts and parts[-1][:1].isupper():   # test classes are CamelCase, modules are not
        classes.insert(0, parts.pop())
    module = "/".join(parts) + ".py" if parts else "?"
    return "::".join([module, *classes, name])


def pytest_command(report: Path, marker: str, keyword: str | None, paths: list[str],
                   extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-m", marker, "-p", "no:cacheprovider", "-q",
               f"--junitxml={report}"]
    if keyword:
        command += ["-k", keyword]
    return command + extra + paths


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops beside whatever runs inside; all stopped on the way out."""
    burners = [subprocess.Popen(BURNER, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
               for _ in range(processes)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def run_all(runs: int, marker: str, keyword: str | None, paths: list[str], extra: list[str]) -> Tally:
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="hivemesh-flaky-") as folder:
        for index in range(1, runs + 1):
            report = Path(folder) / f"run-{index}.xml"
            started = time.monotonic()
            done = subprocess.run(pytest_command(report, marker, keyword, paths, extra), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            tally.run_s.append(time.monotonic() - started)
            summary = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print(f"run {index}/{runs}: exit {done.returncode}, {summary[0]} "
                  f"({tally.run_s[-1]:.0f} s)", file=sys.stderr, flush=True)
            if done.returncode not in (*RAN, NO_TESTS) or not report.exists():
                tally.broken_runs.append(f"run {index}: pytest exit code {done.returncode}\n"
                                         f"{done.stdout[-2000:]}")
                continue
            tally.add_report(report, index)
    return tally


def table(tally: Tally, runs: int) -> str:
    ids = sorted(tally.runs, key=lambda t: (-tally.failures[t], t))
    width = max([len("test"), *(len(t) for t in ids)])
    lines = [f"{'test':<{width}}  {'runs':>4}  {'failures':>8}  {'skipped':>7}"]
    lines += [f"{t:<{width}}  {tally.runs[t]:>4}  {tally.failures[t]:>8}  {tally.skips[t]:>7}" for t in ids]
    flaky = [t for t in ids if tally.failures[t]]
    lines.append(f"\n{len(flaky)} of {len(ids)} tests failed at least once in {runs} runs"
                 + (f"; {len(tally.broken_runs)} runs ended without a report" if tally.broken_runs else ""))
    lines += tally.broken_runs
    lines.append("run times (s): " + ", ".join(f"{seconds:.0f}" for seconds in tally.run_s))
    if tally.reasons:
        lines += ["", "failures:", *tally.reasons]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="arguments after -- go to pytest unchanged")
    parser.add_argument("--runs", type=int, default=10, help="how many times to run the tests (default 10)")
    parser.add_argument("-m", dest="marker", default="processes",
                        help="pytest marker expression selecting the tests (default: processes)")
    parser.add_argument("--load", type=int, default=0,
                        help="CPU-bound processes run beside the tests for the whole gate (default 0)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("paths", nargs="*", help="test files or directories (default: pytest's testpaths)")
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra = args_in[args_in.index("--") + 1:] if "--" in args_in else []
    args = parser.parse_args(args_in[:args_in.index("--")] if "--" in args_in else args_in)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.load < 0:
        parser.error("--load must be 0 or more")
    print(f"{args.runs} runs of -m {args.marker!r} with {args.load} CPU-bound processes beside",
          file=sys.stderr, flush=True)
    with cpu_load(args.load):
        tally = run_all(args.runs, args.marker, args.keyword, args.paths, extra)
    if not tally.runs and not tally.broken_runs:
        print(f"no test matched -m {args.marker!r}" + (f" -k {args.keyword!r}" if args.keyword else ""))
        return 1
    print(f"load: {args.load} CPU-bound processes beside the tests")
    print(table(tally, args.runs))
    return 1 if tally.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
