"""Sweep engine: records, resume after interruption, determinism, the Table 3 report."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pandas as pd
import pytest
from interrupt import interrupt_fits
from typer.testing import CliRunner

import topkbench.api
from topkbench.cli import app, compose
from topkbench.config import ExperimentConfig
from topkbench.experiments.report import build_report
from topkbench.experiments.store import RecordStore
from topkbench.experiments.sweep import run_sweep

runner = CliRunner()
GOLDEN = Path(__file__).parent / "golden" / "table3_smoke.md"


def smoke_overrides(results: Path) -> list[str]:
    return [
        "experiment=table3",
        "experiment.draws=2",
        "experiment.C_grid.min_exp=-3",
        "experiment.C_grid.max_exp=3",
        "dataset.n_test=3000",
        f"results_dir={results}",
    ]


def smoke_experiment(results: Path) -> ExperimentConfig:
    return ExperimentConfig.from_dict(compose(smoke_overrides(results)))


METRIC_COLS = ["primal", "dual", "relative_gap", "epochs", "val_top1", "val_top2", "test_top1"]


def _records(exp: ExperimentConfig) -> pd.DataFrame:
    df = RecordStore(exp.results_dir, exp.name).load()
    return df.sort_values(["row", "draw", "C"]).reset_index(drop=True)


def test_sweep_writes_every_record_and_resumes_from_cache(tmp_path):
    exp = smoke_experiment(tmp_path)
    summaries = run_sweep(exp)
    n_expected = exp.draws * len(exp.rows) * len(exp.C_values)
    assert sum(s.done for s in summaries) == n_expected
    recs = _records(exp)
    assert len(recs) == n_expected
    assert recs["key"].is_unique
    assert (recs["status"] == "converged").all()
    convex = recs["method"] != "topk_ent_tr"  # nonconvex: no gap (NaN), see report footnote
    assert (recs.loc[convex, "relative_gap"] <= exp.eps).all()
    assert recs.loc[~convex, "relative_gap"].isna().all()
    again = run_sweep(exp)
    assert sum(s.done for s in again) == 0
    assert sum(s.cached for s in again) == n_expected


def test_interrupted_sweep_loses_nothing_and_resumes_identically(tmp_path, monkeypatch):
    ref = smoke_experiment(tmp_path / "ref")
    run_sweep(ref)
    exp = smoke_experiment(tmp_path / "int")
    calls = interrupt_fits(monkeypatch, exp.max_epochs)
    calls["stop"] = 23
    with pytest.raises(KeyboardInterrupt):
        run_sweep(exp)
    assert len(_records(exp)) == 22  # every finished fit was kept
    calls["stop"] = None
    summaries = run_sweep(exp)
    assert sum(s.cached for s in summaries) == 22
    a, b = _records(ref), _records(exp)
    assert list(a["key"]) == list(b["key"])
    pd.testing.assert_frame_equal(a[METRIC_COLS], b[METRIC_COLS])


def test_resumed_path_without_its_checkpoint_replays_to_the_same_records(tmp_path, monkeypatch):
    """Paths whose duals are too large to hand on at every point (here: none is ever handed
    on) resume by fitting their finished points again from the older checkpoint (here: from
    cold), so the new points start from the duals they started from in the first run."""
    import topkbench.experiments.run as run_mod

    # no time limit: a fit under one could not be replayed, and its dual is always handed on
    ref = ExperimentConfig.from_dict(
        compose([*smoke_overrides(tmp_path / "ref"), "experiment.time_limit=null"])
    )
    assert ref.time_limit is None
    run_sweep(ref)
    monkeypatch.setattr(run_mod, "CHECKPOINT_FREE_BYTES", -1)
    monkeypatch.setattr(run_mod, "CHECKPOINT_FIT_RATIO", float("inf"))
    exp = dataclasses.replace(ref, results_dir=str(tmp_path / "int"))
    calls = interrupt_fits(monkeypatch, exp.max_epochs)
    calls["stop"] = 23
    with pytest.raises(KeyboardInterrupt):
        run_sweep(exp)
    store = RecordStore(exp.results_dir, exp.name)
    assert len(_records(exp)) == 22
    calls["stop"] = None
    points = []
    real_point = run_mod.fit_point

    def counting_point(*args, **kwargs):
        points.append(args[3])
        return real_point(*args, **kwargs)

    monkeypatch.setattr(run_mod, "fit_point", counting_point)
    summaries = run_sweep(exp)
    assert sum(s.cached for s in summaries) == 22
    # the interrupted path's finished point was fitted again before its new ones
    assert len(points) == sum(s.done for s in summaries) + 1
    a, b = _records(ref), _records(exp)
    assert list(a["key"]) == list(b["key"])
    pd.testing.assert_frame_equal(a[METRIC_COLS], b[METRIC_COLS], check_exact=True)
    assert all(store.checkpoint_ref(k) is None for k in b["key"])  # converged: none of their own


def test_checkpoint_due_hands_on_small_duals_always_and_large_ones_after_enough_fitting():
    import numpy as np

    from topkbench.experiments.run import (
        CHECKPOINT_BYTES_PER_SECOND,
        CHECKPOINT_FIT_RATIO,
        checkpoint_due,
    )
    from topkbench.model import WarmStart

    small = WarmStart(1.0, np.zeros((100, 10)), np.zeros((5, 10)))
    assert checkpoint_due(small, 0.0)
    large = WarmStart(1.0, np.zeros((2_000, 1_000)), np.zeros((500, 1_000)))
    cost = (large.A.nbytes + large.W.nbytes) / CHECKPOINT_BYTES_PER_SECOND
    assert not checkpoint_due(large, 0.0)
    assert not checkpoint_due(large, 0.9 * CHECKPOINT_FIT_RATIO * cost)
    assert checkpoint_due(large, CHECKPOINT_FIT_RATIO * cost)
    assert checkpoint_due(large._replace(W=None), CHECKPOINT_FIT_RATIO * cost)


def test_cli_sweep_and_report_match_golden(tmp_path):
    args = smoke_overrides(tmp_path)
    res = runner.invoke(app, ["sweep", *args])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", *args])
    assert res.exit_code == 0, res.output
    md = build_report(smoke_experiment(tmp_path)).markdown
    assert "| SVM^Multi |" in md and "58.9" in md and "96.1" in md
    assert "not run" in md  # paper rows without a method in this experiment
    if os.environ.get("TOPKBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(md)
    assert md == GOLDEN.read_text(), "set TOPKBENCH_UPDATE_GOLDEN=1 to accept a new table"


def test_report_without_records_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["report", *smoke_overrides(tmp_path)])
    assert res.exit_code != 0
    assert "no records for experiment 'table3'" in " ".join(res.output.split())


def test_dataset_class_weight_reaches_every_fit_and_the_record_keys(tmp_path, monkeypatch):
    """``dataset.class_weight=balanced``: every fit of the sweep gets the weights (fit sees
    them), and the records are other records than the unweighted sweep's."""
    base = [*smoke_overrides(tmp_path), "experiment.draws=1", "experiment.C_grid.min_exp=0",
            "experiment.C_grid.max_exp=0"]  # fmt: skip
    seen = []
    real_fit = topkbench.api.fit

    def spy(*args, **kwargs):
        # not the 12-example compile warm-up (fits.warm_up), nor Ent_tr's LR^Multi start,
        # which fit makes itself with the weights already applied
        if len(args[1]) != 12 and kwargs.get("sample_weight") is None:
            seen.append(kwargs.get("class_weight"))
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(topkbench.api, "fit", spy)
    plain = ExperimentConfig.from_dict(compose([*base, f"results_dir={tmp_path / 'a'}"]))
    weighted = ExperimentConfig.from_dict(
        compose([*base, "dataset.class_weight=balanced", f"results_dir={tmp_path / 'b'}"])
    )
    run_sweep(plain)
    assert seen and set(seen) == {None}
    seen.clear()
    run_sweep(weighted)
    assert seen and set(seen) == {"balanced"}
    keys_plain = set(_records(plain)["key"])
    keys_weighted = set(_records(weighted)["key"])
    assert len(keys_weighted) == len(keys_plain) and not keys_plain & keys_weighted


def test_class_weight_is_refused_for_multilabel_rows_and_unknown_rules():
    from topkbench.errors import ConfigError

    root = compose(["experiment=table7_synth"])
    root["experiment"]["datasets"][0]["class_weight"] = "balanced"
    with pytest.raises(ConfigError, match="sets class_weight, and row .* is multilabel"):
        ExperimentConfig.from_dict(root)
    with pytest.raises(ConfigError, match="dataset.class_weight must be one of balanced"):
        ExperimentConfig.from_dict(compose(["experiment=table3", "dataset.class_weight=auto"]))
