"""Kato & Hirohashi's Table 1 rows beside Table 5 (papers/004 §7.4): rows whose k and gamma are
hyper-parameters selected per top-k column together with C, refit at the selected variant, and
the report (`experiment=table5_kato_smoke`)."""

from __future__ import annotations

import numpy as np
import pytest

from topkbench.cli import compose
from topkbench.config import ExperimentConfig
from topkbench.errors import ConfigError
from topkbench.experiments.plan import selection_folds
from topkbench.experiments.render import load_published
from topkbench.experiments.report import build_report
from topkbench.experiments.selection import mean_validation
from topkbench.experiments.store import RecordStore
from topkbench.experiments.sweep import run_sweep


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    exp = ExperimentConfig.from_dict(
        compose(["experiment=table5_kato_smoke", f"results_dir={tmp_path_factory.mktemp('k')}"])
    )
    return exp, run_sweep(exp)


def test_k_and_gamma_are_selected_per_column(smoke):
    exp, summaries = smoke
    assert sum(s.failed for s in summaries) == 0
    recs = RecordStore(exp.results_dir, exp.name).load()
    rep = build_report(exp)
    sel = rep.selected
    folds = selection_folds(exp, 0)
    for r in exp.rows:
        rows_sel = sel[sel["row"] == r.row]
        assert len(rows_sel) == len(exp.ks)
        assert set(rows_sel["k_trained"]) <= set(r.k_values)
        assert set(rows_sel["gamma"]) <= set(r.gamma_values or (r.gamma,))
        grp = recs[recs["row"] == r.row]
        curve = mean_validation(grp, folds, exp.ks)
        for _, s in rows_sel.iterrows():
            # brute force: best mean validation accuracy over every (C, k, gamma) point
            col = f"val_top{s['k']}"
            best = curve[col].max()
            assert s["val"] == pytest.approx(100 * best)
            refit = grp[
                (grp["fold"] == "refit")
                & np.isclose(grp["C"], s["C"])
                & (grp["k"] == s["k_trained"])
                & (grp["gamma"] == s["gamma"])
            ]
            assert len(refit) == 1
            assert s["test"] == pytest.approx(100 * refit[f"test_top{s['k']}"].iloc[0])
    md = rep.markdown
    assert "Frank-Wolfe" not in md  # the rows run SDCA (fw: on a row would select it)
    assert "selected per column with C" in md


def test_published_kato_numbers_and_the_full_experiment_config():
    pub = load_published("kato_table1.csv")
    assert len(pub) == 120
    hit = pub[(pub["row"] == "UTk (ours)") & (pub["dataset"] == "aloi") & (pub["k"] == 1)]
    assert float(hit["value"].iloc[0]) == pytest.approx(84.1)
    exp = ExperimentConfig.from_dict(compose(["experiment=table5_kato"]))
    assert {r.row for r in exp.rows} >= {"UTk (ours)", "WTk (linear)", "WTk (exp)"}
    ut = next(r for r in exp.rows if r.row == "UTk (ours)")
    assert ut.k_values == (1, 3, 5, 10) and ut.gamma_values == (0.0, 0.001, 0.01, 0.1)
    assert len(ut.variants()) == 16


def test_grid_rows_are_validated():
    base = ["experiment=table5_kato_smoke"]
    with pytest.raises(ConfigError, match="takes no gamma"):
        ExperimentConfig.from_dict(
            compose([*base, "experiment.rows=[{row: x, method: lr_multi, gamma: [0, 1]}]"])
        )
    with pytest.raises(ConfigError, match="takes no k"):
        ExperimentConfig.from_dict(
            compose([*base, "experiment.rows=[{row: x, method: svm_ml, k: [1, 2]}]"])
        )
