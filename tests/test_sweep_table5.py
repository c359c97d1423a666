"""Table 5 protocol: multi-dataset sweeps with val or K-fold CV selection, grid extension at the
boundary, refits, resume after interruption, joblib vs Dask, missing data, and the golden report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from interrupt import interrupt_fits
from typer.testing import CliRunner

from topkbench.cli import app, compose
from topkbench.config import ExperimentConfig
from topkbench.experiments.report import build_report
from topkbench.experiments.selection import best_C, mean_validation
from topkbench.experiments.store import RecordStore
from topkbench.experiments.sweep import run_sweep

runner = CliRunner()
GOLDEN_MD = Path(__file__).parent / "golden" / "table5_smoke.md"
GOLDEN_TEX = Path(__file__).parent / "golden" / "table5_smoke.tex"

CV_FOLDS = ("cv0of3", "cv1of3", "cv2of3")
KS = (1, 3, 5, 10)
SUBSET = ("SVM^Multi", "LR^Multi", "top-3 SVM", "top-3 Ent")
ACC_COLS = [f"{split}_top{k}" for split in ("val", "test") for k in range(1, 11)]
METRIC_COLS = [
    "primal",
    "dual",
    "relative_gap",
    "epochs",
    "status",
    "warm_started",
    "n_train",
    *ACC_COLS,
]
TOL = 1e-9  # distinct mean accuracies differ by >= 1/450 here; ties are equal up to rounding


def smoke_experiment(results: Path, *overrides: str) -> ExperimentConfig:
    return ExperimentConfig.from_dict(
        compose(["experiment=table5_smoke", f"results_dir={results}", *overrides])
    )


def with_rows(exp: ExperimentConfig, names) -> ExperimentConfig:
    rows = tuple(r for r in exp.rows if r.row in names)
    assert len(rows) == len(names)
    return dataclasses.replace(exp, rows=rows)


def records(exp: ExperimentConfig) -> pd.DataFrame:
    df = RecordStore(exp.results_dir, exp.name).load()
    return df.sort_values(["dataset", "row", "fold", "C"]).reset_index(drop=True)


def select_C(recs: pd.DataFrame, folds, ks=KS) -> dict[int, float]:
    """Independent re-implementation of the selection: per C with a record in every fold, the
    mean over ``folds`` of the held-out top-k accuracy; argmax with ties to the smallest C."""
    cols = [f"val_top{k}" for k in ks]
    sel = recs[recs["fold"].isin(folds)]
    piv = sel.pivot_table(index="C", columns="fold", values=cols, aggfunc="first")
    out = {}
    for k, col in zip(ks, cols, strict=True):
        mean = piv[col].reindex(columns=list(folds)).dropna().mean(axis=1)
        out[k] = float(mean.index[mean >= mean.max() - TOL].min())
    return out


def assert_extension_complete(exp: ExperimentConfig, recs: pd.DataFrame) -> None:
    """After the sweep, a column's best C lies on the final boundary only where that side was
    extended the full ``extend`` steps (the extension ran while it could)."""
    step = exp.C_base**exp.C_step
    lo_max = min(exp.C_values) / step**exp.extend
    hi_max = max(exp.C_values) * step**exp.extend
    for ds in exp.datasets:
        folds = ("val",) if ds.name == "synth_val" else CV_FOLDS
        for row in exp.rows:
            r = recs[(recs["dataset"] == ds.name) & (recs["row"] == row.row)]
            r = r[r["fold"].isin(folds)]
            lo, hi = r["C"].min(), r["C"].max()
            assert lo >= lo_max * (1 - TOL) and hi <= hi_max * (1 + TOL), (ds.name, row.row)
            for k, b in select_C(r, folds, exp.ks).items():
                if b == hi:
                    assert math.isclose(hi, hi_max, rel_tol=TOL), (ds.name, row.row, k, hi)
                if b == lo:
                    assert math.isclose(lo, lo_max, rel_tol=TOL), (ds.name, row.row, k, lo)


# ---------------------------------------------------------------------------------------------
# shared runs (module scope: each is reused by several tests)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The full table5_smoke sweep through the CLI (joblib, n_jobs=2)."""
    results = tmp_path_factory.mktemp("smoke")
    args = ["experiment=table5_smoke", f"results_dir={results}"]
    res = runner.invoke(app, ["sweep", *args, "n_jobs=2"])
    assert res.exit_code == 0, res.output
    return smoke_experiment(results), args


@pytest.fixture(scope="module")
def joblib_subset(tmp_path_factory):
    """Four rows of table5_smoke, joblib with n_jobs=2: the reference of the resume and Dask
    tests."""
    exp = smoke_experiment(tmp_path_factory.mktemp("joblib"), "n_jobs=2")
    exp = with_rows(exp, SUBSET)
    summaries = run_sweep(exp)
    recs = records(exp)
    assert sum(s.done for s in summaries) == len(recs)
    assert sum(s.cached for s in summaries) == 0
    return exp, recs


# ---------------------------------------------------------------------------------------------
# 1. golden report


def test_cli_sweep_and_report_match_golden(smoke_run):
    exp, args = smoke_run
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 0, res.output
    rep = build_report(exp)
    md, tex = rep.markdown, rep.latex
    out = Path(exp.results_dir) / exp.name
    assert (out / "report.md").read_text() == md
    assert (out / "report.tex").read_text() == tex

    # shape: one block per dataset, the 17 rows and the 3 rows of the L-BFGS block after them,
    # four top-k columns (ours, paper, Δ each)
    assert md.count("\n## ") == 2
    assert "## Gaussian classes, val selection" in md and "## Gaussian classes, 3-fold CV" in md
    header = "| Method | " + " | ".join(f"Top-{k} | paper | Δ" for k in KS) + " |"
    assert md.count(header + "\n") == 2
    table_lines = [ln for ln in md.splitlines() if ln.startswith("| ") and ln != header]
    assert len(table_lines) == 2 * 20
    assert all(ln.count(" | ") == 12 for ln in table_lines)
    assert [ln.split(" | ")[0][2:] for ln in table_lines] == [r.row for r in exp.rows] * 2
    assert not any("not run" in ln for ln in table_lines)
    assert "synth_cv: 3-fold stratified CV on train, then a refit on all of train" in md
    # LaTeX: two tabulars with 13 columns, balanced environments, escaped labels
    assert tex.count(r"\begin{tabular}{l" + "rrr" * 4 + "}") == 2
    for env in ("table", "tabular"):
        assert tex.count(rf"\begin{{{env}}}") == tex.count(rf"\end{{{env}}}") == 2
    body = [ln for ln in tex.splitlines() if ln.endswith(r" \\")]
    assert len(body) == 2 * (20 + 2)
    assert all(ln.count(" & ") == 12 for ln in body if "multicolumn" not in ln)
    assert r"SVM$^{\mathrm{Multi}}$" in tex and r"top-1 SVM$_{\mathrm{1}}$" in tex
    assert "$\\Delta$" in tex and "—" not in tex and "±" not in tex
    # outside math, _ and ^ are escaped
    text = re.sub(r"\$[^$]*\$", "", tex)
    assert not re.search(r"(?<!\\)[_^]", text)

    csv = pd.read_csv(out / "report.csv")
    assert {"dataset", "row", "k", "ours_mean", "paper", "diff"} <= set(csv.columns)
    assert set(csv["dataset"]) == {"synth_val", "synth_cv"}
    assert len(csv) == 2 * 20 * len(KS)
    assert csv["ours_mean"].notna().all()
    assert csv["paper"].isna().all() and csv["diff"].isna().all()  # no published numbers

    if os.environ.get("TOPKBENCH_UPDATE_GOLDEN"):
        GOLDEN_MD.write_text(md)
        GOLDEN_TEX.write_text(tex)
    assert md == GOLDEN_MD.read_text(), "set TOPKBENCH_UPDATE_GOLDEN=1 to accept a new table"
    assert tex == GOLDEN_TEX.read_text(), "set TOPKBENCH_UPDATE_GOLDEN=1 to accept a new table"


# ---------------------------------------------------------------------------------------------
# 2. protocol: val selection, CV selection with a refit on all of train


def test_protocol_val_and_cv_with_refit(smoke_run):
    exp, _ = smoke_run
    recs = records(exp)
    assert recs["key"].is_unique
    by_ds = {d: recs[recs["dataset"] == d] for d in ("synth_val", "synth_cv")}
    assert set(by_ds["synth_val"]["fold"]) == {"val"}
    assert set(by_ds["synth_cv"]["fold"]) == {*CV_FOLDS, "refit"}
    # the fold says which data a record trained on: train, 2 of 3 folds of train, all of train
    n_train = recs.groupby(["dataset", "fold"])["n_train"].unique()
    assert n_train.map(list).to_dict() == {
        ("synth_cv", "cv0of3"): [300],
        ("synth_cv", "cv1of3"): [300],
        ("synth_cv", "cv2of3"): [300],
        ("synth_cv", "refit"): [450],
        ("synth_val", "val"): [600],
    }
    # CV paths never look at the test split; refits do not evaluate held-out folds
    cv = by_ds["synth_cv"][by_ds["synth_cv"]["fold"].isin(CV_FOLDS)]
    refit = by_ds["synth_cv"][by_ds["synth_cv"]["fold"] == "refit"]
    assert cv["test_top1"].isna().all() and cv["val_top1"].notna().all()
    assert refit["val_top1"].isna().all() and refit["test_top1"].notna().all()

    rep = build_report(exp)
    sel = rep.selected.set_index(["dataset", "row", "k"])
    table = rep.table.set_index(["dataset", "row", "k"])
    for row in exp.rows:
        r = cv[cv["row"] == row.row]
        # every fold walked the same C values
        assert len({tuple(g["C"]) for _, g in r.groupby("fold")}) == 1
        chosen = select_C(r, CV_FOLDS)
        rf = refit[refit["row"] == row.row].set_index("C")
        # the refit path walks the selection's C values up to the largest selected one
        walked = {c for c in r["C"] if c <= max(chosen.values())}
        assert set(rf.index) == walked | set(chosen.values()), row.row
        for k, C in chosen.items():
            s = sel.loc[("synth_cv", row.row, k)]
            assert s["C"] == C
            assert s["test"] == pytest.approx(100.0 * rf.loc[C, f"test_top{k}"], abs=1e-12)
            assert s["status"] == rf.loc[C, "status"]
            assert table.loc[("synth_cv", row.row, k), "ours_mean"] == pytest.approx(s["test"])
            assert table.loc[("synth_cv", row.row, k), "C_selected"] == f"{C:g}"
        v = by_ds["synth_val"][by_ds["synth_val"]["row"] == row.row]
        for k, C in select_C(v, ("val",)).items():
            s = sel.loc[("synth_val", row.row, k)]
            assert s["C"] == C
            hit = v[v["C"] == C].iloc[0]
            assert s["test"] == pytest.approx(100.0 * hit[f"test_top{k}"], abs=1e-12)
    assert_extension_complete(exp, recs)


# ---------------------------------------------------------------------------------------------
# 3. grid extension


def test_extension_walks_beyond_a_too_small_grid(tmp_path):
    exp = smoke_experiment(
        tmp_path / "ext",
        "experiment.C_grid.min_exp=-4",
        "experiment.C_grid.max_exp=-4",
        "experiment.extend=2",
    )
    exp = with_rows(exp, ("LR^Multi", "SVM^Multi"))
    assert exp.C_values == (1e-4,) and exp.extend == 2
    stages: list[tuple[str, int]] = []
    summaries = run_sweep(exp, on_stage=lambda name, n: stages.append((name, n)))
    recs = records(exp)
    assert [s for s, _ in stages] == ["grid", "extend", "extend", "refit"]
    assert sum(n for _, n in stages) == sum(s.done for s in summaries) == len(recs)

    def Cs(ds, row, fold):
        r = recs[(recs["dataset"] == ds) & (recs["row"] == row) & (recs["fold"] == fold)]
        return sorted(r["C"])

    for ds, folds in (("synth_val", ("val",)), ("synth_cv", CV_FOLDS)):
        for fold in folds:
            # LR^Multi prefers larger C here: two steps up, and not further
            got = Cs(ds, "LR^Multi", fold)
            for C in (1e-5, 1e-4, 1e-3, 1e-2):  # one grid point is both boundaries
                assert any(math.isclose(c, C, rel_tol=TOL) for c in got), (ds, fold, got)
    assert recs["C"].max() == pytest.approx(1e-2, rel=TOL)
    assert recs["C"].min() >= 1e-6 * (1 - TOL)
    assert not np.isclose(recs["C"], 1e-1, rtol=TOL).any()
    assert_extension_complete(exp, recs)

    stages.clear()
    flat = dataclasses.replace(exp, extend=0, results_dir=str(tmp_path / "flat"))
    run_sweep(flat, on_stage=lambda name, n: stages.append((name, n)))
    recs0 = records(flat)
    assert [s for s, _ in stages] == ["grid", "refit"]
    assert set(recs0["C"]) == {1e-4}
    assert len(recs0) == 2 * (1 + 3 + 1)  # rows x (val + 3 CV folds + refit)


# ---------------------------------------------------------------------------------------------
# 4. interrupted sweep


def test_interrupted_sweep_resumes_identically(tmp_path, monkeypatch, joblib_subset):
    ref, ref_recs = joblib_subset
    exp = dataclasses.replace(ref, n_jobs=1, results_dir=str(tmp_path / "int"))
    total = len(ref_recs)
    n_grid = 4 * (1 + 3) * len(exp.C_values)  # rows x (val + 3 CV folds) x base grid
    n_refit = int((ref_recs["fold"] == "refit").sum())
    assert n_grid + n_refit < total  # this run has an extension stage
    calls = interrupt_fits(monkeypatch, exp.max_epochs)
    # first interruption in the base grid stage
    calls.update(n=0, stop=23)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(exp)
    assert len(records(exp)) == 22  # every finished fit was kept
    # the re-run is interrupted again in the refit stage (its 2nd fit), after every grid and
    # extension fit finished; the paths it completed report the kept records as cached
    seen = []
    calls.update(n=0, stop=(total - n_refit - 22) + 2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(exp, on_path_done=seen.append)
    assert sum(s.cached for s in seen) == 22
    assert sum(s.done for s in seen) == total - n_refit - 22  # not the interrupted path
    assert calls["n"] == total - n_refit - 22 + 2
    kept = len(records(exp))
    assert kept == total - n_refit + 1
    assert set(records(exp)["key"]) <= set(ref_recs["key"])
    # the last re-run fits only what is missing (its cached count: see the xfail test below)
    calls.update(n=0, stop=None)
    summaries = run_sweep(exp)
    assert sum(s.done for s in summaries) == calls["n"] == total - kept == n_refit - 1
    assert sum(s.failed + s.skipped for s in summaries) == 0
    got = records(exp)
    assert list(got["key"]) == list(ref_recs["key"])
    pd.testing.assert_frame_equal(got[METRIC_COLS], ref_recs[METRIC_COLS])
    assert build_report(exp).markdown == build_report(ref).markdown


def test_complete_rerun_reports_every_record_as_cached(joblib_subset):
    ref, ref_recs = joblib_subset
    summaries = run_sweep(dataclasses.replace(ref, n_jobs=1))
    assert sum(s.done for s in summaries) == 0
    assert sum(s.cached for s in summaries) == len(ref_recs)


# ---------------------------------------------------------------------------------------------
# 5. joblib vs Dask


def test_dask_cluster_matches_joblib(tmp_path, joblib_subset):
    from distributed import LocalCluster

    ref, ref_recs = joblib_subset
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        exp = dataclasses.replace(
            ref, scheduler=cluster.scheduler_address, results_dir=str(tmp_path / "dask")
        )
        summaries = run_sweep(exp)
    got = records(exp)
    assert sum(s.done for s in summaries) == len(got) == len(ref_recs)
    assert list(got["key"]) == list(ref_recs["key"])
    pd.testing.assert_frame_equal(got[METRIC_COLS], ref_recs[METRIC_COLS])
    assert build_report(exp).markdown == build_report(ref).markdown


# ---------------------------------------------------------------------------------------------
# 6. missing data, --skip-missing, a tiny Letter


def _write_tiny_letter(root: Path) -> None:
    """26 classes x 3 examples per split, 16 features in [-1, 1], LibSVM format (1-based)."""
    rng = np.random.default_rng(0)
    centers = rng.uniform(-1.0, 1.0, size=(26, 16))
    (root / "letter").mkdir(parents=True)
    for name in ("letter.scale.tr", "letter.scale.val", "letter.scale.t"):
        lines = []
        for c in range(26):
            for _ in range(3):
                x = np.clip(centers[c] + 0.6 * rng.normal(size=16), -1.0, 1.0)
                feats = " ".join(f"{j + 1}:{v:.4f}" for j, v in enumerate(x))
                lines.append(f"{c + 1} {feats}")
        (root / "letter" / name).write_text("\n".join(lines) + "\n")


def test_missing_data_is_refused_then_skipped(tmp_path, monkeypatch, caplog):
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("TOPKBENCH_DATA", str(data))
    args = ["experiment=table5", f"results_dir={tmp_path / 'res'}"]

    res = runner.invoke(app, ["sweep", *args])
    assert res.exit_code == 4, res.output
    text = " ".join(res.output.split())
    assert str(data / "letter" / "letter.scale.tr") in text
    assert str(data / "letter" / "letter.scale.val") in text
    assert str(data / "aloi" / "aloi.scale.bz2") in text
    assert "topkbench data fetch" in text and "Traceback" not in res.output

    res = runner.invoke(app, ["sweep", *args, "--skip-missing"])
    assert res.exit_code == 4, res.output
    text = " ".join(res.output.split())
    assert "not found" in text and "letter.scale.tr" in text and "imagenet2012" in text
    assert "topkbench data fetch" in text and "Traceback" not in res.output
    assert not (tmp_path / "res").exists()

    _write_tiny_letter(data)
    small = [
        *args,
        "experiment.C_grid.min_exp=0",
        "experiment.C_grid.max_exp=0",
        "experiment.extend=0",
        "experiment.rows=[{row:'SVM^Multi',method:svm_multi,gamma:0.0,k:1}]",
    ]
    with caplog.at_level(logging.WARNING, logger="topkbench"):
        res = runner.invoke(app, ["sweep", *small, "--skip-missing"])
    assert res.exit_code == 0, res.output
    warned = " ".join((caplog.text + res.output).split())
    assert "skipping datasets without their files" in warned
    for name in ("aloi", "news20", "caltech101_silhouettes", "imagenet2012"):
        assert f"{name}:" in warned
    assert "letter:" not in warned

    res = runner.invoke(app, ["report", *small])
    assert res.exit_code == 0, res.output
    md = res.stdout
    assert "## Letter" in md and md.count("\n## ") == 1  # only the dataset that ran
    line = next(ln for ln in md.splitlines() if ln.startswith("| SVM^Multi |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    ours = float(cells[1])
    assert cells[2] == "76.5"  # TPAMI Table 5, Letter, SVM^Multi top-1
    assert cells[3] == f"{ours - 76.5:+.1f}"
    assert "| SVM^OVA | not run | 63.0 |  |" in md
    csv = pd.read_csv(tmp_path / "res" / "table5" / "report.csv")
    hit = csv[(csv["dataset"] == "letter") & (csv["row"] == "SVM^Multi") & (csv["k"] == 1)]
    assert hit["paper"].item() == 76.5
    assert hit["diff"].item() == pytest.approx(hit["ours_mean"].item() - 76.5)
    recs = RecordStore(tmp_path / "res", "table5").load()
    assert list(recs["dataset"]) == ["letter"] and list(recs["fold"]) == ["val"]
    assert (recs["n_train"].item(), recs["n_classes"].item()) == (78, 26)


def test_missing_data_hint_names_the_real_option(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKBENCH_DATA", str(tmp_path))
    res = runner.invoke(app, ["sweep", "experiment=table5", f"results_dir={tmp_path / 'r'}"])
    assert res.exit_code == 4
    assert "--skip-missing" in " ".join(res.output.split())


# ---------------------------------------------------------------------------------------------
# 7. selection helpers


def _fold_records(entries) -> pd.DataFrame:
    """``entries``: (C, fold, val_top1, val_top3)."""
    df = pd.DataFrame(entries, columns=["C", "fold", "val_top1", "val_top3"])
    return df.sample(frac=1.0, random_state=3).reset_index(drop=True)  # order must not matter


def test_mean_validation_and_best_C():
    folds = ("cv0of2", "cv1of2")
    recs = _fold_records(
        [
            (0.1, "cv0of2", 0.9, 0.9),  # no cv1of2 record: excluded
            (1.0, "cv0of2", 0.5, 0.7),
            (1.0, "cv1of2", 0.75, 0.7),
            (10.0, "cv0of2", 0.75, 0.8),  # ties C = 1 on top-1
            (10.0, "cv1of2", 0.5, 0.8),
            (100.0, "cv0of2", 0.25, 0.9),
            (100.0, "cv1of2", 0.75, 0.9),
            (1000.0, "val", 1.0, 1.0),  # other folds do not count
            (1000.0, "refit", 1.0, 1.0),
        ]
    )
    curve = mean_validation(recs, folds, [1, 3, 5])
    assert list(curve.columns) == ["C", "val_top1", "val_top3"]  # no val_top5 column
    assert list(curve["C"]) == [1.0, 10.0, 100.0]
    np.testing.assert_allclose(curve["val_top1"], [0.625, 0.625, 0.5])
    np.testing.assert_allclose(curve["val_top3"], [0.7, 0.8, 0.9])
    assert best_C(curve, 1) == 1.0  # tie: the smallest C
    assert best_C(curve, 3) == 100.0
    assert best_C(curve, 5) is None
    assert mean_validation(recs, ("val",), [1])["C"].tolist() == [1000.0]
    empty = mean_validation(recs.iloc[:0], folds, [1])
    assert empty.empty and best_C(empty, 1) is None
    # all ties: the smallest C among those with every fold
    flat = _fold_records([(C, f, 0.5, 0.5) for C in (3.0, 0.3, 30.0) for f in folds])
    assert best_C(mean_validation(flat, folds, [1]), 1) == 0.3
    part = flat[(flat["C"] != 0.3) & ~((flat["C"] == 3.0) & (flat["fold"] == "cv0of2"))]
    assert best_C(mean_validation(part, folds, [1]), 1) == 30.0


def test_best_C_tie_is_robust_to_rounding():
    folds = CV_FOLDS
    recs = pd.DataFrame(
        [(1.0, f, v) for f, v in zip(folds, (0.1, 0.2, 0.3), strict=True)]
        + [(10.0, f, v) for f, v in zip(folds, (0.3, 0.2, 0.1), strict=True)],
        columns=["C", "fold", "val_top1"],
    )
    assert best_C(mean_validation(recs, folds, [1]), 1) == 1.0


def test_best_C_tie_on_an_unsorted_curve():
    curve = pd.DataFrame({"C": [10.0, 1.0], "val_top1": [0.5, 0.5]})
    assert best_C(curve, 1) == 1.0


def test_ent_tr_starts_from_the_selected_lr_multi(smoke_run):
    """ent_tr_init: selected — every Ent_tr record (selection folds and refit) records the C of
    the LR^Multi model selected for the row's k (TPAMI §6.2), recomputed here independently."""
    exp, _ = smoke_run
    assert exp.ent_tr_init == "selected"
    recs = records(exp)
    for ds, folds in (("synth_val", ("val",)), ("synth_cv", CV_FOLDS)):
        lr = recs[(recs["dataset"] == ds) & (recs["row"] == "LR^Multi")]
        for k in (3, 5, 10):
            ent = recs[(recs["dataset"] == ds) & (recs["row"] == f"top-{k} Ent_tr")]
            assert len(ent) and ent["init_C"].notna().all()
            want = select_C(lr, folds, ks=(k,))[k]
            np.testing.assert_allclose(ent["init_C"].unique(), [want], rtol=1e-12)
    assert recs.loc[recs["method"] != "topk_ent_tr", "init_C"].isna().all()


def test_rarely_handed_on_checkpoints_give_the_same_records(tmp_path, monkeypatch):
    """Duals too large to hand on at every point (here: each path's only at its task's end):
    the extension stage still starts from each path's largest C, also after an interruption;
    the records are those of a run that handed every dual on, to the last digit (the replay
    of a resumed path's finished points: tests/test_sweep.py)."""
    import topkbench.experiments.run as run_mod

    one_point = ("n_jobs=1", "experiment.C_grid.min_exp=-1", "experiment.C_grid.max_exp=-1")
    every = with_rows(smoke_experiment(tmp_path / "every", *one_point), SUBSET)
    run_sweep(every)
    monkeypatch.setattr(run_mod, "CHECKPOINT_FREE_BYTES", -1)
    monkeypatch.setattr(run_mod, "CHECKPOINT_FIT_RATIO", math.inf)
    exp = dataclasses.replace(every, results_dir=str(tmp_path / "rare"))
    calls = interrupt_fits(monkeypatch, exp.max_epochs)
    calls["stop"] = 5
    with pytest.raises(KeyboardInterrupt):
        run_sweep(exp)
    calls["stop"] = None
    run_sweep(exp)
    a, b = records(every), records(exp)
    assert list(a["key"]) == list(b["key"])
    assert (b["warm_started"] & (b["C"] > 0.1)).sum() >= 4  # grids extended past their top
    pd.testing.assert_frame_equal(a[METRIC_COLS], b[METRIC_COLS], check_exact=True)
