"""The comparison of simulated scenarios: one row per scenario, and the warnings of each run.

What every view of a report shares: report.json and the terminal table (sim/report.py) and
report.html (sim/report_html.py). Ratios are against the first scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.world import ScenarioResult, TracePoint


def final_point(result: ScenarioResult) -> TracePoint | None:
    return result.trace[-1] if result.trace else None


def comparison(results: Sequence[ScenarioResult]) -> list[dict[str, Any]]:
    """One row per scenario; ratios are against the first scenario."""
    rows = []
    first = results[0] if results else None
    for result in results:
        last = final_point(result)
        row: dict[str, Any] = {
            "name": result.name, "kind": result.kind,
            "time_to_target_s": result.time_to_target_s, "bytes_to_target": result.bytes_to_target,
            "held_target_from_s": result.held_target_from_s, "ends_below_target": result.ends_below_target,
            "final_mean_accuracy": last.mean_accuracy if last else None,
            "bytes_sent": result.bytes_sent, "simulated_time_s": result.simulated_time_s,
            "refused_updates": refused_updates(result),
        }
        if first is not None:
            row["time_to_target_vs_first"] = _ratio(result.time_to_target_s, first.time_to_target_s)
            row["bytes_to_target_vs_first"] = _ratio(result.bytes_to_target, first.bytes_to_target)
        rows.append(row)
    return rows


def refused_updates(result: ScenarioResult) -> int:
    """Updates the gossip machines refused (every reason: the insider filter, malformed parts,
    non-finite values), summed over the members. On an honest run anything but 0 means mixing
    was not W-mixing, so the table shows it beside the accuracy."""
    return int(result.metrics.get("rejected_update", 0.0))


def run_warnings(result: ScenarioResult) -> list[str]:
    """What an operator must not miss: the machines changed a setting, or dropped their own state."""
    warnings = []
    reduced = int(result.metrics.get("consensus_step_reduced", 0.0))
    if reduced:
        steps = [p["metrics"]["consensus_step"] for p in result.peers.values()
                 if "consensus_step" in p.get("metrics", {})]
        lowest = f"; smallest now {min(steps):.4g}" if steps else ""
        warnings.append(f"CHOCO's guard halved the consensus step {reduced} time(s): the public copies were "
                        f"running away{lowest}")
    nonfinite = int(result.metrics.get("nonfinite_params", 0.0))
    if nonfinite:
        warnings.append(f"{nonfinite} round(s) with non-finite parameters (not sent)")
    return warnings + trainer_warnings(result)


def trainer_warnings(result: ScenarioResult) -> list[str]:
    """The members' trainers' warnings (a learning rate at 0 before the end) as one line: how many
    members warned, and the first one's words (each trainer's are alike but for its step)."""
    said = [f"{name}: {text}" for name, peer in sorted(result.peers.items())
            for text in peer.get("warnings", [])]
    if not said:
        return []
    members = sum(1 for peer in result.peers.values() if "warnings" in peer)
    warned = sum(1 for peer in result.peers.values() if peer.get("warnings"))
    return [f"{warned} of {members} members' trainers warned; the first: {said[0]}"]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b
