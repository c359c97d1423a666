"""``topkbench bench bipartite`` (TPAMI Table 2) on a tiny size: both algorithms run on the same
data, agree, and the CSV carries the paper's figures beside ours."""

from __future__ import annotations

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from topkbench.bench.bipartite import PAPER_TABLE2, bench_bipartite
from topkbench.cli import app


def test_bench_bipartite_cli_writes_csv(tmp_path):
    out = tmp_path / "bipartite.csv"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "bipartite",
            "--dim",
            "1000",
            "--dim",
            "64",
            "--problems",
            "7",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert list(df["d"]) == [1000, 64]
    assert (df["problems"] == 7).all()
    assert (df["max_threshold_difference"] < 1e-12).all()
    assert (df["sorting_seconds"] > 0).all() and (df["variable_fixing_seconds"] > 0).all()
    # the paper's figures belong to its setting (rho = 10, 1,000 problems) only
    assert df["paper_improvement"].isna().all()
    rows = bench_bipartite(dims=(1000, 64), problems=1000, rho=10.0)
    assert rows[0].paper_variable_fixing_seconds == PAPER_TABLE2[1000][1]
    assert rows[0].paper_improvement == 3.07
    assert np.isnan(rows[1].paper_improvement)


def test_bench_bipartite_radius_inactive_regime_agrees():
    """With a huge radius the equal-sum branch (steps 2-5) runs on every problem."""
    rows = bench_bipartite(dims=(200,), problems=20, rho=1e6)
    assert rows[0].max_threshold_difference < 1e-9


def test_bench_bipartite_rejects_odd_dimension(tmp_path):
    res = CliRunner().invoke(
        app, ["bench", "bipartite", "--dim", "7", "--out", str(tmp_path / "x.csv")]
    )
    assert res.exit_code != 0
    assert "even" in res.output
