"""top-k Ent_tr by the authors' gradient descent (TPAMI §6.2; libsdca v0.2.0 ``mex_gd``).

A plain numpy reference of the procedure (written from its description, independently of
``solve_ent_tr_gd``) is followed step for step: the same accepted steps, the same iterate,
the same stop.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import topkbench
from topkbench.errors import ConfigError
from topkbench.solvers.ent_tr import solve_ent_tr_gd


def reference_gd(X, y, W0, C, k, eps=1e-3, max_iter=1000):
    """F(W) = C sum_i log(1 + sum_{j in J_i} exp(s_j - s_y)) + ||W||^2 / 2, J_i = the
    off-label scores without the k - 1 largest; Armijo GD as the authors ran it."""
    n, m = X.shape[0], W0.shape[1]

    def F_and_grad(W):
        S = X @ W
        f = 0.5 * np.sum(W * W)
        G = np.zeros_like(S)
        for i in range(n):
            others = [j for j in range(m) if j != y[i]]
            kept = sorted(others, key=lambda j: -S[i, j])[k - 1 :]
            e = np.exp(S[i, kept] - S[i, y[i]])
            f += C * np.log1p(e.sum())
            G[i, kept] = C * e / (1 + e.sum())
            G[i, y[i]] = -C * e.sum() / (1 + e.sum())
        return f, W + X.T @ G

    W = W0.copy()
    f, g = F_and_grad(W)
    norm = np.linalg.norm(g)
    step, before, steps, it = max(1e-9, min(1.0, 1.0 / norm)), 0.0, [], 0
    while norm > eps:
        if it >= max_iter:
            return W, steps, "max_iter"
        it += 1
        if step == before:
            step *= 2
        before = step
        while True:
            f_try, _ = F_and_grad(W - step * g)
            if f_try <= f - step * 1e-5 * norm:
                break
            step /= 2
            if step < 1e-9:
                return W, steps, "line_search"
        W = W - step * g
        f, g = F_and_grad(W)
        norm = np.linalg.norm(g)
        steps.append(step)
    return W, steps, "converged"


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 4))
    y = rng.integers(0, 5, size=40)
    W0 = 0.1 * rng.normal(size=(4, 5))
    return X, y, W0


@pytest.mark.parametrize("C,k,max_iter", [(1.0, 2, 1000), (5.0, 3, 1000), (20.0, 2, 7)])
def test_follows_the_reference_step_for_step(problem, C, k, max_iter):
    X, y, W0 = problem
    W_ref, steps_ref, status_ref = reference_gd(X, y, W0, C, k, max_iter=max_iter)
    r = solve_ent_tr_gd(X, y, W0, C=C, k=k, max_iter=max_iter)
    assert r.status == status_ref
    # the same accepted steps (the first, 1/||g||, agrees to rounding of the gradient's sum)
    assert r.iterations == len(steps_ref) == len(r.steps)
    np.testing.assert_allclose(r.steps, steps_ref, rtol=1e-12)
    np.testing.assert_allclose(r.W, W_ref, rtol=1e-10, atol=1e-12)
    # the trace's objective never rises (Armijo), and a converged run met the authors' rule
    P = [t.primal for t in r.trace]
    assert all(b <= a for a, b in zip(P, P[1:], strict=False))
    if r.status == "converged":
        lam = 1.0 / (C * X.shape[0])
        assert r.grad_norm / lam <= 1e-3


def test_some_steps_are_doubled_and_some_halved(problem):
    X, y, W0 = problem
    r = solve_ent_tr_gd(X, y, W0, C=5.0, k=2)
    ratios = {round(b / a, 12) for a, b in zip(r.steps, r.steps[1:], strict=False)}
    assert 2.0 in ratios  # an accepted step is tried twice as long next time
    assert any(q < 1.0 for q in ratios)  # and the line search halves


def test_fit_offers_gd_for_ent_tr_only(problem):
    X, y, _ = problem
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gd = topkbench.fit(X, y, "topk_ent_tr", C=2.0, k=2, solver="gd")
        lb = topkbench.fit(X, y, "topk_ent_tr", C=2.0, k=2)
    assert gd.info["solver"] == "gd" and lb.info["solver"] == "lbfgs"
    assert gd.params["solver"] == "gd"
    with pytest.raises(ConfigError, match="solver must be one of lbfgs, gd"):
        topkbench.fit(X, y, "topk_ent_tr", k=2, solver="newton")
    with pytest.raises(ConfigError, match="solved by sdca"):
        topkbench.fit(X, y, "lr_multi", solver="gd")


def test_weighted_objective_is_the_reference_with_weighted_losses(problem):
    """Sample weights scale each example's loss and gradient: the objective and gradient of
    weights w equal the reference's on the examples repeated w times."""
    from topkbench.solvers.ent_tr import _objective

    X, y, W0 = problem
    w = np.random.default_rng(6).integers(1, 4, size=X.shape[0]).astype(float)
    rep = np.repeat(np.arange(X.shape[0]), w.astype(int))
    f_w, g_w = _objective(X, y, 2, 3.0, 4, 5, w)(W0.ravel())
    f_r, g_r = _objective(X[rep], y[rep], 2, 3.0, 4, 5)(W0.ravel())
    g_w, g_r = g_w(), g_r()
    assert f_w == pytest.approx(f_r, rel=1e-12)
    np.testing.assert_allclose(g_w, g_r, rtol=1e-10, atol=1e-12)
    for solver in ("lbfgs", "gd"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = topkbench.fit(X, y, "topk_ent_tr", k=2, C=3.0, solver=solver, sample_weight=w)
            b = topkbench.fit(X[rep], y[rep], "topk_ent_tr", k=2, C=3.0, solver=solver)
        assert a.primal * X.shape[0] == pytest.approx(b.primal * rep.size, rel=1e-5)


def test_zero_weights_count_out_of_n_as_in_sdca(problem):
    """P(W) = lambda/2 ||W||^2 + 1/n sum w_i L_i with n the examples of positive weight, as
    every SDCA fit counts them: at k = 1 Ent_tr is LR^Multi and reports its primal."""
    X, y, _ = problem
    w = np.where(np.arange(X.shape[0]) % 2 == 0, 0.0, 1.5)
    model = topkbench.fit(X, y, "topk_ent_tr", k=1, C=2.0, eps=1e-9, sample_weight=w)
    assert model.primal == pytest.approx(model.info["init_primal"], rel=1e-6)


@pytest.mark.parametrize("solver", [None, "gd"])
@pytest.mark.parametrize("sparse", [True, False])
def test_ent_tr_on_features_without_columns_is_w_zero(solver, sparse):
    """Features with no column leave nothing to optimize: W is the d x m empty matrix and
    the run converged at its start, as for the other methods (L-BFGS took the maximum of an
    empty gradient: a raw ValueError)."""
    import scipy.sparse as sp

    X = sp.csr_matrix((60, 0)) if sparse else np.zeros((60, 0))
    y = np.arange(60) % 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = topkbench.fit(X, y, "topk_ent_tr", k=2, solver=solver)
    assert model.W.shape == (0, 5) and model.converged
    assert np.isfinite(model.primal)
    np.testing.assert_array_equal(model.decision_function(X), np.zeros((60, 5)))
