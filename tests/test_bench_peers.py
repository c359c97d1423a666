"""``topkbench bench peers`` (ours vs scikit-learn at the same objective): the C mapping is
checked twice -- scikit-learn's objective written out at a random W equals P(W)/lambda, and
every peer's solution at a tight tolerance has our primal within 1e-4 of our certified
optimum -- then the benchmark and its CLI run on tiny sizes, and bad input is refused."""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.special import logsumexp
from typer.testing import CliRunner

from topkbench.api import fit
from topkbench.bench.common import make_gaussian_problem
from topkbench.bench.peers import (
    CERT_LABEL,
    OURS_LABEL,
    PEERS,
    bench_peers,
    peer_fit,
    primal_value,
    require_sklearn,
    sklearn_C,
)
from topkbench.cli import app
from topkbench.errors import ConfigError

pytest.importorskip("sklearn")

N, D, M = 60, 5, 4


@pytest.fixture(scope="module")
def tiny():
    X, y = make_gaussian_problem(N, D, M, seed=3)
    assert np.bincount(y, minlength=M).min() > 0
    return X, y


def sklearn_objective(method: str, X, y, W, C_sk: float) -> float:
    """What scikit-learn / liblinear minimize for each peer, written out from their docs:
    ``1/2 ||w||^2 + C sum_i loss_i`` (multinomial / Crammer-Singer: one problem over the
    whole W; one-vs-rest: summed over the m binary problems with targets +1 for ``c = y``)."""
    S = X @ W
    n, m = S.shape
    sy = S[np.arange(n), y]
    half = 0.5 * float(np.sum(W * W))
    if method == "lr_multi":  # LogisticRegression multinomial: cross entropy of softmax
        return half + C_sk * float(np.sum(logsumexp(S, axis=1) - sy))
    if method == "svm_multi":  # liblinear -s 4: max_m (e_i^m + w_m x_i - w_y x_i), e = 1 - delta
        e = 1.0 - np.eye(m)[y]
        return half + C_sk * float(np.sum(np.max(e + S - sy[:, None], axis=1)))
    Yt = np.where(np.arange(m)[None, :] == y[:, None], 1.0, -1.0)
    total = 0.0
    for c in range(m):  # one binary problem per class, summed
        margin = Yt[:, c] * S[:, c]
        if method == "svm_ova":  # liblinear -s 3 (L1-loss SVC)
            loss = np.maximum(0.0, 1.0 - margin)
        else:  # liblinear -s 0 / -s 7 (logistic)
            loss = np.logaddexp(0.0, -margin)
        total += 0.5 * float(W[:, c] @ W[:, c]) + C_sk * float(loss.sum())
    return total


@pytest.mark.parametrize("method", list(PEERS))
def test_sklearn_objective_is_P_over_lambda(tiny, method):
    X, y = tiny
    C = 0.37
    lam = 1.0 / (C * N)
    W = np.random.default_rng(1).normal(scale=0.5, size=(D, M))
    ours = primal_value(X, y, W, method, C) / lam
    theirs = sklearn_objective(method, X, y, W, sklearn_C(method, C))
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_written_out_losses_match_sklearn_metrics(tiny):
    """The multiclass losses above agree with scikit-learn's own metrics (Crammer-Singer
    hinge and multinomial log loss), so the test's formulas are scikit-learn's."""
    from sklearn.metrics import hinge_loss, log_loss

    X, y = tiny
    W = np.random.default_rng(2).normal(scale=0.5, size=(D, M))
    S = X @ W
    zero = np.zeros((D, M))
    n = len(y)
    cs = sklearn_objective("svm_multi", X, y, W, 1.0) - 0.5 * np.sum(W * W)
    assert cs == pytest.approx(n * hinge_loss(y, S, labels=np.arange(M)), rel=1e-12)
    P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
    ce = sklearn_objective("lr_multi", X, y, W, 1.0) - 0.5 * np.sum(W * W)
    assert ce == pytest.approx(n * log_loss(y, P, labels=np.arange(M)), rel=1e-10)
    assert sklearn_objective("lr_multi", X, y, zero, 1.0) == pytest.approx(n * math.log(M))


@pytest.mark.parametrize(
    "spec", [s for specs in PEERS.values() for s in specs], ids=lambda s: f"{s.method}-{s.key}"
)
def test_sklearn_solution_reaches_our_certified_optimum(tiny, spec):
    """Same C -> same minimizer: the peer at a tight tolerance is within 1e-4 of our P*."""
    X, y = tiny
    C = 0.5
    model = fit(X, y, spec.method, C=C, eps=1e-10, max_epochs=20_000, warn=False)
    assert model.relative_gap <= 1e-9
    budget = 1e-10 if spec.budget_kind == "tol" else 20_000
    W, seconds, n_iter, _ = peer_fit(spec, X, y, M, C, budget)
    assert W.shape == (D, M) and seconds > 0 and n_iter >= 1
    P = primal_value(X, y, W, spec.method, C)
    assert P >= model.dual - 1e-12 * abs(model.dual)  # nobody beats a certified dual
    assert (P - model.primal) / abs(model.primal) <= 1e-4


def test_bench_peers_rows(tiny):
    rows, points = bench_peers(
        n=150, d=6, m=4, C=1.0, separation=1.0, cert_eps=1e-10, peer_seconds=2.0, cert_seconds=20.0
    )
    assert [r.solver for r in rows].count(OURS_LABEL) == 4
    assert len(rows) == 4 + sum(len(s) for s in PEERS.values())
    by_method = {}
    for r in rows:
        by_method.setdefault(r.method, []).append(r)
    for method, rs in by_method.items():
        ours = rs[0]
        assert ours.solver == OURS_LABEL and ours.reached and ours.ratio_to_ours == 1.0
        assert ours.cert_gap <= 1e-8 and ours.P_ref <= ours.P_star_ours
        assert ours.certified_seconds >= ours.seconds > 0
        for r in rs[1:]:
            assert r.C_sklearn == r.C == 1.0 and r.fits >= 1
            assert r.rel_subopt >= -r.cert_gap - 1e-12  # above our certified dual
            if r.reached:
                assert r.rel_subopt <= r.tol
                assert r.ratio_to_ours == pytest.approx(r.seconds / ours.seconds)
            else:
                assert math.isnan(r.ratio_to_ours)
        traced = {p.solver for p in points if p.method == method}
        assert traced == {r.solver for r in rs} | {CERT_LABEL}
        # our row is the run to eps = tol (it stops there), not the certification run
        assert ours.budget == max(p.budget for p in points if p.solver == OURS_LABEL
                                  and p.method == method)  # fmt: skip
        assert math.isfinite(ours.certified_seconds)
    # a peer whose budget stops after one fit reports its best point, "not reached"
    rows, _ = bench_peers(
        n=150, d=6, m=4, C=1.0, separation=1.0, methods=("softmax",), peer_seconds=1e-9, refine=0
    )
    for r in rows[1:]:
        assert r.method == "lr_multi" and r.fits == 1 and not r.reached
        assert r.rel_subopt > r.tol and math.isnan(r.ratio_to_ours)


def test_bench_peers_cli_smoke(tmp_path):
    out = tmp_path / "peers.csv"
    args = ["bench", "peers", "--n", "120", "--d", "5", "--m", "4", "--peer-seconds", "2"]
    args += ["--C", "1", "--separation", "1"]
    res = CliRunner().invoke(
        app, [*args, "--method", "svm_multi", "--method", "lr_ova", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "ratio to ours" in res.output and "crammer_singer" in res.output
    df = pd.read_csv(out)
    assert set(df["method"]) == {"svm_multi", "lr_ova"}
    assert (df["solver"] == OURS_LABEL).sum() == 2
    assert (tmp_path / "peers.png").stat().st_size > 10_000
    trace = pd.read_csv(tmp_path / "peers_trace.csv")
    assert set(trace["solver"]) == set(df["solver"]) | {CERT_LABEL}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--C", "0"], "C must be in (0, inf)"),
        (["--C", "-1"], "C must be in (0, inf)"),
        (["--m", "2"], "m must be an integer >= 3"),
        (["--tol", "2"], "tol must be in (0, 1)"),
        (["--method", "topk_ent"], "Available methods are: lr_multi, svm_multi"),
        (["--method", "nonsense"], "unknown method 'nonsense'"),
    ],
)
def test_bench_peers_bad_input(tmp_path, extra, message):
    args = ["bench", "peers", "--n", "50", "--d", "3", "--m", "4", "--out", str(tmp_path / "p.csv")]
    res = CliRunner().invoke(app, [*args, *extra])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert not (tmp_path / "p.csv").exists()


def test_missing_sklearn_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn` fail
    with pytest.raises(ConfigError, match="needs scikit-learn") as info:
        require_sklearn()
    assert "pip install" in info.value.hint
    with pytest.raises(ConfigError, match="needs scikit-learn"):
        bench_peers(n=50, d=3, m=4)
