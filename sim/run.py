"""Run one scenario: build its world, drive gossip or a baseline, and say the seed if it fails."""

from __future__ import annotations

import sys

from protocols.errors import HivemeshError
from sim.scenario import ScenarioConfig
from sim.world import Progress, ScenarioResult, build_world


def check_scenario(scenario: ScenarioConfig) -> None:
    """Validate the tables checked against other components' classes, before anything runs
    (a ``compare_with`` variant is made after loading: its tables are checked here)."""
    scenario.check_tables()


def run_scenario(scenario: ScenarioConfig, progress: Progress | None = None) -> ScenarioResult:
    """Simulate ``scenario`` from scratch; the same scenario gives the same result, bit for bit."""
    try:
        if scenario.federation.gateways > 0:
            from sim.federation import run_federation

            return run_federation(scenario, progress)
        world = build_world(scenario)
        if scenario.baseline.kind != "none":
            from sim.baselines import run_baseline

            return run_baseline(world, progress)
        from sim.gossip_driver import run_gossip

        return run_gossip(world, progress)
    except HivemeshError:
        raise  # the user's to fix: the CLI prints it as one line
    except Exception as error:
        # Any other failure is replayable: the scenario and its seed are the whole input.
        note = f"simulation of {scenario.source} failed with seed {scenario.seed} (rerun it to replay)"
        error.add_note(note)
        print(f"hivemesh sim: {note}", file=sys.stderr)
        raise
