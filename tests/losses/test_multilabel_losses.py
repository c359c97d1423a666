"""Multilabel losses SVM^ML, smooth SVM^ML_gamma and LR^ML with their conjugates (TPAMI, 002
§3.3, Props. 5-7; §5.3, Props. 18-20), ``topkbench.losses.multilabel``.

Notation: scores ``u`` (length m), label set ``Y`` (``k = |Y|``, ``0 < k < m``), complement
``Ybar``.  The kernels' pairing: ``loss_value_ml(loss, Y, u, gamma, ...) = L(u)`` and
``neg_conjugate_value_ml(loss, Y, a, C, gamma, mask) = -L*(v)`` at ``v = -a / C``.

* SVM^ML (Prop. 5): ``L(u) = max{0, 1 + max_Ybar u_j - min_Y u_y}``, the support-type function
  ``max_{v in S_Y} <u, v> - L*(v)`` with ``S_Y = {v_Y <= 0, v_Ybar >= 0, -sum v_Y = sum v_Ybar
  <= 1}`` and ``L*(v) = -sum_Ybar v_j``.
* Smooth SVM^ML_gamma (Prop. 6): the same maximization with ``L*_gamma(v) = 1/2 (sum_Y v_y -
  sum_Ybar v_j) + gamma/2 ||v||^2``.  Writing ``v_Y = -p'``, ``v_Ybar = pbar'`` with ``(p',
  pbar')`` in B(1) the objective is ``<b, p'> + <bbar, pbar'> - gamma/2 (||p'||^2 +
  ||pbar'||^2)``, ``b = 1/2 - u_Y``, ``bbar = 1/2 + u_Ybar``; substituting ``p' = p / gamma``
  it is ``1/gamma`` times the projection objective over B(gamma), so the maximizer (= the
  gradient of L_gamma, Danskin) is ``v_Y = -p / gamma``, ``v_Ybar = pbar / gamma`` with
  ``(p, pbar) = proj_{B(gamma)}(b, bbar)``.
* Smoothing bounds: ``L*_gamma = L* + gamma/2 ||.||^2`` on S_Y, and on S_Y ``||v||^2 = ||p'||^2 +
  ||pbar'||^2 <= (sum p')^2 + (sum pbar')^2 <= 2``, so ``L - gamma <= L_gamma <= L``; the constant
  is attained (``Y = {0}``, ``u = (-10, 10)``: ``L = 21``, ``L_gamma = 21 - gamma`` for small
  gamma), so ``L - gamma/2`` is *not* a valid lower bound.
* Singleton Y: SVM^ML = SVM^Multi at gamma = 0, but the smooth losses differ: SVM^ML_gamma
  smooths all m coordinates of v, including ``v_y = -<1, x>``, i.e. it is ``max_{x in Delta}
  <z, x> - gamma/2 (||x||^2 + <1,x>^2)`` (``z = 1 + u_j - u_y``, ``j != y``), while
  SVM^Multi_gamma has no ``<1,x>^2`` term (this first form is checked with the biased simplex
  projection of ``topkbench.prox.projections``).
* LR^ML: ``L(u) = log sum_j exp u_j - (1/k) sum_Y u_y`` (the all-class form of the
  cross-entropy; see the kernel's docstring for the printed inner sum over Y), with
  ``L*(v) = sum_j q_j log q_j`` for ``q = v + 1_Y / k`` in the simplex (Prop. 7); singleton Y
  gives LR^Multi.

Checked: closed forms, cvxpy (CLARABEL) LP/QP for the SVM losses, Fenchel-Young inequality
``L(u) + L*(v) >= <u, v>`` on random domain points and equality at the gradient, finite-
difference gradients, and the trivial label sets (empty or complete: loss 0, conjugate 0).
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.special as sps
from hypothesis import given, settings
from hypothesis import strategies as st

from topkbench.losses.dispatch import loss_value
from topkbench.losses.ids import LOSS_LR_ML, LOSS_LR_MULTI, LOSS_SVM_ML, LOSS_SVM_MULTI
from topkbench.losses.multilabel import loss_value_ml, neg_conjugate_value_ml
from topkbench.prox.bipartite import project_bipartite
from topkbench.prox.projections import simplex_biased_threshold

CVX_TOL = {"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11}
GAMMAS = (1e-3, 0.1, 1.0, 10.0)


# --- kernel wrappers ---------------------------------------------------------------------------


def as_labels(labels):
    return np.ascontiguousarray(sorted(labels), dtype=np.int64)


def L(loss, labels, u, gamma=0.0):
    """``L(Y, u)`` through the numba kernel; also checks that the mask comes back all-False."""
    u = np.ascontiguousarray(u, dtype=np.float64)
    m = u.shape[0]
    mask = np.zeros(m, dtype=np.bool_)
    value = loss_value_ml(
        loss, as_labels(labels), u, float(gamma), np.empty(m), np.empty(m, np.int64), mask,
        np.empty(0),
    )  # fmt: skip
    assert not mask.any()
    return value


def L_star(loss, labels, v, gamma=0.0, C=1.0):
    """``L*(Y, v)`` through the kernel, which takes the dual block ``a = -C v``."""
    a = np.ascontiguousarray(-C * np.asarray(v, dtype=np.float64))
    mask = np.zeros(a.shape[0], dtype=np.bool_)
    value = -neg_conjugate_value_ml(loss, as_labels(labels), a, float(C), float(gamma), mask)
    assert not mask.any()
    return value


def L_multi(loss, y, u, gamma=0.0):
    """Multiclass loss (``topkbench.losses.dispatch.loss_value``) with k = 1."""
    u = np.ascontiguousarray(u, dtype=np.float64)
    m = u.shape[0]
    return loss_value(
        loss, int(y), u, float(gamma), 1, np.empty(m), np.empty(m), np.empty(m, np.int64),
        np.empty(m),
    )  # fmt: skip


# --- references --------------------------------------------------------------------------------


def in_Y(labels, m):
    mask = np.zeros(m, dtype=bool)
    mask[list(labels)] = True
    return mask


def svm_ml_closed_form(labels, u):
    """Max over pairs (y, j) in Y x Ybar of max{0, 1 + u_j - u_y} (the first line of SVM^ML)."""
    mask = in_Y(labels, u.size)
    return max(
        0.0, max(1.0 + u[j] - u[y] for y in np.flatnonzero(mask) for j in np.flatnonzero(~mask))
    )


def cvx_svm_ml(labels, u, gamma):
    """``max_{v in S_Y} <u, v> - L*_gamma(v)`` by CLARABEL (an LP for gamma = 0)."""
    mask = in_Y(labels, u.size)
    v = cp.Variable(u.size)
    vy, vn = v[np.flatnonzero(mask)], v[np.flatnonzero(~mask)]
    cons = [vy <= 0, vn >= 0, -cp.sum(vy) == cp.sum(vn), cp.sum(vn) <= 1]
    conj = 0.5 * (cp.sum(vy) - cp.sum(vn)) + gamma / 2 * cp.sum_squares(v)
    problem = cp.Problem(cp.Maximize(u @ v - conj), cons)
    problem.solve(solver=cp.CLARABEL, **CVX_TOL)
    assert problem.status == cp.OPTIMAL, problem.status
    return float(problem.value)


def smooth_svm_ml_gradient(labels, u, gamma):
    """The maximizer v of Prop. 6 (module docstring): v_Y = -p/gamma, v_Ybar = pbar/gamma."""
    mask = in_Y(labels, u.size)
    p, pb = project_bipartite(0.5 - u[mask], 0.5 + u[~mask], gamma)
    v = np.empty(u.size)
    v[mask] = -p / gamma
    v[~mask] = pb / gamma
    return v


def lr_ml_gradient(labels, u):
    mask = in_Y(labels, u.size)
    return sps.softmax(u) - mask / mask.sum()


def singleton_smooth_svm_ml(y, u, gamma):
    """``max_{x in Delta} <z, x> - gamma/2 (||x||^2 + <1,x>^2)``: x = (z/gamma - t)_+ with t the
    threshold of the biased simplex projection (rho = 1, radius 1)."""
    z = np.delete(1.0 + u - u[y], y)
    b = np.ascontiguousarray(z / gamma)
    t = simplex_biased_threshold(b, 1.0, 1.0, np.empty(b.size, np.int64))
    x = np.maximum(b - t, 0.0)
    return float(z @ x - gamma / 2 * (x @ x + x.sum() ** 2))


def random_S_Y_point(labels, m, rng):
    """v in S_Y from a random point (p, pbar) of B(1): v_Y = -p, v_Ybar = pbar."""
    mask = in_Y(labels, m)
    total = float(rng.choice([0.0, 1.0, rng.random()]))
    p = rng.dirichlet(np.ones(mask.sum())) * total
    pb = rng.dirichlet(np.ones((~mask).sum())) * total
    if rng.random() < 0.5:  # sparse points: zero some coordinates, renormalize
        p[rng.random(p.size) < 0.5] = 0.0
        pb[rng.random(pb.size) < 0.5] = 0.0
        p = p / p.sum() * total if p.sum() > 0 else np.eye(p.size)[0] * total
        pb = pb / pb.sum() * total if pb.sum() > 0 else np.eye(pb.size)[0] * total
    v = np.empty(m)
    v[mask] = -p
    v[~mask] = pb
    return v


def random_simplex_point(m, rng):
    q = rng.dirichlet(np.ones(m))
    if rng.random() < 0.5:
        q[rng.random(m) < 0.4] = 0.0
        q = q / q.sum() if q.sum() > 0 else np.eye(m)[0]
    return q


# --- strategies --------------------------------------------------------------------------------


@st.composite
def examples(draw, singleton=False, max_m=7):
    """(labels, u, rng): 0 < |Y| < m, scores at several scales, sometimes integer (ties)."""
    m = draw(st.integers(2, max_m))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k = 1 if singleton else draw(st.integers(1, m - 1))
    labels = sorted(int(j) for j in rng.choice(m, size=k, replace=False))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    u = rng.normal(0.0, scale, m)
    if draw(st.booleans()):
        u = np.round(u)
    return labels, u, rng


# --- SVM^ML (gamma = 0) ------------------------------------------------------------------------


@settings(max_examples=60)
@given(ex=examples())
def test_svm_ml_closed_form_and_lp(ex):
    """L equals the max over label pairs, and the LP max_{S_Y} <u, v> - L*(v) (Prop. 5)."""
    labels, u, _ = ex
    value = L(LOSS_SVM_ML, labels, u)
    assert value == pytest.approx(svm_ml_closed_form(labels, u), rel=1e-15, abs=0)
    assert value == pytest.approx(cvx_svm_ml(labels, u, 0.0), rel=1e-8, abs=1e-9)


def test_svm_ml_vertex_maximizer():
    """For L > 0 the LP is maximized at v = e_{argmax Ybar} - e_{argmin Y}, with -L* = 1."""
    u = np.array([0.3, -0.2, 0.9, 0.1, 0.5])
    labels = [0, 1, 4]
    value = L(LOSS_SVM_ML, labels, u)
    assert value == pytest.approx(1.0 + 0.9 - (-0.2))
    v = np.zeros(5)
    v[2], v[1] = 1.0, -1.0
    assert L_star(LOSS_SVM_ML, labels, v) == pytest.approx(-1.0, abs=1e-15)
    assert value + L_star(LOSS_SVM_ML, labels, v) == pytest.approx(u @ v, abs=1e-15)


# --- smooth SVM^ML_gamma -----------------------------------------------------------------------


@settings(max_examples=60)
@given(ex=examples(), gamma=st.sampled_from(GAMMAS))
def test_smooth_svm_ml_matches_cvxpy_qp(ex, gamma):
    """Prop. 6's closed form through the bipartite projection equals the QP
    max_{v in S_Y} <u, v> - L*_gamma(v)."""
    labels, u, _ = ex
    value = L(LOSS_SVM_ML, labels, u, gamma)
    assert value == pytest.approx(cvx_svm_ml(labels, u, gamma), rel=1e-7, abs=1e-8)


@settings(max_examples=60)
@given(ex=examples(), gamma=st.sampled_from((*GAMMAS, 100.0)))
def test_smoothing_bounds(ex, gamma):
    """L - gamma <= L_gamma <= L (module docstring: ||v||^2 <= 2 on S_Y)."""
    labels, u, _ = ex
    hard = L(LOSS_SVM_ML, labels, u)
    smooth = L(LOSS_SVM_ML, labels, u, gamma)
    tol = 1e-12 * (1.0 + hard)
    assert hard - gamma - tol <= smooth <= hard + tol


@pytest.mark.parametrize("gamma", [1e-3, 0.1, 1.0])
def test_smoothing_bound_is_attained(gamma):
    """Y = {0}, u = (-10, 10): L = 21 and L_gamma = 21 - gamma (projection p = pbar = gamma), so
    the constant gamma of the lower bound cannot be improved to gamma/2."""
    u = np.array([-10.0, 10.0])
    assert L(LOSS_SVM_ML, [0], u) == 21.0
    smooth = L(LOSS_SVM_ML, [0], u, gamma)
    assert smooth == pytest.approx(21.0 - gamma, rel=1e-14)
    assert smooth < 21.0 - gamma / 2


@settings(max_examples=40)
@given(ex=examples(singleton=True), gamma=st.sampled_from(GAMMAS))
def test_singleton_reductions_svm(ex, gamma):
    """Singleton Y: SVM^ML = SVM^Multi at gamma = 0; SVM^ML_gamma = max_{x in Delta} <z, x> -
    gamma/2 (||x||^2 + <1,x>^2) (all m coordinates smoothed), which is <= SVM^Multi_gamma."""
    labels, u, _ = ex
    y = labels[0]
    assert L(LOSS_SVM_ML, labels, u) == pytest.approx(L_multi(LOSS_SVM_MULTI, y, u), rel=1e-15)
    smooth_ml = L(LOSS_SVM_ML, labels, u, gamma)
    assert smooth_ml == pytest.approx(singleton_smooth_svm_ml(y, u, gamma), rel=1e-10, abs=1e-12)
    assert smooth_ml <= L_multi(LOSS_SVM_MULTI, y, u, gamma) + 1e-12


@pytest.mark.parametrize("gamma", [0.1, 1.0])
def test_singleton_smooth_svm_ml_is_not_smooth_svm_multi(gamma):
    """TPAMI §3.3 says the smooth SVM^ML 'naturally recovers' SVM^Multi_gamma for singleton Y;
    it does not (module docstring): u = (-10, 10), Y = {0} gives 21 - gamma versus the
    multiclass 21 - gamma/2; at gamma = 0 they coincide."""
    u = np.array([-10.0, 10.0])
    ml = L(LOSS_SVM_ML, [0], u, gamma)
    multi = L_multi(LOSS_SVM_MULTI, 0, u, gamma)
    assert ml == pytest.approx(21.0 - gamma, rel=1e-14)
    assert multi == pytest.approx(21.0 - gamma / 2, rel=1e-14)
    assert multi - ml > 0.4 * gamma
    # a generic example, m = 4, inside the quadratic region of both
    u = np.array([0.2, 0.1, -0.3, 0.4])
    assert abs(L(LOSS_SVM_ML, [1], u, gamma) - L_multi(LOSS_SVM_MULTI, 1, u, gamma)) > 1e-3
    assert L(LOSS_SVM_ML, [1], u) == L_multi(LOSS_SVM_MULTI, 1, u)


# --- LR^ML -------------------------------------------------------------------------------------


@settings(max_examples=60)
@given(ex=examples())
def test_lr_ml_closed_form(ex):
    """L = logsumexp(u) - mean_Y u; shifting u by a constant leaves it unchanged."""
    labels, u, _ = ex
    ref = float(sps.logsumexp(u) - u[labels].mean())
    assert L(LOSS_LR_ML, labels, u) == pytest.approx(ref, rel=1e-13, abs=1e-14)
    assert L(LOSS_LR_ML, labels, u + 7.0) == pytest.approx(ref, rel=1e-12, abs=1e-13)


@settings(max_examples=40)
@given(ex=examples(singleton=True))
def test_singleton_lr_ml_is_lr_multi(ex):
    labels, u, _ = ex
    ml = L(LOSS_LR_ML, labels, u)
    assert ml == pytest.approx(L_multi(LOSS_LR_MULTI, labels[0], u), rel=1e-14, abs=1e-15)


@settings(max_examples=60)
@given(ex=examples())
def test_lr_ml_conjugate(ex):
    """Prop. 7: for q in the simplex and v = q - 1_Y/k, -L*(v) = -sum q log q; and the sup in
    L*(v) = sup_u <u, v> - L(u) is attained at u = log q (q > 0)."""
    labels, u, rng = ex
    m = u.size
    mask = in_Y(labels, m)
    for C in (1.0, 0.01, 50.0):
        q = random_simplex_point(m, rng)
        v = q - mask / mask.sum()
        assert -L_star(LOSS_LR_ML, labels, v, C=C) == pytest.approx(
            float(sps.entr(q).sum()), rel=1e-12, abs=1e-14
        )
    q = rng.dirichlet(np.ones(m))
    v = q - mask / mask.sum()
    w = np.log(q)
    assert L(LOSS_LR_ML, labels, w) + L_star(LOSS_LR_ML, labels, v) == pytest.approx(
        float(w @ v), abs=1e-12 * (1.0 + np.abs(w).max())
    )


# --- Fenchel-Young -----------------------------------------------------------------------------


@settings(max_examples=60)
@given(ex=examples(), gamma=st.sampled_from((0.0, *GAMMAS)))
def test_fenchel_young_inequality(ex, gamma):
    """L(u) + L*(v) >= <u, v> for random v in the conjugate domains (SVM: S_Y from a random
    point of B(1); LR: v = q - 1_Y/k with q in the simplex)."""
    labels, u, rng = ex
    m = u.size
    mask = in_Y(labels, m)
    for _ in range(5):
        v = random_S_Y_point(labels, m, rng)
        gap = L(LOSS_SVM_ML, labels, u, gamma) + L_star(LOSS_SVM_ML, labels, v, gamma) - u @ v
        assert gap >= -1e-10, gap
        v = random_simplex_point(m, rng) - mask / mask.sum()
        gap = L(LOSS_LR_ML, labels, u) + L_star(LOSS_LR_ML, labels, v) - u @ v
        assert gap >= -1e-10, gap


@settings(max_examples=60)
@given(ex=examples(), gamma=st.sampled_from(GAMMAS))
def test_fenchel_young_equality_at_gradient(ex, gamma):
    """Equality at v = grad L(u): LR^ML at softmax(u) - 1_Y/k; smooth SVM^ML at the v of
    Prop. 6 built from the bipartite projection (module docstring), which lies in S_Y."""
    labels, u, _ = ex
    m = u.size
    mask = in_Y(labels, m)
    v = lr_ml_gradient(labels, u)
    lhs = L(LOSS_LR_ML, labels, u) + L_star(LOSS_LR_ML, labels, v)
    assert lhs == pytest.approx(float(u @ v), abs=1e-12 * (1.0 + np.abs(u).max()))
    v = smooth_svm_ml_gradient(labels, u, gamma)
    assert np.all(v[mask] <= 0) and np.all(v[~mask] >= 0)
    assert -v[mask].sum() == pytest.approx(v[~mask].sum(), rel=1e-12, abs=1e-12)
    assert v[~mask].sum() <= 1.0 + 1e-12
    lhs = L(LOSS_SVM_ML, labels, u, gamma) + L_star(LOSS_SVM_ML, labels, v, gamma)
    scale = 1.0 + np.abs(u).max() + gamma
    assert lhs == pytest.approx(float(u @ v), abs=1e-10 * scale)


@settings(max_examples=40)
@given(ex=examples(), gamma=st.sampled_from((0.1, 1.0, 10.0)))
def test_gradients_by_finite_differences(ex, gamma):
    """Central differences (h = 1e-6) of LR^ML and SVM^ML_gamma against the gradients above.

    The error of a central difference is O(h^2) where the function is C^3 and at most
    ``h * Lip(grad)`` across a kink of the gradient; Lip(grad) = 1/gamma for SVM^ML_gamma."""
    labels, u, _ = ex
    m = u.size
    h = 1e-6
    fd = np.empty((2, m))
    for j in range(m):
        e = np.zeros(m)
        e[j] = h
        fd[0, j] = (L(LOSS_LR_ML, labels, u + e) - L(LOSS_LR_ML, labels, u - e)) / (2 * h)
        up = L(LOSS_SVM_ML, labels, u + e, gamma)
        fd[1, j] = (up - L(LOSS_SVM_ML, labels, u - e, gamma)) / (2 * h)
    scale = 1.0 + np.abs(u).max()
    np.testing.assert_allclose(fd[0], lr_ml_gradient(labels, u), rtol=0, atol=1e-8 * scale)
    v = smooth_svm_ml_gradient(labels, u, gamma)
    np.testing.assert_allclose(fd[1], v, rtol=0, atol=h / gamma + 1e-8 * scale / gamma)


# --- trivial label sets -------------------------------------------------------------------------


@pytest.mark.parametrize("loss", [LOSS_SVM_ML, LOSS_LR_ML])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_empty_and_complete_label_sets(loss, gamma):
    """No ranking constraint: loss 0 and conjugate 0 whatever u and the dual block."""
    rng = np.random.default_rng(0)
    m = 5
    u = rng.normal(size=m) * 3
    a = rng.normal(size=m)
    for labels in ([], list(range(m))):
        assert L(loss, labels, u, gamma) == 0.0
        mask = np.zeros(m, dtype=np.bool_)
        ys = as_labels(labels)
        assert neg_conjugate_value_ml(loss, ys, a, 1.0, gamma, mask) == 0.0
        assert not mask.any()
