"""bench conditioning: the ill-conditioned generator, the study's rows, summary and files."""

from __future__ import annotations

import numpy as np
import pandas as pd
from typer.testing import CliRunner

import topkbench.bench.conditioning as bc
from topkbench.cli import app
from topkbench.data.synthetic import make_ill_conditioned


def test_generator_has_the_real_data_scales():
    X, y = make_ill_conditioned(400, 72, 6, seed=0)
    sq = np.einsum("ij,ij->i", X, X)
    assert 1e4 < sq.max() < 1e6
    col = np.abs(X).max(axis=0)
    assert col.max() / col.min() > 1e3  # magnitudes spread over decades
    assert set(np.unique(y)) == set(range(6))
    X2, Y = make_ill_conditioned(50, 8, 5, seed=1, multilabel=True)
    assert Y.shape == (50, 5) and 1.0 < Y.sum() / 50 < 3.0
    np.testing.assert_array_equal(make_ill_conditioned(50, 8, 5, seed=1, multilabel=True)[0], X2)


def test_cli_writes_rows_summary_and_plot(tmp_path, monkeypatch):
    monkeypatch.setitem(bc.PROBLEMS, "multiclass-400", (60, 6, 3, False))
    out = tmp_path / "cond.csv"
    res = CliRunner().invoke(app, [
        "bench", "conditioning", "--problem", "multiclass-400", "--method", "lr_multi",
        "--log2-C", "-2", "--log2-C", "6", "--time-limit", "5", "--out", str(out),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out)
    assert len(rows) == 4 and set(rows["mode"]) == {"plain", "accelerated"}
    acc = rows[rows["mode"] == "accelerated"]
    assert (acc["status"] == "converged").all() and (acc["relative_gap"] <= 1e-3).all()
    big = rows[rows["C"] == 64.0].set_index("mode")
    # at C = 2^6 the problem is ill-conditioned: the accelerated run hands over and wins
    # (plain SDCA needs more epochs, or runs out of its 5 s)
    assert big.loc["accelerated", "accelerated_from_epoch"] >= 0
    assert big.loc["accelerated", "phase"] == "newton"
    plain = big.loc["plain"]
    assert plain["status"] != "converged" or big.loc["accelerated", "epochs"] < plain["epochs"]
    assert (tmp_path / "cond_summary.csv").exists() and (tmp_path / "cond.png").stat().st_size
    assert "speed-up" in res.output


def test_cli_refuses_unknown_problem():
    res = CliRunner().invoke(app, ["bench", "conditioning", "--problem", "nope"])
    assert res.exit_code != 0 and "multiclass-400" in res.output
