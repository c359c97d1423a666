"""Projections onto permutahedra and the weighted top-k hinge's biased projection
(:mod:`topkbench.prox.permutahedron`): cvxpy references, KKT-free invariants (feasibility,
permutation equivariance, ties, theta at its ends) and the reductions to the flat top-k and
SVM^Multi domains."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topkbench.prox.permutahedron import (
    project_permutahedron_sorted,
    wtopk_biased_projection,
)
from topkbench.prox.projections import simplex_biased_threshold
from topkbench.prox.topk import SET_DK, topk_threshold


def project(b, rho, C):
    m = rho.shape[0]
    x = np.empty(m - 1)
    scratch = (np.empty(m, np.int64), np.empty(m), np.empty(m), np.empty(m), np.empty(m),
               np.empty(m, np.int64))  # fmt: skip
    theta = wtopk_biased_projection(np.asarray(b, float), rho, C, x, *scratch)
    return x, theta


def weights(m, K, kind, rng=None):
    if kind == "flat":
        head = np.full(K, 1.0 / K)
    elif kind == "linear":
        head = 2.0 * (K + 1 - np.arange(1, K + 1)) / ((K + 1) * K)
    elif kind == "exp":
        head = np.exp(-np.arange(1, K + 1) / K)
        head /= head.sum()
    else:
        head = np.sort(rng.random(K))[::-1]
    return np.concatenate([head, np.zeros(m - K)])


def cvxpy_reference(b, rho, C):
    """min_{theta in [0,1], p in P(theta C rho)} ||p^{\\y} - b||^2 + (p_y - theta C sum rho)^2
    with the permutahedron by its majorization inequalities (y is the last coordinate)."""
    m = rho.shape[0]
    p, theta = cp.Variable(m), cp.Variable()
    w = C * np.cumsum(rho)
    cons = [cp.sum(p) == theta * w[-1], theta >= 0, theta <= 1]
    cons += [cp.sum_largest(p, j) <= theta * w[j - 1] for j in range(1, m)]
    obj = cp.sum_squares(p[:-1] - b) + cp.square(p[-1] - theta * w[-1])
    problem = cp.Problem(cp.Minimize(obj), cons)
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert problem.status == cp.OPTIMAL
    return p.value[:-1], problem.value


def objective(x, b):
    return float(np.sum((x - b) ** 2) + x.sum() ** 2)


def in_domain(x, rho, C, theta, tol=1e-9):
    """x = p^{\\y} for some p in P(theta C rho): the label's entry t = theta C sum rho - <1,x>
    completes a vector majorized by theta C rho."""
    p = np.sort(np.append(x, theta * C * rho.sum() - x.sum()))[::-1]
    w = theta * C * np.cumsum(rho)
    return bool(np.all(np.cumsum(p)[:-1] <= w[:-1] + tol) and abs(p.sum() - w[-1]) <= tol)


@pytest.mark.parametrize("kind", ["flat", "linear", "exp", "random"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_cvxpy(kind, seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 9))
    K = int(rng.integers(1, m + 1))
    rho = weights(m, K, kind, rng)
    b = 2.0 * rng.normal(size=m - 1) + rng.normal()
    C = float(rng.uniform(0.1, 5.0))
    x, theta = project(b, rho, C)
    x_ref, value = cvxpy_reference(b, rho, C)
    assert objective(x, b) == pytest.approx(value, rel=1e-9, abs=1e-10)
    np.testing.assert_allclose(x, x_ref, atol=1e-6)
    assert 0.0 <= theta <= 1.0 and in_domain(x, rho, C, theta)


@settings(max_examples=200, derandomize=True)
@given(
    m=st.integers(2, 12),
    K=st.integers(1, 12),
    kind=st.sampled_from(["flat", "linear", "exp"]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
)
def test_feasible_and_not_worse_than_its_neighbours(m, K, kind, seed, scale):
    """Feasibility, and optimality against points of the domain near the solution: the
    objective is convex, so any feasible point, e.g. a mix with the projection at other
    theta, is no better."""
    K = min(K, m)
    rng = np.random.default_rng(seed)
    rho = weights(m, K, kind)
    b = scale * rng.normal(size=m - 1)
    C = float(rng.uniform(0.1, 3.0))
    x, theta = project(b, rho, C)
    assert in_domain(x, rho, C, theta, tol=1e-9 * max(1.0, C, scale))
    best = objective(x, b)
    assert best <= objective(np.zeros(m - 1), b) * (1 + 1e-12) + 1e-300
    for other in (0.0, 0.5 * theta, min(1.0, 1.5 * theta + 0.1), 1.0):
        # the projection onto the slice P(other C rho) is feasible
        z = np.append(b, other * C * rho.sum())
        order = np.argsort(-z, kind="stable")
        out = np.empty(m)
        project_permutahedron_sorted(z[order], other * C * rho, out, np.empty(m), np.empty(m),
                                     np.empty(m, np.int64))  # fmt: skip
        p = np.empty(m)
        p[order] = out
        assert best <= objective(p[:-1], b) + 1e-9 * max(1.0, best)


def test_permutation_equivariance_and_ties():
    rng = np.random.default_rng(3)
    rho = weights(6, 3, "linear")
    b = np.array([1.0, 1.0, 0.5, 0.5, -0.2])  # ties
    x, _ = project(b, rho, 2.0)
    for _ in range(5):
        perm = rng.permutation(5)
        xp, _ = project(b[perm], rho, 2.0)
        np.testing.assert_allclose(xp, x[perm], atol=1e-12)
    assert x[0] == pytest.approx(x[1], abs=1e-12) and x[2] == pytest.approx(x[3], abs=1e-12)


def test_theta_at_its_ends():
    rho = weights(5, 2, "exp")
    x, theta = project(-np.ones(4), rho, 1.0)  # no margin violated: x = 0, theta = 0
    assert theta == 0.0 and not x.any()
    x, theta = project(np.full(4, 100.0), rho, 1.0)  # far out: the largest permutahedron
    assert theta == 1.0 and in_domain(x, rho, 1.0, 1.0)


@pytest.mark.parametrize("seed", range(8))
def test_flat_weights_give_the_printed_topk_domain(seed):
    """rho = 1/k: the biased projection onto D_k(C) of the top-k hinge alpha as printed."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(3, 10))
    k = int(rng.integers(1, m))
    b = rng.normal(size=m - 1) + 0.3
    C = float(rng.uniform(0.2, 3.0))
    x, _ = project(b, weights(m, k, "flat"), C)
    # topk_threshold solves 1/2 ||x - b||^2 + rho/2 <1,x>^2: rho = 1 is our problem
    t, c, _ = topk_threshold(SET_DK, b.copy(), k, 1.0, C, np.empty(m))
    np.testing.assert_allclose(x, np.clip(b - t, 0.0, c), atol=1e-10)


def test_first_weight_only_gives_the_simplex():
    rng = np.random.default_rng(9)
    for _ in range(10):
        b = rng.normal(size=6)
        x, _ = project(b, weights(7, 1, "flat"), 1.5)
        t = simplex_biased_threshold(b.copy(), 1.0, 1.5, np.empty(6, np.int64))
        np.testing.assert_allclose(x, np.maximum(b - t, 0.0), atol=1e-10)


def test_projection_onto_a_permutahedron_matches_cvxpy():
    rng = np.random.default_rng(11)
    for _ in range(5):
        m = 6
        w = np.sort(rng.random(m))[::-1]
        z = np.sort(3 * rng.normal(size=m))[::-1]
        out = np.empty(m)
        project_permutahedron_sorted(z, w, out, np.empty(m), np.empty(m), np.empty(m, np.int64))
        p = cp.Variable(m)
        cons = [cp.sum(p) == w.sum()]
        cons += [cp.sum_largest(p, j) <= np.cumsum(w)[j - 1] for j in range(1, m)]
        cp.Problem(cp.Minimize(cp.sum_squares(p - z)), cons).solve(solver=cp.CLARABEL)
        np.testing.assert_allclose(out, p.value, atol=1e-6)


@settings(max_examples=100, derandomize=True)
@given(n=st.integers(0, 40), seed=st.integers(0, 2**16), ties=st.booleans())
def test_argsort_desc_orders_keys_descending(n, seed, ties):
    from topkbench.prox.permutahedron import argsort_desc

    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 4, size=n).astype(float) if ties else rng.normal(size=n)
    idx = np.full(n + 2, -1, dtype=np.int64)
    argsort_desc(keys, n, idx)
    assert sorted(idx[:n].tolist()) == list(range(n))
    assert np.all(np.diff(keys[idx[:n]]) <= 0.0)
    assert np.all(idx[n:] == -1)
