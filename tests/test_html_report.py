"""``topkbench report --html``: the Table 3, Table 5 and Table 7 smoke experiments' pages,
rendered in a real headless Chromium with the network blocked: no console errors, every plot
present and non-empty, the table's values equal to ``report.csv``, nothing fetched from
elsewhere, and a screenshot under ``results/`` (a CI artifact)."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from topkbench.cli import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("TOPKBENCH_REQUIRE_BROWSER"),
    reason="no Chromium here (Debian: apt-get install chromium; .ci/run installs it and sets "
    "TOPKBENCH_REQUIRE_BROWSER=1, which turns this skip into a failure)",
)
ARTIFACTS = Path(__file__).resolve().parents[1] / "results"
# no network: every request goes to a closed local port
OFFLINE = ["--headless=new", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
           "--proxy-bypass-list=<-loopback>", "--enable-logging=stderr", "--v=0"]  # fmt: skip


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None, "Chromium is required here (TOPKBENCH_REQUIRE_BROWSER)"
    return subprocess.run([CHROMIUM, *OFFLINE, *args, page.as_uri()], capture_output=True,
                          text=True, timeout=180, check=True)  # fmt: skip


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line]


class _Page(HTMLParser):
    """The report table's data-value cells, the plots (and whether each holds SVG paths),
    and every src/href."""

    def __init__(self):
        super().__init__()
        self.rows, self.plots, self.links = [], [], []
        self._in_table = self._in_plot = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") == "report-table":
            self._in_table = True
        elif tag == "tr" and self._in_table:
            self.rows.append([])
        elif tag == "td" and self._in_table:
            self.rows[-1].append(a.get("data-value"))
        elif tag == "figure" and "plot" in (a.get("class") or ""):
            self.plots.append({"id": a.get("id"), "paths": 0})
            self._in_plot = True
        elif tag in ("path", "use") and self._in_plot:
            self.plots[-1]["paths"] += 1
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("#"):
                self.links.append(a[key])

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag == "figure":
            self._in_plot = False


def test_console_errors_are_seen(tmp_path):
    """The check below can fail: a page that logs an error is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('broken plot')</script></body></html>")
    assert any("broken plot" in m for m in console_messages(chromium(page, "--dump-dom").stderr))


@pytest.mark.parametrize(
    "overrides, stem, plots",
    [
        (["experiment=table3", "experiment.draws=1", "experiment.C_grid.min_exp=-2",
          "experiment.C_grid.max_exp=2", "dataset.n_test=2000"], "table3",
         ("-val-vs-C", "-topk-vs-k", "-ours-vs-paper")),
        (["experiment=table5_smoke"], "table5_smoke", ("-val-vs-C", "-topk-vs-k")),
        (["experiment=table7_smoke"], "table7_smoke", ("-val-vs-C", "-metrics-vs-delta")),
    ],
)  # fmt: skip
def test_html_report_renders_offline(tmp_path, overrides, stem, plots):
    results = tmp_path / "results"
    args = [*overrides, f"results_dir={results}"]
    assert CliRunner().invoke(app, ["sweep", *args]).exit_code == 0
    res = CliRunner().invoke(app, ["report", *args, "--html", "--figures", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    name = overrides[0].split("=")[1]
    page = results / name / "report.html"
    run = chromium(page, "--dump-dom", "--virtual-time-budget=3000")
    assert console_messages(run.stderr) == []
    dom = _Page()
    dom.feed(run.stdout)
    # every plot is there and drawn: the layout's per-dataset plots, and solver health
    ids = [p["id"] for p in dom.plots]
    assert "solver-health" in ids
    assert all(any(i.endswith(suffix) for i in ids) for suffix in plots), ids
    assert all(p["paths"] > 10 for p in dom.plots), dom.plots
    assert len(list((tmp_path / "f").glob("*.png"))) == len(ids)
    # nothing to fetch: only in-page references
    assert dom.links == []
    # the table is report.csv, value for value
    csv = pd.read_csv(results / name / "report.csv")
    body = [r for r in dom.rows if r]
    assert len(body) == len(csv)
    for cells, (_, want) in zip(body, csv.iterrows(), strict=True):
        for got, value in zip(cells, want, strict=True):
            if isinstance(value, (bool, np.bool_)):
                assert got == str(value)
            elif isinstance(value, float) and np.isnan(value):
                assert got in ("nan", "")  # CSV writes an empty string and NaN alike
            elif isinstance(value, (float, np.floating, int, np.integer)):
                assert float(got) == float(value)
            else:
                assert got == str(value)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"html_report_{stem}.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1300,2600")
    assert shot.stat().st_size > 50_000
