"""bench protocol: a whole sweep timed into a fresh results directory, per row and overall."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from topkbench.cli import app


def test_cli_times_the_linear_rows_of_a_protocol(tmp_path):
    res = CliRunner().invoke(app, [
        "bench", "protocol", "experiment=table7_smoke", "experiment.C_grid.step=4",
        "--linear", "--n-jobs", "1", "--out", str(tmp_path),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(tmp_path / "protocol_table7_smoke.csv")
    assert list(rows["row"]) == ["LR^ML", "SVM^ML", "SVM^ML_gamma"]  # no RBF row
    summary = json.loads((tmp_path / "protocol_table7_smoke.json").read_text())
    assert summary["fits"] == rows["fits"].sum() > 0
    assert summary["wall_seconds"] > 0.0 and summary["cpu_seconds"] > 0.0
    # every metric selects its own C: 7 metrics x 3 rows, all certified
    assert summary["certified"] == summary["selected"] == 21
    assert (rows["plain_epochs"] + rows["newton_iterations"] + rows["accelerated_epochs"] > 0).all()
    report = (tmp_path / "protocol_table7_smoke.md").read_text()
    assert "SVM^ML_gamma" in report and "(RBF)" not in report
    assert "selected models certified: 21 of 21" in res.output
    # the timed sweep shows its progress (a long protocol is not silent until its table)
    assert (
        "table7_smoke (timed) [" in res.output
        and f"{summary['fits']}/{summary['fits']}" in res.output
    )


def test_cli_refuses_an_unknown_row(tmp_path):
    res = CliRunner().invoke(app, [
        "bench", "protocol", "experiment=table7_smoke", "--row", "nope", "--out", str(tmp_path),
    ])  # fmt: skip
    assert res.exit_code != 0
    assert "unknown row(s) nope" in res.output and "LR^ML" in res.output


def test_cli_refuses_overrides_its_options_set(tmp_path, monkeypatch):
    """n_jobs= among the overrides (silently replaced by --n-jobs' default) and results_dir=
    (silently ignored: the sweep goes under --out) are refused, naming the option, before
    anything runs."""
    import topkbench.bench.protocol

    def never(*args, **kwargs):
        raise AssertionError("the protocol ran")

    monkeypatch.setattr(topkbench.bench.protocol, "bench_protocol", never)
    for override, expected in [
        ("n_jobs=1", "its --n-jobs option, not an n_jobs= override"),
        ("results_dir=elsewhere", "under its --out option, not a results_dir= override"),
    ]:
        res = CliRunner().invoke(app, [
            "bench", "protocol", "experiment=table7_smoke", override, "--out", str(tmp_path),
        ])  # fmt: skip
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert expected in " ".join(res.output.split())
    assert not any(tmp_path.iterdir())
