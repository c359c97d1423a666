"""The fine-tuning protocol (TPAMI Table 6's layout): configuration checks, a whole run on small
images through the store, resumption, determinism across n_jobs, and the report."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from torch_required import import_torch

import_torch()

from topkbench.deep.config import FinetuneConfig  # noqa: E402
from topkbench.deep.protocol import image_side, reference_keys, run_finetune  # noqa: E402
from topkbench.deep.report import build_finetune_report  # noqa: E402
from topkbench.errors import ConfigError  # noqa: E402

ROWS = [
    {"row": "top-2 SVM_1 (FT)", "method": "topk_svm_alpha_pseudo", "gamma": 1.0, "k": 2},
    {"row": "LR^Multi (FT)", "method": "lr_multi"},
]


def _write_images(path, m=4, side=16, seed=0):
    """Binary side x side images, each class lighting its own quadrant, in the features
    layout with train / val / test index sets."""
    rng = np.random.default_rng(seed)
    n = {"train": 64, "val": 32, "test": 32}
    total = sum(n.values())
    y = rng.integers(0, m, total)
    X = (rng.random((total, side, side)) < 0.1).astype(np.float64)
    h = side // 2
    for c in range(m):
        r, q = divmod(c, 2)
        lit = y == c
        X[lit, h * r : h * r + h - 2, h * q : h * q + h - 2] = rng.random((lit.sum(), 1, 1)) < 0.8
    arrays, start = {}, 0
    for split, count in n.items():
        arrays[f"splits/{split}"] = np.arange(start, start + count)
        start += count
    np.savez(path, features=X.reshape(total, side * side), labels=y, **arrays)
    return path


def _root(path, results, **exp):
    files = {s: {"file": str(path)} for s in ("train", "val", "test")}
    experiment = {
        "name": "ft",
        "title": "fine-tuning test",
        "layout": "finetune",
        "datasets": [{"name": "imgs", "kind": "features", "files": files}],
        "ks": [1, 2],
        "seeds": 2,
        "network": {"channels": [4, 8], "hidden": 16},
        "reference": {"epochs": 2, "lr": 0.05, "batch_size": 16},
        "finetune": {"epochs": 2, "lrs": [0.01, 0.001], "batch_size": 16},
        "rows": ROWS,
        "classifier": {
            "C_grid": {"base": 10.0, "min_exp": -1, "max_exp": 0, "step": 1},
            "extend": 0,
            "eps": 1e-3,
            "max_epochs": 1000,
            "rows": [{"row": "LR^Multi", "method": "lr_multi"}],
        },
    }
    experiment.update(exp)
    return {"experiment": experiment, "results_dir": str(results), "seed": 0, "n_jobs": 1}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return _write_images(tmp_path_factory.mktemp("imgs") / "imgs.npz")


@pytest.fixture(scope="module")
def finished(images, tmp_path_factory):
    """A whole run (two seeds, in process) and its report."""
    results = tmp_path_factory.mktemp("run")
    cfg = FinetuneConfig.from_dict(_root(images, results))
    summaries = run_finetune(cfg)
    rep, records = build_finetune_report(cfg)
    return cfg, summaries, rep, records


def _records(cfg, sub=""):
    db = f"{cfg.results_dir}/{cfg.name}{sub}/records.sqlite"
    with sqlite3.connect(db) as conn:
        return {k: json.loads(b) for k, b in conn.execute("SELECT key, body FROM records")}


def test_a_run_stores_every_network_candidate_and_classifier_fit(finished):
    cfg, summaries, rep, records = finished
    recs = _records(cfg)
    stages = pd.Series([r["stage"] for r in recs.values()]).value_counts().to_dict()
    # 2 seeds: a reference each, 2 rows x 2 rates x 2 epochs of fine-tuning each
    assert stages == {"reference": 2, "finetune": 16}
    refs = [r for r in recs.values() if r["stage"] == "reference"]
    assert all(r["epoch"] in (1, 2) and len(r["val_curve"]) == 2 for r in refs)
    cls = _records(cfg, "/classifier")
    assert len(cls) == 2 * 2 and {r["status"] for r in cls.values()} == {"converged"}
    # the reference's selected epoch has the best val top-1 of its curve
    for r in refs:
        assert r["val_top1"] == pytest.approx(max(r["val_curve"]))


def test_the_report_has_every_row_the_paper_context_and_paired_differences(finished):
    cfg, _, rep, records = finished
    t = rep.table
    ours = t[t["block"] == "finetune"]
    assert list(ours["row"]) == ["LR^Multi", *(r["row"] for r in ROWS)]
    assert (ours["top1_seeds"] == 2).all()
    ref = ours.iloc[0]
    # Δ is the mean of the paired (per-seed) differences: the difference of the means here
    for _, r in ours.iloc[1:].iterrows():
        assert r["top1_diff"] == pytest.approx(r["top1_mean"] - ref["top1_mean"])
    assert "the classifier alone" in rep.markdown and not rep.incomplete
    assert "Selected models certified" in rep.markdown
    from topkbench.experiments.html import write_table_page

    page = write_table_page(cfg.title, rep, records, Path(cfg.results_dir) / "report.html")
    text = page.read_text()
    assert "top-2 SVM_1 (FT)" in text and "Provenance" in text and "<svg" not in text


def test_selection_on_val_takes_the_best_candidate_with_ties_to_fewer_epochs(finished):
    cfg, _, rep, _ = finished
    recs = pd.DataFrame([r for r in _records(cfg).values() if r["stage"] == "finetune"])
    sel = rep.selected[(rep.selected["block"] == "finetune") & (rep.selected["row"] != "LR^Multi")]
    for _, s in sel.iterrows():
        cands = recs[(recs["seed"] == s["seed"]) & (recs["row"] == s["row"])]
        col = f"val_top{int(s['k'])}"
        best = cands[col].max()
        assert s["val"] == pytest.approx(100 * best)
        first = cands[cands[col] >= best - 1e-9].sort_values(["epoch", "lr"]).iloc[0]
        assert (s["epoch"], s["lr"]) == (first["epoch"], first["lr"])


def test_a_rerun_trains_nothing_and_an_interrupted_one_resumes_to_the_same_report(finished):
    cfg, _, rep, _ = finished
    again = run_finetune(cfg)
    assert sum(s.done for s in again) == 0
    # lose two fine-tuning records and damage a reference network's weights on disk
    db = f"{cfg.results_dir}/{cfg.name}/records.sqlite"
    with sqlite3.connect(db) as conn:
        keys = [
            k
            for k, b in conn.execute("SELECT key, body FROM records")
            if json.loads(b)["stage"] == "finetune"
        ][:2]
        conn.executemany("DELETE FROM records WHERE key = ?", [(k,) for k in keys])
        (name,) = conn.execute("SELECT file FROM checkpoints LIMIT 1").fetchone()
    with open(f"{cfg.results_dir}/{cfg.name}/warm/{name}", "r+b") as fh:
        fh.seek(200)
        fh.write(b"\0\1\2\3")
    resumed = run_finetune(cfg)
    assert sum(s.done for s in resumed) >= 3  # a reference and at least the two lost epochs
    rep2, _ = build_finetune_report(cfg)
    assert rep2.markdown == rep.markdown
    pd.testing.assert_frame_equal(rep2.table, rep.table)


def test_the_numbers_do_not_depend_on_n_jobs(finished, images, tmp_path):
    cfg, _, rep, _ = finished
    root = _root(images, tmp_path, classifier={})
    root["n_jobs"] = 2
    par = FinetuneConfig.from_dict(root)
    run_finetune(par)
    seq_refs = {r["seed"]: r for r in _records(cfg).values() if r["stage"] == "reference"}
    par_refs = {r["seed"]: r for r in _records(par).values() if r["stage"] == "reference"}
    for seed, r in seq_refs.items():
        assert par_refs[seed]["val_curve"] == r["val_curve"]
        assert par_refs[seed]["train_loss"] == r["train_loss"]
    assert reference_keys(par) == reference_keys(cfg)
    seq = {k: r["val_top1"] for k, r in _records(cfg).items() if r["stage"] == "finetune"}
    assert {k: r["val_top1"] for k, r in _records(par).items() if r["stage"] == "finetune"} == seq


def test_a_store_without_records_or_with_part_of_them_is_reported_as_such(images, tmp_path):
    cfg = FinetuneConfig.from_dict(_root(images, tmp_path))
    with pytest.raises(ConfigError, match="no records for experiment 'ft'"):
        build_finetune_report(cfg)
    part = dataclasses.replace(cfg, rows=cfg.rows[:1], classifier={})
    run_finetune(part)
    rep, _ = build_finetune_report(cfg)
    assert rep.incomplete and rep.markdown.startswith("> **Incomplete run:**")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seeds": 0}, r"experiment.seeds must be an integer >= 1"),
        ({"finetune": {"lrs": [0.01, -1]}}, r"experiment.finetune.lrs\[1\] must be in \(0, inf\)"),
        ({"finetune": {"lrs": []}}, r"experiment.finetune.lrs must be a non-empty list"),
        ({"finetune": {"epoch": 2}}, r"unknown experiment.finetune key\(s\): epoch"),
        ({"reference": {"momentum": 1.5}}, r"experiment.reference.momentum must be in \[0, 1\)"),
        ({"network": {"channels": [4]}}, r"channels must be two integers"),
        ({"device": "tpu"}, r"experiment.device must be one of cpu, cuda"),
        ({"rows": []}, r"no fine-tuning rows"),
        ({"rows": [{"row": "x", "method": "topk_svm_alpha", "k": [2, 3]}]}, r"one k and one gamma"),
        ({"classifier": {"C_grd": {}}}, r"unknown experiment.classifier key\(s\): C_grd"),
        ({"ks": [3, 5]}, r"experiment.ks must hold 1"),
        ({"rows": [{"row": "LR^Multi", "method": "lr_multi"}]}, r"the reference network's name"),
        ({"rows": [ROWS[1], {**ROWS[1], "row": "again"}]}, r"the same loss as another row"),
        ({"rows": [{"row": "ml", "method": "svm_ml"}]}, r"is a multilabel loss"),
        ({"classifier": {"rows": [{"row": "x", "method": "lr_ml"}]}}, r"is a multilabel loss"),
    ],
)
def test_impossible_settings_are_refused_with_their_range(images, tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        FinetuneConfig.from_dict(_root(images, tmp_path, **change))


def test_cuda_where_torch_sees_none_is_refused(images, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = FinetuneConfig.from_dict(_root(images, tmp_path, device="cuda"))
    with pytest.raises(ConfigError, match="device=cuda, but torch sees no CUDA device"):
        run_finetune(cfg)
    assert not any(tmp_path.iterdir())


def test_a_dask_scheduler_is_refused(images, tmp_path):
    root = _root(images, tmp_path)
    root["scheduler"] = "tcp://127.0.0.1:8786"
    with pytest.raises(ConfigError, match="scheduler= is not supported"):
        FinetuneConfig.from_dict(root)


def test_images_must_be_square_with_a_side_divisible_by_four():
    assert image_side(784) == 28
    for d in (783, 900):
        with pytest.raises(ConfigError, match="side is divisible by 4"):
            image_side(d)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # each layout's own keys: an override of the other layout's would do nothing
        (["experiment=table5", "experiment.seeds=3"], "unknown experiment key(s): seeds"),
        (["experiment=table6", "experiment.C_grid=1"], "unknown experiment key(s): C_grid"),
        (
            ["experiment=table6", "experiment.finetune.lrs=[abc]"],
            "experiment.finetune.lrs[0] must be a number in (0, inf); got 'abc'",
        ),
        (
            ["experiment=table6", "experiment.reference.epochs=0"],
            "experiment.reference.epochs must be an integer >= 1; got 0",
        ),
    ],
)
def test_the_cli_refuses_overrides_of_the_wrong_layout_or_range(tmp_path, args, expected):
    from typer.testing import CliRunner

    from topkbench.cli import app

    res = CliRunner().invoke(app, ["sweep", *args, f"results_dir={tmp_path}"])
    assert res.exit_code not in (0, None) and "Traceback" not in res.output
    assert expected in " ".join(res.output.split())
    assert not any(tmp_path.iterdir())  # nothing ran


def test_a_moved_results_directory_keeps_every_record(finished, tmp_path):
    import shutil

    cfg, _, rep, _ = finished
    moved = tmp_path / "moved"
    shutil.copytree(cfg.results_dir, moved)
    there = dataclasses.replace(cfg, results_dir=str(moved))
    rep2, _ = build_finetune_report(there)
    assert rep2.markdown == rep.markdown and not rep2.incomplete


def test_records_follow_their_row_when_it_is_renamed(finished):
    cfg, _, rep, _ = finished
    renamed = [dataclasses.replace(r, row=r.row + " renamed") for r in cfg.rows]
    rep2, _ = build_finetune_report(dataclasses.replace(cfg, rows=tuple(renamed)))
    t = rep2.table[rep2.table["block"] == "finetune"]
    assert list(t["row"])[1:] == [r.row for r in renamed] and not rep2.incomplete
    pd.testing.assert_series_equal(
        t["top1_mean"].reset_index(drop=True),
        rep.table[rep.table["block"] == "finetune"]["top1_mean"].reset_index(drop=True),
    )


def test_a_partial_classifier_sweep_is_reported_incomplete(finished, tmp_path):
    import shutil

    cfg, _, _, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(cfg.results_dir, copy)
    db = copy / cfg.name / "classifier" / "records.sqlite"
    with sqlite3.connect(db) as conn:
        (key,) = conn.execute("SELECT key FROM records LIMIT 1").fetchone()
        conn.execute("DELETE FROM records WHERE key = ?", (key,))
    rep, _ = build_finetune_report(dataclasses.replace(cfg, results_dir=str(copy)))
    assert rep.incomplete and "1 of the classifier rows' grid fits" in rep.markdown


def test_the_export_holds_the_classifier_fits_too(finished, tmp_path):
    from typer.testing import CliRunner

    from topkbench.cli import app
    from topkbench.experiments.store import RecordStore, read_records

    cfg, _, _, _ = finished
    fits = read_records(f"{cfg.results_dir}/{cfg.name}", "classifier")[0]
    out = tmp_path / "all.csv"
    RecordStore(cfg.results_dir, cfg.name).export(out, (fits.assign(stage="classifier"),))
    df = pd.read_csv(out)
    assert df["stage"].value_counts().to_dict() == {"finetune": 16, "classifier": 4, "reference": 2}
    res = CliRunner().invoke(app, ["report", "experiment=table6", f"results_dir={tmp_path}",
                                   "--figures", str(tmp_path / "f")])  # fmt: skip
    assert res.exit_code != 0 and "the fine-tuning report has no plots" in res.output


def test_a_diverging_rate_is_a_candidate_that_loses_and_a_diverging_reference_an_error(
    images, tmp_path
):
    root = _root(images, tmp_path, seeds=1, classifier={},
                 finetune={"epochs": 2, "lrs": [1e9], "batch_size": 16})  # fmt: skip
    root["experiment"]["rows"] = ROWS[1:]
    cfg = FinetuneConfig.from_dict(root)
    run_finetune(cfg)
    recs = [r for r in _records(cfg).values() if r["stage"] == "finetune"]
    assert [r["status"] for r in recs] == ["diverged", "diverged"]
    rep, _ = build_finetune_report(cfg)
    assert "2 fine-tuning candidates diverged" in rep.markdown and not rep.incomplete
    row = rep.table[rep.table["row"] == "LR^Multi (FT)"].iloc[0]
    assert row["top1_seeds"] == 0
    bad = _root(images, tmp_path / "b", seeds=1, classifier={},
                reference={"epochs": 1, "lr": 1e9, "batch_size": 16})  # fmt: skip
    with pytest.raises(ConfigError, match="reference network of seed 0: .* diverged") as err:
        run_finetune(FinetuneConfig.from_dict(bad))
    assert err.value.hint == "lower experiment.reference.lr"


def test_the_report_reads_the_records_digests_where_the_data_file_is_gone(finished, images):
    cfg, _, rep, _ = finished
    hidden = images.with_name("hidden.npz")
    images.rename(hidden)
    try:
        rep2, _ = build_finetune_report(cfg)
    finally:
        hidden.rename(images)
    assert "is not on this machine" in rep2.markdown
    assert rep2.markdown.split("The data file")[0] == rep.markdown.split("The paper's rows")[0]
