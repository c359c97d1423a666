"""Newton's method in the primal (topkbench.solvers.newton): its derivatives, its certificate
and its hand-overs.  Agreement with cvxpy's optima is in test_accelerated.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from solvers.test_accelerated import ill_conditioned

import topkbench
from topkbench.errors import ConvergenceWarning
from topkbench.losses.curvature import Curvature
from topkbench.losses.registry import get_method
from topkbench.solvers import hessian_kernels, newton_steps, plan
from topkbench.solvers.newton import PROX_MIN_GAMMA, derivatives_of
from topkbench.solvers.newton_steps import GramRows, hessian, newton_step, woodbury_direction
from topkbench.solvers.plan import NEWTON_MAX_DIM
from topkbench.solvers.problem import SDCAProblem

# (method, gamma): every loss Newton covers; at the test point the simplex sum of svm_multi
# binds in some examples at gamma = 5 and in all at gamma = 0.05
CASES = [("lr_multi", 0.0), ("lr_ova", 0.0), ("svm_ova", 0.5), ("svm_multi", 5.0),
         ("svm_multi", 0.05), ("topk_svm_beta", 0.5)]  # fmt: skip


def _problem(problem_factory, method, sparse=False, seed=41):
    X, y = problem_factory(n=30, d=3, m=5, seed=seed, sparse=sparse)
    X = ill_conditioned(X)
    loss = get_method(method).loss_id
    return SDCAProblem(X, y, gram=False, n_classes=5, loss_id=loss, k=2 if "topk" in method else 1)


def _grad_F(prob, deriv, W, C, gamma):
    """grad F = W + C X^T G (P / lambda scale)."""
    G = deriv.gradient(prob.scores(W), gamma)
    return W + C * np.asarray(prob.X.T @ G)


@pytest.mark.parametrize("method,gamma", CASES)
def test_hessian_is_the_gradients_derivative(problem_factory, method, gamma):
    """H v equals the central difference of grad F along v (the hinges' gradients are
    piecewise linear: a small step stays on one piece at a generic point); for top-k
    SVM^beta, whose H_i are finite differences, this checks their assembly."""
    prob = _problem(problem_factory, method)
    rng = np.random.default_rng(1)
    C = 0.7
    W = rng.standard_normal((3, 5)) * np.array([[100.0], [3.0], [0.1]])
    deriv = derivatives_of(prob)
    deriv.gradient(prob.scores(W), gamma)
    H = hessian(prob.X, deriv, C, 5)
    np.testing.assert_allclose(H, H.T, rtol=0, atol=1e-9 * np.abs(H).max())
    assert np.linalg.eigvalsh(H).min() >= 1.0 - 1e-9 * np.abs(H).max()  # I + PSD
    for _ in range(3):
        V = rng.standard_normal((3, 5)) * 1e-7
        fd = (_grad_F(prob, deriv, W + V, C, gamma) - _grad_F(prob, deriv, W - V, C, gamma)) / 2
        hv = (H @ V.T.reshape(-1)).reshape(5, 3).T
        np.testing.assert_allclose(hv, fd, rtol=1e-5, atol=1e-6 * np.abs(hv).max())


def test_hinge_cases_cover_both_simplex_regimes(problem_factory):
    """The svm_multi cases above exercise both Jacobians: sum constraint free and binding."""
    prob = _problem(problem_factory, "svm_multi")
    rng = np.random.default_rng(1)
    W = rng.standard_normal((3, 5)) * np.array([[100.0], [3.0], [0.1]])
    deriv = derivatives_of(prob)
    deriv.gradient(prob.scores(W), 5.0)
    support, binds, _ = deriv.state
    assert binds.any() and (~binds & support.any(axis=1)).any()


@pytest.mark.parametrize("method,gamma", CASES[:4])
def test_gap_is_half_the_squared_gradient(problem_factory, method, gamma):
    """The certificate of (W, -C G(W)) is lambda/2 ||grad F(W)||^2, computed independently
    from the kernels' loss and conjugate values."""
    X, y = problem_factory(n=30, d=3, m=5, seed=42)
    X = ill_conditioned(X)
    C = 3.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = topkbench.fit(X, y, method, C=C, gamma=gamma, eps=1e-12, max_epochs=2,
                              accelerate="newton", warn=False)  # fmt: skip
    assert model.info["newton_iterations"] == 2
    lam = 1.0 / (C * 30)
    grad = model.W - X.T @ model.A
    assert model.primal - model.dual == pytest.approx(0.5 * lam * np.vdot(grad, grad), rel=1e-6)


@pytest.mark.parametrize("method,gamma", [("lr_multi", 0.0), ("svm_multi", 0.5)])
@pytest.mark.parametrize("dtype_case", ["float32", "csr"])
def test_float32_and_csr_features(problem_factory, dtype_case, method, gamma):
    X, y = problem_factory(n=30, d=3, m=5, seed=43)
    X = ill_conditioned(X)
    if dtype_case == "float32":
        X = X.astype(np.float32).astype(np.float64)  # the same values in both runs
        feats = X.astype(np.float32)
    else:
        feats = sp.csr_matrix(X)
    kw = dict(C=30.0, gamma=gamma, eps=1e-9, accelerate="newton")
    ref = topkbench.fit(X, y, method, **kw)
    model = topkbench.fit(feats, y, method, **kw)
    assert model.converged and "newton_from_epoch" in model.info
    assert "plain_from_epoch" not in model.info
    assert model.primal == pytest.approx(ref.primal, rel=1e-8)


def test_budget_stop_warns(problem_factory):
    X, y = problem_factory(n=30, d=3, m=5, seed=44)
    X = ill_conditioned(X)
    with pytest.warns(ConvergenceWarning, match="max_epochs"):
        model = topkbench.fit(X, y, "svm_multi", C=100.0, eps=1e-12, max_epochs=3,
                              accelerate="newton")  # fmt: skip
    assert model.status == "max_epochs" and model.epochs == 3
    assert model.trace[-1].relative_gap > 1e-12


def test_nonsmooth_hinge_continues_to_gamma_zero(problem_factory):
    """gamma = 0 runs the smoothing continuation; every certificate is the gamma = 0 one."""
    X, y = problem_factory(n=30, d=3, m=5, seed=45)
    X = ill_conditioned(X)
    model = topkbench.fit(X, y, "svm_multi", C=100.0, eps=1e-6, accelerate="newton")
    assert model.converged and len(model.info["gamma_stages"]) > 1
    assert "plain_from_epoch" not in model.info
    stages = model.info["gamma_stages"]
    assert stages[0] == 1.0 and all(b <= a for a, b in zip(stages, stages[1:], strict=False))
    assert min(stages) == PROX_MIN_GAMMA and stages.count(PROX_MIN_GAMMA) > 1  # centres moved
    other = topkbench.fit(X, y, "svm_multi", C=100.0, eps=1e-6, max_epochs=10**6,
                          accelerate="catalyst")  # fmt: skip
    assert model.primal == pytest.approx(other.primal, rel=2e-6)


def test_not_applicable_falls_back_to_catalyst(problem_factory):
    """A Gram matrix leaves the run to accelerated SDCA.  Above NEWTON_MAX_DIM LR^Multi takes
    Newton-CG and a smoothed hinge the Woodbury steps, unless it has more than
    WOODBURY_MAX_ROWS examples (then accelerated SDCA), or its Woodbury system would have more
    than WOODBURY_MAX_RANK rows (then Newton hands on to accelerated SDCA)."""
    X, y = problem_factory(n=30, d=3, m=5, seed=46)
    X = ill_conditioned(X)
    kw = dict(C=10.0, eps=1e-6, max_epochs=50, warn=False, accelerate="newton")
    kernel = topkbench.fit(None, y, "lr_multi", K=X @ X.T, **kw)
    assert "accelerated_from_epoch" in kernel.info and "newton_from_epoch" not in kernel.info
    wide = np.hstack([X] * (NEWTON_MAX_DIM // 15 + 1))
    assert wide.shape[1] * 5 > NEWTON_MAX_DIM
    model = topkbench.fit(wide, y, "lr_multi", **kw)
    assert model.converged and "newton_from_epoch" in model.info
    model = topkbench.fit(wide, y, "svm_multi", gamma=0.5, **kw)  # the Woodbury route
    assert model.converged and model.info["newton_iterations"] > 0
    assert "accelerated_from_epoch" not in model.info
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "WOODBURY_MAX_ROWS", X.shape[0] - 1)
        model = topkbench.fit(wide, y, "svm_multi", gamma=0.5, **kw)
    assert "accelerated_from_epoch" in model.info and "newton_from_epoch" not in model.info
    import topkbench.solvers.sdca as sdca

    given, handed = [], []

    def recording(solver, duals):
        def solve(prob, run, A, *args):
            duals.append(A.copy())
            return solver(prob, run, A, *args)

        return solve

    with pytest.MonkeyPatch.context() as mp:  # a Woodbury system too large: handed on
        mp.setattr(plan, "WOODBURY_MAX_RANK", 1)
        mp.setattr(sdca, "solve_newton", recording(sdca.solve_newton, given))
        mp.setattr(sdca, "solve_accelerated", recording(sdca.solve_accelerated, handed))
        model = topkbench.fit(wide, y, "svm_multi", gamma=0.5, **{**kw, "max_epochs": 10**5})
    assert model.converged and model.info["newton_iterations"] == 0
    assert "accelerated_from_epoch" in model.info
    # refused before any step, Newton hands back the dual it was given, not its gradient
    # dual; plain SDCA offers it once more, then the accelerated phase takes that dual
    assert len(given) == 2 and len(handed) == 1
    np.testing.assert_array_equal(handed[0], given[1])


GRADIENT_CASES = [("topk_svm_alpha", 0.5, 2), ("topk_svm_alpha_pseudo", 0.5, 3),
                  ("topk_svm_beta", 0.5, 2), ("topk_ent", 0.0, 3), ("svm_multi", 0.1, 1),
                  ("svm_ova", 0.1, 1), ("lr_ova", 0.0, 1), ("lr_multi", 0.0, 1)]  # fmt: skip


@pytest.mark.parametrize("method,gamma,k", GRADIENT_CASES)
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_gradient_matches_the_kernels_loss(method, gamma, k, scale):
    """<G, E> equals the central difference of the kernels' loss sum along E, for the
    analytic gradients and for the kernels' zero-norm block update alike."""
    rng = np.random.default_rng(7)
    n, m = 40, 6
    y = rng.integers(0, m, n)
    prob = SDCAProblem(rng.standard_normal((n, 3)), y, gram=False, n_classes=m,
                       loss_id=get_method(method).loss_id, k=k)  # fmt: skip
    S = rng.standard_normal((n, m)) * scale
    G = derivatives_of(prob).gradient(S, gamma)

    def loss_sum(T):
        return prob.values(np.ascontiguousarray(T), np.zeros((n, m)), 0.0, 1.0, gamma)[0] * n

    E = rng.standard_normal((n, m))
    h = 1e-6 * scale
    fd = (loss_sum(S + h * E) - loss_sum(S - h * E)) / (2 * h)
    assert np.vdot(G, E) == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_multilabel_gradient_matches_the_kernels_loss():
    rng = np.random.default_rng(8)
    n, m = 40, 6
    Y = sp.csr_matrix((rng.random((n, m)) < 0.3).astype(float))
    for method, gamma in (("svm_ml", 0.3), ("lr_ml", 0.0)):
        prob = SDCAProblem(rng.standard_normal((n, 3)), Y, gram=False, n_classes=m,
                           loss_id=get_method(method).loss_id, k=1)  # fmt: skip
        S = rng.standard_normal((n, m)) * 10.0
        G = derivatives_of(prob).gradient(S, gamma)

        def loss_sum(T, prob=prob, gamma=gamma):
            return prob.values(np.ascontiguousarray(T), np.zeros((n, m)), 0.0, 1.0, gamma)[0] * n

        E = rng.standard_normal((n, m))
        fd = (loss_sum(S + 1e-5 * E) - loss_sum(S - 1e-5 * E)) / 2e-5
        assert np.vdot(G, E) == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("C", [1e5, 1e8])
def test_huge_C_first_step(problem_factory, C):
    """At W = 0 the Huber hinge is linear, H = I and the Newton step is of size C n R: the line
    search must shrink it as far as needed (its floor is relative to W and the step)."""
    X, y = problem_factory(n=40, d=3, m=5, seed=47)
    X = ill_conditioned(X)
    model = topkbench.fit(X, y, "svm_ova", gamma=0.5, C=C, eps=1e-6, accelerate="newton")
    assert model.converged and model.info["newton_iterations"] < 100
    assert "plain_from_epoch" not in model.info and "accelerated_from_epoch" not in model.info


def test_a_failed_newton_step_hands_on_to_catalyst(problem_factory, monkeypatch):

    X, y = problem_factory(n=30, d=3, m=5, seed=48)
    X = ill_conditioned(X)
    ref = topkbench.fit(X, y, "lr_multi", C=10.0, eps=1e-9, accelerate="newton")
    monkeypatch.setattr(newton_steps, "newton_step", lambda H, grad: None)
    model = topkbench.fit(X, y, "lr_multi", C=10.0, eps=1e-6, accelerate="newton",
                          max_epochs=100_000)  # fmt: skip
    assert model.converged
    assert model.info["newton_iterations"] == 0 and "accelerated_from_epoch" in model.info
    assert model.primal == pytest.approx(ref.primal, rel=2e-6)


def test_a_stall_hands_on(problem_factory, monkeypatch):
    """A gap that stops falling (here: every step is cut to nothing by a useless Hessian)
    ends the Newton phase after STALL_ITERATIONS, and the run still converges."""
    import topkbench.solvers.newton as newton

    X, y = problem_factory(n=30, d=3, m=5, seed=49)
    X = ill_conditioned(X)
    from topkbench.solvers import line_search

    real = newton_steps.newton_step
    monkeypatch.setattr(newton_steps, "newton_step", lambda H, grad: 1e-9 * real(H, grad))
    monkeypatch.setattr(line_search, "ARMIJO", 0.0)
    model = topkbench.fit(X, y, "lr_multi", C=10.0, eps=1e-6, accelerate="newton",
                          max_epochs=100_000)  # fmt: skip
    assert model.converged and "accelerated_from_epoch" in model.info
    assert model.info["newton_iterations"] == newton.STALL_ITERATIONS


def test_multilabel_rows_without_ranking_are_left_out(problem_factory):
    """LR^ML and SVM^ML under Newton with empty and complete label sets: fit leaves those rows
    out; the optimum is that of the remaining rows."""
    rng = np.random.default_rng(50)
    X = ill_conditioned(rng.standard_normal((30, 3)))
    Y = (rng.random((30, 4)) < 0.4).astype(float)
    Y[0] = 0.0
    Y[1] = 1.0
    keep = np.flatnonzero((Y.sum(axis=1) > 0) & (Y.sum(axis=1) < 4))
    for method, gamma in (("lr_ml", 0.0), ("svm_ml", 0.5)):
        model = topkbench.fit(X, Y, method, gamma=gamma, C=30.0, eps=1e-9, accelerate="newton")
        assert model.converged and model.info["excluded_examples"] == 30 - keep.size >= 2
        assert "plain_from_epoch" not in model.info
        sub = topkbench.fit(X[keep], Y[keep], method, gamma=gamma, C=30.0, eps=1e-9,
                            accelerate="newton")  # fmt: skip
        assert model.primal == pytest.approx(sub.primal, rel=1e-8)


# --- structured curvature, exact line search, hand-over and warm starts ------------------------


def _multilabel_problem(seed=5, n=40, d=3, m=6):
    rng = np.random.default_rng(seed)
    Y = (rng.random((n, m)) < 0.35).astype(float)
    Y[0] = 0.0  # an empty label set: no ranking constraint, no curvature
    X = ill_conditioned(rng.standard_normal((n, d)))
    return X, sp.csr_matrix(Y)


@pytest.mark.parametrize("gamma", [5.0, 0.05])
def test_bipartite_hessian_is_the_gradients_derivative(gamma):
    """SVM^ML_gamma's analytic Hessian (the bipartite projection's Jacobian on its face)
    against central differences of grad F; gamma = 5 leaves the radius free in most
    examples, gamma = 0.05 makes it bind in most."""
    X, Y = _multilabel_problem()
    prob = SDCAProblem(X, Y, gram=False, n_classes=6, loss_id=get_method("svm_ml").loss_id, k=1)
    rng = np.random.default_rng(2)
    C = 0.9
    W = rng.standard_normal((3, 6)) * np.array([[30.0], [1.0], [0.1]])
    deriv = derivatives_of(prob)
    G = deriv.gradient(prob.scores(W), gamma)
    radius = -np.where(deriv.positive, G, 0.0).sum(axis=1) > 1.0 - 1e-9
    free = ~radius & (G != 0.0).any(axis=1)
    assert radius.any() if gamma < 1.0 else free.any()
    H = hessian(prob.X, deriv, C, 6)
    np.testing.assert_allclose(H, H.T, rtol=0, atol=1e-9 * np.abs(H).max())
    for _ in range(3):
        V = rng.standard_normal((3, 6)) * 1e-8
        fd = (_grad_F(prob, deriv, W + V, C, gamma) - _grad_F(prob, deriv, W - V, C, gamma)) / 2
        hv = (H @ V.T.reshape(-1)).reshape(6, 3).T
        np.testing.assert_allclose(hv, fd, rtol=1e-5, atol=1e-6 * np.abs(hv).max())


@pytest.mark.parametrize("method,gamma", [("svm_multi", 5.0), ("svm_multi", 0.05),
                                          ("lr_multi", 0.0), ("svm_ml", 0.3)])  # fmt: skip
def test_structured_curvature_equals_dense_hessians(problem_factory, method, gamma):
    """The diagonal-plus-rank-one form of each H_i equals the per-example matrix: the
    finite-difference Hessian of the kernels' gradient (exact off the kinks)."""
    if method == "svm_ml":
        X, Y = _multilabel_problem(seed=9)
        prob = SDCAProblem(X, Y, gram=False, n_classes=6, loss_id=get_method(method).loss_id,
                           k=1)  # fmt: skip
    else:
        prob = _problem(problem_factory, method)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((3, prob.m)) * np.array([[30.0], [1.0], [0.1]])
    deriv = derivatives_of(prob)
    S = prob.scores(W)
    deriv.gradient(S, gamma)
    curv = deriv.curvature(0, prob.n)
    dense = np.stack([curv.apply(np.eye(prob.m)[c][None].repeat(prob.n, 0))
                      for c in range(prob.m)], axis=2)  # fmt: skip
    G0 = deriv.kernel_gradient_at(np.ascontiguousarray(S), gamma)
    h = 1e-7 * min(gamma, 1.0) if gamma else 1e-7
    for c in range(prob.m):
        Sc = S.copy()
        Sc[:, c] += h
        col = (deriv.kernel_gradient_at(np.ascontiguousarray(Sc), gamma) - G0) / h
        np.testing.assert_allclose(dense[:, :, c], col, rtol=1e-5, atol=1e-6 / max(gamma, 1e-3))
    np.testing.assert_allclose(curv.diagonal(), np.einsum("icc->ic", dense), atol=1e-12)


def test_exact_step_finds_the_minimum_of_a_piecewise_quadratic():
    """phi(t) = sum_j huber(a_j t - b_j): the line search returns a step in (0, 1] where
    phi's slope is within LINE_SEARCH_TOL of 0 (relative to the first), and phi's minimizer
    itself when asked for it."""
    from topkbench.solvers import line_search
    from topkbench.solvers.line_search import LINE_SEARCH_TOL, exact_step

    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(50) * 10.0, rng.standard_normal(50)

    def dphi(t, g=0.01):
        z = a * t - b
        return float(np.sum(a * np.clip(z / g, -1.0, 1.0))) + 0.1 * t

    assert dphi(0.0) < 0.0 < dphi(1.0)
    lo, hi = 0.0, 1.0  # the root of the monotone phi' by bisection
    for _ in range(60):
        lo, hi = ((lo + hi) / 2, hi) if dphi((lo + hi) / 2) < 0.0 else (lo, (lo + hi) / 2)
    t = exact_step(dphi, dphi(0.0))
    assert 0.0 < t <= 1.0 and abs(dphi(t)) <= LINE_SEARCH_TOL * abs(dphi(0.0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(line_search, "LINE_SEARCH_TOL", 1e-9)
        assert abs(exact_step(dphi, dphi(0.0)) - lo) < 1e-9
    assert exact_step(lambda t: -1.0 + 0.5 * t, -1.0) == 1.0


def test_nonsmooth_hinge_hands_over_by_predicted_epochs():
    """A well-conditioned nonsmooth fit (C R^2 below the conditioning rule) that plain SDCA
    would take longer than Newton's predicted cost to certify goes to Newton, and the result
    certifies the gamma = 0 problem (P, D and gap of the original loss)."""
    from solvers.test_multilabel_sdca import dual_value

    from topkbench.solvers.accelerated import condition_number
    from topkbench.solvers.plan import ACCEL_MIN_CONDITION

    X, Y = _multilabel_problem(seed=12, n=60)
    X = X / np.sqrt((X**2).sum(axis=1).max()) * 10.0  # R^2 = 100
    C = 2.0
    prob = SDCAProblem(X, Y, gram=False, n_classes=6, loss_id=get_method("svm_ml").loss_id, k=1)
    assert condition_number(prob, C, 0.0) < ACCEL_MIN_CONDITION
    never = topkbench.fit(X, Y, "svm_ml", C=C, eps=1e-4, accelerate="never", max_epochs=20000,
                          warn=False)  # fmt: skip
    auto = topkbench.fit(X, Y, "svm_ml", C=C, eps=1e-4, max_epochs=20000, warn=False)
    assert never.epochs > 200  # plain SDCA's sublinear tail
    assert auto.converged and auto.info.get("newton_iterations", 0) > 0
    assert auto.relative_gap <= 1e-4
    assert auto.primal == pytest.approx(never.primal, rel=2e-4)
    D = dual_value(X, Y.toarray(), auto.A, "svm_ml", 0.0, C)
    assert D == pytest.approx(auto.dual, rel=1e-9)
    again = topkbench.fit(X, Y, "svm_ml", C=C, eps=1e-4, max_epochs=20000, warn=False)
    np.testing.assert_array_equal(again.A, auto.A)  # deterministic


def test_warm_start_hands_newton_the_previous_primal():
    """Along a C path, Newton starts from the previous model's W (and the last smoothing of
    its continuation): few iterations per C, each fit certified."""
    X, Y = _multilabel_problem(seed=13, n=80)
    warm = None
    iterations = []
    for C in (1.0, 2.0, 4.0, 8.0):
        model = topkbench.fit(X, Y, "lr_ml", C=C, eps=1e-6, warm_start=warm, warn=False)
        assert model.converged and model.relative_gap <= 1e-6
        iterations.append(model.info.get("newton_iterations", 0))
        warm = model
    cold = topkbench.fit(X, Y, "lr_ml", C=8.0, eps=1e-6, warn=False)
    assert cold.info["newton_iterations"] > iterations[-1] >= 1
    assert warm.primal == pytest.approx(cold.primal, rel=1e-5)


@pytest.mark.parametrize("method,gamma,k", [("topk_svm_beta", 0.5, 2), ("topk_svm_alpha", 0.3, 3),
                                            ("topk_svm_alpha_pseudo", 0.5, 2),
                                            ("svm_multi", 0.05, 1)])  # fmt: skip
@pytest.mark.parametrize("blas_min_work,dense_pair_slowdown", [(0, 0.0), (10**9, 1e9)])
def test_support_hessians_equal_the_dense_ones(problem_factory, monkeypatch, method, gamma, k,
                                               blas_min_work, dense_pair_slowdown):  # fmt: skip
    """The hinges' Hessians on their gradient's support (the compiled differences along the
    support only, or the analytic structured form) equal the dense per-example matrices, and
    the assembly from the supports, each class pair's block by the BLAS or by the compiled
    loops, equals the one from the dense matrices, by class-pair products or by one product
    of the rows' vech(x x^T)."""

    monkeypatch.setattr(hessian_kernels, "BLAS_MIN_WORK", blas_min_work)
    monkeypatch.setattr(newton_steps, "DENSE_PAIR_SLOWDOWN", dense_pair_slowdown)
    X, y = problem_factory(n=40, d=3, m=6, seed=17)
    prob = SDCAProblem(ill_conditioned(X), y, gram=False, n_classes=6,
                       loss_id=get_method(method).loss_id, k=k)  # fmt: skip
    rng = np.random.default_rng(6)
    W = rng.standard_normal((3, 6)) * np.array([[30.0], [1.0], [0.1]])
    deriv = derivatives_of(prob)
    G = deriv.gradient(prob.scores(W), gamma)
    assert 0 < (G != 0.0).sum(axis=1).mean() < 6  # supports are proper subsets here
    tptr, tidx, hptr, hvals = deriv.support_blocks(0, prob.n)
    if method == "svm_multi":  # analytic: the structured form's matrices
        curv = deriv.curvature(0, prob.n)
        dense = np.stack([curv.apply(np.tile(np.eye(6)[c], (prob.n, 1))) for c in range(6)], 2)
    else:
        dense = deriv.difference_hessians(0, prob.n)
    for i in range(prob.n):
        T = tidx[tptr[i] : tptr[i + 1]]
        block = hvals[hptr[i] : hptr[i + 1]].reshape(T.size, T.size)
        full = np.zeros((6, 6))
        full[np.ix_(T, T)] = block
        np.testing.assert_allclose(full, dense[i], rtol=1e-6, atol=1e-6 / gamma)
    sparse_H = hessian(prob.X, deriv, 0.7, 6, weights=np.linspace(0.5, 2.0, prob.n))

    class Dense:  # the same derivatives through the class-pair products
        sparse_support = False

        def curvature(self, a, b):
            return Curvature(None, (), dense[a:b])

    dense_H = hessian(prob.X, Dense(), 0.7, 6, weights=np.linspace(0.5, 2.0, prob.n))
    np.testing.assert_allclose(sparse_H, dense_H, rtol=1e-6, atol=1e-6 * np.abs(dense_H).max())


@pytest.mark.parametrize("method", ["lr_multi", "lr_ova"])
@pytest.mark.parametrize("sparse", [False, True])
def test_newton_cg_matches_cvxpy_on_ill_conditioned_features(problem_factory, monkeypatch,
                                                            method, sparse):  # fmt: skip
    """Above the dense limit (lowered here) the logistic losses take Newton-CG steps; on
    badly scaled columns, dense and CSR, the certified optimum is cvxpy's, and P and D are
    the kernels' values of the returned pair."""
    import cvxpy as cp

    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 1)
    X, y = problem_factory(n=40, d=3, m=4, seed=23, sparse=sparse)
    X = ill_conditioned(X)
    C = 5.0
    model = topkbench.fit(X, y, method, C=C, eps=1e-8, accelerate="newton", warn=False)
    assert model.converged and model.info["newton_iterations"] > 0
    Xd = X.toarray() if sp.issparse(X) else X
    W = cp.Variable((3, 4))
    S = Xd @ W
    Yo = np.eye(4)[y]
    if method == "lr_multi":
        loss = cp.sum(cp.log_sum_exp(S, axis=1)) - cp.sum(cp.multiply(Yo, S))
    else:
        loss = cp.sum(cp.logistic(cp.multiply(1.0 - 2.0 * Yo, S)))
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(W) + C * loss))
    prob.solve(solver=cp.CLARABEL)
    assert model.primal == pytest.approx(prob.value / (C * 40), rel=1e-6)
    P, D = SDCAProblem(X, y, gram=False, n_classes=4, loss_id=get_method(method).loss_id,
                       k=1).objective(model.A, np.asarray(X.T @ model.A), C, 0.0)  # fmt: skip
    assert D == pytest.approx(model.dual, rel=1e-10)


def test_plan_names_each_shapes_phases():
    """The printed plan follows the hand-over rules: dense Newton for small d m (with the
    predicted-epochs rule below the conditioning threshold, for eps >= 1e-6), Newton-CG for
    the logistic losses above the dense limit, Woodbury steps for the hinges there,
    accelerated SDCA for Gram matrices."""
    from topkbench.solvers.plan import describe, plan

    lid = {name: get_method(name).loss_id for name in ("lr_ml", "svm_ml", "topk_svm_beta")}
    emotions = describe(plan("features", 72, 6, lid["svm_ml"], 0.0))
    assert emotions.startswith("plain") and "-> newton (" in emotions
    assert "predicted epochs" in emotions and "smoothing continuation" in emotions
    assert "predicted epochs" in describe(plan("features", 16, 26, lid["topk_svm_beta"], 0.0))
    assert "predicted epochs" in describe(plan("features", 16, 26, lid["topk_svm_beta"], 1.0))
    assert "predicted epochs" not in describe(plan("features", 16, 26, lid["topk_svm_beta"], 1.0,
                                                   eps=1e-8))  # fmt: skip
    scene_lr = plan("features", 294, 6, lid["lr_ml"], 0.0)
    assert [p.name for p in scene_lr] == ["plain", "newton-cg", "accelerated", "plain"]
    scene_svm = plan("features", 294, 6, lid["svm_ml"], 1.0, n=1211)
    assert [p.name for p in scene_svm] == ["plain", "newton-woodbury", "accelerated", "plain"]
    delicious = plan("features", 500, 983, lid["svm_ml"], 1.0, n=11628)
    assert [p.name for p in delicious] == ["plain", "active-set"]
    unknown_n = plan("features", 294, 6, lid["svm_ml"], 1.0)
    assert [p.name for p in unknown_n] == ["plain", "active-set"]
    assert [p.name for p in plan("gram", 0, 6, lid["lr_ml"], 0.0)] == ["plain", "accelerated",
                                                                        "plain"]  # fmt: skip
    assert [p.name for p in plan("features", 72, 6, lid["lr_ml"], 0.0, "never")] == ["plain"]
    assert [p.name for p in plan("features", 72, 6, lid["lr_ml"], 0.0, "catalyst")] == [
        "plain", "accelerated", "plain"]  # fmt: skip


# --- top-k Ent's Jacobian, and the line search's Fenchel-Young evaluations ---------------------


def _topk_ent_scores_problem(m, k, n=60, scale=3.0, seed=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, m, n)
    prob = SDCAProblem(rng.standard_normal((n, 2)), y, gram=False, n_classes=m,
                       loss_id=get_method("topk_ent").loss_id, k=k)  # fmt: skip
    return prob, rng.standard_normal((n, m)) * scale


@pytest.mark.parametrize("m,k,scale", [(6, 2, 0.3), (6, 2, 5.0), (6, 5, 3.0), (12, 3, 4.0)])
def test_topk_ent_hessians_are_the_gradients_jacobian(m, k, scale):
    """The analytic top-k Ent Hessians equal the central differences of the kernels' gradient,
    with no coordinate capped (scale 0.3: the softmax's), some capped, and all capped (m - 1 =
    k, the closed form); symmetric in every case."""
    prob, S = _topk_ent_scores_problem(m, k, scale=scale)
    deriv = derivatives_of(prob)
    G = deriv.gradient(S, 0.0)
    H = deriv.curvature(0, prob.n).dense
    x = G.copy()
    x[np.arange(prob.n), prob.y[1]] = 0.0
    capped = (x >= x.sum(axis=1, keepdims=True) / k * (1.0 - 1e-9)).sum(axis=1)
    expected = {0.3: {0}, 5.0: {0, 1}, 3.0: {k}}.get(scale)
    if expected is not None:
        assert expected <= set(capped.tolist())
    h = 1e-5
    fd = np.empty_like(H)
    for c in range(m):
        E = np.zeros_like(S)
        E[:, c] = h
        hi, lo = deriv.kernel_gradient_at(S + E, 0.0), deriv.kernel_gradient_at(S - E, 0.0)
        fd[:, :, c] = (hi - lo) / (2 * h)
    np.testing.assert_allclose(H, fd, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(H, H.transpose(0, 2, 1))


def test_topk_ent_jacobian_matches_cvxpy():
    """In the coordinates a = s^{\\y} - s_y, the Jacobian is the derivative of cvxpy's
    maximizer of <a, x> - <x, log x> - (1-s) log(1-s) over the top-k simplex."""
    import cvxpy as cp

    def maximizer(a, k):
        x = cp.Variable(a.size)
        s = cp.sum(x)
        obj = cp.Maximize(a @ x + cp.sum(cp.entr(x)) + cp.entr(1 - s))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cp.Problem(obj, [x >= 0, s <= 1, k * x <= s]).solve(
                solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11
            )
        return x.value

    k = 2
    for a in (np.array([2.5, 2.2, 0.1, -1.0, -3.0]), np.array([0.4, -0.2, 0.1, -1.0, 0.3])):
        prob = SDCAProblem(np.ones((1, 1)), np.array([0]), gram=False, n_classes=a.size + 1,
                           loss_id=get_method("topk_ent").loss_id, k=k)  # fmt: skip
        deriv = derivatives_of(prob)
        S = np.concatenate([[0.0], a])[None, :]  # label 0: a_j = s_j
        G = deriv.gradient(S, 0.0)
        np.testing.assert_allclose(G[0, 1:], maximizer(a, k), rtol=0, atol=2e-6)
        J = deriv.curvature(0, 1).dense[0][1:, 1:]
        # cvxpy's maximizer is good to ~1e-6: a wide step, within the partition at these a
        h = 1e-2
        fd = np.column_stack([(maximizer(a + h * e, k) - maximizer(a - h * e, k)) / (2 * h)
                              for e in np.eye(a.size)])  # fmt: skip
        np.testing.assert_allclose(J, fd, rtol=0, atol=1e-3 * np.abs(J).max())


FY_CASES = [("svm_multi", 0.05, 1), ("topk_svm_alpha", 0.3, 3), ("topk_svm_alpha_pseudo", 0.5, 2),
            ("topk_svm_beta", 0.5, 2), ("svm_ova", 0.2, 1)]  # fmt: skip


@pytest.mark.parametrize("method,gamma,k", FY_CASES)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_loss_from_the_gradient_is_the_kernels_loss(method, gamma, k, scale):
    """Fenchel-Young: the loss sum from the gradient and the conjugate alone equals the
    kernels' loss sum, whole and on a subset of rows."""
    rng = np.random.default_rng(12)
    n, m = 50, 6
    X, y = rng.standard_normal((n, 3)), rng.integers(0, m, n)
    prob = SDCAProblem(X, y, gram=False, n_classes=m, loss_id=get_method(method).loss_id, k=k)
    deriv = derivatives_of(prob)
    assert deriv.fenchel_young
    S = rng.standard_normal((n, m)) * scale
    G = deriv.gradient(S, gamma)
    Cs = prob.example_c(0.7) * np.linspace(0.5, 2.0, n)
    kernel = _k_objective_loss(prob, S, Cs, gamma)
    assert deriv.loss_sum(S, G, Cs, gamma) == pytest.approx(kernel, rel=1e-12)
    rows = np.flatnonzero(rng.random(n) < 0.5)
    sub = deriv.restricted(rows)
    np.testing.assert_array_equal(sub.gradient(S[rows], gamma), G[rows])
    sub_prob = SDCAProblem(X[rows], y[rows], gram=False, n_classes=m, loss_id=prob.loss_id, k=k)
    part = _k_objective_loss(sub_prob, np.ascontiguousarray(S[rows]), Cs[rows], gamma)
    assert sub.loss_sum(S[rows], G[rows], Cs[rows], gamma) == pytest.approx(part, rel=1e-12)


def _k_objective_loss(prob, S, Cs, gamma):
    from topkbench.losses import dispatch

    return dispatch.objective_terms(S, *prob.y, np.zeros_like(S), prob.loss_id, Cs, gamma,
                                    prob.k, prob.rho, 0.0, 0.0, np.empty(0))[0]  # fmt: skip


@pytest.mark.parametrize("method,gamma,k", FY_CASES[:3] + [("svm_ml", 0.05, 1)])
def test_line_search_with_fenchel_young_and_live_rows_takes_the_same_step(
        problem_factory, monkeypatch, method, gamma, k):  # fmt: skip
    """The line search that takes losses from gradients and drops the rows whose gradient is
    zero at both ends returns the step of the one that evaluates every loss on every row;
    Newton directions from points ever further from the optimum have such rows, and some take
    exact steps (the evaluations on the live rows)."""
    from topkbench.solvers.line_search import line_search

    if method == "svm_ml":
        X, y = _multilabel_problem(seed=9, n=60)
        m = 6
    else:  # separated classes, so that some examples have zero loss near the optimum
        m, rng = 6, np.random.default_rng(23)
        y = rng.integers(0, m, 60)
        centers = rng.standard_normal((m, 3)) * 5.0
        X = ill_conditioned(centers[y] + 0.5 * rng.standard_normal((60, 3)))
    prob = SDCAProblem(X, y, gram=False, n_classes=m, loss_id=get_method(method).loss_id, k=k)
    rng = np.random.default_rng(2)
    C, steps, dead = 5.0, set(), 0
    W0 = topkbench.fit(X, y, method, C=C, gamma=gamma, k=k, eps=1e-8).W
    for noise in (1e-7, 1e-5, 1e-3, 1e-2, 0.1, 1.0):  # above the rounding floor of F
        W = W0 + noise * np.abs(W0).max() * rng.standard_normal(W0.shape)
        deriv = derivatives_of(prob)
        S = prob.scores(W)
        G = deriv.gradient(S, gamma)
        grad = W + C * np.asarray(prob.X.T @ G)
        step = newton_step(hessian(prob.X, deriv, C, m), grad.T.reshape(-1))
        D = np.ascontiguousarray(step.reshape(m, -1).T)
        SD = prob.scores(D)
        slope = float(np.vdot(grad, D))
        G1 = deriv.gradient(S + SD, gamma)
        dead += int((~((G != 0).any(axis=1) | (G1 != 0).any(axis=1))).sum())
        t_fy, G_t = line_search(prob, derivatives_of(prob), W, S, D, SD, C, gamma, slope, G)
        plain = derivatives_of(prob)
        plain.fenchel_young = False  # every loss evaluated on every row
        t_plain, _ = line_search(prob, plain, W, S, D, SD, C, gamma, slope, G)
        assert t_fy == pytest.approx(t_plain, rel=1e-9, abs=1e-12)
        # the gradient handed back is the whole gradient at the step, dropped rows included
        np.testing.assert_array_equal(G_t, deriv.gradient(S + t_fy * SD, gamma))
        steps.add(t_fy == 1.0)
    assert dead > 0 and False in steps  # the exact steps: the ones on the live rows only


@pytest.mark.parametrize("method", ["svm_multi", "svm_ml"])
def test_stage_loss_about_a_centre_is_the_proximal_smoothing(method):
    """The continuation's stage loss: the gradient of L_gamma at ``s + gamma P v`` is the
    maximizer of ``<u, s> - L*(u) - gamma/2 ||P (u - v)||^2`` over the conjugate's domain
    (cvxpy), P the coordinates the smoothing regularizes, and its value the maximum."""
    import cvxpy as cp

    rng = np.random.default_rng(12)
    n, m, gamma = 8, 5, 0.3
    if method == "svm_ml":
        Y = (rng.random((n, m)) < 0.4).astype(float)
        Y[:, 0], Y[:, 1] = 1.0, 0.0  # every example ranks something
        y = sp.csr_matrix(Y)
    else:
        y = rng.integers(0, m, n)
    prob = SDCAProblem(rng.standard_normal((n, 3)), y, gram=False, n_classes=m,
                       loss_id=get_method(method).loss_id, k=1)  # fmt: skip
    S = rng.standard_normal((n, m)) * 2.0
    deriv = derivatives_of(prob)
    V = deriv.smoothing_centre(deriv.gradient(rng.standard_normal((n, m)) * 3.0, 0.05))
    G = deriv.gradient(S + gamma * V, gamma)
    shifted_loss = prob.values(np.ascontiguousarray(S + gamma * V), np.zeros((n, m)), 0.0, 1.0,
                               gamma)[0] * n  # fmt: skip
    total = 0.0
    for i in range(n):
        u = cp.Variable(m)
        if method == "svm_ml":  # u = (p off Y, -q on Y), p, q >= 0, sum p = sum q <= 1
            pos = Y[i] > 0
            p, q = u[np.flatnonzero(~pos)], -u[np.flatnonzero(pos)]
            cons = [p >= 0, q >= 0, cp.sum(p) == cp.sum(q), cp.sum(p) <= 1]
            gain = 0.5 * cp.sum(p) + 0.5 * cp.sum(q)  # -L*(u): the margin split in halves
            reg = cp.sum_squares(u - V[i])
        else:  # u_j >= 0 off the label, their sum <= 1, u_y = -sum
            off = np.flatnonzero(np.arange(m) != y[i])
            cons = [u[off] >= 0, cp.sum(u[off]) <= 1, u[y[i]] == -cp.sum(u[off])]
            gain = cp.sum(u[off])
            reg = cp.sum_squares(u[off] - V[i, off])
        obj = cp.Problem(cp.Maximize(u @ S[i] + gain - gamma / 2 * reg), cons)
        total += obj.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10)
        np.testing.assert_allclose(G[i], u.value, atol=1e-6)
    # the stage's loss sum, L_gamma at the shifted scores minus gamma/2 ||P V||^2
    assert shifted_loss - gamma / 2 * float(np.vdot(V, V)) == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize("method,k", [("svm_multi", 1), ("svm_ova", 1), ("topk_svm_alpha", 3),
                                      ("topk_svm_alpha_pseudo", 2), ("topk_svm_beta", 2),
                                      ("wtopk_svm", 3), ("svm_ml", 1)])  # fmt: skip
def test_centre_at_a_subgradient_leaves_the_loss_unsmoothed(method, k):
    """For every hinge the continuation smooths: with the centre v a maximizer of <u, s> -
    L*(u) (a gamma = 0 gradient), the proximal smoothing max_u <u, s> - L*(u) - gamma/2
    ||P (u - v)||^2 equals L(s), which the stage's formula L_gamma(s + gamma P v) - gamma/2
    ||P v||^2 must reproduce: it does only with the coordinates P the loss's own smoothing
    regularizes."""
    rng = np.random.default_rng(21)
    n, m, gamma = 30, 6, 0.3
    if method == "svm_ml":
        Y = (rng.random((n, m)) < 0.4).astype(float)
        Y[:, 0], Y[:, 1] = 1.0, 0.0
        y = sp.csr_matrix(Y)
    else:
        y = rng.integers(0, m, n)
    rho = np.full(k, 1.0 / k) if method == "wtopk_svm" else None
    prob = SDCAProblem(rng.standard_normal((n, 3)), y, gram=False, n_classes=m,
                       loss_id=get_method(method).loss_id, k=k, rho=rho)  # fmt: skip
    S = rng.standard_normal((n, m)) * 2.0
    # a maximizer (to 1e-9) of the unsmoothed problem: the smoothed gradient at gamma = 1e-9
    V = derivatives_of(prob).smoothing_centre(derivatives_of(prob).gradient(S, 1e-9))

    def loss_sum(T, g):
        return prob.values(np.ascontiguousarray(T), np.zeros((n, m)), 0.0, 1.0, g)[0] * n

    stage = loss_sum(S + gamma * V, gamma) - gamma / 2 * float(np.vdot(V, V))
    assert stage == pytest.approx(loss_sum(S, 0.0), abs=1e-6)


WOODBURY_CASES = [("svm_ml", 0.05, 1), ("svm_ml", 2.0, 1), ("svm_multi", 0.05, 1),
                  ("svm_ova", 0.5, 1), ("topk_svm_beta", 0.5, 2),
                  ("topk_svm_alpha_pseudo", 0.3, 3)]  # fmt: skip


@pytest.mark.parametrize("method,gamma,k", WOODBURY_CASES)
@pytest.mark.parametrize("sparse", [False, True, "float32"])
def test_woodbury_direction_is_the_dense_newton_step(method, gamma, k, sparse):
    """The Woodbury step through the examples' curvature solves the Newton system of the
    formed Hessian (it loses a few more digits than the Cholesky of H, which an inexact
    Newton step can spare), with sample weights, dense, CSR and float32, on badly scaled
    columns; the Gram blocks are formed per call or taken from the whole X X^T alike."""
    rng = np.random.default_rng(29)
    n, d, m = 40, 4, 6
    X = ill_conditioned(rng.standard_normal((n, d)), scales=np.array([100.0, 3.0, 1.0, 0.1]))
    if method == "svm_ml":
        y = sp.csr_matrix(rng.random((n, m)) < 0.3)
    else:
        y = rng.integers(0, m, n)
    if sparse == "float32":
        Xs = X = X.astype(np.float32)
    else:
        Xs = sp.csr_matrix(X) if sparse else X
    w = rng.uniform(0.5, 2.0, n)
    prob = SDCAProblem(Xs, y, gram=False, n_classes=m, loss_id=get_method(method).loss_id, k=k,
                       weights=w)  # fmt: skip
    C = 3.0
    # near the optimum, where examples sit in their hinges' quadratic pieces
    W = topkbench.fit(Xs, y, method, C=C, gamma=gamma, k=k, max_epochs=30, sample_weight=w,
                      n_classes=m, warn=False, accelerate="never").W  # fmt: skip
    deriv = derivatives_of(prob)
    G = deriv.gradient(prob.scores(W), gamma)
    grad = W + C * np.asarray(prob.X.T @ (w[:, None] * G))
    H = hessian(prob.X, deriv, C, m, prob.weights)
    assert (np.abs(H - np.eye(d * m)) > 0.0).any()
    want = newton_step(H.copy(), grad.T.reshape(-1)).reshape(m, d).T  # factors in place
    per_call, whole = GramRows(prob.X), GramRows(prob.X)
    whole.spent = np.inf  # its first block already takes the whole X X^T
    for gram in (per_call, whole):
        got = woodbury_direction(prob, deriv, C, grad, gram)
        residual = H @ got.T.reshape(-1) + grad.T.reshape(-1)
        assert np.linalg.norm(residual) <= 1e-6 * np.linalg.norm(grad)  # cond(H) up to 3e6
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert per_call.full is None and whole.full is not None


def test_predicted_epochs_rides_out_one_bump():
    """A gap that rose at the last certificate but fell over the last two intervals predicts
    from those two; a gap that fell over neither predicts infinity (a stall)."""
    from topkbench.solvers.plan import predicted_epochs
    from topkbench.solvers.problem import Run, TracePoint

    def run_with(gaps):
        run = Run(10, eps=1e-3, max_epochs=1000, time_limit=None, seed=0, on_eval=None)
        run.trace = [TracePoint(5 * i, 1.0, 0.0, g, 0.0) for i, g in enumerate(gaps)]
        run.epochs = 5 * (len(gaps) - 1)
        return run

    falling = predicted_epochs(run_with([4e-3, 2e-3]))
    assert falling == pytest.approx(5.0)  # halves every 5 epochs: 5 more to 1e-3
    bumped = predicted_epochs(run_with([4e-3, 1e-3 * 1.5, 2e-3]))
    assert bumped == pytest.approx(np.log(2.0) / (np.log(2.0) / 10.0))
    assert predicted_epochs(run_with([2e-3, 2.5e-3, 3e-3])) == np.inf
    assert predicted_epochs(run_with([2e-3, 3e-3])) == np.inf


@pytest.mark.parametrize("d,expect_woodbury", [(40, True), (2, False)])
def test_hinge_within_the_dense_limit_takes_the_smaller_system(monkeypatch, d, expect_woodbury):
    """Within the dense limit a hinge's step solves the Woodbury system when it has fewer
    rows than WOODBURY_DENSE_SHARE d m (few examples, many features), else the formed
    Hessian; either way the fit is certified at the same optimum as accelerated SDCA's."""

    calls = {"woodbury": 0, "dense": 0}
    woodbury, dense_hessian = newton_steps.woodbury_direction, newton_steps.hessian

    def counted_woodbury(*args, **kw):
        D = woodbury(*args, **kw)
        calls["woodbury"] += D is not None
        return D

    def counted_hessian(*args, **kw):
        calls["dense"] += 1
        return dense_hessian(*args, **kw)

    monkeypatch.setattr(newton_steps, "woodbury_direction", counted_woodbury)
    monkeypatch.setattr(newton_steps, "hessian", counted_hessian)
    rng = np.random.default_rng(14)
    X = rng.standard_normal((40, d)) * rng.uniform(0.1, 10.0, d)
    Y = sp.csr_matrix(rng.random((40, 6)) < 0.35)
    assert d * 6 <= NEWTON_MAX_DIM
    kw = dict(C=4.0, gamma=0.0, eps=1e-6, max_epochs=10**5, warn=False)
    model = topkbench.fit(X, Y, "svm_ml", accelerate="newton", **kw)
    assert model.converged and model.info["newton_iterations"] > 0
    assert (calls["woodbury"] > 0) == expect_woodbury and (calls["dense"] > 0) != expect_woodbury
    other = topkbench.fit(X, Y, "svm_ml", accelerate="catalyst", **kw)
    assert model.primal == pytest.approx(other.primal, rel=3e-6)


def test_newton_refused_at_a_cold_start_is_offered_again(monkeypatch):
    """At a cold start every example is at the margin, so a hinge's Woodbury system can be
    past its limit before the first step; plain SDCA then goes on and offers Newton again
    after NEWTON_RETRY_EPOCHS epochs, when the margin has thinned, and the fit is certified at
    the optimum plain SDCA reaches."""
    from topkbench.solvers.plan import NEWTON_RETRY_EPOCHS

    monkeypatch.setattr(plan, "NEWTON_MAX_DIM", 1)
    monkeypatch.setattr(plan, "WOODBURY_MAX_RANK", 200)  # cold: ~300 rows; later 90-150
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 40)) * rng.uniform(0.1, 10.0, 40)
    Y = sp.csr_matrix(rng.random((60, 6)) < 0.35)
    kw = dict(C=30.0, gamma=0.0, eps=1e-6, max_epochs=10**5, warn=False)
    model = topkbench.fit(X, Y, "svm_ml", accelerate="newton", **kw)
    assert model.converged and model.info["newton_iterations"] > 0
    assert model.info["newton_from_epoch"] == NEWTON_RETRY_EPOCHS
    assert "accelerated_from_epoch" not in model.info
    plain = topkbench.fit(X, Y, "svm_ml", accelerate="never", **kw)
    assert plain.converged and model.primal == pytest.approx(plain.primal, rel=3e-6)


def test_newton_step_shifts_an_indefinite_hessian_from_its_original_entries():
    """A Hessian a few ulps short of positive definite fails the in-place factorization; the
    retry restores the entries the failed attempt overwrote and solves with the smallest
    shift ``max diag(H) 10^e`` (e = -12, -10, ...) whose matrix factors: the step equals the
    solve of a fresh copy of that shifted matrix, and it is a descent direction."""
    rng = np.random.default_rng(41)
    r = 60
    Q, _ = np.linalg.qr(rng.standard_normal((r, r)))
    lam = np.geomspace(1e-3, 1e3, r)
    lam[0] = -1e-7  # indefinite beyond rounding; a shift of 1e-8 max diag is not enough
    H = (Q * lam) @ Q.T
    H = 0.5 * (H + H.T)
    g = rng.standard_normal(r)
    scale = float(np.diag(H).max())
    for e in range(-12, 2, 2):
        shifted = H + scale * 10.0**e * np.eye(r)
        if np.linalg.eigvalsh(shifted).min() > 0.0:
            break
    want = np.linalg.solve(shifted, -g)
    got = newton_step(H.copy(), g)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert float(g @ got) < 0.0
    assert newton_step(np.full((3, 3), np.nan), np.ones(3)) is None


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("method", ["svm_multi", "lr_multi", "svm_ml"])
def test_features_with_no_nonzero_entry_give_the_zero_model(method, sparse):
    """All-zero features (a LibSVM file whose rows hold only labels): the cost model prices
    no second-order phase (it divided by the features' zero entries), and plain SDCA's first
    epoch certifies W = 0, with P = D = the loss at zero scores."""
    X = np.zeros((12, 4))
    X = sp.csr_matrix(X) if sparse else X
    y = np.arange(12) % 3
    Y = sp.csr_matrix(np.eye(3)[y] + np.eye(3)[(y + 1) % 3]) if method == "svm_ml" else y
    prob = SDCAProblem(X, Y if method == "svm_ml" else y, gram=False, n_classes=3,
                       loss_id=get_method(method).loss_id, k=1)  # fmt: skip
    if sparse:  # no stored entry (dense zeros are priced as entries)
        assert plan.newton_cost_epochs(prob) == np.inf
    model = topkbench.fit(X, Y, method, C=100.0)
    assert model.converged and not model.W.any()
    loss0 = np.log(3.0) if method == "lr_multi" else 1.0
    assert model.primal == pytest.approx(loss0) and model.dual == pytest.approx(loss0)


# --- the class-separable route of the one-vs-all hinge -----------------------------------------


def _ova_problem(d, sparse, seed=17, n=40, m=5):
    rng = np.random.default_rng(seed)
    X = ill_conditioned(rng.standard_normal((n, d)), scales=np.geomspace(100.0, 0.1, d))
    y = rng.integers(0, m, n)
    if sparse == "float32":
        X = X.astype(np.float32)
    elif sparse:
        X = sp.csr_matrix(X)
    w = rng.uniform(0.5, 2.0, n)
    prob = SDCAProblem(X, y, gram=False, n_classes=m, loss_id=get_method("svm_ova").loss_id,
                       k=1, weights=w)  # fmt: skip
    return prob, X, y, w


@pytest.mark.parametrize("d", [3, 60])  # each class's d x d block; each class's Woodbury system
@pytest.mark.parametrize("sparse", [False, True, "float32"])
def test_separable_direction_is_the_dense_newton_step(d, sparse):
    """SVM^OVA's Hessian is block diagonal by class; solving each block by Woodbury's identity
    on its margin examples (d = 60 > their number) or from the formed d x d block (d = 3)
    gives the Newton step of the whole formed Hessian, with sample weights, dense, CSR and
    float32, on badly scaled columns, the Gram blocks formed per call or taken whole."""
    prob, X, y, w = _ova_problem(d, sparse)
    m, C, gamma = prob.m, 3.0, 0.5
    W = topkbench.fit(X, y, "svm_ova", C=C, gamma=gamma, max_epochs=30, sample_weight=w,
                      n_classes=m, warn=False, accelerate="never").W  # fmt: skip
    deriv = derivatives_of(prob)
    G = deriv.gradient(prob.scores(W), gamma)
    assert 0 < np.count_nonzero(deriv.curvature(0, prob.n).diag) < prob.n * m
    grad = W + C * np.asarray(prob.X.T @ (w[:, None] * G))
    H = hessian(prob.X, deriv, C, m, prob.weights)
    want = newton_step(H.copy(), grad.T.reshape(-1)).reshape(m, d).T
    per_call, whole = GramRows(prob.X), GramRows(prob.X)
    whole.spent = np.inf
    for gram in (per_call, whole):
        got = newton_steps.separable_direction(prob, deriv, C, grad, gram)
        residual = H @ got.T.reshape(-1) + grad.T.reshape(-1)
        assert np.linalg.norm(residual) <= 1e-8 * np.linalg.norm(grad)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert per_call.full is None and whole.full is not None


def test_separable_direction_refuses_a_class_past_the_limit(monkeypatch):
    """A class whose system (its margin examples, or d if fewer) passes the limit: None."""
    prob, X, y, w = _ova_problem(60, False)
    deriv = derivatives_of(prob)
    W = np.random.default_rng(0).standard_normal((60, prob.m)) * 0.01
    deriv.gradient(prob.scores(W), 10.0)  # every example inside its quadratic pieces
    monkeypatch.setattr(plan, "WOODBURY_MAX_RANK", 10)
    assert newton_steps.separable_direction(prob, deriv, 1.0, W, GramRows(prob.X)) is None


def test_separable_steps_minimize_each_class_on_its_own():
    """The per-class line search: each class with descent decreases its own objective, stops
    at its own minimizer along its direction (to the slope tolerance, from below) or at the
    full step, and a class without descent stays put."""
    from topkbench.solvers.line_search import LINE_SEARCH_TOL, separable_steps

    prob, X, y, w = _ova_problem(3, False, n=60)
    m, C, gamma = prob.m, 50.0, 0.2
    rng = np.random.default_rng(3)
    W = rng.standard_normal((3, m)) * 0.05
    D = rng.standard_normal((3, m)) * 0.5
    deriv = derivatives_of(prob)
    S, SD, Cs = prob.scores(W), prob.scores(D), prob.example_c(C)
    G0 = deriv.gradient(S, gamma)
    slope0 = np.einsum("jc,jc->c", W, D) + np.einsum("ic,ic->c", Cs[:, None] * G0, SD)
    D *= -np.sign(slope0)  # every class descends along its direction ...
    D[:, 0] *= -1.0  # ... but class 0, which must not move
    SD = prob.scores(D)
    slope0 = np.einsum("jc,jc->c", W, D) + np.einsum("ic,ic->c", Cs[:, None] * G0, SD)
    assert slope0[0] > 0 and (slope0[1:] < 0).all()
    t = separable_steps(deriv, W, S, D, SD, Cs, gamma, G0)

    def phi(c, tc):
        w_c = W[:, c] + tc * D[:, c]
        return 0.5 * float(w_c @ w_c) + _ova_loss_c(S + tc * SD, y, c, gamma, Cs)

    assert t[0] == 0.0
    for c in range(1, m):
        assert 0.0 < t[c] <= 1.0 and phi(c, t[c]) < phi(c, 0.0)
        grid = np.linspace(0.0, 1.0, 2001)
        best = min(phi(c, s) for s in grid)
        # convex phi_c, stopped where |phi_c'| <= tol |phi_c'(0)| from below: within
        # tol |phi_c'(0)| (1 - t_c) of the least value on [0, 1]
        assert phi(c, t[c]) - best <= LINE_SEARCH_TOL * abs(slope0[c]) + 1e-12


def _ova_loss_c(S, y, c, gamma, Cs):
    """Class c's share of the weighted smoothed OVA hinge, ``sum_i C_i l_gamma(1 - yt s_ic)``."""
    yt = np.where(y == c, 1.0, -1.0)
    r = 1.0 - yt * S[:, c]
    lv = np.where(r >= gamma, r - gamma / 2, np.where(r > 0, r * r / (2 * gamma), 0.0))
    return float(Cs @ lv)


def test_separable_cg_solves_each_class_to_its_own_tolerance():
    """LR^OVA's Newton-CG runs one CG per class in lockstep, each stopped by its own forcing
    term: every class's residual is at most CG_FORCING times its own gradient, a class whose
    gradient is a millionth of the others' too (one CG over all classes stops on the sum and
    leaves it unsolved), on badly scaled columns."""
    rng = np.random.default_rng(5)
    n, d, m = 50, 4, 5
    X = ill_conditioned(rng.standard_normal((n, d)), scales=np.array([50.0, 3.0, 1.0, 0.1]))
    y = rng.integers(0, m, n)
    prob = SDCAProblem(X, y, gram=False, n_classes=m, loss_id=get_method("lr_ova").loss_id, k=1)
    deriv = derivatives_of(prob)
    C = 4.0
    W = rng.standard_normal((d, m)) * 0.1
    G = deriv.gradient(prob.scores(W), 0.0)
    grad = W + C * np.asarray(X.T @ G)
    grad[:, 2] *= 1e-6
    H = hessian(X, deriv, C, m)
    got = newton_steps.cg_direction(prob, deriv, C, grad)
    residual = (H @ got.T.reshape(-1) + grad.T.reshape(-1)).reshape(m, d)
    for c in range(m):
        assert np.linalg.norm(residual[c]) <= newton_steps.CG_FORCING * np.linalg.norm(grad[:, c])


def test_ova_hinge_takes_the_separable_route_at_any_size():
    """SVM^OVA's Newton phase is the class-separable one whatever n, d and m (Caltech101
    Silhouettes' 4,100 x 784 with m = 101 too, past the coupled Woodbury route's sizes)."""
    from topkbench.solvers.plan import describe, plan

    ova = get_method("svm_ova").loss_id
    for d, m, n in ((16, 26, 10_500), (784, 101, 4100), (500, 983, 12_920)):
        phases = plan("features", d, m, ova, 0.0, n=n)
        assert [p.name for p in phases] == ["plain", "newton-separable", "accelerated", "plain"]
    assert "predicted epochs" in describe(plan("features", 784, 101, ova, 0.0, n=4100))


def test_a_stall_hands_on_when_some_classes_do_not_move(problem_factory, monkeypatch):
    """The per-class line search leaves classes without descent where they are (t_c = 0);
    the stall rule still counts the steps of the others as full, so a Newton phase whose gap
    stops falling hands on after STALL_ITERATIONS instead of running to its budget."""
    import topkbench.solvers.newton as newton
    from topkbench.solvers import line_search

    X, y = problem_factory(n=30, d=3, m=5, seed=49)
    X = ill_conditioned(X)
    real_direction = newton_steps.separable_direction
    real_steps = line_search.separable_steps

    def useless(*args):
        D = real_direction(*args)
        return None if D is None else 1e-9 * D

    def pinned(*args):
        t = real_steps(*args)
        if t is not None:
            t = t.copy()
            t[0] = 0.0  # class 0 never moves
        return t

    monkeypatch.setattr(newton_steps, "separable_direction", useless)
    monkeypatch.setattr(line_search, "separable_steps", pinned)
    model = topkbench.fit(X, y, "svm_ova", C=10.0, gamma=0.5, eps=1e-6, accelerate="newton",
                          max_epochs=100_000)  # fmt: skip
    assert model.converged and "accelerated_from_epoch" in model.info
    assert model.info["newton_iterations"] == newton.STALL_ITERATIONS


def test_separable_cost_model_prices_a_refused_system_as_never_paying(problem_factory,
                                                                      monkeypatch):  # fmt: skip
    """Per-class systems past the route's limit (their margin examples and d both above it)
    cost infinitely many epochs: the rules never hand over to a refusal."""
    X, y = problem_factory(n=40, d=6, m=2, seed=3)
    prob = SDCAProblem(X, y, gram=False, n_classes=2, loss_id=get_method("svm_ova").loss_id, k=1)
    assert np.isfinite(plan.newton_cost_epochs(prob))
    monkeypatch.setattr(plan, "WOODBURY_MAX_RANK", 5)
    assert plan.newton_cost_epochs(prob) == np.inf


def test_newton_cg_on_csr_features_is_priced_not_taken_at_once():
    """On CSR features a Hessian-vector product costs about an epoch: above the conditioning
    threshold Newton-CG is not taken at the first certificate (a warm start often converges in
    a few plain epochs, where one CG iteration costs dozens) but once plain SDCA is predicted to
    need more than 5 sqrt(C R^2 / mu) epochs; on dense features it is taken at once, as
    before."""
    from topkbench.solvers.accelerated import condition_number
    from topkbench.solvers.problem import Run, TracePoint

    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 40))
    y = rng.integers(0, 30, 50)
    lid = get_method("lr_multi").loss_id
    dense = SDCAProblem(X, y, gram=False, n_classes=30, loss_id=lid, k=1)
    csr = SDCAProblem(sp.csr_matrix(X), y, gram=False, n_classes=30, loss_id=lid, k=1)
    assert plan.route_of(dense) == plan.route_of(csr) == "cg"
    C = 1e3
    cond = condition_number(csr, C, 0.0)
    assert cond >= plan.ACCEL_MIN_CONDITION

    def run_with(epochs, gaps):
        run = Run(10, eps=1e-3, max_epochs=1000, time_limit=None, seed=0, on_eval=None)
        step = epochs // (len(gaps) - 1)
        run.trace = [TracePoint(step * i, 1.0, 0.0, g, 0.0) for i, g in enumerate(gaps)]
        run.epochs = epochs
        return run

    first = run_with(1, [0.5, 0.4])
    assert plan.hand_over(first, dense, "auto", C, 0.0)
    assert not plan.hand_over(first, csr, "auto", C, 0.0)  # before PREDICTED_MIN_EPOCHS
    cost = plan.newton_cost_epochs(csr, True, cond)
    assert cost == pytest.approx(5 * np.sqrt(cond))
    fast = run_with(20, [1e-1, 2e-3])  # plain SDCA about to reach eps
    slow = run_with(20, [1e-1, 0.99e-1])  # some 9,000 more epochs predicted
    assert not plan.hand_over(fast, csr, "auto", C, 0.0)
    assert plan.hand_over(slow, csr, "auto", C, 0.0)
    assert plan.can_hand_over(csr, "auto", 1e-3, 0.0, 1e-3)  # watched at any conditioning
