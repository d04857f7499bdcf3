"""The report of one or more simulated scenarios: report.json, metrics.csv, plots and report.html.

``report.json`` holds only simulated quantities (never wall time), written
with sorted keys, so rerunning the same scenarios gives the same bytes.
Several scenarios in one report share every plot and a comparison table
(time and bytes to the target accuracy, relative to the first scenario).
"First reached" and "held from" are reported apart: a run can touch the
target and fall away again (CHOCO past its stable step did, ending at 25%),
and one that ends below its target is marked so in the table.
The table's rows and the warnings are :mod:`sim.comparison`'s, the plots :mod:`sim.plots`'s;
:mod:`sim.report_html` gathers the table, the plots and the scenarios as run into one
self-contained page.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peer.files.statefiles import json_safe
from protocols.federation.accountant import epsilon_json
from sim.comparison import comparison, final_point, run_warnings
from sim.report_html import render_html
from sim.world import ScenarioResult

TRACE_FIELDS = ("time_s", "bytes_sent", "mean_loss", "mean_accuracy", "min_accuracy",
                "consensus_rms", "running")


def scenario_summary(result: ScenarioResult) -> dict[str, Any]:
    """One scenario as plain data (what report.json lists)."""
    last = final_point(result)
    federation: dict[str, Any] = {}
    if result.rounds:  # sim/federation.py: per round (with DP, the epsilon spent so far: "inf" without noise)
        federation["rounds"] = [{**row, "epsilon": epsilon_json(row["epsilon"])} if "epsilon" in row else row
                                for row in result.rounds]
    if "epsilon" in result.metrics:
        federation["privacy"] = {"epsilon": epsilon_json(result.metrics["epsilon"])}
    return {
        **federation,
        "name": result.name,
        "source": result.source,
        "kind": result.kind,
        "seed": result.seed,
        "members": result.n_members,
        "model_params": result.n_params,
        "simulated_time_s": result.simulated_time_s,
        "events": result.events_run,
        "target_accuracy": result.target_accuracy,
        "time_to_target_s": result.time_to_target_s,
        "bytes_to_target": result.bytes_to_target,
        "held_target_from_s": result.held_target_from_s,
        "bytes_to_held_target": result.bytes_to_held_target,
        "ends_below_target": result.ends_below_target,
        "bytes_sent": result.bytes_sent,
        "notes": list(result.notes),
        "warnings": run_warnings(result),
        "final": {
            "mean_accuracy": last.mean_accuracy if last else None,
            "min_accuracy": last.min_accuracy if last else None,
            "mean_loss": last.mean_loss if last else None,
            "consensus_rms": last.consensus_rms if last else None,
        },
        "peers": result.peers,
        "rejections": result.rejections,
        "dropped": result.dropped,
        "metrics": result.metrics,
        "links": [{"src": s, "dst": d, "messages": m, "bytes": b} for s, d, m, b in result.links],
        "trace": {name: [getattr(p, name) for p in result.trace] for name in TRACE_FIELDS},
    }


def report_data(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    return {"scenarios": [scenario_summary(r) for r in results], "comparison": comparison(results)}


def write_report(results: Sequence[ScenarioResult], out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """Write report.json, metrics.csv, (optionally) the plots and report.html, which embeds them;
    return the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    report = out / "report.json"
    report.write_text(json.dumps(json_safe(report_data(results)), sort_keys=True, indent=1) + "\n")
    written.append(report)
    metrics = out / "metrics.csv"
    with metrics.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["scenario", *TRACE_FIELDS])
        for result in results:
            for point in result.trace:
                writer.writerow([result.name, *(getattr(point, name) for name in TRACE_FIELDS)])
    written.append(metrics)
    pictures = []
    if plots:
        from sim.plots import draw_plots

        pictures = draw_plots(results, out)
    written.extend(pictures)
    page = out / "report.html"
    page.write_text(render_html(results, pictures), encoding="utf-8")
    written.append(page)
    return written


def comparison_table(results: Sequence[ScenarioResult]) -> str:
    """The comparison as a text table for the terminal."""
    rows = comparison(results)
    width = max([len("scenario"), *(len(row["name"]) for row in rows)])
    lines = [f"{'scenario':<{width}} {'kind':<18} {'final acc':>11} {'first reached':>13} {'held from':>10} "
             f"{'bytes to target':>16} {'bytes sent':>14} {'sim time':>9} {'refused':>8}"]
    for row in rows:
        first = "-" if row["time_to_target_s"] is None else f"{row['time_to_target_s']:.1f} s"
        held = "-" if row["held_target_from_s"] is None else f"{row['held_target_from_s']:.1f} s"
        bytes_target = "-" if row["bytes_to_target"] is None else f"{row['bytes_to_target']:,}"
        accuracy = "-" if row["final_mean_accuracy"] is None else f"{row['final_mean_accuracy']:.3f}"
        if row["ends_below_target"]:
            accuracy += " <"   # ends below its target, whatever it reached on the way
        lines.append(f"{row['name']:<{width}} {row['kind'][:18]:<18} {accuracy:>11} {first:>13} {held:>10} "
                     f"{bytes_target:>16} {row['bytes_sent']:>14,} {row['simulated_time_s']:>8.1f}s "
                     f"{row['refused_updates']:>8,}")
    if any(row["ends_below_target"] for row in rows):
        lines.append("< ends below its target accuracy")
    for result in results:
        lines.extend(f"{result.name}: {note}" for note in result.notes)
        lines.extend(f"{result.name}: warning: {warning}" for warning in run_warnings(result))
    return "\n".join(lines)
