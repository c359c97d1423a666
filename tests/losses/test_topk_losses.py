"""Top-k losses of the SDCA core against independent references (DESIGN §3, §4.1; STYLE "Tests").

Notation.  ``z = (1 + s_j - s_y)_{j != y}`` (hinge family), ``a = (s_j - s_y)_{j != y}``
(entropy family), ``T_j(z)`` the sum of the j largest entries of z (``T_0 = 0``).  The hinge
family is the support function of its conjugate domain S, smoothed as in TPAMI Prop. 2::

    L_gamma(z) = max_{v in S} <z, v> - gamma/2 ||v||^2
    pseudo alpha:  S = Delta_k^alpha(1) = {v >= 0, <1,v> <= 1, k v_j <= <1,v>}
    printed alpha: S = D_k(1)           = {v >= 0, <1,v> <= 1, v_j <= 1/k, (k-1) v_j <= <1,v>}
    beta:          S = Delta_k^beta(1)  = {0 <= v_j <= 1/k, <1,v> <= 1}

with the closed forms (1/k) max{0, T_k}, (1/k) max{0, T_{k-1}, T_k} and
(1/k) sum_{j<=k} max{0, z_[j]} at gamma = 0.  Top-k Ent (TPAMI Prop. 4) is
``max_{x in Delta_k^alpha(1)} <a, x> + H(x) + H(1 - <1,x>)`` with ``H(p) = -p log p``.

Pairing with the kernels' conjugate (read from ``topkbench/losses/dispatch.py``):
``neg_conjugate_value(loss, y, a, C, gamma, k) = -L*(y, v)`` at ``v = -a / C``, where
``v^{\\y} = x`` lies in S and ``v_y = -<1, x>``; for the hinges ``-L*(v) = <1,x> - gamma/2
||x||^2``, for top-k Ent ``-L*(v) = H(x) + H(1 - <1,x>)``.  Since ``<s, v> = <z, x> - <1, x>``
(hinges) or ``<a, x>`` (entropy), the Fenchel-Young gap is

    FY(s, v) = L(s) + L*(v) - <s, v> = L(s) - (<z, x> - gamma/2 ||x||^2)   (or the entropy
    analogue) >= 0,  with equality iff x is the maximizer defining L(s).
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.special as sps
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from topkbench.losses.dispatch import loss_value, neg_conjugate_value
from topkbench.losses.registry import get_method
from topkbench.solvers.ent_tr import ent_tr_loss_and_grad

HINGES = ("topk_svm_alpha_pseudo", "topk_svm_alpha", "topk_svm_beta")
CVX_TOL = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


def loss_id(name):
    return get_method(name).loss_id


def L(name, y, s, gamma=0.0, k=1):
    """Per-example loss through the numba kernel."""
    s = np.ascontiguousarray(s, dtype=np.float64)
    m = s.shape[0]
    return loss_value(
        loss_id(name),
        int(y),
        s,
        float(gamma),
        int(k),
        np.empty(m),
        np.empty(m),
        np.empty(m, dtype=np.int64),
        np.empty(m),
    )


def L_star(name, y, v, gamma=0.0, k=1, C=1.0):
    """L*(y, v) through the kernel, which takes the dual block a = -C v."""
    a = np.ascontiguousarray(-C * np.asarray(v, dtype=np.float64))
    scratch = (np.empty(a.shape[0]), np.empty(a.shape[0]), np.empty(a.shape[0]))
    return -neg_conjugate_value(loss_id(name), int(y), a, float(C), float(gamma), int(k), *scratch)


def hinge_margins(y, s):
    return np.delete(1.0 + s - s[y], y)


def embed(x, y):
    """Dual point v with v^{\\y} = x and v_y = -<1, x>."""
    v = np.insert(np.asarray(x, dtype=np.float64), y, 0.0)
    v[y] = -float(np.sum(x))
    return v


def T(z, j):
    return float(np.sort(z)[::-1][:j].sum())


def closed_form(name, z, k):
    if name == "topk_svm_alpha_pseudo":
        return max(0.0, T(z, k)) / k
    if name == "topk_svm_alpha":
        return max(0.0, T(z, k - 1), T(z, k)) / k
    if name == "topk_svm_beta":
        return T(np.maximum(z, 0.0), k) / k
    return max(0.0, float(z.max()))  # svm_multi


def vertex_maximizer(name, z, k):
    """A maximizer of <z, v> over S (gamma = 0), built from the closed form's cases."""
    n = z.shape[0]
    order = np.argsort(-z, kind="stable")

    def top(j):
        v = np.zeros(n)
        v[order[:j]] = 1.0 / k
        return v

    if name == "topk_svm_beta":
        v = np.zeros(n)
        chosen = order[:k]
        v[chosen[z[chosen] > 0]] = 1.0 / k
        return v
    candidates = [np.zeros(n), top(k)]
    if name == "topk_svm_alpha":
        candidates.append(top(k - 1))
    return max(candidates, key=lambda v: float(z @ v))


def in_domain(name, x, k, tol=1e-12):
    """Membership of x in the conjugate domain S(1) of ``name`` (Delta_k^alpha for Ent)."""
    s = float(np.sum(x))
    ok = bool(np.all(x >= -tol)) and s <= 1.0 + tol
    if name in ("topk_svm_alpha_pseudo", "topk_ent"):
        ok = ok and bool(np.all(k * x <= s + tol))
    elif name == "topk_svm_alpha":
        ok = ok and bool(np.all(x <= 1.0 / k + tol)) and bool(np.all((k - 1) * x <= s + tol))
    elif name == "topk_svm_beta":
        ok = ok and bool(np.all(x <= 1.0 / k + tol))
    return ok


def cvx_domain(name, v, k):
    s = cp.sum(v)
    cons = [v >= 0, s <= 1]
    if name in ("topk_svm_alpha_pseudo", "topk_ent"):
        cons.append(k * v <= s)
    elif name == "topk_svm_alpha":
        cons += [v <= 1.0 / k, (k - 1) * v <= s]
    else:
        cons.append(v <= 1.0 / k)
    return cons


def cvx_hinge(name, z, gamma, k):
    """max_{v in S} <z, v> - gamma/2 ||v||^2 by CLARABEL: (value, maximizer)."""
    v = cp.Variable(z.shape[0])
    problem = cp.Problem(cp.Maximize(z @ v - gamma / 2 * cp.sum_squares(v)), cvx_domain(name, v, k))
    problem.solve(solver=cp.CLARABEL, **CVX_TOL)
    assert problem.status == cp.OPTIMAL, problem.status
    return problem.value, v.value


def cvx_topk_ent(a, k):
    """Prop. 4 directly: max_{x in Delta_k^alpha(1)} <a,x> + sum entr(x) + entr(1 - <1,x>)."""
    x = cp.Variable(a.shape[0])
    objective = a @ x + cp.sum(cp.entr(x)) + cp.entr(1 - cp.sum(x))
    problem = cp.Problem(cp.Maximize(objective), cvx_domain("topk_ent", x, k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "solution may be inaccurate" at 1e-10 tolerances
        problem.solve(solver=cp.CLARABEL, **CVX_TOL)
    assert problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE), problem.status
    return problem.value, x.value


def cvx_topk_ent_dual(a, k):
    """The Lagrangian dual of Prop. 4: L(a) = min_{mu >= 0} log(1 + sum_j exp(a_j + <1,mu> -
    k mu_j)) (mu prices the caps k x_j <= <1,x>; derivation in tests/solvers/test_topk_sdca.py)."""
    mu = cp.Variable(a.shape[0], nonneg=True)
    expr = cp.log_sum_exp(cp.hstack([np.zeros(1), a + cp.sum(mu) - k * mu]))
    problem = cp.Problem(cp.Minimize(expr))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem.solve(solver=cp.CLARABEL, **CVX_TOL)
    assert problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE), problem.status
    return problem.value


def random_domain_point(name, n, k, rng):
    """A random point of S(1): a convex combination of points known to lie in S.

    Delta_k^alpha(1) contains 0 and 1_J/|J| for |J| >= k; D_k(1) also contains 1_J/k for
    |J| in {k-1, k}; Delta_k^beta(1) contains 1_J/k for |J| <= k.
    """
    points = [np.zeros(n)]
    for _ in range(4):
        if name == "topk_svm_beta":
            size = int(rng.integers(0, k + 1))
            scale = 1.0 / k
        elif name == "topk_svm_alpha" and rng.random() < 0.5:
            size = int(rng.integers(max(k - 1, 0), k + 1))
            scale = 1.0 / k
        else:
            size = int(rng.integers(k, n + 1))
            scale = 1.0 / size
        p = np.zeros(n)
        p[rng.choice(n, size=size, replace=False)] = scale
        points.append(p)
    w = rng.dirichlet(np.ones(len(points)))
    if rng.random() < 0.3:
        w[0] = 0.0  # no weight on 0: boundary points of S more often
        w /= w.sum()
    x = w @ np.array(points)
    assert in_domain(name, x, k)
    return x


# --- strategies ------------------------------------------------------------------------------


@st.composite
def scores_with_k(draw, lo=-4.0, hi=4.0, min_m=2, max_m=6):
    """(y, s, k) with m = len(s) in [min_m, max_m] and k in [1, m - 1]."""
    m = draw(st.integers(min_m, max_m))
    y = draw(st.integers(0, m - 1))
    k = draw(st.integers(1, m - 1))
    s = draw(hnp.arrays(np.float64, m, elements=st.floats(lo, hi)))
    return y, s, k


# --- (a) gamma = 0: closed forms and the LP over the conjugate domain ------------------------


@pytest.mark.parametrize("name", HINGES)
@settings(max_examples=40)
@given(data=scores_with_k())
def test_nonsmooth_value_is_closed_form_and_lp(name, data):
    """loss_value = printed closed form = max_{v in S} <z, v> (cvxpy LP), which checks that S
    is the conjugate domain of the printed loss."""
    y, s, k = data
    z = hinge_margins(y, s)
    value = L(name, y, s, 0.0, k)
    scale = 1.0 + float(np.abs(z).max())
    assert value == pytest.approx(closed_form(name, z, k), rel=1e-14, abs=1e-14 * scale)
    lp_value, _ = cvx_hinge(name, z, 0.0, k)
    assert value == pytest.approx(lp_value, abs=1e-8 * scale)


# --- (b) gamma > 0: the QP over the conjugate domain ------------------------------------------


@pytest.mark.parametrize("name", HINGES)
@settings(max_examples=40)
@given(data=scores_with_k(), gamma=st.floats(0.01, 5.0))
def test_smooth_value_matches_qp(name, data, gamma):
    """loss_value(gamma) = max_{v in S} <z, v> - gamma/2 ||v||^2 (TPAMI Prop. 2, cvxpy QP)."""
    y, s, k = data
    z = hinge_margins(y, s)
    qp_value, _ = cvx_hinge(name, z, gamma, k)
    assert L(name, y, s, gamma, k) == pytest.approx(qp_value, abs=1e-8 * (1 + np.abs(z).max()))


# --- (c) order and reductions -----------------------------------------------------------------


@settings(max_examples=200)
@given(data=scores_with_k(), smooth=st.booleans(), gamma=st.floats(1e-3, 10.0))
def test_pseudo_alpha_le_alpha_le_beta(data, smooth, gamma):
    """Delta_k^alpha(1) within D_k(1) within Delta_k^beta(1), so the losses are ordered for
    every gamma >= 0."""
    y, s, k = data
    gamma = gamma if smooth else 0.0
    pseudo, alpha, beta = (L(name, y, s, gamma, k) for name in HINGES)
    tol = 1e-13 * (1 + np.abs(s).max())
    assert pseudo <= alpha + tol
    assert alpha <= beta + tol


@settings(max_examples=100)
@given(data=scores_with_k(min_m=3), gamma=st.sampled_from([0.0, 0.01, 0.5, 3.0]))
def test_alpha_equals_beta_for_k2(data, gamma):
    """For k = 2 the constraint (k-1) v_j <= <1,v> is implied by v >= 0: D_2 = Delta_2^beta."""
    y, s, _ = data
    tol = 1e-13 * (1 + np.abs(s).max())
    assert L("topk_svm_alpha", y, s, gamma, 2) == pytest.approx(
        L("topk_svm_beta", y, s, gamma, 2), abs=tol
    )


@settings(max_examples=100)
@given(data=scores_with_k(), gamma=st.sampled_from([0.0, 0.01, 0.5, 3.0]))
def test_k1_hinges_are_svm_multi(data, gamma):
    """For k = 1 all three domains are the unit simplex: the losses are SVM^Multi_gamma."""
    y, s, _ = data
    reference = L("svm_multi", y, s, gamma)
    tol = 1e-13 * (1 + np.abs(s).max())
    for name in HINGES:
        assert L(name, y, s, gamma, 1) == pytest.approx(reference, abs=tol)


@settings(max_examples=60)
@given(data=scores_with_k(), gamma=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32))
def test_values_are_permutation_invariant(data, gamma, seed):
    """Relabelling the classes (and y with them) changes no loss value."""
    y, s, k = data
    perm = np.random.default_rng(seed).permutation(s.shape[0])
    s_perm = np.empty_like(s)
    s_perm[perm] = s
    tol = 1e-13 * (1 + np.abs(s).max())
    for name in (*HINGES, "topk_ent"):
        g = 0.0 if name == "topk_ent" else gamma
        assert L(name, perm[y], s_perm, g, k) == pytest.approx(L(name, y, s, g, k), abs=tol)


# --- (d) smoothing limit ----------------------------------------------------------------------


@pytest.mark.parametrize("name", HINGES)
@given(data=scores_with_k())
def test_smoothing_sandwich_and_limit(name, data):
    """L_0 - gamma/2 R^2 <= L_gamma <= L_0 with R^2 = max_{v in S} ||v||^2 = 1/k for all three
    sets (||v||^2 <= max_j v_j <1,v> <= 1/k, attained at 1/k on k coordinates); L_gamma
    increases as gamma decreases and tends to L_0."""
    y, s, k = data
    l0 = L(name, y, s, 0.0, k)
    tol = 1e-13 * (1 + np.abs(s).max())
    previous = -np.inf
    for gamma in (8.0, 1.0, 0.25, 1e-2, 1e-4):
        lg = L(name, y, s, gamma, k)
        assert lg <= l0 + tol
        assert lg >= l0 - gamma / (2 * k) - tol
        assert lg >= previous - tol
        previous = lg
    assert L(name, y, s, 1e-4, k) == pytest.approx(l0, abs=1e-4 / (2 * k) + tol)


@pytest.mark.parametrize("name", HINGES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sandwich_bound_is_attained(name, k):
    """With z = 5 on k coordinates and -5 elsewhere the maximizer is the vertex 1/k on those k
    coordinates for small gamma, so L_gamma = L_0 - gamma/(2k) exactly."""
    z = np.array([5.0] * k + [-5.0] * 2)
    s = np.concatenate([[0.0], z - 1.0])  # y = 0: 1 + s_j - s_0 = z_j
    for gamma in (0.5, 1.0):
        assert L(name, 0, s, gamma, k) == pytest.approx(5.0 - gamma / (2 * k), rel=1e-14)


@pytest.mark.parametrize("name", ["topk_svm_alpha", "topk_svm_beta"])
def test_tiny_gamma_keeps_relative_accuracy(name):
    """The _hinge_loss docstring promises full relative accuracy for tiny gamma.  Here the
    maximizer over D_3 and Delta_3^beta is the vertex (0, 1/3, 1/3) for all small gamma, so
    L_gamma = (z_2 + z_3)/3 - gamma/9 exactly."""
    s = np.array([0.0, -1.6057006362008164, -0.2921855660288906, 0.7899498915324719])
    z = hinge_margins(0, s)
    for gamma in (1e-6, 1e-8, 1e-10):
        exact = (z[1] + z[2]) / 3 - gamma / 9
        assert L(name, 0, s, gamma, 3) == pytest.approx(exact, rel=1e-13)


# --- (e) Fenchel-Young --------------------------------------------------------------------------


@pytest.mark.parametrize("name", HINGES)
@settings(max_examples=60)
@given(data=scores_with_k(), gamma=st.sampled_from([0.0, 0.1, 1.0]), seed=st.integers(0, 2**32))
def test_fenchel_young_inequality(name, data, gamma, seed):
    """L(s) + L*(v) >= <s, v> for feasible dual points v (x = v^{\\y} in S)."""
    y, s, k = data
    rng = np.random.default_rng(seed)
    for _ in range(3):
        v = embed(random_domain_point(name, s.shape[0] - 1, k, rng), y)
        fy = L(name, y, s, gamma, k) + L_star(name, y, v, gamma, k, C=2.5) - float(s @ v)
        assert fy >= -1e-13 * (1 + np.abs(s).max())


@pytest.mark.parametrize("name", HINGES)
@given(data=scores_with_k())
def test_fenchel_young_equality_at_the_vertex(name, data):
    """gamma = 0: FY = 0 at the LP vertex of the closed form, which lies in S."""
    y, s, k = data
    x = vertex_maximizer(name, hinge_margins(y, s), k)
    assert in_domain(name, x, k, tol=0.0)
    v = embed(x, y)
    fy = L(name, y, s, 0.0, k) + L_star(name, y, v, 0.0, k) - float(s @ v)
    assert abs(fy) <= 1e-13 * (1 + np.abs(s).max())


@pytest.mark.parametrize("name", HINGES)
@settings(max_examples=30)
@given(data=scores_with_k(), gamma=st.floats(0.05, 5.0))
def test_fenchel_young_equality_at_the_qp_maximizer(name, data, gamma):
    """gamma > 0: FY = 0 (to solver accuracy) at the cvxpy maximizer of the QP."""
    y, s, k = data
    _, x = cvx_hinge(name, hinge_margins(y, s), gamma, k)
    assert in_domain(name, x, k, tol=1e-8)
    v = embed(x, y)
    fy = L(name, y, s, gamma, k) + L_star(name, y, v, gamma, k) - float(s @ v)
    assert abs(fy) <= 1e-7 * (1 + np.abs(s).max())


# --- (f) top-k Ent and top-k Ent_tr -----------------------------------------------------------


@settings(max_examples=40)
@given(data=scores_with_k())
def test_topk_ent_matches_cvxpy(data):
    """Prop. 4 by cvxpy (cp.entr) and by its Lagrangian dual give the kernel's value."""
    y, s, k = data
    a = np.delete(s - s[y], y)
    value = L("topk_ent", y, s, 0.0, k)
    primal, x = cvx_topk_ent(a, k)
    assert value == pytest.approx(primal, abs=1e-7)
    assert value == pytest.approx(cvx_topk_ent_dual(a, k), abs=1e-7)
    # Fenchel-Young equality at the cvxpy maximizer (entropy analogue)
    v = embed(np.clip(x, 0.0, None), y)
    fy = value + L_star("topk_ent", y, v, 0.0, k) - float(s @ v)
    assert abs(fy) <= 1e-6


@given(data=scores_with_k(lo=-1e6, hi=1e6))
def test_topk_ent_is_finite_and_sandwiched_for_large_scores(data):
    """max_{x in Delta_k^alpha(1)} <a, x> = max(0, T_k(a))/k <= L(a) <= that + log m (the two
    entropies form the entropy of a distribution on m outcomes), at any scale."""
    y, s, k = data
    a = np.delete(s - s[y], y)
    value = L("topk_ent", y, s, 0.0, k)
    lower = max(0.0, T(a, k)) / k
    tol = 1e-13 * (1 + np.abs(a).max())
    assert np.isfinite(value)
    assert lower - tol <= value <= lower + np.log(s.shape[0]) + tol


@given(data=scores_with_k())
def test_topk_ent_k1_is_softmax(data):
    """Top-1 Ent = LR^Multi = logsumexp(s) - s_y."""
    y, s, _ = data
    expected = sps.logsumexp(s) - s[y]
    assert L("topk_ent", y, s, 0.0, 1) == pytest.approx(expected, rel=1e-13, abs=1e-14)
    assert L("lr_multi", y, s) == pytest.approx(expected, rel=1e-13, abs=1e-14)


@settings(max_examples=60)
@given(data=scores_with_k(), seed=st.integers(0, 2**32))
def test_topk_ent_fenchel_young_inequality(data, seed):
    """L(a) >= <a, x> + H(x) + H(1 - <1,x>) for x in Delta_k^alpha(1)."""
    y, s, k = data
    rng = np.random.default_rng(seed)
    value = L("topk_ent", y, s, 0.0, k)
    for _ in range(3):
        v = embed(random_domain_point("topk_ent", s.shape[0] - 1, k, rng), y)
        assert value + L_star("topk_ent", y, v, 0.0, k) - float(s @ v) >= -1e-13


@given(data=scores_with_k())
def test_topk_ent_and_ent_tr_lie_below_softmax(data):
    """The top-k Ent value lies below LR^Multi (its domain is a subset of the simplex's).
    Top-k Ent_tr drops the k-1 largest terms of the softmax sum, so it lies below LR^Multi too."""
    y, s, k = data
    softmax = L("lr_multi", y, s)
    tol = 1e-13 * (1 + np.abs(s).max())
    assert L("topk_ent", y, s, 0.0, k) <= softmax + tol
    tr, _ = ent_tr_loss_and_grad(s[None, :].copy(), np.array([y]), k)
    assert tr[0] <= softmax + tol


def ent_tr_direct(s, y, k):
    """log(1 + sum_{j in J} exp(s_j - s_y)), J = off-label classes minus the k-1 largest."""
    a = np.sort(np.delete(s - s[y], y))[::-1][k - 1 :]
    return float(np.logaddexp(0.0, sps.logsumexp(a)))


@given(data=scores_with_k(lo=-30.0, hi=30.0))
def test_ent_tr_loss_matches_direct_formula(data):
    """ent_tr_loss_and_grad's per-example loss is the truncated softmax; k = 1 is LR^Multi;
    rows are independent and the gradient rows sum to zero (shift invariance)."""
    y, s, k = data
    S = np.stack([s, s[::-1], s + 3.0])
    ys = np.array([y, s.shape[0] - 1 - y, y])
    losses, G = ent_tr_loss_and_grad(S.copy(), ys, k)
    for i in range(3):
        assert losses[i] == pytest.approx(ent_tr_direct(S[i], ys[i], k), rel=1e-13, abs=1e-14)
    np.testing.assert_allclose(G.sum(axis=1), 0.0, atol=1e-14)
    if k == 1:
        assert losses[0] == pytest.approx(sps.logsumexp(s) - s[y], rel=1e-13, abs=1e-14)


@given(data=scores_with_k(lo=-3.0, hi=3.0))
def test_ent_tr_gradient_matches_finite_differences(data):
    """Away from ties between the (k-1)-th and k-th largest off-label scores the loss is
    smooth and the returned gradient is its derivative."""
    y, s, k = data
    a = np.sort(np.delete(s, y))[::-1]
    if k > 1:
        assume(a[k - 2] - a[k - 1] > 1e-3)
    h = 1e-6
    _, G = ent_tr_loss_and_grad(s[None, :].copy(), np.array([y]), k)
    fd = np.empty_like(s)
    for j in range(s.shape[0]):
        e = np.zeros_like(s)
        e[j] = h
        plus, _ = ent_tr_loss_and_grad((s + e)[None, :], np.array([y]), k)
        minus, _ = ent_tr_loss_and_grad((s - e)[None, :], np.array([y]), k)
        fd[j] = (plus[0] - minus[0]) / (2 * h)
    np.testing.assert_allclose(fd, G[0], atol=1e-8, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 4, 9])
def test_ent_tr_kernel_matches_the_array_formula(k):
    """The compiled truncated-entropy rows against the same loss and gradient written with
    whole-array operations (argpartition drops the k - 1 largest off-label margins)."""
    rng = np.random.default_rng(k)
    S = (
        rng.standard_normal((300, 10))
        * np.array([1e-3, 1.0, 30.0])[rng.integers(0, 3, 300)][:, None]
    )
    y = rng.integers(0, 10, 300)
    rows = np.arange(300)
    A = S - S[rows, y][:, None]
    A[rows, y] = -np.inf
    if k > 1:
        A[rows[:, None], np.argpartition(-A, k - 2, axis=1)[:, : k - 1]] = -np.inf
    mx = np.maximum(A.max(axis=1), 0.0)
    E = np.exp(A - mx[:, None])
    Z = np.exp(-mx) + E.sum(axis=1)
    G = E / Z[:, None]
    G[rows, y] = -G.sum(axis=1)
    losses, grad = ent_tr_loss_and_grad(S, y, k)
    np.testing.assert_allclose(losses, mx + np.log(Z), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(grad, G, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("k", [1, 2, 4, 9, 10, 11])
def test_ent_tr_remembered_classes_change_nothing(k):
    """Rows keep their dropped classes from the last call only while those still lie strictly
    above the rest: along a drifting sequence of scores, with exact ties planted at the
    (k-1)-th margin and labels among the dropped, every call equals a fresh one bit for bit."""
    rng = np.random.default_rng(10 + k)
    n, m = 400, 10
    y = rng.integers(0, m, n)
    S = rng.standard_normal((n, m))
    dropped = np.full((n, max(k - 1, 1)), -1, dtype=np.int64)
    for step in range(12):
        S = S + 0.3 * rng.standard_normal((n, m)) * (rng.random((n, 1)) < 0.5)
        S[::5, : m // 2] = S[::5, :1]  # ties across the boundary of the dropped set
        if step == 6:
            y = rng.integers(0, m, n)  # a label among the remembered classes
        kept, G_kept = ent_tr_loss_and_grad(S, y, k, dropped)
        fresh, G_fresh = ent_tr_loss_and_grad(S, y, k)
        np.testing.assert_array_equal(kept, fresh)
        np.testing.assert_array_equal(G_kept, G_fresh)
    assert (dropped[:, 0] >= 0).all() == (1 < k <= m)  # k = 1 drops none; k > m: too few
    with pytest.raises(ValueError, match="dropped must be"):
        ent_tr_loss_and_grad(S, y, k, dropped[:, :-1] if k > 2 else dropped.astype(np.int32))
