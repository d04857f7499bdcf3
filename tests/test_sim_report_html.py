"""The simulation report a person looks at: report.html and its plots.

Results are made by hand (no simulation): two scenarios on a time-varying graph, one ending at
an exact average (consensus distance 0), as a gossip run and its all-reduce baseline would.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from sim.plots import figures, legend_labels
from sim.report import write_report
from sim.world import ScenarioResult, TracePoint
from topology import build
from topology.plot import MATRIX_LABEL_PT, figure_of


def trace(consensus: list[float], accuracy: list[float]) -> list[TracePoint]:
    return [TracePoint(time_s=0.5 * k, bytes_sent=1000 * k ** 2, mean_loss=1.0 - a, mean_accuracy=a,
                       min_accuracy=a - 0.05, consensus_rms=c, running=8)
            for k, (c, a) in enumerate(zip(consensus, accuracy, strict=True))]


def results() -> list[ScenarioResult]:
    topology = build("one-peer-exponential:8", seed=3)
    names = topology.names
    peers = {name: {"behaviour": "sign-flip" if name == "p05" else "honest", "bytes_sent": 2000}
             for name in names}
    ring_links = [(a, b, 10, 4000 * (k + 1))
                  for k, (a, b) in enumerate(zip(names, names[1:] + names[:1], strict=True))]
    gossip = ScenarioResult(
        name="tv", source="scenario-tv.toml", kind="gossip:dpsgd", seed=31337, n_members=8, n_params=51,
        target_accuracy=0.7, simulated_time_s=2.0, trace=trace([0.3, 0.05, 4e-3, 2e-4, 3e-5],
                                                               [0.2, 0.5, 0.72, 0.8, 0.85]),
        peers=peers, links=ring_links, notes=["consensus step 0.5 chosen for ring"],
        scenario={"name": "tv", "seed": 31337, "graph": {"spec": "one-peer-exponential:8"},
                  "algorithm": {"algorithm": "dpsgd", "total_steps": 40}},
        topology=topology)
    allreduce = ScenarioResult(
        name="tv/allreduce", source="scenario-tv.toml", kind="allreduce", seed=31337, n_members=8,
        n_params=51, target_accuracy=0.7, simulated_time_s=2.0,
        trace=trace([0.0, 0.0, 0.0, 0.0, 0.0], [0.2, 0.6, 0.75, 0.6, 0.65]),
        peers={name: {"behaviour": "honest", "bytes_sent": 2000} for name in names},
        links=[("p00", "*", 40, 90000)],
        scenario={"name": "tv/allreduce", "seed": 31337, "baseline": {"kind": "allreduce"}},
        topology=topology)
    return [gossip, allreduce]


class Page(HTMLParser):
    """What the checks need from report.html: every URL-valued attribute, images, the table, <pre>s."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.rows: list[list[str]] = []
        self.pres: list[str] = []
        self.in_table = False
        self.cell: list[str] | None = None
        self.pre: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        for name in ("src", "href", "action", "poster", "data"):
            if values.get(name) is not None:
                self.urls.append(str(values[name]))
        if tag == "img":
            self.images.append(str(values.get("src")))
        if tag == "table" and values.get("id") == "comparison":
            self.in_table = True
        if self.in_table and tag == "tr":
            self.rows.append([])
        if self.in_table and tag in ("td", "th"):
            self.cell = []
        if tag == "pre":
            self.pre = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None
        if tag == "table":
            self.in_table = False
        if tag == "pre" and self.pre is not None:
            self.pres.append("".join(self.pre))
            self.pre = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)
        if self.pre is not None:
            self.pre.append(data)


def test_report_html_is_self_contained_and_embeds_every_plot_the_table_and_the_scenarios(
        tmp_path: Path) -> None:
    written = write_report(results(), tmp_path)
    assert tmp_path / "report.html" in written
    page = Page()
    page.feed((tmp_path / "report.html").read_text(encoding="utf-8"))
    page.close()
    # Nothing to fetch: every URL is inline data, and there is nothing to run.
    assert page.urls and all(url.startswith("data:image/png;base64,") for url in page.urls), page.urls
    assert not page.tags & {"script", "link", "iframe", "object", "embed"}
    # Every plot file in the folder is on the page, byte for byte (the topology plot included).
    on_page = sorted(base64.b64decode(url.split(",", 1)[1]) for url in page.images)
    plots = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in plots} >= {"accuracy_vs_time.png", "consensus_vs_time.png",
                                       "traffic_00_tv.png", "topology_00_tv.png"}
    assert on_page == sorted(p.read_bytes() for p in plots)
    # The table: a header and one row per scenario, with its seed.
    header, *rows = page.rows
    assert header[:3] == ["scenario", "kind", "seed"]
    assert [row[:3] for row in rows] == [["tv", "gossip:dpsgd", "31337"],
                                         ["tv/allreduce", "allreduce", "31337"]]
    # Each scenario as run, as JSON that reads back to what ran.
    assert [json.loads(text) for text in page.pres] == [r.scenario for r in results()]


def test_report_html_without_plots_still_has_the_table_and_the_seed(tmp_path: Path) -> None:
    written = write_report(results(), tmp_path, plots=False)
    assert [p.name for p in written] == ["report.json", "metrics.csv", "report.html"]
    page = Page()
    page.feed((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert page.urls == [] and len(page.rows) == 3 and "31337" in page.rows[1]


def test_the_screenshot_script_says_what_to_install_when_there_is_no_chromium(tmp_path: Path) -> None:
    write_report(results(), tmp_path, plots=False)
    script = Path(__file__).resolve().parent.parent / "examples" / "render_report.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "--browser", "no-such-chromium-here"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no no-such-chromium-here on PATH" in done.stderr and "apt-get install chromium" in done.stderr
    assert not (tmp_path / "report.png").exists()


@pytest.fixture(scope="module")
def drawn() -> Iterator[dict[str, Any]]:
    import matplotlib.pyplot as plt

    figs = figures(results())
    yield figs
    for figure in figs.values():
        plt.close(figure)


def test_every_panel_has_a_title_and_one_legend_entry_per_line(drawn: dict[str, Any]) -> None:
    for name, figure in drawn.items():
        axes = figure.axes[0]
        assert axes.get_title(), name
        legend = axes.get_legend() or figure.legends[0]  # traffic plots' legend sits beside the axes
        labels = [text.get_text() for text in legend.get_texts()]
        assert len(labels) == len(set(labels)), (name, labels)
    # The kind is said once: 'tv/allreduce', not 'tv/allreduce (allreduce)'.
    assert legend_labels(results()) == ["tv (gossip:dpsgd)", "tv/allreduce"]


def test_the_target_line_is_labelled_on_the_accuracy_plots(drawn: dict[str, Any]) -> None:
    for name in ("accuracy_vs_time.png", "accuracy_vs_bytes.png"):
        legend = drawn[name].axes[0].get_legend()
        assert "target accuracy 0.7" in [text.get_text() for text in legend.get_texts()]


def test_the_consensus_axis_labels_several_decades(drawn: dict[str, Any]) -> None:
    figure = drawn["consensus_vs_time.png"]
    figure.canvas.draw()
    axes = figure.axes[0]
    low, high = axes.get_ylim()
    labelled = [tick for tick in axes.yaxis.get_major_ticks()
                if tick.label1.get_visible() and tick.label1.get_text() and low <= tick.get_loc() <= high]
    assert len(labelled) >= 3, [t.label1.get_text() for t in labelled]
    # The exact average (0) is drawn on the floor, not dropped off a log axis.
    assert min(min(line.get_ydata()) for line in axes.get_lines()) == pytest.approx(low)


def test_traffic_plots_have_a_byte_scale_for_edge_width(drawn: dict[str, Any]) -> None:
    legend = drawn["traffic_00_tv.png"].legends[0]
    entries = {text.get_text(): line.get_linewidth()
               for text, line in zip(legend.get_texts(), legend.get_lines(), strict=True)}
    # The heaviest link is 32,000 bytes (the ring's 8th): the widest line says so.
    assert entries["32.0 kB on a link"] == max(entries.values())
    assert "16.0 kB on a link" in entries and {"honest", "attacker"} <= set(entries)


def test_the_topology_matrix_is_legible_and_a_time_varying_graph_shows_each_round() -> None:
    import matplotlib.pyplot as plt

    big = figure_of(build("ring:64"))
    matrix = big.axes[1]
    labels = [label for label in matrix.get_xticklabels() + matrix.get_yticklabels() if label.get_text()]
    assert labels and min(label.get_fontsize() for label in labels) >= MATRIX_LABEL_PT >= 8
    assert len(matrix.get_xticklabels()) <= 24
    plt.close(big)
    varying = figure_of(build("one-peer-exponential:8"))
    titles = [axes.get_title() for axes in varying.axes]
    assert [t for t in titles if t.startswith("round ")] == ["round 0", "round 1", "round 2"]
    plt.close(varying)
