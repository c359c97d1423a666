"""Euclidean projection onto the bipartite simplex (TPAMI, 002 §3.3 eq. (7), §5.3 eq. (17),
Prop. 19), ``topkbench.prox.bipartite``.

Problem (17), with ``B(r) = {(x, y) : x >= 0, y >= 0, <1,x> = <1,y> <= r}``::

    (p, pbar) = argmin_{(x, y) in B(r)}  1/2 ||x - b||^2 + 1/2 ||y - bbar||^2

The kernels return thresholds ``(t, s)`` with ``p = (b - t)_+`` and ``pbar = (bbar - s)_+``.
With multipliers ``mu`` (for ``<1,x> = <1,y>``) and ``nu >= 0`` (for the radius), the KKT
conditions are ``t = mu + nu``, ``s = -mu``, so ``t + s = nu >= 0`` and ``nu (<1,x> - r) = 0``;
together with ``<1,p> = <1,pbar> <= r`` they are necessary and sufficient (a strongly convex
objective over a polyhedron), so they certify the solution without any solver.

What is tested:

(a) both methods (variable fixing, TPAMI §5.3 with the corrected step 5; sorting, ref. [60])
    against cvxpy (CLARABEL) on sizes 1..8, radii 1e-6..1e6, data N(0, sigma^2) for sigma in
    {0.1, 1, 10}, shifted data (inactive radius) and zero solutions;
(b) the KKT certificate above on sizes up to 1000;
(c) the two methods against each other on degenerate inputs (ties, equal values, a block with
    no positive mass, r = 1e-12 and 1e12, a side of size 1);
(d) reductions: permutation equivariance, symmetry of the two blocks, exact homogeneity under
    powers of two, idempotence, and r = inf / huge r equal to the equal-sum solution computed
    by an independent numpy root finder;
(e) the paper's step 5 as printed ("if Delta_x > Delta_y, update I_x") fails, the swapped rule
    (the package's) is right.

Tolerances: a coordinate ``b_j - t`` carries a rounding error of a few ``eps * scale`` (``scale``
the largest of |b|, |bbar|, |t|, |s|), so every sum check has an absolute floor
``4 (m + n) eps scale`` on top of the relative tolerance.
"""

from __future__ import annotations

import math
import warnings

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from topkbench.prox.bipartite import (
    bipartite_thresholds,
    bipartite_thresholds_sorted,
    project_bipartite,
)
from topkbench.prox.projections import simplex_threshold

EPS = float(np.finfo(np.float64).eps)
METHODS = ("variable_fixing", "sorting")


# --- helpers ----------------------------------------------------------------------------------


def thresholds(method, b, bb, r):
    """``(t, s)`` from the numba kernel of ``method``."""
    b = np.ascontiguousarray(b, dtype=np.float64)
    bb = np.ascontiguousarray(bb, dtype=np.float64)
    if method == "sorting":
        return bipartite_thresholds_sorted(b, bb, float(r), np.empty(b.size), np.empty(bb.size))
    return bipartite_thresholds(
        b, bb, float(r), np.empty(b.size, np.int64), np.empty(bb.size, np.int64)
    )


def reduced_objective(b, bb, p, pb):
    """Objective of (17) minus the constant 1/2 (||b||^2 + ||bbar||^2)."""
    return 0.5 * float(p @ p) - float(b @ p) + 0.5 * float(pb @ pb) - float(bb @ pb)


def g(b, bb, t):
    """``g(t) = sum (b - t)_+ - sum (bbar + t)_+`` (non-increasing); its root is the
    equal-sum threshold when the radius is inactive."""
    return float(np.maximum(b - t, 0.0).sum() - np.maximum(bb + t, 0.0).sum())


def equal_sum_root(b, bb):
    """Root of g by an exhaustive search over its breakpoints (numpy, independent of the
    package).  Assumes max b + max bbar > 0, so that g changes sign at a unique point."""
    knots = np.unique(np.concatenate([b, -bb]))
    vals = np.array([g(b, bb, k) for k in knots])
    for k, v in zip(knots, vals, strict=True):
        if v == 0.0:
            return float(k)
    # g > 0 far left; find the last knot with g > 0, the root lies after it
    lo = knots[vals > 0.0].max() if np.any(vals > 0.0) else knots[0] - 1.0
    above = knots[knots > lo]
    hi = above.min() if above.size else lo + 1.0
    mid = 0.5 * (lo + hi)
    ax = b > mid
    ay = bb + mid > 0.0
    return float((b[ax].sum() - bb[ay].sum()) / (ax.sum() + ay.sum()))


def scale_of(b, bb, t=0.0, s=0.0):
    return max(float(np.max(np.abs(b))), float(np.max(np.abs(bb))), abs(t), abs(s), 1e-300)


def cvxpy_projection(b, bb, r):
    """cvxpy (CLARABEL) on an equivalent, well-scaled problem; None if the solver fails.

    Equivalences (``B = max(|b|, |bbar|) > 0``): every coordinate of the solution is at most
    ``max b + max bbar <= 2B`` (``t >= -max bbar`` and ``s >= -max b`` at the optimum), so
    ``r' = min(r, 2 (m + n) B)`` gives the same projection; and ``(x, y) = B (x', y')`` maps it
    to the projection of ``(b, bbar)/B`` onto ``B(r'/B)``, whose objective is ``B^2`` times the
    original (reduced) one.
    """
    big = max(float(np.max(np.abs(b))), float(np.max(np.abs(bb))))
    r_eff = min(r, 2.0 * (b.size + bb.size) * big)
    x = cp.Variable(b.size, nonneg=True)
    y = cp.Variable(bb.size, nonneg=True)
    obj = 0.5 * cp.sum_squares(x) - (b / big) @ x + 0.5 * cp.sum_squares(y) - (bb / big) @ y
    problem = cp.Problem(cp.Minimize(obj), [cp.sum(x) == cp.sum(y), cp.sum(x) <= r_eff / big])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    except cp.SolverError:
        return None
    if problem.status != cp.OPTIMAL:
        return None
    return big * x.value, big * y.value, big * big * float(problem.value), big


def assert_kkt(b, bb, r, t, s, p, pb):
    """The KKT certificate of the module docstring, with rounding floors."""
    m, n = b.size, bb.size
    scale = scale_of(b, bb, t, s)
    floor = 4.0 * (m + n) * EPS * scale
    np.testing.assert_array_equal(p, np.maximum(b - t, 0.0))
    np.testing.assert_array_equal(pb, np.maximum(bb - s, 0.0))
    assert np.all(p >= 0.0) and np.all(pb >= 0.0)
    sx, sy = float(p.sum()), float(pb.sum())
    assert abs(sx - sy) <= 1e-12 * max(sx, sy) + floor, (sx, sy)
    assert sx <= r * (1.0 + 1e-12) + floor, (sx, r)
    assert sy <= r * (1.0 + 1e-12) + floor, (sy, r)
    assert t + s >= -floor, (t, s)
    if t + s > 1e-12 * scale:  # radius multiplier nu > 0: the radius is attained
        assert abs(sx - r) <= 1e-12 * r + floor, (sx, r)
        assert abs(sy - r) <= 1e-12 * r + floor, (sy, r)


# --- strategies -------------------------------------------------------------------------------


@st.composite
def gaussian_problems(draw, max_size=8):
    """(b, bbar, r): N(0, sigma^2) data, log-uniform radius in [1e-6, 1e6] or in [0.1, 30]
    sigma, with shifts."""
    m = draw(st.integers(1, max_size))
    n = draw(st.integers(1, max_size))
    sigma = draw(st.sampled_from([0.1, 1.0, 10.0]))
    if draw(st.booleans()):
        r = 10.0 ** draw(st.floats(-6.0, 6.0))
    else:  # radius near the data scale: active or inactive with partial knapsack supports
        r = sigma * 10.0 ** draw(st.floats(-1.0, 1.5))
    shift = draw(st.sampled_from(["none", "negative", "zero"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = rng.normal(0.0, sigma, m)
    bb = rng.normal(0.0, sigma, n)
    if shift == "negative":  # mostly negative: little positive mass, radius often inactive
        b -= 2.0 * sigma
        bb -= 2.0 * sigma
    elif shift == "zero":  # max b + max bbar <= 0: the solution is 0
        b -= b.max() + sigma * rng.random()
        bb -= bb.max()
    return b, bb, r


@st.composite
def degenerate_problems(draw, max_size=8):
    """Ties, equal values, a block without positive mass, extreme radii, a side of size 1."""
    m = draw(st.integers(1, max_size))
    n = draw(st.integers(1, max_size))
    if draw(st.booleans()):
        m, n = (1, n) if draw(st.booleans()) else (m, 1)
    kind = draw(st.sampled_from(["equal", "ties", "dead_y", "dead_x", "gauss"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "equal":
        b = np.full(m, draw(st.sampled_from([-1.0, 0.0, 0.5, 3.0])))
        bb = np.full(n, draw(st.sampled_from([-2.0, 0.0, 0.5, 1.0])))
    elif kind == "ties":
        b = rng.integers(-3, 4, m).astype(np.float64)
        bb = rng.integers(-3, 4, n).astype(np.float64)
    elif kind == "dead_y":  # all bbar very negative: only large b carry mass
        b = rng.normal(0.0, 10.0, m) + draw(st.sampled_from([0.0, 20.0]))
        bb = -5.0 - np.abs(rng.normal(0.0, 1.0, n))
    elif kind == "dead_x":
        b = -5.0 - np.abs(rng.normal(0.0, 1.0, m))
        bb = rng.normal(0.0, 10.0, n) + draw(st.sampled_from([0.0, 20.0]))
    else:
        b = rng.normal(size=m)
        bb = rng.normal(size=n)
    r = draw(st.sampled_from([1e-12, 1e-3, 1.0, 10.0, 1e12]))
    return b, bb, r


# --- (a) cvxpy --------------------------------------------------------------------------------


@settings(max_examples=60)
@given(problem=gaussian_problems())
def test_projection_matches_cvxpy(problem):
    """Both methods equal CLARABEL's projection to 1e-7 absolute (the solution is unique), and
    our objective does not exceed cvxpy's by more than 1e-8 relative (the absolute floor is
    cvxpy's 1e-12 accuracy in the rescaled units, times B^2)."""
    b, bb, r = problem
    ref = cvxpy_projection(b, bb, r)
    if ref is None:
        note("CLARABEL failed")
        return
    x, y, value, big = ref
    for method in METHODS:
        p, pb = project_bipartite(b, bb, r, method)
        np.testing.assert_allclose(p, x, rtol=0, atol=1e-7)
        np.testing.assert_allclose(pb, y, rtol=0, atol=1e-7)
        ours = reduced_objective(b, bb, p, pb)
        assert ours <= value + 1e-8 * abs(value) + 1e-11 * big * big, (method, ours, value)
    if b.max() + bb.max() <= 0.0:
        for method in METHODS:
            p, pb = project_bipartite(b, bb, r, method)
            assert not p.any() and not pb.any()


def test_cvxpy_comparison_is_not_vacuous():
    """CLARABEL solves (almost) every rescaled problem of the cvxpy test, and the draws cover
    the three regimes: radius active, radius inactive with mass, zero solution."""
    rng = np.random.default_rng(17)
    regimes = {"active": 0, "inactive": 0, "zero": 0}
    failures = 0
    for trial in range(30):
        m, n = (int(v) for v in rng.integers(1, 9, 2))
        sigma = float(rng.choice([0.1, 1.0, 10.0]))
        b, bb = rng.normal(0, sigma, m), rng.normal(0, sigma, n)
        if trial % 3 == 1:
            b -= 2 * sigma
            bb -= 2 * sigma
        elif trial % 3 == 2:
            b -= b.max() + sigma
            bb -= bb.max()
        r = float(10.0 ** rng.uniform(-6, 6))
        t, s = thresholds("variable_fixing", b, bb, r)
        if b.max() + bb.max() <= 0:
            regimes["zero"] += 1
        else:
            regimes["active" if t + s > 0 else "inactive"] += 1
        failures += cvxpy_projection(b, bb, r) is None
    assert failures <= 1
    assert min(regimes.values()) >= 3, regimes


# --- (b) KKT certificate ----------------------------------------------------------------------


@settings(max_examples=60)
@given(
    problem=gaussian_problems(max_size=1000),
    method=st.sampled_from(METHODS),
    integer=st.booleans(),
)
def test_kkt_certificate_large(problem, method, integer):
    """Feasibility, t + s >= 0, complementarity and p = (b - t)_+ on sizes up to 1000
    (``integer`` rounds the data to create many ties)."""
    b, bb, r = problem
    if integer:
        b, bb = np.round(b), np.round(bb)
    t, s = thresholds(method, b, bb, r)
    p, pb = project_bipartite(b, bb, r, method)
    assert math.isfinite(t) and math.isfinite(s)
    assert_kkt(b, bb, r, t, s, p, pb)


def test_kkt_certificate_fixed_regimes():
    """One deterministic problem per regime (m = 700, n = 300): radius active, radius
    inactive, zero solution; the regime is read off the thresholds."""
    rng = np.random.default_rng(3)
    b, bb = rng.normal(size=700), rng.normal(size=300)
    cases = [(b, bb, 1.0, "active"), (b - 3.0, bb - 3.0, 10.0, "inactive")]
    cases.append((b - b.max() - 0.1, bb - bb.max(), 10.0, "zero"))
    for bx, by, r, regime in cases:
        for method in METHODS:
            t, s = thresholds(method, bx, by, r)
            p, pb = project_bipartite(bx, by, r, method)
            assert_kkt(bx, by, r, t, s, p, pb)
            if regime == "active":
                assert t + s > 0 and p.sum() == pytest.approx(r, rel=1e-12)
            elif regime == "inactive":
                assert t + s == 0 and 0 < p.sum() < r
            else:
                assert not p.any() and not pb.any()


# --- (c) the two methods agree -----------------------------------------------------------------


@settings(max_examples=60)
@given(problem=degenerate_problems())
def test_methods_agree_on_degenerate_inputs(problem):
    """Variable fixing and sorting give the same projection to 1e-10 (times the data scale)
    on ties, constant blocks, dead blocks, r in {1e-12, 1e12} and size-1 sides; both pass
    the KKT certificate."""
    b, bb, r = problem
    sols = {}
    for method in METHODS:
        t, s = thresholds(method, b, bb, r)
        p, pb = project_bipartite(b, bb, r, method)
        assert_kkt(b, bb, r, t, s, p, pb)
        sols[method] = (p, pb)
    tol = 1e-10 * max(1.0, scale_of(b, bb))
    for a, c in zip(sols["variable_fixing"], sols["sorting"], strict=True):
        np.testing.assert_allclose(a, c, rtol=0, atol=tol)


@settings(max_examples=40)
@given(problem=gaussian_problems(max_size=200))
def test_methods_agree_on_random_inputs(problem):
    b, bb, r = problem
    p1, q1 = project_bipartite(b, bb, r, "variable_fixing")
    p2, q2 = project_bipartite(b, bb, r, "sorting")
    tol = 1e-10 * max(1.0, scale_of(b, bb))
    np.testing.assert_allclose(p1, p2, rtol=0, atol=tol)
    np.testing.assert_allclose(q1, q2, rtol=0, atol=tol)


def test_work_arrays_may_be_longer():
    """The kernels accept work arrays longer than the blocks (the SDCA loop reuses length-m
    scratch) and give the same thresholds."""
    rng = np.random.default_rng(5)
    b, bb = rng.normal(size=5), rng.normal(size=3)
    for r in (0.1, 100.0):
        t_vf = bipartite_thresholds(b, bb, r, np.empty(9, np.int64), np.empty(9, np.int64))
        t_so = bipartite_thresholds_sorted(b, bb, r, np.empty(9), np.empty(9))
        assert t_vf == thresholds("variable_fixing", b, bb, r)
        assert t_so == thresholds("sorting", b, bb, r)


# --- (d) reductions ---------------------------------------------------------------------------


@settings(max_examples=40)
@given(
    problem=gaussian_problems(max_size=30),
    method=st.sampled_from(METHODS),
    seed=st.integers(0, 999),
)
def test_permutation_equivariance_and_block_symmetry(problem, method, seed):
    """Permuting b and bbar permutes the projection; B(r) is symmetric in its two blocks, so
    projecting (bbar, b) swaps the result."""
    b, bb, r = problem
    p, pb = project_bipartite(b, bb, r, method)
    tol = 8.0 * (b.size + bb.size) * EPS * scale_of(b, bb)
    rng = np.random.default_rng(seed)
    px, py = rng.permutation(b.size), rng.permutation(bb.size)
    p2, pb2 = project_bipartite(b[px], bb[py], r, method)
    np.testing.assert_allclose(p2, p[px], rtol=0, atol=tol)
    np.testing.assert_allclose(pb2, pb[py], rtol=0, atol=tol)
    q, qb = project_bipartite(bb, b, r, method)
    np.testing.assert_allclose(q, pb, rtol=0, atol=tol)
    np.testing.assert_allclose(qb, p, rtol=0, atol=tol)


@settings(max_examples=40)
@given(
    problem=gaussian_problems(max_size=30),
    method=st.sampled_from(METHODS),
    power=st.integers(-20, 20),
)
def test_homogeneity_under_powers_of_two(problem, method, power):
    """proj_{B(c r)}(c b, c bbar) = c proj_{B(r)}(b, bbar); for c = 2^k every floating-point
    operation of both algorithms scales exactly, so the results are bit-identical."""
    b, bb, r = problem
    c = 2.0**power
    p, pb = project_bipartite(b, bb, r, method)
    p2, pb2 = project_bipartite(c * b, c * bb, c * r, method)
    np.testing.assert_array_equal(p2, c * p)
    np.testing.assert_array_equal(pb2, c * pb)


@settings(max_examples=40)
@given(problem=gaussian_problems(max_size=30), method=st.sampled_from(METHODS))
def test_idempotence(problem, method):
    """A point of B(r) is its own projection: projecting (p, pbar) returns it (to rounding)."""
    b, bb, r = problem
    p, pb = project_bipartite(b, bb, r, method)
    p2, pb2 = project_bipartite(p, pb, r, method)
    tol = 8.0 * (b.size + bb.size) * EPS * scale_of(b, bb) + 1e-12 * r
    np.testing.assert_allclose(p2, p, rtol=0, atol=tol)
    np.testing.assert_allclose(pb2, pb, rtol=0, atol=tol)


@settings(max_examples=40)
@given(problem=gaussian_problems(max_size=50), method=st.sampled_from(METHODS))
def test_huge_radius_is_the_equal_sum_solution(problem, method):
    """With r = inf (no radius) or r = 1e12 (larger than any mass here), the projection is the
    equal-sum solution (b - t)_+, (bbar + t)_+ with t the root of g found by the numpy
    breakpoint search; with no positive mass it is 0."""
    b, bb, _ = problem
    tol = 8.0 * (b.size + bb.size) * EPS * scale_of(b, bb)
    if b.max() + bb.max() <= 0.0:
        x, y = np.zeros_like(b), np.zeros_like(bb)
    else:
        t = equal_sum_root(b, bb)
        assert abs(g(b, bb, t)) <= tol
        x, y = np.maximum(b - t, 0.0), np.maximum(bb + t, 0.0)
    for r in (math.inf, 1e12):
        p, pb = project_bipartite(b, bb, r, method)
        np.testing.assert_allclose(p, x, rtol=0, atol=tol)
        np.testing.assert_allclose(pb, y, rtol=0, atol=tol)


def test_empty_block_gives_empty_projection():
    """An empty side forces <1,x> = 0, hence the projection is 0."""
    p, pb = project_bipartite(np.array([1.0, 2.0]), np.array([]), 1.0)
    assert p.tolist() == [0.0, 0.0] and pb.size == 0


# --- (e) step 5 of TPAMI §5.3 -------------------------------------------------------------------


def paper_steps_2_to_5(b, bb, *, as_printed):
    """Steps 2-5 of TPAMI §5.3 in numpy, with the step-5 rule as printed ("if Delta_x >
    Delta_y, update I_x <- I_x minus I_x^L"; "if Delta_x < Delta_y, update I_y") or swapped.

    Returns ``(t, status)``: status "stopped" (step 4 reached, t returned), or "stalled" (step
    5 removed nothing, so steps 2-5 would repeat forever with the same t, which is then not a
    root since Delta_x != Delta_y), or "exhausted" (a free set became empty in both blocks).
    """
    ix = np.ones(b.size, bool)
    iy = np.ones(bb.size, bool)
    while True:
        free = int(ix.sum() + iy.sum())
        if free == 0:
            return math.nan, "exhausted"
        t = (b[ix].sum() - bb[iy].sum()) / free  # step 2
        lx = ix & (b - t <= 0.0)  # step 3
        ly = iy & (bb + t <= 0.0)
        dx = float((b[lx] - t).sum())
        dy = float((bb[ly] + t).sum())
        if dx == dy:  # step 4
            return float(t), "stopped"
        fix_x = dx > dy if as_printed else dx < dy  # step 5
        fixed = lx if fix_x else ly
        if not fixed.any():
            return float(t), "stalled"
        if fix_x:
            ix &= ~lx
        else:
            iy &= ~ly


def test_paper_step5_as_printed_is_wrong_and_swapped_rule_is_right():
    """On 500 random problems (sizes 1..8, N(0,1), r = 10 as in TPAMI Table 2) where step 1
    does not stop (radius inactive) and max b + max bbar > 0:

    * the printed rule does not find a root of g on most of them (> 30% required; in fact
      nearly all), because when Delta_x > Delta_y we have g(t) = Delta_y - Delta_x < 0, so the
      root t* < t and the x's in I_x^L may be positive at t*: it is the y's in I_y^L that are
      certainly 0 (bbar_j + t* < bbar_j + t <= 0);
    * the swapped rule always stops at the root, which is also the package's threshold.
    """
    rng = np.random.default_rng(2017)
    r = 10.0
    count = printed_bad = 0
    statuses = {"stopped": 0, "stalled": 0, "exhausted": 0}
    while count < 500:
        m, n = (int(v) for v in rng.integers(1, 9, 2))
        b, bb = rng.normal(size=m), rng.normal(size=n)
        if b.max() + bb.max() <= 0.0:
            continue
        t1 = simplex_threshold(b, r, np.empty(m, np.int64))
        s1 = simplex_threshold(bb, r, np.empty(n, np.int64))
        if t1 + s1 >= 0.0:  # step 1 stops: the radius is active
            continue
        count += 1
        tol = 1e-12 * (m + n) * scale_of(b, bb)
        t, status = paper_steps_2_to_5(b, bb, as_printed=True)
        statuses[status] += 1
        if status != "stopped" or abs(g(b, bb, t)) > tol:
            printed_bad += 1
        t, status = paper_steps_2_to_5(b, bb, as_printed=False)
        assert status == "stopped", (b, bb)
        assert abs(g(b, bb, t)) <= tol, (b, bb, t)
        t_pkg, s_pkg = thresholds("variable_fixing", b, bb, r)
        assert s_pkg == -t_pkg
        assert t_pkg == pytest.approx(t, rel=1e-12, abs=tol)
    assert printed_bad > 0.3 * count, (printed_bad, statuses)
