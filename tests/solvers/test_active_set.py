"""The active-set finish of SVM^ML_gamma (:mod:`topkbench.solvers.active_set`): its face
kernels, its optimum against cvxpy on small ill-conditioned problems (dense and CSR, with and
without smoothing, weighted), and where the phase plan takes it."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from ml_reference import (
    cvxpy_primal,
    dense,
    dual_value,
    fit_certified,
    kept_rows,
    make_ml_problem,
    primal_value,
)

from topkbench.losses.ids import LOSS_LR_ML, LOSS_SVM_ML
from topkbench.solvers import active_set as act
from topkbench.solvers import plan
from topkbench.solvers.problem import SDCAProblem, _csr_arrays


@pytest.fixture
def no_newton_route(monkeypatch):
    """Small problems take Newton's dense or Woodbury steps; without them SVM^ML takes the
    active-set finish, as corel5k and delicious do."""
    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 0)
    monkeypatch.setattr(plan, "WOODBURY_MAX_ROWS", 0)


def ill_conditioned(seed: int, sparse: bool, n: int = 24, d: int = 4, m: int = 5):
    """A multilabel problem whose feature columns span four orders of magnitude."""
    X, Y = make_ml_problem(n=n, d=d, m=m, seed=seed, n_empty=1, n_full=1, zero_rows=(3,))
    X = X * np.logspace(-2, 2, d)
    return (sp.csr_matrix(X) if sparse else X), Y


CASES = [
    # gamma, C, seed, sparse, weighted
    (0.0, 10.0, 1, False, False),
    (0.0, 100.0, 2, True, False),
    (0.5, 10.0, 3, True, False),
    (0.0, 30.0, 4, False, True),
    (1.0, 1000.0, 5, True, True),
]


@pytest.mark.parametrize("gamma,C,seed,sparse,weighted", CASES)
def test_active_set_matches_cvxpy(no_newton_route, gamma, C, seed, sparse, weighted):
    """The finish reaches cvxpy's optimum (1e-6 relative), and the model's P, D and gap are
    the original problem's: recomputed in numpy from W and from the domain-checked A."""
    X, Y = ill_conditioned(seed, sparse)
    weights = np.random.default_rng(seed).uniform(0.5, 2.0, Y.shape[0]) if weighted else None
    model = fit_certified(X, Y, "svm_ml", C=C, gamma=gamma, eps=1e-9, max_epochs=20_000,
                          accelerate="newton", sample_weight=weights)  # fmt: skip
    assert model.status == "converged"
    assert model.info["active_set_rounds"] >= 1
    p_ref, W_ref = cvxpy_primal(X, Y, "svm_ml", gamma, C, weights=weights)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    if weights is None:
        P = primal_value(X, Y, model.W, "svm_ml", gamma, C)
        D = dual_value(X, Y, model.A, "svm_ml", gamma, C)
        assert P == pytest.approx(model.primal, rel=1e-12)
        assert D == pytest.approx(model.dual, rel=1e-12)
        assert 0.0 <= (P - D) / P <= 1e-8
        assert D <= primal_value(X, Y, W_ref, "svm_ml", gamma, C) * (1 + 1e-12)
    np.testing.assert_allclose(model.W, dense(X).T @ model.A, rtol=0, atol=1e-9 * C)


def test_active_set_reaches_the_plain_sdca_optimum(no_newton_route):
    """A large-C nonsmooth problem: the same optimum as plain SDCA, in fewer epochs."""
    X, Y = make_ml_problem(n=60, d=6, m=7, seed=7, sparse=True)
    kw = dict(C=100.0, gamma=0.0, eps=1e-6, max_epochs=50_000)
    plain = fit_certified(X, Y, "svm_ml", accelerate="never", **kw)
    finish = fit_certified(X, Y, "svm_ml", accelerate="newton", **kw)
    assert finish.info["active_set_rounds"] >= 1
    assert finish.primal == pytest.approx(plain.primal, rel=1e-5)
    assert finish.epochs < plain.epochs


# --- the face ----------------------------------------------------------------------------------


def face_of(seed: int = 11, C: float = 5.0, gamma: float = 0.0):
    """A face from a dual SDCA leaves after a few epochs (some blocks at their radius)."""
    X, Y = ill_conditioned(seed, True, n=40, d=5, m=6)
    model = fit_certified(X, Y, "svm_ml", C=C, gamma=gamma, eps=1e-12, max_epochs=3,
                          accelerate="never", warn=False)  # fmt: skip
    rows = kept_rows(Y)
    prob = SDCAProblem(X[rows], sp.csr_matrix(Y[rows]), gram=False, n_classes=Y.shape[1],
                       loss_id=LOSS_SVM_ML, k=1)  # fmt: skip
    A = np.ascontiguousarray(model.A[rows])
    return act._Face(prob, A, C, gamma, _csr_arrays(prob.X)), prob, A


def test_tangent_is_the_orthogonal_projection_onto_the_face():
    """Idempotent and symmetric, zero on the entries at 0, and its image keeps each block's
    constraints: the sum (radius free) or each side's sum (radius binding) unchanged."""
    face, _, _ = face_of()
    assert face.bounded.any() and not face.bounded.all()
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=face.a.size), rng.normal(size=face.a.size)
    Pu, Pv = face.tangent(u.copy()), face.tangent(v.copy())
    np.testing.assert_allclose(face.tangent(Pu.copy()), Pu, atol=1e-13)
    assert float(Pu @ v) == pytest.approx(float(u @ Pv), rel=1e-12)
    for i in range(face.fptr.size - 1):
        sl = slice(face.fptr[i], face.fptr[i + 1])
        pos = face.fsgn[sl] > 0
        if face.bounded[i]:
            assert abs(Pu[sl][pos].sum()) < 1e-12 and abs(Pu[sl][~pos].sum()) < 1e-12
        else:
            assert abs(Pu[sl].sum()) < 1e-12


def test_hessian_products_are_those_of_the_dual():
    """f(a + t v) - f(a) = t <g, v> + t^2/2 <v, H v> with f = -D computed from dense A."""
    C, gamma = 5.0, 0.3
    face, prob, A = face_of(C=C, gamma=gamma)
    X = dense(prob.X)
    Ypos = dense(sp.csr_matrix((np.ones(prob.y[1].size), prob.y[1], prob.y[0]),
                               shape=(prob.n, prob.m))).astype(bool)  # fmt: skip
    sigma = np.where(Ypos, 1.0, -1.0)

    def f(A):
        return 0.5 * float(np.sum((X.T @ A) ** 2)) + gamma / (2 * C) * float(np.sum(A * A)) \
            - 0.5 * float(np.sum(sigma * A))  # fmt: skip

    rows = np.repeat(np.arange(prob.n), np.diff(face.fptr))
    v = np.random.default_rng(1).normal(size=face.a.size)
    V = np.zeros_like(A)
    V[rows, face.fcol] = v
    Hv, Hv_t = face.hess(v)
    t = 0.37
    assert f(A + t * V) - f(A) == pytest.approx(t * float(face.g @ v) + t * t / 2 * float(v @ Hv),
                                                rel=1e-9)  # fmt: skip
    np.testing.assert_allclose(Hv_t, face.tangent(Hv.copy()), atol=1e-12)


def test_max_step_and_projection_keep_the_domain():
    """The step to the boundary stays in the domain and reaches it; the projection of any
    point lands in it (signs, equal sums, radius)."""
    face, _, _ = face_of()
    rng = np.random.default_rng(2)
    p = face.tangent(rng.normal(size=face.a.size))
    tmax = act._max_step(face.fptr, face.fsgn, face.bounded, face.rc, face.a, p)
    assert 0.0 < tmax < np.inf
    for a in (face.a + tmax * p, face.projected(face.a + 10 * tmax * p)[0]):
        for i in range(face.fptr.size - 1):
            sl = slice(face.fptr[i], face.fptr[i + 1])
            pos = face.fsgn[sl] > 0
            assert np.all(a[sl][pos] >= -1e-12) and np.all(a[sl][~pos] <= 1e-12)
            assert a[sl][pos].sum() == pytest.approx(-a[sl][~pos].sum(), abs=1e-10)
            assert a[sl][pos].sum() <= face.rc[i] * (1 + 1e-12)


def test_cg_on_the_face_decreases_f():
    """A CG budget lowers f = -D (its tracked gradient stays the true one)."""
    face, _, _ = face_of(C=20.0)
    g0 = face.g.copy()
    a0 = face.a.copy()
    act._cg_on_face(face, 50)
    step = face.a - a0
    assert float(g0 @ step) < 0.0
    np.testing.assert_allclose(face.g, face.hess(face.a)[0] - 0.5 * face.fsgn, atol=1e-9)


# --- where the plan takes it --------------------------------------------------------------------


def test_plan_takes_the_active_set_where_no_newton_route_applies():
    """SVM^ML past the Woodbury limit (corel5k's shape) finishes on its faces; LR^ML keeps
    Newton-CG, and a Gram matrix has no face phase."""
    n = plan.WOODBURY_MAX_ROWS + 1
    assert plan.second_order("csr", 499, 374, LOSS_SVM_ML, n) == plan.ACTIVE_SET
    assert plan.second_order("gram", n, 374, LOSS_SVM_ML, n) is None
    assert plan.second_order("csr", 499, 374, LOSS_LR_ML, n) == "newton-cg"
    assert plan.second_order("dense", 294, 6, LOSS_SVM_ML, 1000) == "newton-woodbury"
    text = plan.describe(plan.plan("csr", 499, 374, LOSS_SVM_ML, 0.0, n=n))
    assert "active-set" in text and "accelerated (if" not in text


def test_the_finish_is_priced_by_its_face_and_refused_past_its_density(no_newton_route):
    """A round's products cost with the dual's nonzeros; a dense face (delicious' 17 %) is
    not offered the finish, whose rounds then grow with it too."""
    _, prob, _ = face_of()
    sparse, denser = (plan.newton_cost_epochs(prob, density=rho) for rho in (0.02, 0.05))
    assert 0.0 < sparse < denser < np.inf
    assert plan.newton_cost_epochs(prob, density=plan.ACTIVE_SET_MAX_DENSITY * 1.5) == np.inf
