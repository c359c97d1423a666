"""SDCA for the multilabel losses SVM^ML, SVM^ML_gamma and LR^ML (TPAMI, 002 §3.3 Props. 5-7;
§5.3 Props. 18-20, eq. (17)), trained through :func:`topkbench.fit`.

Scale: with ``n'`` the number of examples whose label set is neither empty nor complete (the
others carry no ranking constraint and are left out),

    P(W) = lambda/2 ||W||^2 + 1/n' sum_i L(Y_i, W^T x_i),       C = 1/(lambda n'),
    D(A) = lambda (C sum_i -L*(Y_i, -a_i/C) - 1/2 ||X^T A||^2),  W = X^T A,

and cvxpy minimizes ``1/2 ||W||^2 + C sum_i L = P / lambda``.  cvxpy formulations:

* SVM^ML: ``pos(1 + max_Ybar s_j - min_Y s_y)``;
* SVM^ML_gamma: ``L*_gamma = L* + gamma/2 ||.||^2`` (Prop. 6; see
  tests/losses/test_multilabel_losses.py), so ``L_gamma`` is the Moreau envelope
  ``min_w L(w) + ||s - w||^2 / (2 gamma)``: one extra variable per example, minimized jointly
  with W;
* LR^ML: ``log_sum_exp(s) - mean_Y s``.

The dual is recomputed in numpy from A after checking that every block is in the conjugate
domain (S_Y for the SVMs: ``a_Y >= 0``, ``a_Ybar <= 0``, ``sum a_Y = -sum a_Ybar <= C``; for
LR^ML ``q = -a/C + 1_Y/k`` in the simplex), so the certificate does not rely on the kernels.

Also tested: dense/CSR features and labels, Gram mode, singleton label sets against the
multiclass methods (SVM^ML = SVM^Multi, LR^ML = LR^Multi, but smooth SVM^ML_gamma differs from
SVM^Multi_gamma), excluded examples, zero-norm rows, warm starts and input validation.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_reference import (
    cvxpy_primal,
    dense,
    dual_value,
    fit_certified,
    kept_rows,
    make_ml_problem,
    primal_value,
)

import topkbench
from topkbench.errors import ConfigError, InputError
from topkbench.losses.ids import LOSS_SVM_ML
from topkbench.losses.multilabel import update_block_ml

# --- cvxpy --------------------------------------------------------------------------------------

CVXPY_CASES = [
    # method, gamma, C, n, m, seed, sparse
    ("svm_ml", 0.0, 1.0, 16, 4, 1, False),
    ("svm_ml", 0.0, 10.0, 20, 4, 2, True),
    ("svm_ml", 0.5, 1.0, 16, 4, 3, False),
    ("svm_ml", 1.0, 10.0, 12, 4, 4, True),
    ("svm_ml", 1.0, 0.3, 20, 5, 5, False),
    ("lr_ml", 0.0, 1.0, 16, 4, 6, False),
    ("lr_ml", 0.0, 10.0, 12, 4, 7, True),
]


@pytest.mark.parametrize("method,gamma,C,n,m,seed,sparse", CVXPY_CASES)
def test_primal_matches_cvxpy(method, gamma, C, n, m, seed, sparse):
    """Same optimum as cvxpy (1e-6 relative), P >= D with a gap <= eps, and both values
    recomputed outside the solver (P from closed forms at W, D from a domain-checked A)."""
    X, Y = make_ml_problem(n=n, m=m, seed=seed, n_empty=1, n_full=1, zero_rows=(2,), sparse=sparse)
    model = fit_certified(X, Y, method, C=C, gamma=gamma, eps=1e-9, max_epochs=20_000)
    assert model.status == "converged"
    assert model.info["excluded_examples"] == 2
    assert model.primal >= model.dual
    assert 0.0 <= model.relative_gap <= 1e-9
    p_ref, W_ref = cvxpy_primal(X, Y, method, gamma, C)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    if not {"accelerated_from_epoch", "newton_from_epoch"} & model.info.keys():
        # plain SDCA returns W = X^T A; the accelerated phase may return its (better) prox
        # iterate and the Newton phase its own iterate, certified by the same D(A)
        np.testing.assert_allclose(model.W, dense(X).T @ model.A, rtol=0, atol=1e-12)
    P = primal_value(X, Y, model.W, method, gamma, C)
    D = dual_value(X, Y, model.A, method, gamma, C)
    assert P == pytest.approx(model.primal, rel=1e-12)
    assert D == pytest.approx(model.dual, rel=1e-12)
    assert 0.0 <= (P - D) / P <= 1e-8
    # weak duality against cvxpy's (independent) primal point
    assert D <= primal_value(X, Y, W_ref, method, gamma, C) * (1 + 1e-12)


@pytest.mark.parametrize("method, gamma", [("svm_ml", 0.0), ("svm_ml", 0.5), ("lr_ml", 0.0)])
def test_weighted_primal_matches_cvxpy(method, gamma):
    """Sample weights on multilabel examples (trivial label sets still left out)."""
    X, Y = make_ml_problem(n=16, m=4, seed=73, n_empty=1, n_full=1, zero_rows=(2,))
    w = np.random.default_rng(74).uniform(0.1, 10.0, size=16)
    model = fit_certified(X, Y, method, C=2.0, gamma=gamma, eps=1e-9, max_epochs=50_000,
                          sample_weight=w)  # fmt: skip
    assert model.status == "converged" and model.info["excluded_examples"] == 2
    p_ref, _ = cvxpy_primal(X, Y, method, gamma, 2.0, weights=w)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert model.dual <= p_ref * (1 + 1e-9)


@settings(max_examples=20)
@given(
    method=st.sampled_from(["svm_ml", "lr_ml"]),
    smooth=st.booleans(),
    gamma=st.sampled_from([0.05, 0.5, 2.0]),
    log_C=st.floats(-1.0, 1.0),
    n=st.integers(5, 14),
    d=st.integers(1, 3),
    m=st.integers(2, 5),
    seed=st.integers(0, 2**16),
    n_trivial=st.integers(0, 2),
    n_zero=st.integers(0, 2),
)
def test_random_tiny_problems_match_cvxpy(
    method, smooth, gamma, log_C, n, d, m, seed, n_trivial, n_zero
):
    """As above on random shapes (m = 2 included), C, gamma, trivial label sets and zero rows."""
    gamma = gamma if smooth and method == "svm_ml" else 0.0
    C = 10.0**log_C
    X, Y = make_ml_problem(
        n=n, d=d, m=m, seed=seed, n_empty=n_trivial, n_full=n_trivial // 2,
        zero_rows=tuple(range(n - n_zero, n)),
    )  # fmt: skip
    model = fit_certified(X, Y, method, C=C, gamma=gamma, eps=1e-9, max_epochs=50_000)
    assert model.info.get("excluded_examples", 0) == n_trivial + n_trivial // 2
    p_ref, _ = cvxpy_primal(X, Y, method, gamma, C)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    D = dual_value(X, Y, model.A, method, gamma, C)
    assert D == pytest.approx(model.dual, rel=1e-12)


def test_tiny_gamma_gap_is_not_negative():
    """D <= P at every iterate (the gap is the certificate), even where the update divides by
    the tiny K + gamma/C (large features, tiny C and gamma)."""
    X, Y = make_ml_problem(n=20, m=4, seed=8, zero_rows=(3,))
    model = topkbench.fit(
        1000.0 * X, Y, "svm_ml", C=1e-4, gamma=1e-8, eps=1e-10, max_epochs=3000, warn=False
    )
    assert min(p.relative_gap for p in model.trace) >= -1e-14


# --- input forms and kernel mode ---------------------------------------------------------------


@pytest.mark.parametrize("method,gamma", [("svm_ml", 0.0), ("svm_ml", 0.5), ("lr_ml", 0.0)])
def test_dense_csr_and_label_forms_agree(method, gamma):
    """Dense or CSR features, dense int / bool / CSR indicators: the same run (same
    permutations) and so the same A up to rounding.  Plain SDCA throughout: the nonsmooth
    problem's dual optimum is not unique, and a Newton phase may end on another one."""
    X, Y = make_ml_problem(n=16, m=4, seed=11, zero_rows=(5,))
    kw = dict(C=1.0, gamma=gamma, eps=1e-10, max_epochs=20_000, accelerate="never")
    ref = fit_certified(X, Y, method, **kw)
    variants = [
        (sp.csr_matrix(X), Y),
        (X, Y.astype(bool)),
        (X, sp.csr_matrix(Y)),
        (sp.csr_matrix(X), sp.csr_matrix(Y.astype(np.float64))),
    ]
    for Xv, Yv in variants:
        model = fit_certified(Xv, Yv, method, **kw)
        np.testing.assert_allclose(model.A, ref.A, rtol=0, atol=1e-12)
        assert model.primal == pytest.approx(ref.primal, rel=1e-12)
        assert model.info == ref.info


@pytest.mark.parametrize("method,gamma", [("svm_ml", 0.0), ("svm_ml", 1.0), ("lr_ml", 0.0)])
def test_gram_mode_matches_linear_mode(method, gamma):
    """fit(None, Y, K=X X^T) reaches the linear-mode optimum (to the sum of the two gaps), with
    excluded examples sliced out of K, and K A = X W on the training set."""
    X, Y = make_ml_problem(n=16, m=4, seed=12, n_empty=2, n_full=1, zero_rows=(4,))
    kw = dict(C=2.0, gamma=gamma, eps=1e-11, max_epochs=20_000)
    lin = fit_certified(X, Y, method, **kw)
    ker = fit_certified(None, Y, method, K=X @ X.T, **kw)
    assert ker.W is None and ker.info["excluded_examples"] == 3
    gaps = (lin.primal - lin.dual) + (ker.primal - ker.dual)
    assert abs(lin.primal - ker.primal) <= gaps + 1e-14 * lin.primal
    assert lin.primal == pytest.approx(ker.primal, rel=1e-9)
    D = dual_value(X, Y, ker.A, method, gamma, 2.0)
    assert D == pytest.approx(ker.dual, rel=1e-12)
    np.testing.assert_allclose(ker.decision_function(K=X @ X.T), X @ (X.T @ ker.A), atol=1e-12)


# --- singleton label sets -----------------------------------------------------------------------


def singleton_problem(seed=21, n=18, m=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.concatenate([np.arange(m), rng.integers(0, m, size=n - m)])
    rng.shuffle(y)
    return X, y


@pytest.mark.parametrize("ml,multi", [("svm_ml", "svm_multi"), ("lr_ml", "lr_multi")])
def test_singletons_reduce_to_multiclass(ml, multi):
    """|Y_i| = 1: SVM^ML is SVM^Multi and LR^ML is LR^Multi (Prop. 5, Prop. 7), so the optima
    coincide; 1-D labels and the equivalent one-hot indicator give the same multilabel run."""
    X, y = singleton_problem()
    kw = dict(C=2.0, eps=1e-10, max_epochs=20_000)
    ref = fit_certified(X, y, multi, **kw)
    model = fit_certified(X, y, ml, **kw)
    assert model.primal == pytest.approx(ref.primal, rel=1e-8)
    assert "excluded_examples" not in model.info
    onehot = np.eye(4, dtype=np.int64)[y]
    same = fit_certified(X, onehot, ml, **kw)
    np.testing.assert_array_equal(same.A, model.A)


def test_singleton_smooth_svm_ml_differs_from_smooth_svm_multi():
    """gamma = 1: SVM^ML_gamma smooths v_y too (tests/losses/test_multilabel_losses.py), so its
    loss is pointwise <= SVM^Multi_gamma's and the optima separate, certified by the gaps:
    P*_ML <= P_ML < D_Multi <= P*_Multi."""
    X, y = singleton_problem()
    kw = dict(C=2.0, gamma=1.0, eps=1e-10, max_epochs=20_000)
    multi = fit_certified(X, y, "svm_multi", **kw)
    ml = fit_certified(X, y, "svm_ml", **kw)
    assert ml.primal < multi.dual
    assert (multi.dual - ml.primal) / multi.primal > 1e-3


# --- excluded examples, zero-norm rows, warm start -----------------------------------------------


@pytest.mark.parametrize("method,gamma", [("svm_ml", 0.0), ("svm_ml", 0.5), ("lr_ml", 0.0)])
def test_excluded_examples(method, gamma):
    """Empty and complete label sets are counted, keep dual rows 0, and the model is the one
    trained on the other rows (same n', hence same C scale, same permutations)."""
    X, Y = make_ml_problem(n=18, m=4, seed=13, n_empty=2, n_full=2)
    perm = np.random.default_rng(0).permutation(18)  # spread the excluded rows around
    X, Y = X[perm], Y[perm]
    kw = dict(C=1.0, gamma=gamma, eps=1e-10, max_epochs=20_000)
    model = fit_certified(X, Y, method, **kw)
    rows = kept_rows(Y)
    excluded = np.setdiff1d(np.arange(18), rows)
    assert model.info["excluded_examples"] == excluded.size == 4
    assert not model.A[excluded].any()
    sub = fit_certified(X[rows], Y[rows], method, **kw)
    assert "excluded_examples" not in sub.info
    np.testing.assert_allclose(model.A[rows], sub.A, rtol=0, atol=1e-13)
    np.testing.assert_allclose(model.W, sub.W, rtol=0, atol=1e-13)
    assert model.primal == pytest.approx(sub.primal, rel=1e-13)
    assert model.dual == pytest.approx(sub.dual, rel=1e-13)


@pytest.mark.parametrize("method", ["svm_ml", "lr_ml"])
def test_zero_norm_rows_do_not_block_convergence(method):
    """x_i = 0 with gamma = 0: the update has den = 0 (SVM^ML) or alpha = 0 (LR^ML); the block
    must maximize -L* alone so that the gap closes (TPAMI's Prop. 18 divides by |x_i|^2)."""
    X, Y = make_ml_problem(n=16, m=4, seed=14, n_empty=0, n_full=0, zero_rows=(0, 3, 7))
    model = fit_certified(X, Y, method, C=1.0, eps=1e-9, max_epochs=20_000)
    assert model.converged and model.relative_gap <= 1e-9
    D = dual_value(X, Y, model.A, method, 0.0, 1.0)
    assert D == pytest.approx(model.dual, rel=1e-12)
    for i in (0, 3, 7):
        mask = Y[i].astype(bool)
        a = model.A[i]
        if method == "svm_ml":  # -L* = sum a_Y / C is maximal (= 1) on the radius
            assert a[mask].sum() == pytest.approx(1.0, rel=1e-12)
        else:  # v = grad L(0) = 1/m - 1_Y/k
            np.testing.assert_allclose(-a, 1.0 / 4 - mask / mask.sum(), atol=1e-12)


@pytest.mark.parametrize("method,gamma", [("svm_ml", 0.0), ("svm_ml", 0.5), ("lr_ml", 0.0)])
def test_warm_start_reaches_the_cold_optimum(method, gamma):
    """fit(C=2, warm_start=model at C=1) converges to the cold C=2 optimum (excluded rows in the
    data: the warm-start A has all n rows); a (C_old, A_old) pair works the same."""
    X, Y = make_ml_problem(n=16, m=4, seed=15, zero_rows=(6,))
    kw = dict(gamma=gamma, eps=1e-10, max_epochs=20_000)
    first = fit_certified(X, Y, method, C=1.0, **kw)
    cold = fit_certified(X, Y, method, C=2.0, **kw)
    warm = fit_certified(X, Y, method, C=2.0, warm_start=first, **kw)
    pair = fit_certified(X, Y, method, C=2.0, warm_start=(1.0, first.A), **kw)
    for model in (warm, pair):
        assert model.primal == pytest.approx(cold.primal, rel=1e-8)
        assert model.info["excluded_examples"] == 2
    np.testing.assert_array_equal(warm.A, pair.A)
    # the rescaled dual C_new/C_old * A_old is feasible and starts closer than A = 0
    assert warm.trace[0].relative_gap < cold.trace[0].relative_gap


# --- tiny C |x_i|^2: the entries ~1/K of the projected blocks must not swamp the answer ~C ------


def test_svm_ml_update_with_tiny_norm_reaches_the_radius():
    """One block update from a = 0, W = 0: maximizing sum_Y a_y - K/2 ||a||^2 over S_Y(C)
    (scale P/lambda) puts the block on the radius (value ~C versus 0 at a = 0), by symmetry
    at a_Y = C/k, a_Ybar = -C/(m-k)."""
    m, C, K = 4, 1e-4, 1e-16
    labels = np.array([0, 2], dtype=np.int64)
    out = np.empty(m)
    update_block_ml(
        LOSS_SVM_ML, labels, np.zeros(m), np.zeros(m), K, C, 0.0, out, np.empty(m),
        np.empty(m), np.empty(m, np.int64), np.full(1, np.nan), 0, np.zeros(m, np.bool_),
    )  # fmt: skip
    np.testing.assert_allclose(out, C / 2 * np.array([1.0, -1.0, 1.0, -1.0]), rtol=1e-9)


def test_svm_ml_converges_for_tiny_feature_norms():
    """X scaled by 1e-6 (C |x_i|^2 ~ 3e-16), C = 1e-4: the optimum is W ~ 0 with P ~ 1 and a
    dual on the radius, reached in one exact SDCA epoch.  (Before the blocks were shifted to a
    maximum of 0 before dividing by C |x_i|^2, the solver stalled at a relative gap ~6e-2.)"""
    X, Y = make_ml_problem(n=12, m=4, seed=22, n_empty=0, n_full=0)
    model = topkbench.fit(1e-6 * X, Y, "svm_ml", C=1e-4, eps=1e-6, max_epochs=200, warn=False)
    assert model.converged


def test_smooth_and_lr_ml_converge_for_tiny_feature_norms():
    """Control for the two tests above: with gamma > 0 (den >= gamma/C) or LR^ML (softmax
    limit below alpha = 1e-16) the same data converge at once."""
    X, Y = make_ml_problem(n=12, m=4, seed=22, n_empty=0, n_full=0)
    for method, gamma in (("svm_ml", 1e-3), ("lr_ml", 0.0)):
        model = fit_certified(1e-6 * X, Y, method, C=1e-4, gamma=gamma, eps=1e-9, max_epochs=200)
        assert model.converged and model.epochs <= 2


# --- input validation ---------------------------------------------------------------------------


def test_non_binary_indicator_names_row_and_column():
    X, Y = make_ml_problem(n=8, m=4, seed=16)
    Y = Y.astype(np.float64)
    Y[5, 2] = 2.0
    with pytest.raises(InputError, match=r"0/1.*row 5, column 2"):
        topkbench.fit(X, Y, "svm_ml")
    Y[5, 2] = 0.5
    with pytest.raises(InputError, match=r"row 5, column 2"):
        topkbench.fit(X, sp.csr_matrix(Y), "lr_ml")


@pytest.mark.parametrize("which", ["empty", "complete", "mixed"])
def test_no_usable_example_is_an_input_error(which):
    X, _ = make_ml_problem(n=6, m=3, seed=17)
    Y = np.zeros((6, 3), dtype=np.int64)
    if which == "complete":
        Y[:] = 1
    elif which == "mixed":
        Y[::2] = 1
    with pytest.raises(InputError, match="empty or complete"):
        topkbench.fit(X, Y, "svm_ml")


def test_indicator_passed_to_multiclass_method():
    X, Y = make_ml_problem(n=8, m=4, seed=18)
    for Yv in (Y, sp.csr_matrix(Y)):
        with pytest.raises(InputError, match="1-D"):
            topkbench.fit(X, Yv, "svm_multi")


def test_multilabel_methods_take_no_k():
    X, Y = make_ml_problem(n=8, m=4, seed=19)
    for method in ("svm_ml", "lr_ml"):
        with pytest.raises(ConfigError, match="k=1"):
            topkbench.fit(X, Y, method, k=2)
    with pytest.raises(ConfigError, match="gamma"):
        topkbench.fit(X, Y, "lr_ml", gamma=0.5)


def test_indicator_shape_is_checked():
    X, Y = make_ml_problem(n=8, m=4, seed=20)
    with pytest.raises(InputError, match="label rows"):
        topkbench.fit(X, Y[:7], "svm_ml")
    with pytest.raises(InputError, match="n_classes"):
        topkbench.fit(X, Y, "svm_ml", n_classes=5)
    with pytest.raises(InputError, match="at least 2 classes"):
        topkbench.fit(X, Y[:, :1], "svm_ml")


@pytest.mark.parametrize("gamma,sparse", [(1.0, False), (0.5, True), (0.0, False), (0.0, True)])
def test_newton_on_ill_conditioned_features_matches_cvxpy(gamma, sparse):
    """SVM^ML by Newton's method (its analytic bipartite Hessian; continuation for gamma = 0)
    on badly scaled columns, dense and CSR: cvxpy's optimum, and the certificate's P and D
    recomputed outside the solver."""
    X, Y = make_ml_problem(n=18, m=4, seed=21, n_empty=1, zero_rows=(2,), sparse=sparse)
    scale = np.array([300.0, 1.0, 0.01] + [1.0] * (X.shape[1] - 3))
    X = X @ sp.diags(scale) if sp.issparse(X) else X * scale
    X = sp.csr_matrix(X) if sparse else X
    C = 3.0
    model = fit_certified(X, Y, "svm_ml", C=C, gamma=gamma, eps=1e-6, max_epochs=20_000,
                          accelerate="newton")  # fmt: skip
    assert model.converged and model.info["newton_iterations"] > 0
    p_ref, _ = cvxpy_primal(X, Y, "svm_ml", gamma, C)
    assert model.primal == pytest.approx(p_ref, rel=2e-6)
    assert primal_value(X, Y, model.W, "svm_ml", gamma, C) == pytest.approx(model.primal, rel=1e-12)
    assert dual_value(X, Y, model.A, "svm_ml", gamma, C) == pytest.approx(model.dual, rel=1e-12)
