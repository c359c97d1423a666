"""Simplex and biased simplex projections (TPAMI 002 Prop. 14 with k = 1; DESIGN §4.4).

``simplex_threshold(b, r)``: t with ``sum_j (b_j - t)_+ = r``, i.e. the projection onto the face
``{x >= 0, <1,x> = r}``.  ``simplex_biased_threshold(b, rho, r)``: t such that
``x = (b - t)_+`` solves ``min ||x - b||^2 + rho <1,x>^2  s.t.  x >= 0, <1,x> <= r``.

Optimality is checked primarily through the KKT conditions, which characterise the solution
exactly (the problem is convex): ``x = (b - t)_+`` with ``t = rho s + mu``, ``s = <1,x>``,
``mu >= 0``, ``s <= r``, ``mu (s - r) = 0``.  cvxpy (CLARABEL) is a second, coarser opinion.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from topkbench.prox.projections import (
    apply_threshold,
    simplex_biased_threshold,
    simplex_threshold,
)

KKT_TOL = 1e-12  # relative to max(|b|, r)


def biased_projection(b, rho, r):
    b = np.ascontiguousarray(b, dtype=np.float64)
    idx = np.empty(b.shape[0], dtype=np.int64)
    t = simplex_biased_threshold(b, float(rho), float(r), idx)
    x = np.empty_like(b)
    s = apply_threshold(b, t, x)
    return t, x, s


def face_projection(b, r):
    b = np.ascontiguousarray(b, dtype=np.float64)
    idx = np.empty(b.shape[0], dtype=np.int64)
    t = simplex_threshold(b, float(r), idx)
    x = np.empty_like(b)
    s = apply_threshold(b, t, x)
    return t, x, s


def assert_biased_kkt(b, rho, r, t, x, s, tol=KKT_TOL):
    scale = max(float(np.max(np.abs(b))), r, 1e-300)
    m = b.shape[0]
    # x = (b - t)_+ and s = <1, x>, i.e. apply_threshold did what it says
    np.testing.assert_array_equal(x, np.maximum(b - t, 0.0))
    assert s == pytest.approx(x.sum(), rel=1e-15 * m, abs=1e-300)
    mu = t - rho * s
    # t is the one unknown: moving it by delta moves s by <= m delta and mu by
    # <= (1 + rho m) delta, so residuals of mu are divided by (1 + rho m) to read as
    # "distance in t from a KKT point" relative to max(|b|, r)
    assert np.all(x >= 0.0)
    assert s <= r + tol * scale, f"sum {s} exceeds r = {r}"
    assert mu >= -tol * scale * (1 + rho * m), f"mu = {mu} < 0"
    # complementary slackness: mu > 0 only on the boundary s = r
    assert min(abs(mu), abs(s - r)) <= tol * scale * (1 + rho * m), (mu, s - r)


def assert_face_kkt(b, r, t, x, s, tol=KKT_TOL):
    scale = max(float(np.max(np.abs(b))), r)
    np.testing.assert_array_equal(x, np.maximum(b - t, 0.0))
    assert abs(s - r) <= tol * scale * b.shape[0]
    assert x.max() > 0.0


def cvxpy_biased(b, rho, r):
    x = cp.Variable(b.shape[0])
    objective = cp.sum_squares(x - b) + rho * cp.square(cp.sum(x))
    problem = cp.Problem(cp.Minimize(objective), [x >= 0, cp.sum(x) <= r])
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert problem.status == cp.OPTIMAL
    return x.value, problem.value


def sorted_simplex_face(b, r):
    """Textbook sort-based projection onto {x >= 0, sum x = r} (Held et al. / Duchi et al.)."""
    u = np.sort(b)[::-1]
    css = np.cumsum(u)
    ks = np.arange(1, b.shape[0] + 1)
    cond = u - (css - r) / ks > 0
    k = ks[cond][-1]
    return (css[k - 1] - r) / k


def sorted_case1_threshold(b, rho):
    """Root of t = rho * sum (b - t)_+ by sorting (the mu = 0 case of the biased problem)."""
    u = np.sort(b)[::-1]
    if u[0] <= 0:
        return 0.0
    css = np.cumsum(u)
    for k in range(1, b.shape[0] + 1):
        t = rho * css[k - 1] / (1 + rho * k)
        nxt = u[k] if k < b.shape[0] else -np.inf
        if u[k - 1] > t >= nxt:
            return t
    raise AssertionError("no breakpoint found")


def objective(b, rho, x):
    return float(np.sum((x - b) ** 2) + rho * np.sum(x) ** 2)


# --- strategies --------------------------------------------------------------------------------

finite = dict(allow_nan=False, allow_infinity=False)


@st.composite
def vectors(draw, min_size=1, max_size=12, lo=-10.0, hi=10.0):
    m = draw(st.integers(min_size, max_size))
    b = draw(hnp.arrays(np.float64, m, elements=st.floats(lo, hi, **finite)))
    if draw(st.booleans()):  # ties
        ties = draw(st.integers(1, m))
        b[:ties] = b[0]
    return b


@st.composite
def multiscale_vectors(draw, max_size=12):
    """Entries of magnitude 1e-6 .. 1e6 with random signs, plus a global scale."""
    m = draw(st.integers(1, max_size))
    exponents = draw(hnp.arrays(np.float64, m, elements=st.floats(-6.0, 6.0)))
    signs = draw(hnp.arrays(np.float64, m, elements=st.sampled_from([-1.0, 1.0])))
    b = signs * 10.0**exponents
    if draw(st.booleans()):
        j = draw(st.integers(0, m - 1))
        b[j:] = b[j]
    return b


rhos = st.one_of(
    st.just(0.0), st.floats(0.0, 1.0), st.floats(1.0, 1e3), st.sampled_from([1e-6, 1e6])
)
radii = st.one_of(st.floats(1e-3, 10.0), st.sampled_from([1e-6, 1.0, 1e6]))


# --- KKT (the primary optimality check) ---------------------------------------------------------


@given(vectors(), rhos, radii)
def test_biased_kkt(b, rho, r):
    t, x, s = biased_projection(b, rho, r)
    assert t >= 0.0
    assert_biased_kkt(b, rho, r, t, x, s)


@given(multiscale_vectors(), rhos, radii)
def test_biased_kkt_multiscale(b, rho, r):
    t, x, s = biased_projection(b, rho, r)
    assert_biased_kkt(b, rho, r, t, x, s)


@given(vectors(max_size=40), radii)
def test_face_kkt(b, r):
    t, x, s = face_projection(b, r)
    assert_face_kkt(b, r, t, x, s)


@given(multiscale_vectors(max_size=40), radii)
def test_face_kkt_multiscale(b, r):
    t, x, s = face_projection(b, r)
    assert_face_kkt(b, r, t, x, s)


@given(vectors(max_size=40), radii)
def test_face_matches_sorting(b, r):
    t, _, _ = face_projection(b, r)
    t_ref = sorted_simplex_face(b, r)
    assert t == pytest.approx(t_ref, abs=1e-12 * max(np.abs(b).max(), r))


def test_kkt_on_large_random_inputs():
    rng = np.random.default_rng(7)
    for m in (2, 10, 100, 1000):
        for _ in range(20):
            b = rng.normal(size=m) * 10.0 ** rng.uniform(-6, 6)
            rho = float(rng.choice([0.0, rng.uniform(0, 1), 10.0 ** rng.uniform(-6, 6)]))
            r = float(10.0 ** rng.uniform(-6, 6))
            assert_biased_kkt(b, rho, r, *biased_projection(b, rho, r))
            assert_face_kkt(b, r, *face_projection(b, r))


def test_long_knapsacks_match_sorting_on_hard_shapes():
    """Past 32 entries the knapsack starts with Condat's support search (then variable fixing
    confirms it): ties, sorted and Zipf-like entries, huge offsets, radii from 1e-9 to 1e6."""
    rng = np.random.default_rng(11)
    for trial in range(400):
        m = int(rng.integers(33, 700))
        shape = trial % 5
        b = rng.normal(size=m) * 10.0 ** rng.uniform(-3, 3)
        if shape == 1:
            b = np.round(b, 1)
        elif shape == 2:
            b = np.sort(b) if trial % 2 else np.sort(b)[::-1].copy()
        elif shape == 3:
            b = rng.zipf(1.5, size=m).astype(float)
        elif shape == 4:
            b = b + 1e6
        r = float(10.0 ** rng.uniform(-9, 6))
        t, _, _ = face_projection(b, r)
        t_ref = sorted_simplex_face(b, r)
        assert t == pytest.approx(t_ref, abs=1e-12 * max(np.abs(b).max(), r)), trial


@pytest.mark.parametrize("where", [0, 17, 39])
def test_nan_entry_gives_a_nan_threshold(where):
    """A NaN anywhere makes the threshold NaN (variable fixing's behaviour), not a finite one
    from the other entries: nothing silently wrong."""
    b = np.random.default_rng(where).normal(size=40)
    b[where] = np.nan
    assert np.isnan(simplex_threshold(b, 1.0, np.empty(40, np.int64)))


# --- cvxpy (second opinion on small inputs) -----------------------------------------------------


@settings(max_examples=40)
@given(vectors(max_size=8, lo=-3.0, hi=3.0), st.floats(0.0, 5.0), st.floats(0.05, 3.0))
def test_biased_matches_cvxpy(b, rho, r):
    _, x, _ = biased_projection(b, rho, r)
    x_ref, val_ref = cvxpy_biased(b, rho, r)
    val = objective(b, rho, x)
    # ours is feasible, so it cannot beat the optimum; the objective is (2 + 2 rho m)-smooth
    # and 2-strongly convex, so x is determined to ~sqrt(solver tolerance)
    assert val == pytest.approx(val_ref, rel=1e-7, abs=1e-9)
    np.testing.assert_allclose(x, x_ref, atol=1e-5)


@settings(max_examples=30)
@given(vectors(max_size=8, lo=-3.0, hi=3.0), st.floats(0.05, 3.0))
def test_face_matches_cvxpy(b, r):
    _, x, _ = face_projection(b, r)
    z = cp.Variable(b.shape[0])
    problem = cp.Problem(cp.Minimize(cp.sum_squares(z - b)), [z >= 0, cp.sum(z) == r])
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert problem.status == cp.OPTIMAL
    assert float(np.sum((x - b) ** 2)) == pytest.approx(problem.value, rel=1e-7, abs=1e-9)
    np.testing.assert_allclose(x, z.value, atol=1e-5)


# --- feasibility, idempotence, equivariance, reductions ----------------------------------------


@given(vectors(), rhos, radii)
def test_feasible(b, rho, r):
    _, x, s = biased_projection(b, rho, r)
    assert np.all(x >= 0.0)
    assert s <= r * (1 + 1e-14) + 1e-14 * np.abs(b).max()


@given(hnp.arrays(np.float64, st.integers(1, 10), elements=st.floats(0.0, 1.0)), radii)
def test_idempotent_on_feasible_points(x0, r):
    # rescale into {x >= 0, sum x <= r}
    total = x0.sum()
    x0 = x0 * (r / total) * 0.999 if total > r else x0
    assume(x0.sum() <= r)
    t, x, _ = biased_projection(x0, 0.0, r)
    assert t == 0.0
    np.testing.assert_array_equal(x, x0)


@given(hnp.arrays(np.float64, st.integers(1, 10), elements=st.floats(0.0, 1.0)), radii)
def test_face_idempotent(x0, r):
    assume(x0.sum() >= 1e-3)
    x0 = x0 * (r / x0.sum())
    _, x, _ = face_projection(x0, r)
    np.testing.assert_allclose(x, x0, rtol=0, atol=1e-14 * r * x0.shape[0])


@given(vectors(), rhos, radii, st.randoms(use_true_random=False))
def test_permutation_equivariant(b, rho, r, rnd):
    perm = np.arange(b.shape[0])
    rnd.shuffle(perm)
    t, x, _ = biased_projection(b, rho, r)
    tp, xp, _ = biased_projection(b[perm], rho, r)
    scale = max(np.abs(b).max(), r)
    assert tp == pytest.approx(t, abs=1e-13 * scale * b.shape[0])
    np.testing.assert_allclose(xp, x[perm], atol=1e-13 * scale * b.shape[0], rtol=0)


@given(vectors(), radii)
def test_rho_zero_is_plain_simplex_projection(b, r):
    _, x, _ = biased_projection(b, 0.0, r)
    pos = np.maximum(b, 0.0)
    if pos.sum() <= r:
        expected = pos
    else:
        expected = np.maximum(b - sorted_simplex_face(b, r), 0.0)
    np.testing.assert_allclose(x, expected, atol=1e-12 * max(np.abs(b).max(), r), rtol=0)


@given(vectors(), rhos)
def test_huge_radius_is_case_one(b, rho):
    """With r = inf-like the sum constraint is inactive: t = rho sum (b - t)_+."""
    t, x, s = biased_projection(b, rho, 1e300)
    t_ref = sorted_case1_threshold(b, rho)
    assert t == pytest.approx(t_ref, abs=1e-13 * np.abs(b).max() * (1 + rho * b.shape[0]))
    assert t == pytest.approx(rho * s, abs=1e-13 * np.abs(b).max() * (1 + rho * b.shape[0]))


@given(hnp.arrays(np.float64, st.integers(1, 10), elements=st.floats(-1e6, 0.0)), rhos, radii)
def test_nonpositive_input_projects_to_zero(b, rho, r):
    t, x, s = biased_projection(b, rho, r)
    assert t == 0.0
    assert s == 0.0
    assert np.all(x == 0.0)


def test_ties_and_hand_computed_cases():
    # all equal, rho = 0: x = r/m each when m*b > r
    t, x, s = biased_projection(np.full(5, 3.0), 0.0, 1.0)
    np.testing.assert_allclose(x, 0.2, rtol=1e-15)
    # rho > 0, constraint inactive: b = (1, 1), rho = 1: t = 2 (1 - t) -> t = 2/3
    t, x, s = biased_projection(np.array([1.0, 1.0]), 1.0, 10.0)
    assert t == pytest.approx(2 / 3, rel=1e-15)
    # rho > 0, constraint active: b = (3, 1), rho = 1, r = 1: knapsack gives t = 2, x = (1, 0)
    t, x, s = biased_projection(np.array([3.0, 1.0]), 1.0, 1.0)
    assert t == pytest.approx(2.0, rel=1e-15)
    np.testing.assert_allclose(x, [1.0, 0.0], atol=1e-15)
    # single coordinate
    t, x, s = biased_projection(np.array([5.0]), 0.0, 2.0)
    assert x[0] == 2.0
    t, x, s = face_projection(np.array([-5.0]), 2.0)
    assert x[0] == pytest.approx(2.0, rel=1e-15)
    # a tie at the threshold
    t, x, s = face_projection(np.array([2.0, 1.0, 1.0, 0.0]), 1.0)
    assert t == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_allclose(x, [1.0, 0.0, 0.0, 0.0], atol=1e-15)


def test_adversarial_magnitudes():
    cases = [
        (np.array([1e6, 1e-6, -1e6, 1e6 * (1 + 1e-15)]), 1e-6),
        (np.array([1e6, 1e-6, -1e6, 1e6 * (1 + 1e-15)]), 1e6),
        (np.array([1e-6] * 7 + [2e-6]), 1e-6),
        (np.array([1e-6] * 7 + [2e-6]), 1e6),
        (np.concatenate([np.full(50, 1e6), np.full(50, 1e-6)]), 3.0),
        (np.array([1e6, -1e-6, 1e-6, 0.0]), 1e-6),
    ]
    for b, r in cases:
        for rho in (0.0, 1e-6, 1.0, 1e6):
            assert_biased_kkt(b, rho, r, *biased_projection(b, rho, r))
        assert_face_kkt(b, r, *face_projection(b, r))
