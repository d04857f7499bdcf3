"""``report.html``: one self-contained page for a simulation report.

The comparison table, every plot (the PNG files themselves, inline as ``data:`` URLs), each
scenario as run (overrides applied, as JSON) and its seed. Nothing is fetched: no external URL,
no script, so the page opens the same from a mail attachment, a CI artifact or a machine with
no network.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peer.files.statefiles import json_safe
from peer.files.units import human_bytes
from sim.comparison import comparison, run_warnings
from sim.world import ScenarioResult

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child, td.text { text-align: left; }
figure { display: inline-block; margin: 0 0 1em 0; width: 49.5%; vertical-align: top; }
figure.wide { width: 100%; }
img { width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.8em; color: #666; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.warning { color: #a00; }
"""

# (heading, key of a comparison row, or 'seed' / 'members' from the result)
COLUMNS: tuple[tuple[str, str], ...] = (
    ("scenario", "name"), ("kind", "kind"), ("seed", "seed"), ("members", "members"),
    ("final accuracy", "final_mean_accuracy"), ("first reached target", "time_to_target_s"),
    ("held target from", "held_target_from_s"), ("bytes to target", "bytes_to_target"),
    ("time to target vs first", "time_to_target_vs_first"),
    ("bytes to target vs first", "bytes_to_target_vs_first"),
    ("bytes sent", "bytes_sent"), ("simulated time", "simulated_time_s"),
    ("refused updates", "refused_updates"),
)


def render_html(results: Sequence[ScenarioResult], plots: Sequence[Path]) -> str:
    """The page for ``results``, with each file of ``plots`` (PNG) embedded in the given order."""
    names = ", ".join(result.name for result in results)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>hivemesh sim report: {_text(names)}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>hivemesh sim report</h1>",
        f"<p>Scenarios: {_text(names)}.</p>",
        "<p>Simulated quantities only (never wall time): the same scenarios and seeds give the same "
        "page. Ratios are against the first scenario.</p>",
        _table(results),
        _notes(results),
        "<h2>Plots</h2>",
    ]
    parts.extend(_figure(path) for path in plots)
    if not plots:
        parts.append("<p>No plots (written with --no-plots).</p>")
    parts.append("<h2>Scenarios as run</h2>")
    for result in results:
        scenario = json.dumps(json_safe(result.scenario), indent=2, sort_keys=True)
        parts.append(f"<h3>{_text(result.name)}</h3>"
                     f'<p>seed <span class="seed">{result.seed}</span>, from {_text(result.source)}</p>'
                     f"<pre>{_text(scenario)}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table(results: Sequence[ScenarioResult]) -> str:
    rows = comparison(results)
    head = "".join(f"<th>{_text(heading)}</th>" for heading, _ in COLUMNS)
    body = []
    for row, result in zip(rows, results, strict=True):
        values = {**row, "seed": result.seed, "members": result.n_members}
        cells = []
        for _, key in COLUMNS:
            text = _cell(key, values[key])
            if key == "final_mean_accuracy" and row["ends_below_target"] and values[key] is not None:
                text += " &lt;"   # ends below its target, whatever it reached on the way
            cells.append(f'<td class="text">{text}</td>' if key in ("name", "kind") else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    footnote = ('<p>&lt; ends below its target accuracy.</p>'
                if any(row["ends_below_target"] for row in rows) else "")
    return (f'<h2>Comparison</h2><table id="comparison"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{footnote}")


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("bytes_to_target", "bytes_sent"):
        return f'<span title="{value:,} bytes">{human_bytes(value)}</span>'  # exact in report.json
    if key.endswith("_vs_first"):
        return f"{value:.3g}x"
    if key.endswith("_s"):
        return f"{value:.1f} s"
    if key == "final_mean_accuracy":
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}" if key != "seed" else str(value)
    return _text(str(value))


def _notes(results: Sequence[ScenarioResult]) -> str:
    items = [f"<li>{_text(result.name)}: {_text(note)}</li>" for result in results for note in result.notes]
    items += [f'<li class="warning">{_text(result.name)}: warning: {_text(warning)}</li>'
              for result in results for warning in run_warnings(result)]
    return f"<h2>Notes</h2><ul>{''.join(items)}</ul>" if items else ""


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    wide = ' class="wide"' if path.name.startswith("topology_") else ""  # two panels and a row of rounds
    return (f'<figure{wide}><img src="data:image/png;base64,{data}" alt="{_text(path.name)}">'
            f"<figcaption>{_text(path.name)}</figcaption></figure>")


def _text(value: str) -> str:
    return html.escape(value, quote=True)
