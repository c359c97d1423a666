"""SDCA for the top-k losses (DESIGN §2-§4; STYLE.md "Tests").

(a) every convex top-k loss on tiny problems against a cvxpy (CLARABEL) solution of the primal,
    with the duality gap recomputed independently from (W, A);
(b) the facts of DESIGN §4.1 at the optimum (k = 1 reductions, k = 2 alpha = beta, the order
    pseudo alpha <= alpha <= beta);
(c) the printed-alpha / pseudo-alpha discrepancy: the authors' optimum is not the printed one;
(d) kernel mode (precomputed and RBF Gram matrices) against feature mode;
(e) top-k Ent_tr (nonconvex, L-BFGS from the LR^Multi solution);
(f) zero-norm examples (DESIGN §4.3).

Scale: P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i), C = 1/(lambda n); cvxpy minimizes
1/2 ||W||^2 + C sum_i L = P / lambda.  The dual is D(A) = lambda (C sum_i -L*(y_i, -a_i/C) -
1/2 ||X^T A||^2) with x_i = -a_i^{\\y}/C in the loss's conjugate domain S(1) (see
tests/losses/test_topk_losses.py for the sets and -L*).

cvxpy formulations of the losses (z = (1 + s_j - s_y)_{j != y}, a = (s_j - s_y)_{j != y}):

* gamma = 0 hinges, with ``sum_largest``: pseudo alpha ``pos(T_k(z))/k``, printed alpha
  ``max(0, T_{k-1}(z), T_k(z))/k``, beta ``T_k(pos(z))/k``.
* gamma > 0 hinges: L_0 is the support function of S, whose conjugate is the indicator of S;
  adding gamma/2 ||v||^2 to a conjugate is an infimal convolution with ||.||^2/(2 gamma) in the
  primal, so ``L_gamma(z) = min_u L_0(u) + ||z - u||^2 / (2 gamma)`` (a Moreau envelope): one
  extra variable u per example, minimized jointly with W.
* top-k Ent (TPAMI Prop. 4): write x_0 = 1 - <1,x>, so that p = (x_0, x) ranges over the
  probability simplex with the caps k x_j <= <1,x>.  Pricing the caps with mu_j >= 0,
  ``L(a) = min_{mu >= 0} max_p <c, p> + H(p)`` with c_0 = 0, c_j = a_j + <1,mu> - k mu_j
  (linear constraints and a feasible relative-interior point, so no duality gap), and the
  inner max is log sum exp(c) (Gibbs).  Hence ``L(a) = min_{mu >= 0} LSE(0, a + <1,mu> 1 -
  k mu)``, minimized jointly with W; for k = 1, <1,mu> - mu_j >= 0 gives mu = 0 and softmax.
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

import topkbench
from topkbench.errors import ConvergenceWarning
from topkbench.gram import rbf_kernel
from topkbench.losses.dispatch import loss_value, neg_conjugate_value
from topkbench.losses.registry import get_method
from topkbench.solvers.ent_tr import ent_tr_loss_and_grad

HINGES = ("topk_svm_alpha_pseudo", "topk_svm_alpha", "topk_svm_beta")


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def fit_certified(X, y, method, **kw):
    """fit with ConvergenceWarning as an error (no silent budget stops)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return topkbench.fit(X, y, method, **kw)


# --- objective values, computed outside the solver ------------------------------------------


def conj_scratch(A):
    """Float scratch of neg_conjugate_value for blocks of length m = A.shape[1]."""
    return np.empty(A.shape[1]), np.empty(A.shape[1]), np.empty(A.shape[1])


def example_losses(S, y, method, gamma, k):
    """Per-example L(y_i, s_i) from the kernel's loss_value (checked against closed forms and
    cvxpy in tests/losses/test_topk_losses.py)."""
    n, m = S.shape
    scratch = (np.empty(m), np.empty(m), np.empty(m, dtype=np.int64), np.empty(m))
    lid = get_method(method).loss_id
    return np.array(
        [loss_value(lid, y[i], np.ascontiguousarray(S[i]), gamma, k, *scratch) for i in range(n)]
    )


def closed_form_losses(S, y, method, k):
    """gamma = 0 hinge losses in numpy (DESIGN §4.1)."""
    out = []
    for s, yi in zip(S, y, strict=True):
        z = np.sort(np.delete(1.0 + s - s[yi], yi))[::-1]
        if method == "topk_svm_beta":
            out.append(np.maximum(z[:k], 0.0).sum() / k)
        elif method == "topk_svm_alpha_pseudo":
            out.append(max(0.0, z[:k].sum()) / k)
        else:
            out.append(max(0.0, z[: k - 1].sum(), z[:k].sum()) / k)
    return np.array(out)


def primal_value(X, y, W, method, gamma, k, C):
    """P(W): numpy closed forms for the nonsmooth hinges, else loss_value."""
    n = X.shape[0]
    lam = 1.0 / (C * n)
    S = np.asarray(dense(X) @ W)
    if gamma == 0 and method in HINGES:
        losses = closed_form_losses(S, y, method, k)
    else:
        losses = example_losses(S, y, method, gamma, k)
    return lam / 2 * float(np.sum(W * W)) + float(losses.mean())


def in_conjugate_domain(method, x, k, tol=1e-12):
    s = float(x.sum())
    ok = bool(np.all(x >= -tol)) and s <= 1.0 + tol
    if method in ("topk_svm_alpha_pseudo", "topk_ent"):
        ok = ok and bool(np.all(k * x <= s + tol))
    elif method == "topk_svm_alpha":
        ok = ok and bool(np.all(x <= 1.0 / k + tol)) and bool(np.all((k - 1) * x <= s + tol))
    elif method == "topk_svm_beta":
        ok = ok and bool(np.all(x <= 1.0 / k + tol))
    return ok


def dual_value(X, y, A, method, gamma, k, C):
    """D(A) in numpy, after checking that every block lies in the conjugate domain."""
    n = A.shape[0]
    lam = 1.0 / (C * n)
    W = dense(X).T @ A
    total = 0.0
    for i in range(n):
        x = -np.delete(A[i], y[i]) / C
        assert in_conjugate_domain(method, x, k), (i, x)
        assert A[i, y[i]] == pytest.approx(C * x.sum(), abs=1e-13 * C)
        if method == "topk_ent":
            total += float(sps.entr(x).sum() + sps.entr(1.0 - x.sum()))
        else:
            total += float(x.sum() - gamma / 2 * (x @ x))
    return lam * (C * total - 0.5 * float(np.sum(W * W)))


# --- (a) cvxpy --------------------------------------------------------------------------------


def cvxpy_primal(X, y, m, method, gamma, k, C, *, allow_inaccurate=False, weights=None):
    """Solve min 1/2 ||W||^2 + C sum_i w_i L (formulations in the module docstring; w = 1
    without ``weights``).

    Returns (P(W*) in the P scale, W*); P is None when CLARABEL stops short of its tolerance
    (only with ``allow_inaccurate``)."""
    X = dense(X)
    n, d = X.shape
    W = cp.Variable((d, m))
    S = X @ W
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    terms = []
    for i in range(n):
        others = [j for j in range(m) if j != y[i]]
        diff = S[i, others] - S[i, y[i]]
        if method == "topk_ent":
            mu = cp.Variable(m - 1, nonneg=True)
            terms.append(
                w[i] * cp.log_sum_exp(cp.hstack([np.zeros(1), diff + cp.sum(mu) - k * mu]))
            )
            continue
        z = 1.0 + diff
        u = cp.Variable(m - 1) if gamma > 0 else z
        if method == "topk_svm_beta":
            loss = cp.sum_largest(cp.pos(u), k) / k
        elif method == "topk_svm_alpha_pseudo":
            loss = cp.pos(cp.sum_largest(u, k)) / k
        else:
            head = cp.sum_largest(u, k - 1) if k > 1 else 0.0
            loss = cp.maximum(0.0, head, cp.sum_largest(u, k)) / k
        if gamma > 0:
            loss = loss + cp.sum_squares(z - u) / (2 * gamma)
        terms.append(w[i] * loss)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(W) + C * cp.sum(cp.hstack(terms))))
    problem.solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500
    )
    accepted = (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) if allow_inaccurate else (cp.OPTIMAL,)
    assert problem.status in accepted, problem.status
    if problem.status != cp.OPTIMAL:
        return None, W.value
    return problem.value / (C * n), W.value


CVXPY_CASES = [
    # method, k, gamma, C, n, m, seed, sparse
    ("topk_svm_alpha", 2, 0.0, 1.0, 16, 5, 1, False),
    ("topk_svm_alpha", 2, 0.5, 10.0, 16, 5, 2, True),
    ("topk_svm_alpha", 3, 0.0, 10.0, 16, 5, 3, False),
    ("topk_svm_alpha", 3, 0.5, 1.0, 16, 4, 4, False),
    ("topk_svm_alpha_pseudo", 2, 0.0, 10.0, 16, 5, 5, True),
    ("topk_svm_alpha_pseudo", 2, 0.5, 1.0, 16, 5, 6, False),
    ("topk_svm_alpha_pseudo", 3, 0.0, 1.0, 16, 5, 7, False),
    ("topk_svm_alpha_pseudo", 3, 0.5, 10.0, 16, 4, 8, False),
    ("topk_svm_beta", 2, 0.0, 1.0, 16, 5, 9, False),
    ("topk_svm_beta", 2, 0.5, 10.0, 16, 5, 10, False),
    ("topk_svm_beta", 3, 0.0, 10.0, 16, 5, 11, True),
    ("topk_svm_beta", 3, 0.5, 1.0, 16, 4, 12, False),
    ("topk_ent", 2, 0.0, 1.0, 16, 5, 13, False),
    ("topk_ent", 3, 0.0, 10.0, 16, 4, 14, True),
]


@pytest.mark.parametrize("method,k,gamma,C,n,m,seed,sparse", CVXPY_CASES)
def test_primal_matches_cvxpy(problem_factory, method, k, gamma, C, n, m, seed, sparse):
    """Same optimum as cvxpy (1e-6 relative) and a gap <= 1e-8 that we recompute ourselves:
    P from the closed forms / loss_value at W, D from a feasibility-checked A."""
    X, y = problem_factory(n=n, d=3, m=m, seed=seed, zero_rows=(0,), sparse=sparse)
    model = fit_certified(X, y, method, C=C, k=k, gamma=gamma, eps=1e-9, max_epochs=20_000)
    assert model.status == "converged"
    assert -1e-14 <= model.relative_gap <= 1e-9
    p_ref, W_ref = cvxpy_primal(X, y, m, method, gamma, k, C)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    P = primal_value(X, y, model.W, method, gamma, k, C)
    D = dual_value(X, y, model.A, method, gamma, k, C)
    if not {"accelerated_from_epoch", "newton_from_epoch"} & model.info.keys():
        # plain SDCA returns W = X^T A; the accelerated phase may return its (better) prox
        # iterate and the Newton phase its own iterate, certified by the same D(A)
        np.testing.assert_allclose(model.W, dense(X).T @ model.A, rtol=0, atol=1e-12)
    assert P == pytest.approx(model.primal, rel=1e-12)
    assert D == pytest.approx(model.dual, rel=1e-12)
    assert 0.0 <= (P - D) / P <= 1e-8
    # weak duality against cvxpy's (independent) primal point
    assert D <= primal_value(X, y, W_ref, method, gamma, k, C) * (1 + 1e-12)


@pytest.mark.parametrize(
    "method, k, gamma",
    [("topk_svm_alpha", 2, 0.0), ("topk_svm_alpha", 3, 0.5), ("topk_svm_alpha_pseudo", 2, 0.0),
     ("topk_svm_beta", 2, 0.5), ("topk_svm_beta", 3, 0.0), ("topk_ent", 2, 0.0)],
)  # fmt: skip
def test_weighted_primal_matches_cvxpy(problem_factory, method, k, gamma):
    """Sample weights: cvxpy's weighted optimum to 1e-6 and D <= P* <= P."""
    X, y = problem_factory(n=16, d=3, m=5, seed=71, zero_rows=(0,))
    w = np.random.default_rng(72).uniform(0.1, 10.0, size=16)
    model = fit_certified(X, y, method, C=3.0, k=k, gamma=gamma, eps=1e-9, max_epochs=50_000,
                          sample_weight=w)  # fmt: skip
    assert model.status == "converged"
    p_ref, _ = cvxpy_primal(X, y, 5, method, gamma, k, 3.0, weights=w)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert model.dual <= p_ref * (1 + 1e-9) <= model.primal * (1 + 2e-9)


@settings(max_examples=60, derandomize=True)
@given(
    method=st.sampled_from([*HINGES, "topk_ent"]),
    smooth=st.booleans(),
    gamma=st.floats(0.05, 2.0),
    log_C=st.floats(-1.0, 1.0),
    n=st.integers(5, 14),
    d=st.integers(1, 3),
    m=st.integers(3, 5),
    k_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    n_zero=st.integers(0, 2),
)
def test_random_tiny_problems_match_cvxpy(
    problem_factory, method, smooth, gamma, log_C, n, d, m, k_frac, seed, n_zero
):
    """As above on random shapes, C, gamma and every k in [1, m-1] (k = m-1 included)."""
    gamma = gamma if smooth and method != "topk_ent" else 0.0
    k = 1 + min(int(k_frac * (m - 1)), m - 2)
    C = 10.0**log_C
    X, y = problem_factory(n=n, d=d, m=m, seed=seed, zero_rows=tuple(range(n_zero)))
    model = fit_certified(X, y, method, C=C, k=k, gamma=gamma, eps=1e-9, max_epochs=50_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cvxpy's "may be inaccurate"
        p_ref, W_ref = cvxpy_primal(X, y, m, method, gamma, k, C, allow_inaccurate=True)
    if p_ref is not None:
        assert model.primal == pytest.approx(p_ref, rel=1e-6)
    else:
        # CLARABEL gave up short of its tolerance (seen for top-k Ent on nearly separable
        # data): its W is still a primal point, so it can only be worse than ours
        p_cvx = primal_value(X, y, W_ref, method, gamma, k, C)
        assert model.primal <= p_cvx * (1 + 1e-9)
        assert model.dual <= p_cvx * (1 + 1e-12)
    D = dual_value(X, y, model.A, method, gamma, k, C)
    assert D == pytest.approx(model.dual, rel=1e-12)


def test_tiny_gamma_gap_is_not_negative(problem_factory):
    """D <= P must hold for every iterate: the gap is the certificate."""
    X, y = problem_factory(n=20, d=3, m=4, seed=5, zero_rows=(1,), scale=1000.0)
    model = topkbench.fit(
        X, y, "topk_svm_alpha", C=1e-4, k=3, gamma=1e-8, eps=1e-10, max_epochs=3000, warn=False
    )
    assert min(p.relative_gap for p in model.trace) >= -1e-14


@pytest.mark.parametrize("k", [0, 4, 5])
def test_solve_sdca_refuses_k_outside_1_to_m_minus_1(problem_factory, k):
    """The solver below ``fit`` checks k too: its kernels read the scores by k unchecked."""
    from topkbench.errors import ConfigError
    from topkbench.solvers.sdca import solve_sdca

    X, y = problem_factory(n=20, d=3, m=4, seed=0)
    loss_id = get_method("topk_svm_alpha_pseudo").loss_id
    with pytest.raises(ConfigError, match=r"k must be in \[1, 3\]"):
        solve_sdca(X, y, n_classes=4, loss_id=loss_id, C=0.1, k=k, max_epochs=1, warn=False)


# --- (b) facts at the optimum ----------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_k1_hinges_reach_the_svm_multi_optimum(problem_factory, gamma):
    """k = 1: pseudo alpha, alpha and beta are all SVM^Multi_gamma."""
    X, y = problem_factory(n=20, d=3, m=4, seed=31)
    ref = fit_certified(X, y, "svm_multi", C=2.0, gamma=gamma, eps=1e-10, max_epochs=20_000)
    for method in HINGES:
        model = fit_certified(X, y, method, C=2.0, k=1, gamma=gamma, eps=1e-10, max_epochs=20_000)
        assert model.primal == pytest.approx(ref.primal, rel=1e-8)


def test_k1_topk_ent_is_lr_multi(problem_factory):
    """k = 1: top-k Ent is LR^Multi (TPAMI Table 1), so the optima coincide."""
    X, y = problem_factory(n=20, d=3, m=4, seed=32)
    ref = fit_certified(X, y, "lr_multi", C=2.0, eps=1e-10, max_epochs=20_000)
    model = fit_certified(X, y, "topk_ent", C=2.0, k=1, eps=1e-10, max_epochs=20_000)
    assert model.primal == pytest.approx(ref.primal, rel=1e-8)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_k2_alpha_equals_beta(problem_factory, gamma):
    """D_2 = Delta_2^beta, so the optimal primal values coincide."""
    X, y = problem_factory(n=20, d=3, m=5, seed=33)
    kw = dict(C=1.0, k=2, gamma=gamma, eps=1e-10, max_epochs=20_000)
    alpha = fit_certified(X, y, "topk_svm_alpha", **kw)
    beta = fit_certified(X, y, "topk_svm_beta", **kw)
    assert alpha.primal == pytest.approx(beta.primal, rel=1e-8)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_optimal_primal_order(problem_factory, gamma):
    """P*_pseudo <= P*_alpha <= P*_beta, certified with the duality gaps (D <= P* <= P); on
    this problem (k = 3) both inequalities are strict."""
    X, y = problem_factory(n=16, d=3, m=5, seed=0)
    kw = dict(C=1.0, k=3, gamma=gamma, eps=1e-10, max_epochs=20_000)
    pseudo, alpha, beta = (fit_certified(X, y, method, **kw) for method in HINGES)
    assert pseudo.dual <= alpha.primal
    assert alpha.dual <= beta.primal
    assert pseudo.primal < alpha.dual
    assert alpha.primal < beta.dual


# --- (c) printed alpha versus what the authors' code optimizes --------------------------------


def test_pseudo_alpha_optimum_is_not_the_printed_alpha_optimum(problem_factory):
    """Train pseudo alpha (k = 3) to a tiny gap and read its (W, A) as a printed-alpha pair: A is
    feasible for D_k (Delta_k^alpha is inside D_k, and -L* has the same formula), yet the
    printed-alpha gap stays > 1e-4 relative, while topk_svm_alpha certifies its own optimum."""
    X, y = problem_factory(n=16, d=3, m=5, seed=0)
    C, k = 1.0, 3
    kw = dict(C=C, k=k, gamma=0.0, eps=1e-10, max_epochs=20_000)
    pseudo = fit_certified(X, y, "topk_svm_alpha_pseudo", **kw)
    alpha = fit_certified(X, y, "topk_svm_alpha", **kw)
    # the printed-alpha certificate for the pseudo solution
    P = primal_value(X, y, pseudo.W, "topk_svm_alpha", 0.0, k, C)
    D = dual_value(X, y, pseudo.A, "topk_svm_alpha", 0.0, k, C)
    lid = get_method("topk_svm_alpha").loss_id
    n, lam = X.shape[0], 1.0 / (C * X.shape[0])
    D_kernel = lam * (
        C
        * sum(
            neg_conjugate_value(lid, y[i], pseudo.A[i], C, 0.0, k, *conj_scratch(pseudo.A))
            for i in range(n)
        )
        - 0.5 * float(np.sum(pseudo.W**2))
    )
    assert D_kernel == pytest.approx(D, rel=1e-12)
    assert D == pytest.approx(pseudo.dual, rel=1e-12)
    assert (P - D) / P > 1e-4
    # printed alpha itself closes its gap, and its optimum separates the two certificates
    assert alpha.relative_gap <= 1e-10
    P_alpha = primal_value(X, y, alpha.W, "topk_svm_alpha", 0.0, k, C)
    D_alpha = dual_value(X, y, alpha.A, "topk_svm_alpha", 0.0, k, C)
    assert (P_alpha - D_alpha) / P_alpha <= 1e-8
    assert D < D_alpha <= P_alpha < P


# --- (d) kernel mode -------------------------------------------------------------------------

KERNEL_CASES = [
    ("svm_multi", 1, 0.5),
    ("lr_multi", 1, 0.0),
    ("svm_ova", 1, 0.0),
    ("lr_ova", 1, 0.0),
    ("topk_svm_alpha", 3, 0.0),
    ("topk_svm_alpha_pseudo", 2, 0.5),
    ("topk_svm_beta", 2, 0.0),
    ("topk_ent", 2, 0.0),
]


@pytest.mark.parametrize("method,k,gamma", KERNEL_CASES)
def test_precomputed_kernel_matches_feature_mode(problem_factory, method, k, gamma):
    """fit(None, y, K=X X^T) reaches the feature-mode optimum, and decision_function(K=...)
    agrees with W^T x.  Bounds: P(W) - P* <= P - D for both runs, and lambda-strong convexity
    of P gives ||W - W*||_F <= sqrt(2 (P - D) / lambda)."""
    X, y = problem_factory(n=16, d=3, m=4, seed=41, zero_rows=(2,))
    Xt, _ = problem_factory(n=6, d=3, m=4, seed=42)
    C = 1.0
    kw = dict(C=C, k=k, gamma=gamma, eps=1e-12, max_epochs=20_000)
    feat = fit_certified(X, y, method, **kw)
    kern = fit_certified(None, y, method, K=X @ X.T, **kw)
    assert kern.W is None and kern.kernel == "precomputed"
    gaps = (feat.primal - feat.dual) + (kern.primal - kern.dual)
    assert abs(feat.primal - kern.primal) <= gaps + 1e-15 * feat.primal
    lam = 1.0 / (C * X.shape[0])
    radius = math.sqrt(2 * (feat.primal - feat.dual) / lam) + math.sqrt(
        2 * (kern.primal - kern.dual) / lam
    )
    S_feat = feat.decision_function(Xt)
    S_kern = kern.decision_function(K=Xt @ X.T)
    bound = np.linalg.norm(Xt, axis=1)[:, None] * radius + 1e-13
    assert np.all(np.abs(S_feat - S_kern) <= bound)
    # the kernel model's scores on the training set are K A = X (X^T A)
    np.testing.assert_allclose(
        kern.decision_function(K=X @ X.T), X @ (X.T @ kern.A), rtol=0, atol=1e-13
    )


@pytest.mark.parametrize("theta", [0.1, 1.0, 7.0])
def test_rbf_kernel_matches_sklearn(problem_factory, theta):
    """K = exp(-theta ||x - z||^2) is sklearn's rbf_kernel with gamma = theta (dense, CSR, and
    a separate Z)."""
    from sklearn.metrics.pairwise import rbf_kernel as sk_rbf

    X, _ = problem_factory(n=15, d=4, m=3, seed=51)
    Z, _ = problem_factory(n=7, d=4, m=3, seed=52)
    np.testing.assert_allclose(rbf_kernel(X, theta=theta), sk_rbf(X, gamma=theta), atol=1e-14)
    np.testing.assert_allclose(
        rbf_kernel(X, Z, theta=theta), sk_rbf(X, Z, gamma=theta), rtol=1e-13, atol=1e-15
    )
    np.testing.assert_allclose(
        rbf_kernel(sp.csr_matrix(X), sp.csr_matrix(Z), theta=theta),
        sk_rbf(X, Z, gamma=theta),
        rtol=1e-13,
        atol=1e-15,
    )
    assert np.all(np.diag(rbf_kernel(X, theta=theta)) == 1.0)


@pytest.mark.parametrize("method,k", [("topk_svm_alpha", 2), ("topk_ent", 3)])
def test_rbf_model_predicts_with_sklearn_kernel(problem_factory, method, k):
    """kernel="rbf" trains on the RBF Gram matrix and predicts with K(test, train) A."""
    from sklearn.metrics.pairwise import rbf_kernel as sk_rbf

    X, y = problem_factory(n=16, d=3, m=4, seed=53)
    Xt, _ = problem_factory(n=5, d=3, m=4, seed=54)
    theta = 0.7
    kw = dict(C=1.0, k=k, eps=1e-10, max_epochs=20_000)
    rbf = fit_certified(X, y, method, kernel="rbf", theta=theta, **kw)
    pre = fit_certified(None, y, method, K=sk_rbf(X, gamma=theta), **kw)
    assert rbf.primal == pytest.approx(pre.primal, rel=1e-9)
    np.testing.assert_allclose(
        rbf.decision_function(Xt), sk_rbf(Xt, X, gamma=theta) @ rbf.A, rtol=1e-12, atol=1e-14
    )


# --- (e) top-k Ent_tr -------------------------------------------------------------------------


def ent_tr_objective_and_gradient(X, y, W, k, C):
    """P(W) and grad P for the truncated top-k entropy, written without the library."""
    n = X.shape[0]
    lam = 1.0 / (C * n)
    S = X @ W
    losses = np.empty(n)
    G = np.zeros_like(S)
    for i in range(n):
        others = np.array([j for j in range(S.shape[1]) if j != y[i]])
        a = S[i, others] - S[i, y[i]]
        kept = others[np.argsort(-a, kind="stable")[k - 1 :]]
        e = S[i, kept] - S[i, y[i]]
        losses[i] = np.logaddexp(0.0, sps.logsumexp(e))
        p = np.exp(e - losses[i])
        G[i, kept] = p
        G[i, y[i]] = -p.sum()
    P = lam / 2 * float(np.sum(W * W)) + float(losses.mean())
    return P, lam * W + X.T @ G / n


@pytest.mark.parametrize("k", [2, 3])
def test_ent_tr_descends_from_the_lr_multi_start(problem_factory, k):
    """Ent_tr starts at the LR^Multi solution of the same C, never increases its objective,
    and stops "converged" with a small gradient (the rule documented in solve_ent_tr:
    max |grad P| <= eps max(lambda, max |grad P(W0)|)); the reported primal and gradient
    norm match our own evaluation."""
    X, y = problem_factory(n=20, d=3, m=5, seed=61)
    C, eps = 1.0, 1e-6
    model = fit_certified(X, y, "topk_ent_tr", C=C, k=k, eps=eps, max_epochs=1000)
    start = fit_certified(X, y, "lr_multi", C=C, eps=eps, max_epochs=1000)
    assert np.isnan(model.dual) and np.isnan(model.relative_gap)
    assert model.status == "converged"
    P0, g0 = ent_tr_objective_and_gradient(X, y, start.W, k, C)
    P, g = ent_tr_objective_and_gradient(X, y, model.W, k, C)
    assert model.trace[0].primal == pytest.approx(P0, rel=1e-12)
    assert model.info["init_primal"] == pytest.approx(start.primal, rel=1e-12)
    assert model.primal == pytest.approx(P, rel=1e-12)
    assert P <= P0
    values = [p.primal for p in model.trace]
    assert all(b <= a * (1 + 1e-15) for a, b in zip(values, values[1:], strict=False))
    lam = 1.0 / (C * X.shape[0])
    assert np.abs(g).max() <= eps * max(lam, np.abs(g0).max()) * (1 + 1e-6)
    assert model.info["grad_norm"] == pytest.approx(np.linalg.norm(g), rel=1e-6, abs=1e-14)
    # and the library's per-example losses agree with ours at the start
    losses0, _ = ent_tr_loss_and_grad(X @ start.W, y, k)
    assert P0 == pytest.approx(lam / 2 * np.sum(start.W**2) + losses0.mean(), rel=1e-12)


def test_ent_tr_k1_is_the_lr_multi_optimum(problem_factory):
    """For k = 1 Ent_tr is LR^Multi: L-BFGS from its solution stays at the optimum."""
    X, y = problem_factory(n=20, d=3, m=5, seed=62)
    model = fit_certified(X, y, "topk_ent_tr", C=1.0, k=1, eps=1e-6, max_epochs=1000)
    ref = fit_certified(X, y, "lr_multi", C=1.0, eps=1e-12, max_epochs=20_000)
    assert model.status == "converged"
    assert model.primal == pytest.approx(ref.primal, rel=1e-9)
    assert model.primal >= ref.dual
    np.testing.assert_allclose(model.W, ref.W, atol=1e-4)


# --- (f) zero-norm examples --------------------------------------------------------------------

ZERO_CASES = [
    (method, k, gamma, sparse)
    for method in HINGES
    for k, gamma, sparse in [(2, 0.0, False), (3, 0.5, True)]
] + [("topk_ent", 2, 0.0, False), ("topk_ent", 3, 0.0, True)]


def loss_at_zero(method, m, gamma):
    """L(y, 0): z = 1 (hinges), a = 0 (Ent).  The uniform v is feasible in every set for
    k <= m-1, so max_{<1,v> = r} r - gamma r^2 / (2(m-1)) gives 1 - gamma/(2(m-1)) for
    gamma <= m-1; top-k Ent is the entropy of the uniform distribution on m outcomes."""
    if method == "topk_ent":
        return math.log(m)
    return 1.0 - gamma / (2 * (m - 1))


@pytest.mark.parametrize("method,k,gamma,sparse", ZERO_CASES)
def test_zero_norm_examples_close_the_gap(problem_factory, method, k, gamma, sparse):
    """DESIGN §4.3: zero rows get the maximizer of -L*(-a/C): the gap reaches 1e-8 and each such
    block satisfies -L*(v_i) = L(y_i, 0).  On all-zero data W = 0 and P = D = L(0)."""
    m = 5
    X, y = problem_factory(n=20, d=3, m=m, seed=71, zero_rows=(0, 1, 2, 3, 9), sparse=sparse)
    C = 2.0
    model = fit_certified(X, y, method, C=C, k=k, gamma=gamma, eps=1e-10, max_epochs=20_000)
    assert model.status == "converged"
    assert -1e-14 <= model.relative_gap <= 1e-8
    lid = get_method(method).loss_id
    for i in (0, 1, 2, 3, 9):
        value = neg_conjugate_value(lid, y[i], model.A[i], C, gamma, k, *conj_scratch(model.A))
        assert value == pytest.approx(loss_at_zero(method, m, gamma), rel=1e-12)
        x = -np.delete(model.A[i], y[i]) / C
        assert in_conjugate_domain(method, x, k)
    Xz = np.zeros((8, 2))
    yz = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    model = fit_certified(Xz, yz, method, C=1.0, k=k, gamma=gamma, eps=1e-12, max_epochs=5)
    assert model.status == "converged"
    assert np.all(model.W == 0.0)
    assert model.primal == pytest.approx(loss_at_zero(method, m, gamma), rel=1e-15)
    assert model.dual == pytest.approx(loss_at_zero(method, m, gamma), rel=1e-13)
