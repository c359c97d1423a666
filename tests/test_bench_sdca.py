"""``topkbench bench sdca`` on tiny sizes: the epoch table's multiple of the flop bound, the
time-to-eps study (TPAMI Fig. 3b/3c) reaching its gap with one curve point per epoch, the
solver's ``on_eval`` hook, the CLI files, and refused parameters."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from topkbench.bench.common import (
    make_delicious_problem,
    make_gaussian_problem,
    measure_peak_gflops,
)
from topkbench.bench.sdca import bench_sdca, bench_sdca_convergence, shape_size
from topkbench.cli import app
from topkbench.errors import ConfigError
from topkbench.solvers.sdca import solve_sdca

METHODS = (("svm_multi", 0.0, 1), ("lr_multi", 0.0, 1), ("topk_svm_alpha", 0.5, 2))


def test_epoch_rows_relate_time_to_the_flop_bound():
    rows = bench_sdca(n=60, d=4, m=5, epochs=2, methods=METHODS, peak_gflops=7.0)
    assert [(r.method, r.gamma, r.k) for r in rows] == list(METHODS)
    for r in rows:
        bound = 4.0 * 60 * 4 * 5 / 7e9
        assert r.times_bound == pytest.approx(r.sec_per_epoch / bound)
        assert r.gflops == pytest.approx(4.0 * 60 * 4 * 5 / r.sec_per_epoch / 1e9)
        assert r.sec_per_epoch_min <= r.sec_per_epoch
        assert r.peak_gflops == r.peak_gflops_here == 7.0


def test_bound_uses_the_highest_peak_measured_before_each_loss(monkeypatch):
    """Without a given peak, it is measured before each loss; every row's bound uses the
    highest measurement and keeps its own."""
    import topkbench.bench.sdca as B

    peaks = iter([30.0, 50.0, 40.0])
    monkeypatch.setattr(B, "measure_peak_gflops", lambda: next(peaks))
    rows = bench_sdca(n=60, d=4, m=5, epochs=1, methods=METHODS)
    assert [r.peak_gflops_here for r in rows] == [30.0, 50.0, 40.0]
    for r in rows:
        assert r.peak_gflops == 50.0
        assert r.times_bound == pytest.approx(r.sec_per_epoch / (4.0 * 60 * 4 * 5 / 50e9))


def test_peak_is_a_positive_rate():
    assert 0.01 < measure_peak_gflops(size=64, repeats=2) < 1e5


def test_convergence_study_reaches_eps_with_one_point_per_certificate():
    rows, points = bench_sdca_convergence(
        n=120, d=6, m=4, methods=METHODS, C=0.5, eps=1e-3, max_epochs=500, n_val=40
    )
    assert len(rows) == len(METHODS)
    for r in rows:
        assert r.status == "converged" and r.relative_gap <= 1e-3
        assert 0.0 <= r.val_top1 <= 1.0
        label_pts = [p for p in points if p.epoch <= r.epochs and p.label.startswith(r.method)]
        assert label_pts
    for label in {p.label for p in points}:
        pts = [p for p in points if p.label == label]
        # the auto schedule: epoch 0, then 1, then increasing (a second-order phase that
        # takes over certifies its own starting pair at the epoch it starts from)
        epochs = [p.epoch for p in pts]
        assert epochs[:2] == [0, 1]
        assert all(b >= a for a, b in zip(epochs, epochs[1:], strict=False))
        assert len(set(epochs)) >= len(epochs) - 1
        assert all(b.seconds >= a.seconds for a, b in zip(pts, pts[1:], strict=False))
        assert pts[-1].relative_gap <= 1e-3 < pts[0].relative_gap


def test_on_eval_sees_every_trace_point_with_a_consistent_W():
    X, y = make_gaussian_problem(50, 5, 3, seed=1, separation=0.3)
    seen = []

    def on_eval(epoch, A, W):
        np.testing.assert_allclose(W, X.T @ A, atol=1e-12)
        seen.append(epoch)

    res = solve_sdca(X, y, n_classes=3, loss_id=0, C=1.0, eps=1e-6, on_eval=on_eval)
    assert seen == [tp.epoch for tp in res.trace]


def test_separation_one_keeps_the_timing_problem():
    a = make_gaussian_problem(30, 4, 3, seed=2)
    b = make_gaussian_problem(30, 4, 3, seed=2, separation=1.0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_cli_writes_tables_and_plot(tmp_path):
    out = tmp_path / "sdca.csv"
    args = ["bench", "sdca", "--n", "80", "--d", "5", "--m", "4", "--epochs", "1"]
    args += ["--method", "svm_multi", "--method", "lr_multi", "--conv-C", "0.5"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "x bound" in res.output and "time to relative gap" in res.output
    assert len(pd.read_csv(out)) == 2
    conv = pd.read_csv(tmp_path / "sdca_convergence.csv")
    assert (conv["status"] == "converged").all()
    curves = pd.read_csv(tmp_path / "sdca_curves.csv")
    assert set(curves["label"]) == {"svm_multi", "lr_multi"}
    assert (tmp_path / "sdca_convergence.png").stat().st_size > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(C=0.0), "C must be a finite number > 0"),
        (dict(m=1), "m must be >= 2"),
        (dict(epochs=0), "epochs must be >= 1"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        bench_sdca(**{"n": 10, "d": 2, "m": 3, **kwargs})


@pytest.mark.parametrize(
    "method, message",
    [
        (("topk_ent", 0.0, 3), r"topk_ent k=3: k must be in \[1, 2\]"),
        (("svm_multi", 0.0, 2), "svm_multi is a top-1 loss and takes no k"),
        (("lr_multi", 1.0, 1), "lr_multi has no smoothing parameter"),
        (("topk_svm_alpha", -1.0, 2), r"gamma must be in \[0, inf\)"),
        (("topk_ent_tr", 0.0, 2), "topk_ent_tr is not an SDCA method"),
        (("wtopk_svm", 0.0, 2), "wtopk_svm takes rank weights, which this benchmark"),
    ],
)
def test_bad_methods_are_refused_before_any_kernel_runs(method, message):
    # a k >= m reaches the kernels unchecked (numba has no bounds checks): refused up front
    with pytest.raises(ConfigError, match=message):
        bench_sdca(n=10, d=2, m=3, methods=(method,))
    with pytest.raises(ConfigError, match=message):
        bench_sdca_convergence(n=10, d=2, m=3, methods=(method,), n_val=0)


def test_convergence_study_compiles_top_k_methods_on_a_valid_problem():
    # the compile run before the clock once used 4 classes whatever k was: k = 5 read past the
    # scores and gave an intermittent NaN objective
    (row,), _ = bench_sdca_convergence(
        n=120, d=6, m=8, methods=(("topk_svm_alpha_pseudo", 0.0, 5),), C=0.5, n_val=0
    )
    assert row.status == "converged" and row.relative_gap <= 1e-3


def test_cli_refuses_bad_eps(tmp_path):
    args = ["bench", "sdca", "--n", "20", "--d", "2", "--m", "3", "--epochs", "1"]
    res = CliRunner().invoke(app, [*args, "--eps", "-1", "--out", str(tmp_path / "s.csv")])
    assert res.exit_code != 0 and "eps must be a finite number > 0" in res.output


def test_delicious_shape_times_multilabel_epochs_against_the_csr_bound():
    """The CSR multilabel shape: the bound is 4 nnz m flops, and each row has the median
    certificate that followed its epochs."""
    rows = bench_sdca(shape="delicious", n=80, d=12, m=9, epochs=3, peak_gflops=7.0)
    assert [(r.method, r.gamma) for r in rows] == [("svm_ml", 1.0), ("svm_ml", 0.0), ("lr_ml", 0.0)]
    X, _ = make_delicious_problem(80, 12, 9, 0)
    for r in rows:
        assert (r.shape, r.nnz) == ("delicious", X.nnz)
        assert r.times_bound == pytest.approx(r.sec_per_epoch / (4.0 * X.nnz * 9 / 7e9))
        assert 0.0 < r.sec_per_certificate < 10.0


@pytest.mark.parametrize("shape", ["gaussian", "delicious"])
def test_float32_rows_time_float32_passes(shape):
    """``--float32``: the features are float32 and every timed epoch ran its passes in
    float32 (dense and CSR kernels); without it, none did."""
    kw = dict(shape=shape, n=80, d=12, m=9, epochs=2, peak_gflops=7.0)
    kw["methods"] = (("svm_ml", 1.0, 1),) if shape == "delicious" else (("svm_multi", 0.0, 1),)
    assert [r.precision for r in bench_sdca(**kw, float32=True)] == ["float32"]
    assert [r.precision for r in bench_sdca(**kw)] == ["float64"]


def test_delicious_problem_is_seeded_sparse_and_labelled():
    X, Y = make_delicious_problem(300, 40, 30, seed=3, nnz_per_row=5.0, labels_per_row=4.0)
    X2, Y2 = make_delicious_problem(300, 40, 30, seed=3, nnz_per_row=5.0, labels_per_row=4.0)
    assert (X != X2).nnz == 0 and (Y != Y2).nnz == 0
    assert X.shape == (300, 40) and Y.shape == (300, 30)
    assert set(np.unique(X.data)) == {1.0} and set(np.unique(Y.data)) == {1.0}
    labels = np.diff(Y.indptr)
    assert labels.min() >= 1 and labels.max() <= 29 and np.diff(X.indptr).min() >= 1
    assert 3.0 < labels.mean() < 5.0
    # Zipf-like: the first label is far more frequent than the last
    freq = np.asarray(Y.sum(0)).ravel()
    assert freq[0] > 5 * freq[-10:].mean()


def test_shape_defaults_and_refusals():
    assert shape_size("aloi", None, None, None) == (20_000, 128, 1000)
    assert shape_size("delicious", 50, None, 7) == (50, 500, 7)
    with pytest.raises(ConfigError, match="shape must be one of gaussian, aloi, delicious"):
        bench_sdca(shape="bibtex", n=10, d=2, m=3)
    with pytest.raises(ConfigError, match="lr_multi is a multiclass loss; the delicious shape"):
        bench_sdca(shape="delicious", n=10, d=2, m=3, methods=(("lr_multi", 0.0, 1),))
    with pytest.raises(ConfigError, match="svm_ml is a multilabel loss; the gaussian shape"):
        bench_sdca(n=10, d=2, m=3, methods=(("svm_ml", 0.0, 1),))


def test_cli_runs_the_delicious_shape_and_refuses_its_study(tmp_path):
    """A non-gaussian shape skips the time-to-eps study by default and refuses it asked for."""
    out = tmp_path / "s.csv"
    args = ["bench", "sdca", "--shape", "delicious", "--n", "60", "--d", "10", "--m", "6"]
    args += ["--epochs", "2", "--method", "svm_ml:1"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(out)) == 1 and not (tmp_path / "sdca_convergence.csv").exists()
    res = CliRunner().invoke(app, [*args, "--converge", "--out", str(out)])
    assert res.exit_code != 0 and "runs on the gaussian shape only" in res.output


def test_bench_sdca_times_a_registered_datasets_real_split(tmp_path, monkeypatch):
    """--dataset times the training split of a registered dataset (here an emotions-like
    Mulan set) found on the $TOPKBENCH_DATA search path: a writable directory first (the
    parsed-data cache goes there), then read-only collections such as ../shared/data and
    its mulan/ folder."""
    import os

    from test_sweep_table7 import _write_emotions_like

    writable, shelf = tmp_path / "cache", tmp_path / "shelf"
    writable.mkdir()
    _write_emotions_like(shelf / "mulan", 80, 20)
    search = os.pathsep.join(map(str, [writable, shelf, shelf / "mulan"]))
    monkeypatch.setenv("TOPKBENCH_DATA", search)
    out = tmp_path / "s.csv"
    res = CliRunner().invoke(app, ["bench", "sdca", "--dataset", "emotions", "--epochs", "1",
                                   "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert set(df["shape"]) == {"emotions"} and set(df["m"]) == {6} and set(df["d"]) == {5}
    assert (df["n"] <= 80).all() and set(df["method"]) == {"svm_ml", "lr_ml"}
    assert list((writable / ".cache").glob("emotions-*.pkl")) and not (shelf / ".cache").exists()
    res = CliRunner().invoke(app, ["bench", "sdca", "--dataset", "emotions", "--n", "10"])
    assert res.exit_code != 0 and "drop --n, --d and --m" in res.output
    res = CliRunner().invoke(app, ["bench", "sdca", "--dataset", "nope"])
    assert res.exit_code != 0 and "Traceback" not in res.output
