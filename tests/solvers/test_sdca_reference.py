"""SDCA against independent references (STYLE.md "Tests"; DESIGN §2, §4.3, §5).

(a) every convex loss on tiny problems against a cvxpy (CLARABEL) solution of the primal,
(b) SVM^Multi, SVM^OVA, LR^Multi and LR^OVA against liblinear / scikit-learn at the same C,
(c) the exact trajectory of the numba SDCA against a slow numpy SDCA given the same
    permutations, with block updates implemented independently (see ``reference_block``).

Scale: P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i), C = 1/(lambda n); liblinear and
scikit-learn minimise 1/2 ||W||^2 + C sum_i L = P / lambda.
"""

from __future__ import annotations

import math
import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.special as sps
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import SDCA_METHODS, V_reference
from scipy.optimize import brentq

import topkbench
from topkbench.errors import ConvergenceWarning
from topkbench.losses.registry import get_method
from topkbench.solvers.sdca import solve_sdca

# --- an independent primal objective --------------------------------------------------------


def ytilde_matrix(y, m):
    Yt = -np.ones((y.shape[0], m))
    Yt[np.arange(y.shape[0]), y] = 1.0
    return Yt


def primal_objective(X, y, W, method, gamma, C, weights=None):
    """P(W) of DESIGN §2 in numpy (no topkbench code), with optional sample weights."""
    n = X.shape[0]
    losses = example_losses(X, y, W, method, gamma)
    if weights is not None:
        losses = losses * weights
    lam = 1.0 / (C * n)
    return lam / 2 * float(np.sum(W * W)) + float(losses.mean())


def example_losses(X, y, W, method, gamma):
    """L(y_i, W^T x_i) for every example, in numpy."""
    n, m = X.shape[0], W.shape[1]
    S = np.asarray(X @ W)
    rows = np.arange(n)
    if method == "svm_multi":
        Z = 1.0 + S - S[rows, y][:, None]
        Z[rows, y] = -np.inf
        if gamma == 0:
            losses = np.maximum(Z.max(axis=1), 0.0)
        else:
            losses = np.array([smooth_max_hinge(np.delete(Z[i], y[i]), gamma) for i in range(n)])
    elif method == "lr_multi":
        losses = sps.logsumexp(S, axis=1) - S[rows, y]
    elif method == "svm_ova":
        R = 1.0 - ytilde_matrix(y, m) * S
        if gamma == 0:
            losses = np.maximum(R, 0.0).sum(axis=1)
        else:
            H = np.where(R <= 0, 0.0, np.where(R < gamma, R**2 / (2 * gamma), R - gamma / 2))
            losses = H.sum(axis=1)
    else:
        losses = np.logaddexp(0.0, -ytilde_matrix(y, m) * S).sum(axis=1)
    return losses


def smooth_max_hinge(z, gamma):
    """max_{v >= 0, <1,v> <= 1} <z, v> - gamma/2 |v|^2 (TPAMI Prop. 2, k = 1), via sorting."""
    pos = np.maximum(z, 0.0)
    if pos.sum() <= gamma:
        return pos @ pos / (2 * gamma)
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    ks = np.arange(1, z.shape[0] + 1)
    k = ks[u - (css - gamma) / ks > 0][-1]
    t = (css[k - 1] - gamma) / k
    p = np.maximum(z - t, 0.0)
    return t + p @ p / (2 * gamma)


def make_tiny(n, d, m, seed, *, zero_rows=(), sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[rng.random(size=(n, d)) < 0.25] = 0.0
    for i in zero_rows:
        X[i] = 0.0
    y = np.concatenate([np.arange(m), rng.integers(0, m, size=n - m)])
    rng.shuffle(y)
    return (sp.csr_matrix(X) if sparse else X), y.astype(np.int64)


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


# --- (a) cvxpy -------------------------------------------------------------------------------


def cvxpy_primal(X, y, m, method, gamma, C, *, allow_inaccurate=False, weights=None):
    """Solve min 1/2 ||W||^2 + C sum_i w_i L(y_i, W^T x_i) (w = 1 without ``weights``);
    return (P(W*) in the P scale, W*)."""
    X = dense(X)
    n, d = X.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    W = cp.Variable((d, m))
    S = X @ W
    if method == "svm_multi":
        terms = []
        for c in range(m):
            rows = np.flatnonzero(y == c)
            if rows.size == 0:
                continue
            # margins z_j = 1 + s_j - s_c for j != c
            M = np.zeros((m, m - 1))
            for p, j in enumerate(j for j in range(m) if j != c):
                M[j, p] = 1.0
                M[c, p] = -1.0
            Z = S[rows, :] @ M + 1.0
            wr = w[rows]
            if gamma == 0:
                terms.append(cp.sum(cp.multiply(wr, cp.pos(cp.max(Z, axis=1)))))
            else:
                # Moreau envelope: L_gamma(z) = min_u max(0, max_j u_j) + |z - u|^2 / (2 gamma),
                # whose conjugate is that of max(0, max u) (the simplex indicator) plus
                # gamma/2 |v|^2 -- exactly TPAMI Prop. 2 with k = 1
                U = cp.Variable((rows.size, m - 1))
                terms.append(
                    cp.sum(cp.multiply(wr, cp.pos(cp.max(U, axis=1))))
                    + cp.sum(cp.multiply(wr[:, None], cp.square(Z - U))) / (2 * gamma)
                )
        loss = cp.sum(cp.hstack(terms))
    elif method == "lr_multi":
        onehot = np.eye(m)[y]
        loss = cp.sum(cp.multiply(w, cp.log_sum_exp(S, axis=1))) - cp.sum(
            cp.multiply(w[:, None] * onehot, S)
        )
    elif method == "svm_ova":
        R = 1.0 - cp.multiply(ytilde_matrix(y, m), S)
        if gamma == 0:
            loss = cp.sum(cp.multiply(w[:, None], cp.pos(R)))
        else:
            # huber(r, g) = r^2 (|r| <= g), 2 g |r| - g^2 else; / (2 g) gives the smoothed hinge
            loss = cp.sum(cp.multiply(w[:, None], cp.huber(cp.pos(R), gamma))) / (2 * gamma)
    else:
        loss = cp.sum(cp.multiply(w[:, None], cp.logistic(-cp.multiply(ytilde_matrix(y, m), S))))
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(W) + C * loss))
    problem.solve(
        solver=cp.CLARABEL,
        tol_gap_abs=1e-11,
        tol_gap_rel=1e-11,
        tol_feas=1e-11,
        max_iter=500,
    )
    accepted = (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) if allow_inaccurate else (cp.OPTIMAL,)
    assert problem.status in accepted, problem.status
    if problem.status != cp.OPTIMAL:
        return None, W.value
    lam = 1.0 / (C * n)
    return lam * problem.value, W.value


CVXPY_CASES = [
    # method, gamma, C, n, d, m, seed, zero_rows, sparse
    ("svm_multi", 0.0, 1.0, 30, 3, 4, 1, (), False),
    ("svm_multi", 0.0, 10.0, 24, 4, 3, 2, (0,), True),
    ("svm_multi", 0.5, 1.0, 30, 3, 4, 3, (4,), False),
    ("svm_multi", 0.5, 0.1, 40, 2, 5, 4, (), True),
    ("lr_multi", 0.0, 1.0, 30, 3, 4, 5, (), False),
    ("lr_multi", 0.0, 10.0, 24, 4, 3, 6, (2, 7), True),
    ("svm_ova", 0.0, 1.0, 30, 3, 4, 7, (1,), False),
    ("svm_ova", 0.0, 0.1, 40, 4, 5, 8, (), True),
    ("svm_ova", 0.5, 1.0, 30, 3, 4, 9, (), False),
    ("svm_ova", 0.5, 10.0, 20, 2, 3, 10, (3,), True),
    ("lr_ova", 0.0, 1.0, 30, 3, 4, 11, (0,), False),
    ("lr_ova", 0.0, 10.0, 24, 4, 3, 12, (), True),
]


@pytest.mark.parametrize("method,gamma,C,n,d,m,seed,zero_rows,sparse", CVXPY_CASES)
def test_primal_matches_cvxpy(method, gamma, C, n, d, m, seed, zero_rows, sparse):
    X, y = make_tiny(n, d, m, seed, zero_rows=zero_rows, sparse=sparse)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = topkbench.fit(X, y, method, C=C, gamma=gamma, eps=1e-9, max_epochs=200_000)
    assert model.status == "converged"
    assert -1e-14 <= model.relative_gap <= 1e-8
    p_ref, W_ref = cvxpy_primal(X, y, m, method, gamma, C)
    # same problem, same value; and weak duality against an independent primal point
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert model.primal == pytest.approx(
        primal_objective(X, y, model.W, method, gamma, C), rel=1e-12
    )
    assert model.dual <= primal_objective(X, y, W_ref, method, gamma, C) * (1 + 1e-12)


def tiny_weights(n, seed):
    """Positive weights over two decades, as class or importance weights make them."""
    return np.random.default_rng(seed).uniform(0.1, 10.0, size=n)


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
@pytest.mark.parametrize("sparse", [False, True])
def test_weighted_primal_matches_cvxpy(method, gamma, sparse):
    """P(W) = lambda/2 ||W||^2 + 1/n sum_i w_i L_i: cvxpy's optimum to 1e-6, D <= P* <= P."""
    X, y = make_tiny(24, 3, 4, 61, zero_rows=(5,), sparse=sparse)
    w = tiny_weights(24, 62)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = topkbench.fit(X, y, method, C=2.0, gamma=gamma, eps=1e-9, max_epochs=200_000,
                              sample_weight=w)  # fmt: skip
    assert model.status == "converged" and model.info["weighted"]
    p_ref, W_ref = cvxpy_primal(X, y, 4, method, gamma, 2.0, weights=w)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert model.primal == pytest.approx(
        primal_objective(X, y, model.W, method, gamma, 2.0, w), rel=1e-12
    )
    assert model.dual <= primal_objective(X, y, W_ref, method, gamma, 2.0, w) * (1 + 1e-12)


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
def test_zero_weight_is_leaving_the_example_out(method, gamma):
    X, y = make_tiny(20, 3, 4, 63)
    w = tiny_weights(20, 64)
    w[[2, 9]] = 0.0
    keep = w > 0
    a = topkbench.fit(X, y, method, C=1.0, gamma=gamma, eps=1e-9, max_epochs=200_000,
                      sample_weight=w)  # fmt: skip
    b = topkbench.fit(X[keep], y[keep], method, C=1.0, gamma=gamma, eps=1e-9,
                      max_epochs=200_000, sample_weight=w[keep])  # fmt: skip
    np.testing.assert_array_equal(a.W, b.W)
    assert a.primal == b.primal and a.info["excluded_examples"] == 2
    assert not a.A[~keep].any()


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
def test_integer_weights_are_repetitions(method, gamma):
    """Weight 2 is the example twice: the same objective C sum_i w_i L + 1/2 ||W||^2 (P times
    the row count), the same optimum."""
    X, y = make_tiny(18, 3, 4, 69)
    w = np.random.default_rng(70).integers(1, 4, size=18)
    rep = np.repeat(np.arange(18), w)
    a = topkbench.fit(X, y, method, C=1.0, gamma=gamma, eps=1e-11, max_epochs=200_000,
                      sample_weight=w)  # fmt: skip
    b = topkbench.fit(X[rep], y[rep], method, C=1.0, gamma=gamma, eps=1e-11, max_epochs=200_000)
    assert a.primal * 18 == pytest.approx(b.primal * rep.size, rel=1e-9)
    np.testing.assert_allclose(a.W, b.W, atol=1e-4 * np.abs(b.W).max())


def test_warm_start_across_weights_and_k():
    """A warm start rescales each block by C w_i / (C_old w_old_i), feasible for new weights;
    a model of another k (another dual domain) is refused."""
    from topkbench.errors import ConfigError

    X, y = make_tiny(30, 3, 4, 75)
    w = np.where(y == 0, 0.1, 2.0)
    w[3] = 0.0
    cold = topkbench.fit(X, y, "svm_multi", C=2.0, eps=1e-9, max_epochs=100_000, sample_weight=w)
    for start_w in (None, tiny_weights(30, 76)):
        start = topkbench.fit(X, y, "svm_multi", C=1.0, eps=1e-6, sample_weight=start_w)
        warm = topkbench.fit(X, y, "svm_multi", C=2.0, eps=1e-9, max_epochs=100_000,
                             sample_weight=w, warm_start=start)  # fmt: skip
        assert warm.status == "converged"
        assert warm.primal == pytest.approx(cold.primal, rel=1e-7)
    start = topkbench.fit(X, y, "topk_svm_alpha", k=2, C=1.0)
    with pytest.raises(ConfigError, match="k = 2; this fit has k = 3"):
        topkbench.fit(X, y, "topk_svm_alpha", k=3, C=1.0, warm_start=start)


def test_balanced_counts_the_classes_present():
    from topkbench.validation import example_weights

    codes = np.array([0, 0, 0, 1])
    w = example_weights(None, "balanced", codes, 5, None, 4)  # classes 2..4 absent
    np.testing.assert_allclose(w, [4 / 6, 4 / 6, 4 / 6, 2.0])


def test_unit_weights_are_the_unweighted_problem():
    X, y = make_tiny(20, 3, 4, 65)
    a = topkbench.fit(X, y, "svm_multi", C=1.0, eps=1e-6)
    b = topkbench.fit(X, y, "svm_multi", C=1.0, eps=1e-6, sample_weight=np.ones(20))
    np.testing.assert_array_equal(a.W, b.W)
    assert "weighted" not in b.info


def test_balanced_class_weights():
    X, y = make_tiny(30, 3, 3, 66)
    y[:18] = 0  # class 0 dominates
    counts = np.bincount(y, minlength=3)
    model = topkbench.fit(X, y, "lr_multi", C=1.0, eps=1e-9, class_weight="balanced")
    w = (30 / (3 * counts))[y]
    p_ref, _ = cvxpy_primal(X, y, 3, "lr_multi", 0.0, 1.0, weights=w)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    # a dict of class weights combines with sample weights
    sw = tiny_weights(30, 67)
    model = topkbench.fit(X, y, "lr_multi", C=1.0, eps=1e-9, class_weight={1: 3.0},
                          sample_weight=sw)  # fmt: skip
    p_ref, _ = cvxpy_primal(X, y, 3, "lr_multi", 0.0, 1.0, weights=sw * np.where(y == 1, 3, 1))
    assert model.primal == pytest.approx(p_ref, rel=1e-6)


def test_bad_weights_are_refused():
    from topkbench.errors import ConfigError, InputError

    X, y = make_tiny(10, 2, 3, 68)
    with pytest.raises(InputError, match="sample_weight must be 10 numbers"):
        topkbench.fit(X, y, "svm_multi", sample_weight=np.ones(9))
    with pytest.raises(InputError, match=r"finite and >= 0; got -1.0 at example 3"):
        topkbench.fit(X, y, "svm_multi", sample_weight=np.r_[np.ones(3), -1.0, np.ones(6)])
    with pytest.raises(InputError, match="every example has weight zero"):
        topkbench.fit(X, y, "svm_multi", sample_weight=np.zeros(10))
    with pytest.raises(ConfigError, match="class_weight must be one of balanced"):
        topkbench.fit(X, y, "svm_multi", class_weight="auto")
    with pytest.raises(ConfigError, match="not a training class"):
        topkbench.fit(X, y, "svm_multi", class_weight={7: 2.0})
    with pytest.raises(ConfigError, match="Frank-Wolfe solver has no weighted form"):
        topkbench.fit(X, y, "wtopk_svm", k=1, fw="away", sample_weight=np.ones(10) * 2)


@settings(max_examples=60, derandomize=True)
@given(
    method=st.sampled_from(["svm_multi", "lr_multi", "svm_ova", "lr_ova"]),
    smooth=st.booleans(),
    gamma=st.floats(0.1, 2.0),
    log_C=st.floats(-2.0, 2.0),
    n=st.integers(4, 15),
    d=st.integers(1, 4),
    m=st.integers(2, 5),
    seed=st.integers(0, 2**16),
    n_zero=st.integers(0, 2),
    sparse=st.booleans(),
)
def test_random_tiny_problems_match_cvxpy(
    method, smooth, gamma, log_C, n, d, m, seed, n_zero, sparse
):
    if method in ("lr_multi", "lr_ova") or not smooth:
        gamma = 0.0
    m = min(m, n)
    C = 10.0**log_C
    X, y = make_tiny(n, d, m, seed, zero_rows=tuple(range(n_zero)), sparse=sparse)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = topkbench.fit(X, y, method, C=C, gamma=gamma, eps=1e-9, max_epochs=500_000)
    p_ref, W_ref = cvxpy_primal(X, y, m, method, gamma, C, allow_inaccurate=True)
    if p_ref is not None:
        assert model.primal == pytest.approx(p_ref, rel=1e-6)
    else:
        # CLARABEL gave up short of its tolerance (seen on separable LR problems): its W is
        # still a primal point, so it can only be worse than ours, and bounds our dual
        p_cvx = primal_objective(X, y, W_ref, method, gamma, C)
        assert model.primal <= p_cvx * (1 + 1e-9)
        assert model.dual <= p_cvx * (1 + 1e-12)


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
@pytest.mark.parametrize("sparse", [False, True])
def test_gap_closes_with_zero_norm_rows(method, gamma, sparse):
    """DESIGN §4.3: examples with x_i = 0 get the maximiser of -L*(-a/C) and the gap closes."""
    X, y = make_tiny(20, 3, 4, 21, zero_rows=(0, 1, 2, 3, 9), sparse=sparse)
    model = topkbench.fit(X, y, method, C=2.0, gamma=gamma, eps=1e-10, max_epochs=100_000)
    assert model.status == "converged"
    assert model.relative_gap <= 1e-10
    assert np.all(np.isfinite(model.A))
    # all-zero data: W = 0 and every block sits at the maximiser of -L*
    Xz = np.zeros((6, 2))
    yz = np.array([0, 1, 2, 0, 1, 2])
    model = topkbench.fit(Xz, yz, method, C=1.0, gamma=gamma, eps=1e-12, max_epochs=5)
    assert model.status == "converged"
    assert np.all(model.W == 0.0)
    P0 = primal_objective(Xz, yz, np.zeros((2, 3)), method, gamma, 1.0)
    assert model.primal == pytest.approx(P0, rel=1e-15)
    assert model.dual == pytest.approx(P0, rel=1e-13)


def test_dense_and_csr_give_the_same_model():
    X, y = make_tiny(30, 4, 4, 31, zero_rows=(3,))
    for method, gamma in [("svm_multi", 0.5), ("lr_multi", 0.0), ("lr_ova", 0.0)]:
        a = topkbench.fit(X, y, method, C=1.0, gamma=gamma, eps=1e-6, seed=5)
        b = topkbench.fit(sp.csr_matrix(X), y, method, C=1.0, gamma=gamma, eps=1e-6, seed=5)
        assert a.epochs == b.epochs
        np.testing.assert_allclose(a.A, b.A, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.W, b.W, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["lr_multi", "lr_ova"])
@pytest.mark.parametrize("C", [1e-4, 0.01, 1.0, 1000.0])
@pytest.mark.parametrize("scale", [1.0, 7.0, 1000.0])
def test_root_finding_never_reports_failure(method, C, scale):
    """The softmax / logistic inner roots converge to rounding level for alpha = C |x|^2 from
    ~1e-4 to ~1e9.  Two bugs showed here as root-finding ConvergenceWarnings: a Newton
    step-size test stalling under rounding (C = 10, scale 1), and Newton on the logistic root
    cycling between the ends of its bracket (scale 1000, C = 1)."""
    X, y = make_tiny(20, 3, 4, 5, zero_rows=(1,))
    X = X * scale
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = topkbench.fit(X, y, method, C=C, eps=1e-10, max_epochs=500, warn=False)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert -1e-14 <= model.relative_gap < 1.0


@pytest.mark.parametrize("gamma", [0.0, 1e-6])
@pytest.mark.parametrize("C", [1e-3, 1.0])
def test_dual_stays_feasible_for_tiny_feature_norms(gamma, C):
    """With |x_i|^2 C tiny, b = (q + 1)/|x_i|^2 is huge and (b - t)_+ overshot the simplex by
    up to 5e-5 relative, giving D > P (relative gap -2e-6 reported as "converged")."""
    X, y = make_tiny(20, 3, 4, 5, zero_rows=(1,))
    X = X * 1e-3
    model = topkbench.fit(X, y, "svm_multi", C=C, gamma=gamma, eps=1e-12, max_epochs=30, warn=False)
    assert min(p.relative_gap for p in model.trace) >= -1e-14
    x = -model.A / C
    for i in range(X.shape[0]):
        xi = np.delete(x[i], y[i])
        assert xi.min() >= 0.0 and xi.sum() <= 1.0 + 1e-15
    assert model.dual <= primal_objective(X, y, model.W, "svm_multi", gamma, C) * (1 + 1e-15)


# --- (b) liblinear / scikit-learn ------------------------------------------------------------


def sklearn_problem(seed):
    return make_tiny(60, 5, 4, seed)


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_svm_multi_matches_liblinear_crammer_singer(C):
    from sklearn.svm import LinearSVC

    X, y = sklearn_problem(41)
    clf = LinearSVC(
        multi_class="crammer_singer", fit_intercept=False, C=C, tol=1e-10, max_iter=1_000_000
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    W_sk = clf.coef_.T
    model = topkbench.fit(X, y, "svm_multi", C=C, eps=1e-9, max_epochs=100_000)
    p_sk = primal_objective(X, y, W_sk, "svm_multi", 0.0, C)
    p_ours = primal_objective(X, y, model.W, "svm_multi", 0.0, C)
    assert p_ours == pytest.approx(p_sk, rel=1e-7)
    assert model.dual <= p_sk * (1 + 1e-12)  # liblinear's point is primal feasible


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_svm_ova_matches_liblinear(C):
    from sklearn.svm import LinearSVC

    X, y = sklearn_problem(42)
    clf = LinearSVC(
        loss="hinge", dual=True, fit_intercept=False, C=C, tol=1e-10, max_iter=1_000_000
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    W_sk = clf.coef_.T
    model = topkbench.fit(X, y, "svm_ova", C=C, eps=1e-9, max_epochs=100_000)
    p_sk = primal_objective(X, y, W_sk, "svm_ova", 0.0, C)
    assert primal_objective(X, y, model.W, "svm_ova", 0.0, C) == pytest.approx(p_sk, rel=1e-7)
    assert model.dual <= p_sk * (1 + 1e-12)


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_lr_multi_matches_sklearn_multinomial(C):
    from sklearn.linear_model import LogisticRegression

    X, y = sklearn_problem(43)
    # lbfgs on > 2 classes is the multinomial (softmax) model; objective 1/2 |W|^2 + C sum loss
    clf = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    W_sk = clf.coef_.T
    assert W_sk.shape == (X.shape[1], 4)
    model = topkbench.fit(X, y, "lr_multi", C=C, eps=1e-9, max_epochs=100_000)
    p_sk = primal_objective(X, y, W_sk, "lr_multi", 0.0, C)
    assert primal_objective(X, y, model.W, "lr_multi", 0.0, C) == pytest.approx(p_sk, rel=1e-7)
    assert model.dual <= p_sk * (1 + 1e-12)
    np.testing.assert_allclose(model.W, W_sk, atol=1e-3 * np.abs(W_sk).max())


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_lr_ova_matches_sklearn_one_vs_rest(C):
    from sklearn.linear_model import LogisticRegression

    X, y = sklearn_problem(44)
    m = 4
    W_sk = np.empty((X.shape[1], m))
    for c in range(m):
        clf = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100_000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf.fit(X, (y == c).astype(int))
        W_sk[:, c] = clf.coef_[0]
    model = topkbench.fit(X, y, "lr_ova", C=C, eps=1e-9, max_epochs=100_000)
    p_sk = primal_objective(X, y, W_sk, "lr_ova", 0.0, C)
    assert primal_objective(X, y, model.W, "lr_ova", 0.0, C) == pytest.approx(p_sk, rel=1e-7)
    assert model.dual <= p_sk * (1 + 1e-12)


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_weighted_svm_multi_matches_liblinear_crammer_singer(C):
    from sklearn.svm import LinearSVC

    X, y = sklearn_problem(45)
    w = np.random.default_rng(46).uniform(0.2, 5.0, size=X.shape[0])
    clf = LinearSVC(
        multi_class="crammer_singer", fit_intercept=False, C=C, tol=1e-10, max_iter=1_000_000
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y, sample_weight=w)
    p_sk = primal_objective(X, y, clf.coef_.T, "svm_multi", 0.0, C, w)
    model = topkbench.fit(X, y, "svm_multi", C=C, eps=1e-9, max_epochs=100_000, sample_weight=w)
    assert primal_objective(X, y, model.W, "svm_multi", 0.0, C, w) == pytest.approx(p_sk, rel=1e-7)
    assert model.dual <= p_sk * (1 + 1e-12)


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_weighted_lr_multi_matches_sklearn(C):
    from sklearn.linear_model import LogisticRegression

    X, y = sklearn_problem(47)
    clf = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100_000,
                             class_weight="balanced")  # fmt: skip
    y = y.copy()
    y[:25] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    model = topkbench.fit(X, y, "lr_multi", C=C, eps=1e-9, max_epochs=100_000,
                          class_weight="balanced")  # fmt: skip
    np.testing.assert_allclose(model.W, clf.coef_.T, atol=1e-4 * np.abs(clf.coef_).max())


# --- (c) exact trajectory against a slow numpy SDCA -----------------------------------------


def simplex_face_threshold_sorted(b, s):
    """tau with sum (b - tau)_+ = s (s > 0), by sorting."""
    u = np.sort(b)[::-1]
    css = np.cumsum(u)
    ks = np.arange(1, b.shape[0] + 1)
    support = ks[u - (css - s) / ks > 0]
    k = support[-1] if support.size else 1  # s below rounding of max b: support {argmax}
    return (css[k - 1] - s) / k


def biased_simplex_by_line_search(b, rho, r):
    """argmin_{x >= 0, <1,x> <= r} |x - b|^2 + rho <1,x>^2 as a 1-D problem in s = <1,x>.

    For fixed s the minimiser is the face projection (b - tau(s))_+, and
    phi(s) = |(b - tau(s))_+ - b|^2 + rho s^2 has phi'(s) = 2 (rho s - tau(s)), increasing
    (tau decreases in s).  So s* = 0 if max b <= 0, s* = r if tau(r) >= rho r, else the root
    of tau(s) = rho s (brentq).
    """
    if b.max() <= 0.0:
        return np.zeros_like(b)
    if simplex_face_threshold_sorted(b, r) >= rho * r:
        s = r
    else:

        def g(s):
            return simplex_face_threshold_sorted(b, s) - rho * s

        s = brentq(g, 1e-300, r, xtol=1e-16 * r, rtol=8.9e-16, maxiter=500)
    return np.maximum(b - simplex_face_threshold_sorted(b, s), 0.0)


def softmax_block_by_s(b, alpha):
    """argmin over the unit simplex of alpha/2 (|x|^2 + s^2) - <b,x> + <x,log x> + (1-s)log(1-s)
    (TPAMI (11), k = 1), parametrised by s = <1,x> instead of eq. (14)'s t: stationarity gives
    log x_j + alpha x_j = b_j - alpha s + log(1 - s), i.e.
    alpha x_j = W0(alpha (1 - s) e^{b_j - alpha s}), and s solves sum_j x_j(s) = s."""
    if alpha == 0.0:
        e = np.exp(b - max(b.max(), 0.0))
        return e / (np.exp(-max(b.max(), 0.0)) + e.sum())

    def x_of(s):
        return (
            np.array([V_reference(math.log(alpha) + math.log1p(-s) + bj - alpha * s) for bj in b])
            / alpha
        )

    s = brentq(
        lambda s: x_of(s).sum() - s,
        0.0,
        np.nextafter(1.0, 0.0),
        xtol=1e-17,
        rtol=8.9e-16,
        maxiter=500,
    )
    return x_of(s)


def reference_block(method, y, s, a, K, C, gamma):
    """New dual block a_i maximising D with the other blocks fixed (module doc of
    topkbench/losses/dispatch.py for the scaling: a = -C v, v in dom L*)."""
    m = s.shape[0]
    q = s - K * a
    out = np.empty(m)
    others = [j for j in range(m) if j != y]
    if method == "svm_multi":
        den = K + gamma / C
        if den == 0.0:
            # zero-norm row, nonsmooth loss: every x with <1,x> = C maximises; the solver takes
            # the uniform one
            x = np.full(m - 1, C / (m - 1))
        else:
            b = (q[others] + 1.0 - q[y]) / den
            x = biased_simplex_by_line_search(b, K / den, C)
        out[others] = -x
        out[y] = x.sum()
    elif method == "lr_multi":
        x = softmax_block_by_s(q[others] - q[y], C * K)
        out[others] = -C * x
        out[y] = C * x.sum()
    elif method == "svm_ova":
        yt = -np.ones(m)
        yt[y] = 1.0
        num = 1.0 - yt * q
        den = gamma + C * K
        beta = (num > 0).astype(float) if den == 0 else np.clip(num / den, 0.0, 1.0)
        out[:] = C * beta * yt
    else:
        yt = -np.ones(m)
        yt[y] = 1.0
        ck = C * K
        for c in range(m):
            g = yt[c] * q[c]
            if ck == 0.0:
                u = -g
            else:
                u = brentq(
                    lambda u, g=g: u + g + ck * sps.expit(u),
                    -g - ck,
                    -g,
                    xtol=1e-300,
                    rtol=8.9e-16,
                    maxiter=500,
                )
            out[c] = C * sps.expit(u) * yt[c]
    return out


def numpy_sdca(X, y, m, method, C, gamma, seed, epochs, shrink=True):
    """SDCA in numpy with the solver's permutations; with ``shrink``, each epoch skips the
    examples whose block is zero and whose loss is zero at the epoch's start (their update is
    a no-op: the solver's zero Fenchel-Young gap rule).  Returns (A, W, visits skipped)."""
    Xd = dense(X)
    n, d = Xd.shape
    A = np.zeros((n, m))
    W = np.zeros((d, m))
    rng = np.random.default_rng(seed)
    sq = np.einsum("ij,ij->i", Xd, Xd)
    skipped = 0
    for _ in range(epochs):
        perm = rng.permutation(n)
        if shrink:
            idle = np.all(A == 0.0, axis=1) & (example_losses(Xd, y, W, method, gamma) == 0.0)
            skipped += int(idle.sum())
            perm = perm[~idle[perm]]
        for i in perm:
            s = Xd[i] @ W
            new = reference_block(method, y[i], s, A[i], sq[i], C, gamma)
            W += np.outer(Xd[i], new - A[i])
            A[i] = new
        W = Xd.T @ A
    return A, W, skipped


TRAJECTORY_CASES = [
    # method, gamma, C, sparse, feature scale
    ("svm_multi", 0.0, 1.0, False, 1.0),
    ("svm_multi", 0.0, 5.0, True, 1.0),
    ("svm_multi", 0.5, 1.0, False, 1.0),
    ("svm_multi", 0.5, 0.2, True, 1.0),
    ("svm_multi", 0.5, 1.0, False, 300.0),
    ("lr_multi", 0.0, 1.0, False, 1.0),
    ("lr_multi", 0.0, 20.0, True, 1.0),
    ("lr_multi", 0.0, 10.0, False, 300.0),
    ("svm_ova", 0.0, 1.0, True, 1.0),
    ("svm_ova", 0.5, 3.0, False, 1.0),
    ("lr_ova", 0.0, 1.0, False, 1.0),
    ("lr_ova", 0.0, 20.0, True, 1.0),
    # alpha = C |x|^2 ~ 1e6: plain Newton on the logistic root used to cycle here
    ("lr_ova", 0.0, 10.0, False, 300.0),
]


@pytest.mark.parametrize("shrink", [True, False])
@pytest.mark.parametrize("method,gamma,C,sparse,scale", TRAJECTORY_CASES)
def test_exact_trajectory_against_numpy_sdca(method, gamma, C, sparse, scale, shrink):
    m, seed = 4, 17
    X, y = make_tiny(25, 3, m, 50, zero_rows=(6,), sparse=sparse)
    X = X * scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # no root-finding failures
        res = solve_sdca(
            X,
            y,
            n_classes=m,
            loss_id=get_method(method).loss_id,
            C=C,
            gamma=gamma,
            eps=1e-300,
            max_epochs=3,
            seed=seed,
            warn=False,
            shrink=shrink,
        )
    assert res.epochs == 3 and res.status == "max_epochs"
    A_ref, W_ref, skipped = numpy_sdca(X, y, m, method, C, gamma, seed, epochs=3, shrink=shrink)
    if shrink and method.startswith("svm") and gamma == 0.0 and C <= 1.0:
        assert skipped > 0  # the shrinking path is exercised
    np.testing.assert_allclose(res.A, A_ref, rtol=0, atol=1e-10 * C)
    np.testing.assert_allclose(res.W, W_ref, rtol=0, atol=1e-10 * max(1.0, np.abs(W_ref).max()))
    # the trajectory is not trivial: blocks moved off their starting values
    assert np.abs(A_ref).max() > 0.05 * C


@pytest.mark.parametrize(
    "method,gamma,C,n,m",
    [
        ("svm_multi", 0.0, 1.0, 31, 5),
        ("svm_multi", 0.0, 1.0, 80, 40),
        ("svm_multi", 0.0, 1.0, 80, 43),
        ("svm_multi", 0.5, 2.0, 81, 40),
        ("lr_multi", 0.0, 2.0, 30, 5),
        ("lr_ova", 0.0, 1.0, 31, 5),
    ],
)
def test_exact_trajectory_with_wide_dense_features(method, gamma, C, n, m):
    """d = 9: the four-row blocks of the paired dense passes and their one-row tail (the cases
    above have d = 3 < four rows); odd and even n (a last unpaired example).  With m = 40 an
    SVM^Multi step changes few enough classes (2-5 of m) for the sparse-change path: column
    updates for both examples of a pair, then a read-only pass (the first pair's columns must
    survive the second example's update); the smooth losses take the dense path.  m = 5 and
    43 are not multiples of 8: the epochs run on W padded with zero columns (the sparse
    path's threshold must use the true m)."""
    seed = 3
    X, y = make_tiny(n, 9, m, 51, zero_rows=(4,))
    res = solve_sdca(
        X, y, n_classes=m, loss_id=get_method(method).loss_id, C=C, gamma=gamma, eps=1e-300,
        max_epochs=3, seed=seed, warn=False, shrink=False,
    )  # fmt: skip
    A_ref, W_ref, _ = numpy_sdca(X, y, m, method, C, gamma, seed, epochs=3, shrink=False)
    np.testing.assert_allclose(res.A, A_ref, rtol=0, atol=1e-10 * C)
    np.testing.assert_allclose(res.W, W_ref, rtol=0, atol=1e-10 * max(1.0, np.abs(W_ref).max()))
    assert np.abs(A_ref).max() > 0.05 * C


@pytest.mark.parametrize("sparse", [False, True])
def test_eval_every_does_not_change_the_trajectory(sparse):
    """Permutations are drawn one per epoch in order whatever the evaluation period."""
    X, y = make_tiny(25, 3, 4, 50, zero_rows=(6,), sparse=sparse)
    runs = [
        solve_sdca(
            X,
            y,
            n_classes=4,
            loss_id=get_method("lr_multi").loss_id,
            C=2.0,
            eps=1e-300,
            max_epochs=6,
            eval_every=every,
            seed=3,
            warn=False,
        )
        for every in (1, 4, 6)
    ]
    assert [[p.epoch for p in r.trace] for r in runs] == [[0, 1, 2, 3, 4, 5, 6], [0, 4, 6], [0, 6]]
    for r in runs[1:]:
        np.testing.assert_allclose(r.A, runs[0].A, rtol=0, atol=1e-13)
        assert r.primal == pytest.approx(runs[0].primal, rel=1e-13)


@pytest.mark.parametrize("method,gamma", [("svm_multi", 0.0), ("svm_ova", 0.0), ("lr_multi", 0.0)])
def test_example_gaps_sum_to_the_duality_gap(method, gamma):
    """objective_terms' per-example Fenchel-Young gaps are >= 0 and sum to (P - D)/lambda;
    they vanish on the examples with a zero block and zero loss (those shrinking skips)."""
    from topkbench.solvers.problem import _active_set, evaluate_objective

    rng = np.random.default_rng(5)
    y = rng.integers(0, 4, 40)
    X = 3.0 * np.eye(4)[y] + 0.5 * rng.normal(size=(40, 4))  # well separated: idle examples
    res = solve_sdca(X, y, n_classes=4, loss_id=get_method(method).loss_id, C=0.5,
                     gamma=gamma, eps=1e-300, max_epochs=4, seed=1, warn=False)  # fmt: skip
    gaps = np.empty(40)
    P, D = evaluate_objective(X, y, res.A, res.W, get_method(method).loss_id, 0.5, gamma, 1, gaps)
    lam = 1.0 / (0.5 * 40)
    assert np.all(gaps >= -1e-12)
    assert gaps.sum() * lam == pytest.approx(P - D, rel=1e-9, abs=1e-14)
    losses = example_losses(X, y, res.W, method, gamma)
    idle = np.all(res.A == 0.0, axis=1) & (losses == 0.0)
    assert np.all(gaps[idle] == 0.0)
    keep = _active_set(gaps, res.A)
    if method == "lr_multi":
        assert keep is None  # smooth: nothing is skipped
    else:
        assert idle.any() and np.array_equal(keep, ~idle)


def test_auto_batch_schedule():
    from topkbench.solvers.problem import (
        AUTO_COST_FACTOR,
        AUTO_GROWTH,
        AUTO_MAX_ENTRIES,
        TracePoint,
        auto_batch,
    )

    def tr(*pts):
        return [TracePoint(e, 1.0, 0.0, g, 0.0) for e, g in pts]

    assert auto_batch(tr((0, 1.0)), 1e-3, 100, 100) == 1  # a rate needs two points
    # gap 1 -> 0.1 in one epoch: 1e-3 is two epochs away (within the cap of 4 at n_active = n)
    assert auto_batch(tr((0, 1.0), (1, 0.1)), 1e-3, 100, 100) == 2
    # slow decay: the cap, which grows as shrinking leaves fewer examples per epoch
    assert auto_batch(tr((0, 1.0), (1, 0.9)), 1e-3, 100, 100) == int(AUTO_COST_FACTOR)
    assert auto_batch(tr((0, 1.0), (1, 0.9)), 1e-3, 100, 25) == int(4 * AUTO_COST_FACTOR)
    # no decrease: the cap; at least one epoch
    assert auto_batch(tr((0, 0.5), (2, 0.6)), 1e-3, 100, 100) == int(AUTO_COST_FACTOR)
    assert auto_batch(tr((0, 1.0), (1, 1e-2)), 9e-3, 100, 100) == 1
    # a long run that no certificate can hand over (grow): an eighth of its epochs
    # (AUTO_GROWTH), still cut where eps is predicted; one that may hand over keeps the cap
    slow = tr((390, 0.5), (400, 0.49))
    assert auto_batch(slow, 1e-3, 100, 100, grow=True) == int(AUTO_GROWTH * 400)
    assert auto_batch(slow, 0.48, 100, 100, grow=True) == 11
    assert auto_batch(slow, 1e-3, 100, 100) == int(AUTO_COST_FACTOR)
    assert auto_batch(slow, 1e-3, 100, 100, cap=7, grow=True) == 7  # a cap given is kept
    # the batch's permutations stay within AUTO_MAX_ENTRIES indices
    big = AUTO_MAX_ENTRIES // 20
    assert auto_batch(slow, 1e-3, big, big, grow=True) == 20


@pytest.mark.parametrize("take", [False, True])
def test_warm_dual_is_copied_unless_handed_over(take):
    """``A0`` is the caller's unless ``take_A0`` hands it over; either way the fit is the
    same (the warm start of ``topkbench.fit`` hands over its rescaled temporary)."""
    X, y = make_tiny(40, 5, 4, 53)
    lid = get_method("svm_multi").loss_id
    first = solve_sdca(X, y, n_classes=4, loss_id=lid, C=0.5, eps=1e-6, warn=False)
    A0 = first.A * 2.0
    kept = A0.copy()
    res = solve_sdca(X, y, n_classes=4, loss_id=lid, C=1.0, eps=1e-6, warn=False, A0=A0,
                     take_A0=take)  # fmt: skip
    ref = solve_sdca(X, y, n_classes=4, loss_id=lid, C=1.0, eps=1e-6, warn=False, A0=kept)
    np.testing.assert_array_equal(res.A, ref.A)
    assert res.epochs == ref.epochs and res.epochs > 0
    if take:
        assert not np.array_equal(A0, kept)  # updated in place: no copy was made
    else:
        np.testing.assert_array_equal(A0, kept)


def test_certificates_spread_out_on_runs_no_certificate_can_hand_over(monkeypatch):
    """Plain SDCA that no later certificate can hand over (``accelerate="never"``, or
    ``"auto"`` where the predicted-epochs rule prices the Woodbury route as never paying)
    certifies at a growing fraction of its epochs; a run that may still hand over keeps the
    cap of four epochs between certificates.  Same permutations, so the same epochs' duals."""
    import topkbench.solvers.plan as plan
    from topkbench.solvers.plan import can_hand_over
    from topkbench.solvers.problem import AUTO_GROWTH, SDCAProblem

    X, y = make_tiny(60, 4, 5, 61)
    X = X * np.array([10.0, 1.0, 1.0, 0.1])  # slow, but C R^2 below ACCEL_MIN_CONDITION
    lid = get_method("svm_multi").loss_id
    prob = SDCAProblem(X, y, gram=False, n_classes=5, loss_id=lid, k=1)
    assert prob.r2 < 1000.0
    assert not can_hand_over(prob, "never", 1.0, 0.0, 1e-3)
    assert can_hand_over(prob, "auto", 1.0, 0.0, 1e-3)  # dense Newton is priced
    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 1)  # the Woodbury route ...
    monkeypatch.setattr(plan, "WOODBURY_MAX_ROWS", 10)  # ... refused at this n
    assert not can_hand_over(prob, "auto", 1.0, 0.0, 1e-3)
    kw = dict(
        n_classes=5, loss_id=lid, C=1.0, eps=1e-12, max_epochs=400, warn=False, eval_every="auto"
    )
    spread = solve_sdca(X, y, accelerate="never", **kw)
    steps = np.diff([p.epoch for p in spread.trace])
    assert steps.max() >= int(AUTO_GROWTH * 300) and len(spread.trace) < 60
    monkeypatch.undo()
    kept = solve_sdca(X, y, accelerate="auto", **{**kw, "eps": 1e-3, "max_epochs": 40})
    assert np.diff([p.epoch for p in kept.trace]).max() <= 4
