"""``topkbench bench projections`` (TPAMI Fig. 3a) on tiny sizes: the batched kernel projects
each row exactly as the single-problem wrappers do, the CSV/PNG are written, the fitted
exponent is the log-log slope, and bad names are refused with the list of valid ones."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from topkbench.bench.projection_batch import project_rows
from topkbench.bench.projections import PROJECTION_METHODS, ProjectionBenchRow, scaling_exponent
from topkbench.cli import app
from topkbench.losses.topk_entropy import prox
from topkbench.prox import topk
from topkbench.prox.permutahedron import wtopk_biased_projection


def test_batched_rows_match_single_projections():
    data = np.random.default_rng(3).normal(size=(6, 15))
    for name, (code, k) in PROJECTION_METHODS.items():
        out = np.empty_like(data)
        total = project_rows(code, data, k, 1.0, out)
        assert total == pytest.approx(out.sum())
        for b, x in zip(data, out, strict=True):
            if code == 0:  # simplex {x >= 0, sum = 1}: sort-based reference threshold
                u = np.sort(b)[::-1]
                css = np.cumsum(u) - 1.0
                rho = np.nonzero(u - css / np.arange(1, 16) > 0)[0][-1]
                ref = np.maximum(b - css[rho] / (rho + 1), 0.0)
            elif code == 4:
                ref = prox(b, 1.0, k)
            elif code == 5:  # the weighted top-k set: its own reference in tests/prox
                rho = np.exp(-np.arange(1, k + 1) / k)
                rho = np.r_[rho / rho.sum(), np.zeros(16 - k)]
                ref = np.empty(15)
                scratch = (np.empty(16, np.int64), *(np.empty(16) for _ in range(4)),
                           np.empty(16, np.int64))  # fmt: skip
                wtopk_biased_projection(b.copy(), rho, 1.0, ref, *scratch)
            else:
                kind = {1: topk.SET_ALPHA, 2: topk.SET_BETA, 3: topk.SET_DK}[code]
                ref = topk.project(kind, b, k, 0.0, 1.0)
            np.testing.assert_allclose(x, ref, atol=1e-12, err_msg=name)


def test_scaling_exponent_is_the_log_log_slope():
    rows = [ProjectionBenchRow("a", d, 10, 2e-9 * d**1.5, 0.0) for d in (10**3, 10**4, 10**5)]
    rows.append(ProjectionBenchRow("a", 10, 10, 1.0, 0.0))  # outside 1e3..1e6: ignored
    assert scaling_exponent(rows)["a"] == pytest.approx(1.5)


def test_bench_projections_smoke(tmp_path):
    args = ["bench", "projections", "--dim", "8", "--dim", "64", "--problems", "30"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "projections.csv")
    assert (tmp_path / "projections.png").stat().st_size > 10_000
    assert set(df["method"]) == set(PROJECTION_METHODS)
    assert not ((df["method"] == "alpha k=10") & (df["d"] == 8)).any()  # k < d only
    assert (df["seconds"] > 0).all() and (df["problems"] == 30).all()
    res = CliRunner().invoke(app, [*args, "--method", "gamma", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "available: simplex" in res.output
