"""Accelerated SDCA (topkbench.solvers.accelerated) on tiny ill-conditioned problems.

Features with column scales 3e-2 ... 30 (||x||^2 ~ 1e3, against n = 16) make C R^2 / n ~ 100:
the regime of raw real features at large C.  For every SDCA loss the accelerated run must
reach cvxpy's optimum, and its reported (P, D) must bracket that independently known optimum:
the gap is a true bound.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from solvers.test_multilabel_sdca import cvxpy_primal as ml_cvxpy_primal
from solvers.test_multilabel_sdca import dual_value as ml_dual_value
from solvers.test_multilabel_sdca import make_ml_problem
from solvers.test_multilabel_sdca import primal_value as ml_primal_value
from solvers.test_sdca_reference import cvxpy_primal as basic_cvxpy_primal
from solvers.test_sdca_reference import primal_objective as basic_primal_value
from solvers.test_topk_sdca import cvxpy_primal as topk_cvxpy_primal
from solvers.test_topk_sdca import dual_value as topk_dual_value
from solvers.test_topk_sdca import primal_value as topk_primal_value

import topkbench
from topkbench.errors import ConvergenceWarning
from topkbench.gram import rbf_kernel
from topkbench.losses.registry import get_method
from topkbench.solvers.accelerated import condition_number, loss_smoothness
from topkbench.solvers.problem import SDCAProblem
from topkbench.solvers.sdca import solve_sdca

SCALES = np.array([3e-2, 1.0, 30.0])


def ill_conditioned(X, scales=SCALES):
    """Scale the 3 columns by ``scales`` (dense or CSR)."""
    if sp.issparse(X):
        return sp.csr_matrix(X @ sp.diags(scales))
    return X * scales


PHASE_KEY = {"catalyst": "accelerated_from_epoch", "newton": "newton_from_epoch"}


def fit_accelerated(X, y, method, phase="catalyst", **kw):
    """Accelerated (``phase``: Catalyst or Newton) from the first certificate, to a gap of
    1e-9 (3e-7 for the nonsmooth hinges, whose continuation needs gamma ~ eps: still below
    the 1e-6 agreement asked of the optimum)."""
    spec = get_method(method)
    eps = 3e-7 if loss_smoothness(spec.loss_id, kw.get("gamma", 0.0)) == 0.0 else 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = topkbench.fit(X, y, method, eps=eps, max_epochs=400_000, accelerate=phase, **kw)
    assert model.status == "converged"
    assert PHASE_KEY[phase] in model.info  # that phase ran
    if phase == "newton":  # and finished the run itself
        assert not {"accelerated_from_epoch", "plain_from_epoch"} & model.info.keys()
    assert -1e-14 <= model.relative_gap <= eps
    return model


def check_brackets(model, p_ref, p_at_w):
    """cvxpy's optimum to 1e-6, P recomputed at the returned W, and D <= P* <= P."""
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert p_at_w == pytest.approx(model.primal, rel=1e-10)
    assert model.dual <= p_ref * (1 + 1e-7)
    assert model.primal >= p_ref * (1 - 1e-7)


MULTICLASS = [
    # method, k, gamma, C, sparse (the logistic losses at C = 10 with scales 0.1 ... 10, the
    # same C R^2, where cvxpy's exponential-cone solve stays accurate)
    ("svm_multi", 1, 0.0, 1.0, False),
    ("svm_multi", 1, 0.5, 1.0, True),
    ("lr_multi", 1, 0.0, 10.0, False),
    ("svm_ova", 1, 0.0, 1.0, True),
    ("svm_ova", 1, 0.5, 1.0, False),
    ("lr_ova", 1, 0.0, 10.0, False),
    ("topk_svm_alpha", 2, 0.0, 1.0, False),
    ("topk_svm_alpha_pseudo", 2, 0.5, 1.0, True),
    ("topk_svm_beta", 3, 0.0, 1.0, False),
    ("topk_ent", 2, 0.0, 1.0, False),
]


# Newton's written Hessians on D_k's cone faces, which need k >= 3
NEWTON_ONLY = [("topk_svm_alpha", 3, 0.0, 1.0, True)]
NEWTON_CASES = [
    pytest.param(*case, "newton", id=f"{case[0]}-{case[1]}-{case[2]}-newton")
    for case in MULTICLASS + NEWTON_ONLY
]


@pytest.mark.parametrize(
    "method,k,gamma,C,sparse,phase", [(*case, "catalyst") for case in MULTICLASS] + NEWTON_CASES
)
def test_multiclass_reaches_cvxpy_optimum(problem_factory, method, k, gamma, C, sparse, phase):
    X, y = problem_factory(n=16, d=3, m=4, seed=31, zero_rows=(0,), sparse=sparse)
    X = ill_conditioned(X, SCALES if C == 1.0 else np.array([0.1, 1.0, 10.0]))
    model = fit_accelerated(X, y, method, phase, C=C, k=k, gamma=gamma)
    if method.startswith("topk"):
        p_ref, _ = topk_cvxpy_primal(X, y, 4, method, gamma, k, C)
        p_at_w = topk_primal_value(X, y, model.W, method, gamma, k, C)
        assert topk_dual_value(X, y, model.A, method, gamma, k, C) == pytest.approx(
            model.dual, rel=1e-10
        )
    else:
        p_ref, _ = basic_cvxpy_primal(X, y, 4, method, gamma, C)
        p_at_w = basic_primal_value(X, y, model.W, method, gamma, C)
    check_brackets(model, p_ref, p_at_w)


@pytest.mark.parametrize("method,gamma,sparse,phase", [
    ("svm_ml", 0.0, False, "catalyst"), ("svm_ml", 1.0, True, "catalyst"),
    ("lr_ml", 0.0, False, "catalyst"), ("svm_ml", 0.0, True, "newton"),
    ("svm_ml", 1.0, False, "newton"), ("lr_ml", 0.0, True, "newton"),
])  # fmt: skip
def test_multilabel_reaches_cvxpy_optimum(method, gamma, sparse, phase):
    X, Y = make_ml_problem(n=16, m=4, seed=32, sparse=sparse)
    X = ill_conditioned(X)
    model = fit_accelerated(X, Y, method, phase, C=1.0, gamma=gamma)
    p_ref, _ = ml_cvxpy_primal(X, Y, method, gamma, 1.0)
    check_brackets(model, p_ref, ml_primal_value(X, Y, model.W, method, gamma, 1.0))
    assert ml_dual_value(X, Y, model.A, method, gamma, 1.0) == pytest.approx(model.dual, rel=1e-10)


WOODBURY_MULTICLASS = [
    case for case in MULTICLASS + NEWTON_ONLY if case[0].startswith(("svm", "topk_svm"))
]


@pytest.mark.parametrize("method,k,gamma,C,sparse", WOODBURY_MULTICLASS)
def test_woodbury_newton_reaches_cvxpy_optimum(problem_factory, monkeypatch, method, k, gamma,
                                               C, sparse):  # fmt: skip
    """The hinges' Newton phase through the Woodbury system (the dense limit lowered so that
    it applies), dense and CSR, badly scaled: cvxpy's optimum, certified brackets."""
    import topkbench.solvers.plan as plan

    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 1)
    X, y = problem_factory(n=16, d=3, m=4, seed=31, zero_rows=(0,), sparse=sparse)
    X = ill_conditioned(X)
    model = fit_accelerated(X, y, method, "newton", C=C, k=k, gamma=gamma)
    if method.startswith("topk"):
        p_ref, _ = topk_cvxpy_primal(X, y, 4, method, gamma, k, C)
        p_at_w = topk_primal_value(X, y, model.W, method, gamma, k, C)
    else:
        p_ref, _ = basic_cvxpy_primal(X, y, 4, method, gamma, C)
        p_at_w = basic_primal_value(X, y, model.W, method, gamma, C)
    check_brackets(model, p_ref, p_at_w)


@pytest.mark.parametrize("gamma,sparse", [(0.0, False), (0.0, True), (1.0, False)])
def test_woodbury_newton_multilabel_reaches_cvxpy_optimum(monkeypatch, gamma, sparse):
    import topkbench.solvers.plan as plan

    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 1)
    X, Y = make_ml_problem(n=16, m=4, seed=32, sparse=sparse)
    X = ill_conditioned(X)
    model = fit_accelerated(X, Y, "svm_ml", "newton", C=1.0, gamma=gamma)
    p_ref, _ = ml_cvxpy_primal(X, Y, "svm_ml", gamma, 1.0)
    check_brackets(model, p_ref, ml_primal_value(X, Y, model.W, "svm_ml", gamma, 1.0))
    assert ml_dual_value(X, Y, model.A, "svm_ml", gamma, 1.0) == pytest.approx(
        model.dual, rel=1e-10
    )


@pytest.mark.parametrize("method,gamma", [("svm_multi", 0.0), ("lr_multi", 0.0)])
def test_kernel_mode_matches_feature_mode(problem_factory, method, gamma):
    """A linear Gram matrix K = X X^T is the feature problem: same optimum, accelerated."""
    X, y = problem_factory(n=16, d=3, m=4, seed=33)
    X = ill_conditioned(X)
    linear = fit_accelerated(X, y, method, C=1.0, gamma=gamma)
    kernel = fit_accelerated(None, y, method, K=X @ X.T, C=1.0, gamma=gamma)
    assert kernel.primal == pytest.approx(linear.primal, rel=1e-6)
    # the kernel model's scores are K A, from its certified dual
    scores = X @ linear.W
    np.testing.assert_allclose(
        kernel.decision_function(K=X @ X.T), scores, rtol=0, atol=1e-3 * np.abs(scores).max()
    )


def test_rbf_kernel_ill_conditioned(problem_factory):
    X, y = problem_factory(n=16, d=3, m=4, seed=34)
    K = 300.0 * rbf_kernel(X, theta=0.5)  # diag 300: C R^2 = 3e3
    model = fit_accelerated(None, y, "lr_multi", K=K, C=10.0)
    plain = topkbench.fit(None, y, "lr_multi", K=K, C=10.0, eps=1e-9, max_epochs=400_000,
                          accelerate="never")  # fmt: skip
    assert model.primal == pytest.approx(plain.primal, rel=1e-7)


def test_auto_keeps_well_conditioned_runs_plain(problem_factory):
    """accelerate="auto" leaves a problem that plain SDCA solves quickly exactly as it was."""
    X, y = problem_factory(n=40, d=3, m=4, seed=35)
    auto = topkbench.fit(X, y, "lr_multi", C=1.0, eps=1e-6)
    plain = topkbench.fit(X, y, "lr_multi", C=1.0, eps=1e-6, accelerate="never")
    assert "accelerated_from_epoch" not in auto.info
    assert auto.epochs == plain.epochs
    np.testing.assert_array_equal(auto.A, plain.A)


@pytest.mark.parametrize("kernel,phase", [(False, "newton"), (True, "catalyst")])
def test_auto_accelerates_ill_conditioned_runs(problem_factory, kernel, phase):
    """On an ill-conditioned problem "auto" hands over (to Newton at the first certificate on
    features with small d m, to accelerated SDCA in kernel mode) and needs far fewer epochs."""
    X, y = problem_factory(n=40, d=3, m=4, seed=36)
    X = ill_conditioned(X) * 3.0
    data = dict(X=None, K=X @ X.T) if kernel else dict(X=X)
    kw = dict(Y=y, method="lr_multi", C=10.0, eps=1e-6, max_epochs=200_000, warn=False, **data)
    auto = topkbench.fit(**kw)
    assert auto.converged and PHASE_KEY[phase] in auto.info
    if phase == "newton":
        assert auto.info["newton_from_epoch"] == 0
    # plain SDCA given 3x the epochs is still far from eps
    kw["max_epochs"] = 3 * auto.epochs
    plain = topkbench.fit(accelerate="never", **kw)
    assert plain.relative_gap > 100 * kw["eps"]


def test_condition_number_and_smoothness(problem_factory):
    X, y = problem_factory(n=10, d=3, m=4, seed=37)
    X = ill_conditioned(X)
    for name, gamma, mu in [("lr_multi", 0.0, 1.0), ("lr_ova", 0.0, 4.0),
                            ("svm_multi", 0.5, 0.5), ("svm_multi", 0.0, 0.0)]:  # fmt: skip
        loss = get_method(name).loss_id
        assert loss_smoothness(loss, gamma) == mu
        prob = SDCAProblem(X, y, gram=False, n_classes=4, loss_id=loss, k=1)
        r2 = float((X**2).sum(axis=1).max())
        assert condition_number(prob, 2.0, gamma) == pytest.approx(2.0 * r2 / (mu or 1.0))


def test_budget_stop_is_reported_and_warned(problem_factory):
    X, y = problem_factory(n=16, d=3, m=4, seed=38)
    X = ill_conditioned(X)
    with pytest.warns(ConvergenceWarning, match="max_epochs"):
        res = solve_sdca(X, y, n_classes=4, loss_id=get_method("svm_multi").loss_id, C=100.0,
                         eps=1e-12, max_epochs=60, accelerate="catalyst")  # fmt: skip
    assert res.status == "max_epochs" and res.epochs == 60
    assert res.trace[-1].epoch == 60 and res.relative_gap > 1e-12
