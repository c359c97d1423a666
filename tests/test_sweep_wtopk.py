"""Weighted top-k SVM rows in a sweep (Kato & Hirohashi, papers/004; issue: optional Table 5 block):
rows carry their rank weights and Frank-Wolfe variant into the fits and into the record keys."""

from __future__ import annotations

import dataclasses

import numpy as np

from topkbench.cli import compose
from topkbench.config import ExperimentConfig, SweepRow
from topkbench.experiments.plan import record_spec
from topkbench.experiments.report import build_report
from topkbench.experiments.store import RecordStore
from topkbench.experiments.sweep import run_sweep


def test_wtopk_rows_in_a_table5_style_sweep(tmp_path):
    exp = ExperimentConfig.from_dict(
        compose(["experiment=table5_smoke", f"results_dir={tmp_path}"])
    )
    rows = (
        SweepRow.from_dict({"row": "UT3 (FW)", "method": "wtopk_svm", "k": 3}),
        SweepRow.from_dict(
            {"row": "WT3 (linear)", "method": "wtopk_svm", "k": 3, "weights": "linear"}
        ),
        SweepRow.from_dict(
            {
                "row": "WT3 (user)",
                "method": "wtopk_svm",
                "k": 3,
                "weights": [0.5, 0.3, 0.2],
                "fw": "pairwise",
            }
        ),  # fmt: skip
        SweepRow.from_dict({"row": "top-3 SVM", "method": "topk_svm_alpha", "k": 3}),
    )
    exp = dataclasses.replace(
        exp, rows=rows, datasets=exp.datasets[:1], C_values=exp.C_values[:2], extend=0
    )
    summaries = run_sweep(exp)
    assert sum(s.failed for s in summaries) == 0
    recs = RecordStore(exp.results_dir, exp.name).load()
    assert set(recs["row"]) == {r.row for r in rows}
    w = recs.set_index(["row", "C"])["weights"]
    assert set(w.loc["WT3 (linear)"]) == {"linear"}
    assert set(w.loc["WT3 (user)"]) == {"0.5,0.29999999999999999,0.20000000000000001"}
    assert w.loc["top-3 SVM"].isna().all()  # other methods keep their old record keys
    assert "weights" not in record_spec(exp, exp.datasets[0], rows[3], 0, "val", 1.0)
    # flat weights and the printed-alpha SDCA optimize the same loss: same primal within eps
    for C in exp.C_values:
        fw = recs[(recs["row"] == "UT3 (FW)") & np.isclose(recs["C"], C)]["primal"].iloc[0]
        sd = recs[(recs["row"] == "top-3 SVM") & np.isclose(recs["C"], C)]["primal"].iloc[0]
        assert abs(fw - sd) <= 2 * exp.eps * max(abs(fw), abs(sd))
    md = build_report(exp).markdown
    assert "| WT3 (linear) |" in md and "| UT3 (FW) |" in md
