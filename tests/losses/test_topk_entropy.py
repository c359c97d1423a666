"""Top-k entropy loss and prox (TPAMI 002 Prop. 4, Props. 15-17, eqs. (11)-(14); DESIGN §4.2),
``topkbench.losses.topk_entropy`` and its capped candidates,
``topkbench.losses.topk_entropy_capped``.

Notation: ``x`` in the top-k simplex Delta_k = {x >= 0, s <= 1, x_j <= s/k}, ``s = <1,x>``,
``H(x) = -<x, log x> - (1-s) log(1-s)`` (the entropy of the distribution (x, 1-s)).

* ``loss(a, k) = max_{x in Delta_k} <a,x> + H(x)``;
* ``prox(b, alpha, k) = argmin_{x in Delta_k} alpha/2 (<x,x> + s^2) - <b,x> - H(x)``.

References used below, all derived here:

* **Dual of the loss.**  With multipliers ``nu >= 0`` for ``x_j <= s/k``, weak duality and
  the log-sum-exp formula for ``max_{simplex} <c,x> + H`` give, for every ``nu >= 0``,
  ``loss(a) <= log(1 + sum_j exp(a_j - nu_j + <1,nu>/k))``, with equality at the optimal nu
  (Slater holds).  At the optimum nu_j = (a_j - theta)_+ for a threshold theta (the capped
  coordinates are the largest ones and share the value s/k), and on the piece where the u
  largest are capped, stationarity in theta gives ``e^theta = sum_{j not capped} e^{a_j} /
  (k - u)``.  :func:`loss_dual_bound` evaluates the bound at these candidates (plus nu = 0
  and theta = min a, the k = n case): an upper bound for every input, and the loss itself.
* **Fenchel dual of the prox.**  ``loss(., k)`` is the conjugate of ``-H`` on Delta_k, and
  ``q(x) = alpha/2 x^T (I + 1 1^T) x`` has ``q*(y) = (|y|^2 - <1,y>^2/(n+1)) / (2 alpha)``,
  so for every y the prox objective is ``>= -q*(y) - loss(b - y, k)``, with equality at
  ``y = alpha (x* + s* 1)``.  The prox objective is alpha-strongly convex, so a gap ``g``
  bounds ``|x - x*|^2 <= 2 g / alpha``.
* **KKT of the prox (TPAMI Prop. 16).**  Stationarity of the Lagrangian gives
  ``alpha x_j + log(alpha x_j) = b_j - t - nu_j`` with
  ``t = alpha s - log(1-s) - <1,nu>/k - log alpha``: hence ``x_j = min(V(b_j - t), alpha s/k)
  / alpha`` with ``V = W0(exp)``, ``nu_j = b_j - t - V^{-1}(alpha s/k) >= 0`` on the capped
  coordinates (``V^{-1}(v) = v + log v``), and ``alpha (1 - s) = V(alpha - t - p/k)``,
  ``p = sum nu_j``.
"""

from __future__ import annotations

import math
import warnings

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from reference import V_reference
from scipy.optimize import brentq
from scipy.special import expit, logsumexp, xlogy

from topkbench.losses.topk_entropy import ALPHA_TINY, loss, prox, topk_ent_prox
from topkbench.prox.roots import STATUS_OK

EPS = float(np.finfo(np.float64).eps)
CVXPY_REL = 1e-7


# --- references -----------------------------------------------------------------------------


def V_inverse(v):
    return v + math.log(v)


def entropy(x):
    """H(x) = -<x, log x> - (1-s) log(1-s), 0 log 0 = 0 (1 - s clamped at 0: s may exceed 1
    by rounding when the slack 1 - s is below eps)."""
    slack = max(1.0 - math.fsum(x), 0.0)
    return -float(np.sum(xlogy(x, x))) - float(xlogy(slack, slack))


def loss_objective(a, x):
    return float(a @ x) + entropy(x)


def prox_objective(b, alpha, x):
    s = math.fsum(x)
    return 0.5 * alpha * (float(x @ x) + s * s) - float(b @ x) - entropy(x)


def loss_dual_bound(a, k):
    """``min`` of the dual bound over the candidate thresholds of the module docstring."""
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    desc = np.sort(a)[::-1]

    def bound(theta):
        expo = np.minimum(a, theta) + np.sum(np.maximum(a - theta, 0.0)) / k
        return float(logsumexp(np.concatenate([[0.0], expo])))

    thetas = [math.inf, float(desc[-1])]
    thetas += [float(logsumexp(desc[u:]) - math.log(k - u)) for u in range(1, min(k, n))]
    return min(bound(theta) for theta in thetas)


def assert_in_top_k_simplex(x, k, b, cap_tol=1e-9, abs_tol=1e-300):
    """x >= 0, s <= 1 up to rounding, and x_j <= s/k up to 1e-9 relative (the kernel accepts
    a capped candidate when the first uncapped entry is within 1e-10 of the cap).

    Rounding of s: x_j = V(b_j - t)/alpha or exp(b_j - t) with |t| ~ |b|, and b_j - t is
    rounded, so each x_j carries a relative error ~ eps (1 + |b|)."""
    s = math.fsum(x)
    assert np.all(x >= 0.0)
    assert s <= 1.0 + 8 * x.shape[0] * EPS * (1.0 + float(np.max(np.abs(b))))
    assert k * float(np.max(x)) <= s * (1.0 + cap_tol) + abs_tol


def solve_cvxpy(problem):
    """CLARABEL at 1e-10, then at 1e-9 (the exponential cone is often 'inaccurate' at tight
    tolerances); returns the optimal value or None."""
    for tol in (1e-10, 1e-9):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                problem.solve(solver=cp.CLARABEL, tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol)
        except cp.SolverError:
            continue
        if problem.status == cp.OPTIMAL and np.isfinite(problem.value):
            return float(problem.value)
    return None


def cvxpy_loss(a, k):
    x = cp.Variable(a.shape[0])
    s = cp.sum(x)
    obj = a @ x + cp.sum(cp.entr(x)) + cp.entr(1 - s)
    return solve_cvxpy(cp.Problem(cp.Maximize(obj), [x >= 0, s <= 1, k * x <= s]))


def cvxpy_prox_value(b, alpha, k):
    x = cp.Variable(b.shape[0])
    s = cp.sum(x)
    obj = 0.5 * alpha * (cp.sum_squares(x) + cp.square(s)) - b @ x
    obj = obj - cp.sum(cp.entr(x)) - cp.entr(1 - s)
    return solve_cvxpy(cp.Problem(cp.Minimize(obj), [x >= 0, s <= 1, k * x <= s]))


def capped_mask(x, k):
    """Coordinates at the cap s/k (for k = 1 the row x_j <= s is redundant: none)."""
    s = math.fsum(x)
    if k == 1 or s == 0.0:
        return np.zeros(x.shape[0], dtype=bool)
    return x >= (s / k) * (1.0 - 1e-12)


def prox_kkt_residuals(b, alpha, k, x):
    """Residuals of TPAMI Prop. 16 (module docstring), each divided by its tolerance.

    ``t`` is read off the largest uncapped coordinate, ``t = b_j - V^{-1}(alpha x_j)`` (well
    conditioned).  If every uncapped coordinate underflows, they carry no mass, so all k
    largest are capped (u = k); then t cancels from the second equation and any
    ``t <= min_capped b_j - V^{-1}(alpha s/k)`` (nu >= 0) is admissible: we take the largest,
    for which the underflowing ones are smallest.

    Tolerances: 1e-10 (x) or 1e-9 relative, plus ``1e-290 / alpha`` absolute for x
    (alpha x_j near the subnormal range has few digits), plus for ``1 - s`` the rounding of
    s, ``~ n eps (1 + max|b|)`` since x_j = V(b_j - t)/alpha with b_j - t rounded.  When
    ``alpha s`` itself is below the normal range (1e-280) the equations cannot be evaluated
    (V^{-1} of a subnormal has few digits); x is then zero to double precision and only the
    duality gap and feasibility apply: an empty dict is returned.
    """
    n = b.shape[0]
    s = math.fsum(x)
    if alpha * s < 1e-280:
        return {}
    cap = alpha * s / k  # alpha times the cap
    capped = capped_mask(x, k)
    u = int(np.sum(capped))
    free = (~capped) & (alpha * x > 1e-300)
    if free.any():
        j = int(np.argmax(np.where(free, x, -np.inf)))
        t = float(b[j] - V_inverse(alpha * x[j]))
    else:
        assert u == k, f"no uncapped mass but only {u} < k = {k} capped coordinates"
        t = float(np.min(b[capped])) - V_inverse(cap)
    out = {}
    pred = np.array([min(V_reference(bj - t), cap) for bj in b]) / alpha
    err = np.abs(x - pred) / (1e-10 * np.maximum(pred, x) + 1e-290 / alpha)
    out["x_j = min(V(b_j - t), alpha s/k)/alpha"] = float(np.max(err))
    nu = b[capped] - t - V_inverse(cap) if u else np.zeros(0)
    # nu is a difference of O(|b| + |t|) numbers
    nu_tol = 1e-9 * (1.0 + float(np.max(np.abs(b))) + abs(t))
    out["nu >= 0"] = float(np.max(-nu, initial=0.0)) / nu_tol
    w = V_reference(alpha - t - math.fsum(nu) / k) / alpha
    # rounding of s, plus 1e-9 s: the kernel accepts a partition when the next entry is
    # within 1e-10 (relative) of the cap, which moves s by up to ~n 1e-10 s
    s_tol = 64 * n * EPS * (1.0 + float(np.max(np.abs(b)))) + 1e-9 * s
    out["alpha (1-s) = V(alpha - t - p/k)"] = abs(w - (1.0 - s)) / (1e-9 * w + s_tol)
    return out


def assert_prox_kkt(b, alpha, k, x):
    res = prox_kkt_residuals(b, alpha, k, x)
    bad = {name: v for name, v in res.items() if not v <= 1.0}
    assert not bad, f"KKT residuals / tolerance: {bad}; x = {x!r}"


def prox_duality_gap(b, alpha, k, x):
    """Primal minus Fenchel dual at y = alpha (x + s 1) (module docstring), and a tolerance.

    x_j = V(b_j - t)/alpha carries an absolute error ``~ eps (|b| + |t|)`` (b_j - t is
    rounded), and near the boundary s = 1 the objective changes to first order in it, with
    slope up to ``|b| + alpha``; the dual side is a sum of terms of size ``|b - y| + |y|``."""
    n = b.shape[0]
    s = math.fsum(x)
    y = alpha * (x + s)
    q_star = (float(y @ y) - math.fsum(y) ** 2 / (n + 1)) / (2.0 * alpha)
    dual = -q_star - loss(b - y, k)
    size = 1.0 + float(np.max(np.abs(b))) + alpha + float(np.max(y))
    tol = 64 * n * EPS * size * size
    return prox_objective(b, alpha, x) - dual, tol


# --- strategies -------------------------------------------------------------------------------


def floats_vector(n, bound):
    return st.lists(st.floats(-bound, bound), min_size=n, max_size=n).map(np.array)


@st.composite
def score_vectors(draw, n, bound):
    """Uniform, integer-valued (ties), or with a repeated block."""
    kind = draw(st.sampled_from(["uniform", "integer", "repeated"]))
    if kind == "integer":
        a = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), dtype=float)
        return a * draw(st.sampled_from([1.0, bound / 3.0]))
    a = draw(floats_vector(n, bound))
    if kind == "repeated":  # a fresh array (hypothesis reports the drawn one)
        i, j = sorted((draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))))
        a = np.concatenate([a[:i], np.full(j - i + 1, a[i]), a[j + 1 :]])
    return a


@st.composite
def loss_inputs(draw, bound, max_n=8):
    n = draw(st.integers(1, max_n))
    k = draw(st.integers(1, n))
    return draw(score_vectors(n, bound)), k


alphas = st.floats(-3.0, 4.0).map(lambda e: 10.0**e)


@st.composite
def prox_inputs(draw, bound=1e3, max_n=8):
    n = draw(st.integers(1, max_n))
    k = draw(st.integers(1, n))
    magnitude = 10.0 ** draw(st.floats(-1.0, math.log10(bound)))
    return draw(score_vectors(n, magnitude)), draw(alphas), k


@st.composite
def capped_prox_inputs(draw):
    """One or two dominant entries and k >= 2 (>= 3 for two): the unconstrained solution puts
    more than s/k on them, so the cap must be active.  The gap to the rest grows with alpha:
    for large alpha, V is nearly linear and t >= -log(alpha) (alpha (1-s) <= alpha), so the
    ratio x_top / x_rest is about (gap + log alpha) / log alpha."""
    n = draw(st.integers(2, 8))
    n_dom = draw(st.integers(1, min(2, n - 1)))
    k = draw(st.integers(n_dom + 1, n))
    alpha = draw(alphas)
    rest = draw(floats_vector(n - n_dom, draw(st.sampled_from([1.0, 10.0, 100.0]))))
    gap = draw(st.floats(30.0, 300.0)) + 20.0 * math.log10(alpha) ** 2
    top = float(np.max(rest)) + gap
    dom = [top] if n_dom == 1 else [top, top - draw(st.floats(0.0, 1.0))]
    b = np.concatenate([dom, rest])
    perm = draw(st.permutations(range(n)))
    return b[list(perm)], alpha, k


# --- loss -----------------------------------------------------------------------------------


@settings(max_examples=100)
@given(inputs=st.one_of(loss_inputs(50.0), loss_inputs(1e3)))
def test_loss_k1_is_logsumexp(inputs):
    """k = 1: the rows x_j <= s are redundant, loss = max over the simplex with slack of
    <a,x> + H = log(1 + sum exp a) (Gibbs), also for |a| up to 1e3 (no overflow)."""
    a, _ = inputs
    # log(1 + e^y) with y = logsumexp(a), by log1p (logsumexp([0, a]) loses the relative
    # accuracy of tiny results)
    expected = float(np.logaddexp(0.0, logsumexp(a)))
    assert loss(a, 1) == pytest.approx(expected, rel=4 * a.shape[0] * EPS, abs=1e-300)


@settings(max_examples=60)
@given(inputs=loss_inputs(50.0))
def test_loss_matches_cvxpy(inputs):
    """Against cvxpy's exponential-cone model (cp.entr), k = 1..n, |a| <= 50."""
    a, k = inputs
    ref = cvxpy_loss(a, k)
    if ref is None:
        note("CLARABEL failed; the dual sandwich test covers this input")
        return
    assert loss(a, k) == pytest.approx(ref, rel=CVXPY_REL, abs=CVXPY_REL)


@settings(max_examples=150)
@given(inputs=st.one_of(loss_inputs(50.0), loss_inputs(1e3)))
def test_loss_dual_sandwich_and_alpha_zero_prox(inputs):
    """obj(x) <= loss <= dual bound, for x = prox(a, 0, k) (the maximizer of the loss problem
    by definition of the alpha -> 0 prox) and the bound of :func:`loss_dual_bound`.

    The loss equals the dual bound to rounding (so it is exact), and obj(x) is within a
    slack of both (so prox(., 0) is the maximizer: H is 1-strongly concave in l1 on the
    simplex (Pinsker), so a gap g puts (x, 1-s) within sqrt(2 g) of the maximizer in l1)."""
    a, k = inputs
    x = prox(a, 0.0, k)
    assert_in_top_k_simplex(x, k, a)
    lower = loss_objective(a, x)
    upper = loss_dual_bound(a, k)
    value = loss(a, k)
    assert np.isfinite(value)
    # x_j = exp(a_j - t) has relative error ~ eps |t| (a_j - t is rounded), and near s = 1
    # the objective moves to first order in s with slope ~ |a|
    size = 1.0 + float(np.max(np.abs(a)))
    tol = 16 * a.shape[0] * EPS * size * size
    assert abs(value - upper) <= tol, (value, upper)
    # x may exceed the cap by 1e-10 relative at near-ties (the kernel accepts a partition
    # consistent to 1e-10), which moves obj(x) to first order
    slack = tol + 1e-9 * size * math.fsum(x)
    assert lower <= value + slack
    assert upper - lower <= slack, (lower, value, upper)


@settings(max_examples=150)
@given(inputs=st.one_of(loss_inputs(50.0), loss_inputs(1e3)))
def test_loss_bounds_and_monotonicity(inputs):
    """Bounds that hold for every a, checked up to |a| = 1e3 (no overflow):

    * loss(a, k+1) <= loss(a, k) <= loss(a, 1) = log(1 + sum e^a): Delta_{k+1} subset
      Delta_k (x_j <= s/(k+1) <= s/k), and a max over a smaller set is smaller;
    * loss(a, k) >= softplus(A + log k) >= max(0, A), A = mean of the k largest a: the points
      x = (s/k) 1_K (K the k largest) are feasible with objective s (A + log k) + h(s) (h the
      binary entropy), whose max over s is log(1 + k e^A);
    * loss(a, k) <= max(0, A) + log(n + 1): x/s lies in {y >= 0, <1,y> = 1, y_j <= 1/k},
      whose vertices are 1_K/k, so <a,x> <= s A <= max(0, A); and H <= log(n + 1).
    """
    a, k = inputs
    n = a.shape[0]
    values = [loss(a, j) for j in range(1, n + 1)]
    assert np.all(np.isfinite(values))
    tol = 8 * n * EPS * (1.0 + float(np.max(np.abs(a))))
    assert values[0] == pytest.approx(float(np.logaddexp(0.0, logsumexp(a))), abs=tol)
    assert np.all(np.diff(values) <= tol), values
    mean_top = math.fsum(np.sort(a)[::-1][:k]) / k
    lower = float(np.logaddexp(0.0, mean_top + math.log(k)))
    assert values[k - 1] >= lower - tol
    assert values[k - 1] <= max(0.0, mean_top) + math.log(n + 1) + tol


@settings(max_examples=60)
@given(a=st.integers(1, 8).flatmap(lambda n: score_vectors(n, 1e3)))
def test_loss_k_equals_n(a):
    """k = n: every coordinate is capped, x = (s/n) 1, and loss = log(1 + n e^{mean a})."""
    n = a.shape[0]
    expected = float(np.logaddexp(0.0, math.fsum(a) / n + math.log(n)))
    # the kernel may stop at a candidate with u = n - 1 capped that is consistent to 1e-10:
    # same point, but its value is formed from thresholds t ~ |a|
    tol = 8 * n * EPS * (1.0 + float(np.max(np.abs(a))))
    assert loss(a, n) == pytest.approx(expected, rel=8 * n * EPS, abs=tol)


@settings(max_examples=60)
@given(inputs=loss_inputs(1e3), perm_seed=st.integers(0, 2**32 - 1))
def test_loss_permutation_invariant(inputs, perm_seed):
    a, k = inputs
    perm = np.random.default_rng(perm_seed).permutation(a.shape[0])
    tol = 8 * a.shape[0] * EPS * (1.0 + float(np.max(np.abs(a))))
    assert loss(a[perm], k) == pytest.approx(loss(a, k), abs=tol)


# --- prox -----------------------------------------------------------------------------------


@settings(max_examples=100)
@given(inputs=prox_inputs())
def test_prox_matches_cvxpy(inputs):
    """Objective value against cvxpy for alpha in 1e-3..1e4 and |b| up to 1e3 (relative 1e-7;
    nothing rescaled).  When CLARABEL fails, the Prop. 16 KKT conditions and the duality gap
    (checked here for every input) are the verdict."""
    b, alpha, k = inputs
    x = prox(b, alpha, k)
    assert_in_top_k_simplex(x, k, b)
    assert_prox_kkt(b, alpha, k, x)
    gap, tol = prox_duality_gap(b, alpha, k, x)
    assert gap <= tol
    ref = cvxpy_prox_value(b, alpha, k)
    if ref is None:
        note("CLARABEL failed: KKT and duality gap only")
        return
    ours = prox_objective(b, alpha, x)
    assert ours <= ref + CVXPY_REL * max(1.0, abs(ref))
    assert ours >= ref - 1e-5 * max(1.0, abs(ref))  # cvxpy solved the same problem


@pytest.mark.slow
@settings(max_examples=2000)
@given(inputs=st.one_of(prox_inputs(), capped_prox_inputs()))
def test_prox_matches_cvxpy_many(inputs):
    """``test_prox_matches_cvxpy`` (KKT and duality gap included) on 20x the examples,
    capped inputs included."""
    test_prox_matches_cvxpy.hypothesis.inner_test(inputs)


@pytest.mark.slow
@settings(max_examples=3000)
@given(inputs=st.one_of(loss_inputs(50.0), loss_inputs(1e3)))
def test_loss_dual_sandwich_many(inputs):
    """``test_loss_dual_sandwich_and_alpha_zero_prox`` on 20x the examples."""
    test_loss_dual_sandwich_and_alpha_zero_prox.hypothesis.inner_test(inputs)


@settings(max_examples=150)
@given(inputs=st.one_of(prox_inputs(), prox_inputs(bound=50.0)))
def test_prox_kkt_and_duality_gap(inputs):
    """TPAMI Prop. 16 KKT conditions and a vanishing Fenchel duality gap (module docstring)."""
    b, alpha, k = inputs
    x = prox(b, alpha, k)
    assert_in_top_k_simplex(x, k, b)
    assert_prox_kkt(b, alpha, k, x)
    gap, tol = prox_duality_gap(b, alpha, k, x)
    assert gap <= tol, (gap, tol)


@settings(max_examples=100)
@given(inputs=capped_prox_inputs())
def test_prox_capped_branch(inputs):
    """Dominant entries force the cap x_j = s/k (asserted, so that this test exercises the
    u >= 1 branch of the kernel), and the capped solution is optimal."""
    b, alpha, k = inputs
    x = prox(b, alpha, k)
    assert_in_top_k_simplex(x, k, b)
    assert capped_mask(x, k).any(), "the cap should be active"
    assert_prox_kkt(b, alpha, k, x)
    gap, tol = prox_duality_gap(b, alpha, k, x)
    assert gap <= tol, (gap, tol)
    ref = cvxpy_prox_value(b, alpha, k)
    if ref is not None:
        assert prox_objective(b, alpha, x) <= ref + CVXPY_REL * max(1.0, abs(ref))


def test_prox_cap_occurs_in_random_data():
    """On a fixed random sample of the regimes above the cap is active often, with one and
    with several capped coordinates, and every solution passes the KKT check (so the random
    tests cannot pass by never reaching the capped branch)."""
    rng = np.random.default_rng(11)
    counts = {"none": 0, "one": 0, "several": 0}
    for _ in range(300):
        n = int(rng.integers(3, 9))
        k = int(rng.integers(2, n))
        alpha = float(10.0 ** rng.uniform(-3, 4))
        b = rng.uniform(-1, 1, n) * 10.0 ** rng.uniform(-1, 3)
        x = prox(b, alpha, k)
        assert_prox_kkt(b, alpha, k, x)
        u = int(np.sum(capped_mask(x, k)))
        counts["none" if u == 0 else "one" if u == 1 else "several"] += 1
    # observed with this seed: 103 / 47 / 150
    assert counts["none"] >= 50 and counts["one"] >= 25 and counts["several"] >= 50, counts


@settings(max_examples=100)
@given(
    b=st.integers(1, 8).flatmap(lambda n: score_vectors(n, 1e3)),
    alpha=st.one_of(alphas, st.just(0.0)),
)
def test_prox_k_equals_n(b, alpha):
    """k = n: x = (s/n) 1 and the objective is a function of s alone,
    alpha/2 (1/n + 1) s^2 - s B/n + s log(s/n) + (1-s) log(1-s) (B = sum b), whose
    stationarity in w = logit(s) reads w + alpha (1 + 1/n) sigmoid(w) = B/n + log n
    (increasing in w: one root, found by brentq)."""
    n = b.shape[0]
    x = prox(b, alpha, n)
    c = alpha * (1.0 + 1.0 / n)
    rhs = math.fsum(b) / n + math.log(n)
    w = brentq(lambda w: w + c * expit(w) - rhs, rhs - c - 1.0, rhs + 1.0, xtol=1e-14, rtol=4 * EPS)
    # entries within ~1e-10 of each other can be resolved as a candidate u < n that is
    # consistent to the kernels' tolerance (_CONSISTENCY_TOL (1 + |t|)) instead of u = n, e.g.
    # b = (0, 1.9e-10, 1.9e-10) at alpha = 0: x off by 1.3e-10 relative
    np.testing.assert_allclose(x, expit(w) / n, rtol=4e-10, atol=1e-300)


@settings(max_examples=100)
@given(
    inputs=st.one_of(loss_inputs(50.0), loss_inputs(1e3)),
    # below ALPHA_TINY = 1e-16 the kernel switches
    # to the loss maximizer
    log_alpha=st.one_of(st.floats(-30.0, -3.0), st.floats(-150.0, -10.0)),
)
def test_prox_small_alpha_tends_to_the_loss_maximizer(inputs, log_alpha):
    """As alpha -> 0 the prox tends to prox(b, 0) (the loss maximizer): with F = <b,x> + H and
    q(x) = (|x|^2 + s^2)/2 <= 1 on Delta_k, F(x0) - F(x_alpha) <= alpha (q(x0) - q(x_alpha))
    <= alpha, and F is 1-strongly concave in l1 (Pinsker), so |x_alpha - x0|_1 <= sqrt(2 alpha).
    """
    b, k = inputs
    alpha = 10.0**log_alpha
    x0 = prox(b, 0.0, k)
    xa = prox(b, alpha, k)
    assert_in_top_k_simplex(xa, k, b)
    # plus 1e-9 s: near-ties, both points are only consistent to 1e-10 relative
    slack = 1e-12 + 1e-9 * math.fsum(x0)
    assert float(np.sum(np.abs(xa - x0))) <= math.sqrt(2.0 * alpha) * (1 + 1e-6) + slack


def prox_with_status(b, alpha, k):
    b = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty_like(b)
    _, status, _ = topk_ent_prox(
        b, alpha, k, out, np.empty_like(b), np.empty_like(b), np.empty(b.shape[0], dtype=np.int64),
        np.empty_like(b), np.empty_like(b), np.empty_like(b), math.nan,
    )  # fmt: skip
    return out, status


@pytest.mark.parametrize(
    "b, alpha, k",
    [
        ([48.0, -600.0], 1e-12, 2),
        ([0.0, -924.0, -924.0, -924.0], 1e-15, 3),
        ([48.0, -600.0], 1e-45, 2),
        ([48.0, -600.0], 1e-41, 2),
        ([-192.0, -193.0], 1e-45, 2),
        ([0.0, -924.0, -924.0, -924.0], 1e-53, 3),
        ([0.0, -924.0, -924.0, -924.0], 1e-50, 3),
        ([0.0, -924.0, -924.0, -924.0], 1e-99, 3),
    ],
)
def test_prox_tiny_alpha(b, alpha, k):
    """Tiny alpha with a tiny solution (some b_j - b_i in the hundreds).

    For alpha <= 1e-10 the alpha terms of the stationarity conditions,
    ``alpha (x_j + s) <= 2 alpha``, perturb log x_j by at most that much, so
    x(alpha) = x0 = prox(b, 0) to relative 1e-9.  Regression: the capped root used to stall
    (plain Newton on h moves about one unit of t per step when V ~ exp) and alpha x_j could
    underflow, e.g. b = (48, -600), k = 2, alpha = 1e-45 gave (6.8e-118, 2.5e-118) instead of
    (1.36e-120, 1.36e-120).
    """
    b = np.array(b)
    x0 = prox(b, 0.0, k)
    x, status = prox_with_status(b, alpha, k)
    assert status == STATUS_OK
    assert k * float(np.max(x)) <= math.fsum(x) * (1.0 + 1e-9), x
    np.testing.assert_allclose(x, x0, rtol=1e-9)


def test_prox_continuous_across_alpha_tiny():
    """Just above and below ALPHA_TINY the two code paths agree (to the bound above)."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(1, 9))
        k = int(rng.integers(1, n + 1))
        b = rng.normal(size=n) * 10.0
        above = prox(b, ALPHA_TINY * 2.0, k)
        below = prox(b, ALPHA_TINY / 2.0, k)
        assert_in_top_k_simplex(above, k, b)
        assert float(np.sum(np.abs(above - below))) <= 1e-12


@settings(max_examples=60)
@given(inputs=prox_inputs(), perm_seed=st.integers(0, 2**32 - 1))
def test_prox_permutation_equivariant(inputs, perm_seed):
    b, alpha, k = inputs
    perm = np.random.default_rng(perm_seed).permutation(b.shape[0])
    np.testing.assert_allclose(prox(b[perm], alpha, k), prox(b, alpha, k)[perm], rtol=1e-12)


def test_prox_hand_computed():
    """n = 1, k = 1: stationarity 2 alpha x + logit(x) = b, so x = 3/4 for
    b = 3 alpha / 2 + log 3."""
    alpha = 2.0
    b = np.array([1.5 * alpha + math.log(3.0)])
    np.testing.assert_allclose(prox(b, alpha, 1), [0.75], rtol=1e-14)
    # k = n = 2, b = (c, c): x = (s/2, s/2) with logit(s) + alpha (3/2) s = c + log 2
    s = 0.5
    c = 1.5 * alpha * s - math.log(2.0)
    np.testing.assert_allclose(prox(np.array([c, c]), alpha, 2), [0.25, 0.25], rtol=1e-14)


@settings(max_examples=100)
@given(b=st.integers(1, 12).flatmap(lambda n: score_vectors(n, 10.0)), data=st.data())
def test_top_k_first_orders_only_the_k_largest(b, data):
    """``_top_k_first`` (the capped candidates' partial order): ``bs[:k]`` is the k largest in
    descending order, every later entry is at most ``bs[k-1]``, and ``bs`` is a permutation of
    ``b`` (ties at the bar included: the integer strategy draws many)."""
    from topkbench.losses.topk_entropy_capped import _top_k_first

    n = b.shape[0]
    k = data.draw(st.integers(1, n))
    bs = np.full(n, np.nan)
    _top_k_first(b, k, bs)
    np.testing.assert_array_equal(bs[:k], np.sort(b)[::-1][:k])
    assert np.all(bs[k:] <= bs[k - 1])
    np.testing.assert_array_equal(np.sort(bs), np.sort(b))


def test_prox_capped_with_near_entries_outside_the_sorted_block():
    """SDCA-sized inputs (n = 99, k = 5) whose capped solution has uncapped entries beyond the
    k largest with ``b_j - t >= SERIES_T_MAX``: the kernel must give them V's closed form after
    the series (which clamps them).  Asserted to occur, so the case is exercised; the result
    passes the KKT and duality-gap checks (it fails if that last pass is skipped)."""
    from topkbench.prox.lambertw import SERIES_T_MAX

    rng = np.random.default_rng(5)
    v_min = V_reference(SERIES_T_MAX)
    near_cases = 0
    for _ in range(40):
        n, k = 99, 5
        alpha = float(10.0 ** rng.uniform(0, 3))
        b = rng.normal(0.0, 1.0, n)
        b[rng.choice(n, 2, replace=False)] += 8.0 + np.log(alpha)  # two dominant entries
        x = prox(b, alpha, k)
        assert_in_top_k_simplex(x, k, b)
        assert_prox_kkt(b, alpha, k, x)
        gap, tol = prox_duality_gap(b, alpha, k, x)
        assert gap <= tol, (gap, tol)
        capped = capped_mask(x, k)
        if capped.any():
            outside = np.argsort(-b, kind="stable")[k:]
            near_cases += bool(np.any(alpha * x[outside] >= v_min))
    assert near_cases >= 10, near_cases


@settings(max_examples=100)
@given(b=st.integers(1, 12).flatmap(lambda n: score_vectors(n, 10.0)), data=st.data())
def test_extract_next_builds_the_sorted_prefix(b, data):
    """``_extract_next`` one entry at a time (the lazy partial order of the capped
    candidates): after q calls ``bs[:q]`` is the q largest in descending order, every later
    entry is at most ``bs[q-1]``, ``ex`` follows ``bs``, and the swaps recorded in ``pos``
    undone in reverse give ``b`` back (ties included)."""
    from topkbench.losses.topk_entropy_capped import _extract_next

    n = b.shape[0]
    q = data.draw(st.integers(1, n))
    bs = b.copy()
    ex = np.arange(n, dtype=np.float64)  # original positions, swapped along with bs
    pos = np.empty(n)
    ks = 0
    for _ in range(q):
        ks = _extract_next(bs, ks, n, ex, pos)
    assert ks == q
    np.testing.assert_array_equal(bs[:q], np.sort(b)[::-1][:q])
    assert np.all(bs[q:] <= bs[q - 1])
    np.testing.assert_array_equal(bs, b[ex.astype(np.int64)])
    # undoing the recorded swaps in reverse order restores b (the capped output relies on it)
    for r in range(ks - 1, -1, -1):
        j = int(pos[r])
        bs[r], bs[j] = bs[j], bs[r]
    np.testing.assert_array_equal(bs, b)


NO_SUMS = (math.nan, math.nan, math.nan)  # _ent_root_capped's sums with GUESS_NONE


def _capped_setup(seed, u, n=40, k=5):
    """A capped-candidate input: bs with its u + 1 largest in order, alpha, A = head / k."""
    from topkbench.losses.topk_entropy_capped import _extract_next

    rng = np.random.default_rng(seed)
    alpha = float(10.0 ** rng.uniform(-1, 3))
    b = rng.normal(0.0, 2.0, n)
    b[:2] += 6.0 + math.log(alpha)
    bs = b.copy()
    ks = 0
    while ks < u + 1:
        ks = _extract_next(bs, ks, n, np.empty(n), np.empty(n))
    return bs, float(k), alpha, float(np.sum(bs[:u])) / k


def _sums(bs, u, t):
    from topkbench.losses.topk_entropy_capped import _m_sums

    n = bs.shape[0]
    scratch = [np.empty(n) for _ in range(3)]
    S, D1, D2, _ = _m_sums(bs, u, t, *scratch, math.nan)
    return S, D1, D2


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("u", [1, 2])
def test_m_values_closed_form_where_the_series_stops(seed, u):
    """``_m_values`` gives V over M = bs[u:] (the series, then the closed form where ``bs_j - t
    >= SERIES_T_MAX``) to the rounding of its arguments, at points t where no entry of M, only
    its largest, or several of them are past the series range (it scans only when the largest,
    ``bs[u]``, is; the later entries are unordered)."""
    from topkbench.losses.topk_entropy_capped import _m_values
    from topkbench.prox.lambertw import SERIES_T_MAX

    bs, _, _, _ = _capped_setup(seed, u)
    n = bs.shape[0]
    rest = np.sort(bs[u + 1 :])[::-1]
    past = 0
    for t in (float(bs[u]) - SERIES_T_MAX + 0.5, float(bs[u]) - 2.0, float(rest[3]) + 2.0):
        ex = np.exp(bs - (t + 1.0))  # anchored at t + 1
        vals = np.full(n, np.nan)
        _m_values(bs, u, t, t + 1.0, ex, vals)
        ref = np.array([V_reference(a) for a in bs[u:] - t])
        # the arguments bs_j - t (|.| up to ~30) are rounded: e^{.} carries ~|a| eps of that
        np.testing.assert_allclose(vals[u:], ref, rtol=64 * EPS, atol=0.0)
        past = max(past, int(np.sum(bs[u:] - t >= SERIES_T_MAX)))
    assert past >= 4, past  # the last point has entries past the range beyond the largest


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("u", [1, 2, 3])
def test_capped_h_derivatives_by_finite_differences(seed, u):
    """``_ent_h``'s h' and h'' (Halley's method on the capped candidates) against central
    differences of h and h' (step 1e-4: truncation ~1e-8 relative), at points around the
    candidate's root."""
    from topkbench.losses.topk_entropy_capped import _ent_h

    bs, kf, alpha, A = _capped_setup(seed, u)

    def hfun(t):
        return _ent_h(u, kf, alpha, A, t, *_sums(bs, u, t))

    for t in (float(bs[u]) - 8.0, float(bs[u]) - 4.0, float(bs[u]) - 1.0):
        h, hp, hpp = hfun(t)
        d = 1e-4
        hm, hpm, _ = hfun(t - d)
        hq, hpq, _ = hfun(t + d)
        scale = abs(hp) + 1e-3 * alpha
        assert abs((hq - hm) / (2 * d) - hp) <= 1e-6 * scale, (t, hp)
        assert abs((hpq - hpm) / (2 * d) - hpp) <= 1e-6 * (abs(hpp) + scale), (t, hpp)


def test_capped_sums_by_taylor_within_rounding():
    """``_sums_at`` moves M's sums by Taylor's formula for steps up to ``_SUMS_TAYLOR``: S
    within a few ulp (times alpha) of the full evaluation, which the root's tolerance
    ``8 (n + 2) eps alpha`` dwarfs; a longer step is evaluated in full."""
    from topkbench.losses.topk_entropy_capped import _SUMS_TAYLOR, _sums_at

    for seed in range(5):
        bs, kf, alpha, A = _capped_setup(seed, 1)
        n = bs.shape[0]
        t0 = float(bs[1]) - 3.5
        S0, D10, D20 = _sums(bs, 1, t0)
        for d in (0.9 * _SUMS_TAYLOR, -0.9 * _SUMS_TAYLOR, 3e-6, 2 * _SUMS_TAYLOR):
            args = (bs, 1, t0 + d, np.empty(n), np.empty(n), np.empty(n), math.nan)
            S, D1, _, _, t_s, *_ = _sums_at(*args, t0, S0, D10, D20)
            S_full, D1_full, _ = _sums(bs, 1, t0 + d)
            assert abs(S - S_full) <= 8 * EPS * (S_full + alpha), (seed, d)
            assert abs(D1 - D1_full) <= 1e-9 * D1_full
            assert (t_s == t0) == (abs(d) <= _SUMS_TAYLOR)


@pytest.mark.parametrize("seed", range(8))
def test_capped_first_evaluation_from_the_root_values(seed):
    """The first capped candidate starts at the u = 0 root and takes M's sums from the root's
    values (all entries minus the u largest, ``at_guess``): same root and s as evaluating M
    in full, and as aiming one step from those sums (a capped hint's ``GUESS_ROUGH``)."""
    from topkbench.losses.topk_entropy_capped import (
        GUESS_EXACT,
        GUESS_NONE,
        GUESS_ROUGH,
        _ent_root_capped,
    )
    from topkbench.prox.roots import _entropic_root

    for u in (1, 2):
        bs, kf, alpha, A = _capped_setup(seed, u, n=99)
        n = bs.shape[0]
        vals, ex, near = np.empty(n), np.empty(n), np.empty(n, np.int64)
        t0, status, _, sums = _entropic_root(bs.copy(), alpha, vals, ex, near, math.nan, 0.0)
        assert status == STATUS_OK
        runs = []
        # the first evaluation from the root's values, with V of the largest entry recomputed
        # or (u = 1) given as the largest value (v_top), a step aimed from them, and M's sums
        for at_guess, v_top in (
            (GUESS_EXACT, math.nan),
            (GUESS_EXACT, float(vals.max())),
            (GUESS_ROUGH, math.nan),
            (GUESS_NONE, math.nan),
        ):
            if u > 1 and v_top == v_top:
                continue
            run = _ent_root_capped(
                bs, u, kf, alpha, A, t0, np.empty(n), np.empty(n), vals.copy(),
                at_guess, v_top, sums, math.nan,
            )  # fmt: skip
            runs.append(run)
        t2, S2, st2, _ = runs[-1]
        assert st2 == STATUS_OK
        for t1, S1, st1, _ in runs[:-1]:
            assert st1 == STATUS_OK
            assert abs(t1 - t2) <= 1e-12 * (1 + abs(t2)), (u, t1, t2)
            assert abs(S1 - S2) <= 1e-12 * (S2 + alpha), (u, S1, S2)


@pytest.mark.parametrize("n_dom", [3, 9, 12])
def test_prox_capped_many_dominant_entries(n_dom):
    """k = 15 with 3, 9 or 12 dominant entries (n = 60): the consistent candidate has u ~
    n_dom, so the bisection's probes pass ``_LAZY_MAX`` (the k largest ordered at once) for the
    larger counts and stay lazy for 3.  The result passes the KKT and duality-gap checks."""
    rng = np.random.default_rng(n_dom)
    n, k = 60, 15
    for alpha in (0.1, 10.0, 1e3):
        b = rng.normal(0.0, 1.0, n)
        b[:n_dom] += 12.0 + math.log(alpha) + rng.uniform(0.0, 0.5, n_dom)
        b = b[rng.permutation(n)]
        x = prox(b, alpha, k)
        assert_in_top_k_simplex(x, k, b)
        assert_prox_kkt(b, alpha, k, x)
        gap, tol = prox_duality_gap(b, alpha, k, x)
        assert gap <= tol, (gap, tol)
        assert capped_mask(x, k).sum() >= min(n_dom, 3), capped_mask(x, k).sum()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("u", [1, 2, 3])
def test_capped_f_derivatives_and_sign(seed, u):
    """``_ent_f`` (the capped candidates' log-domain equation): F' and F'' against central
    differences of F and F' (step 1e-6), F increasing, and its sign against h's (F < 0
    exactly where h > 0, the same root), at points around the root inside F's domain."""
    import topkbench.losses.topk_entropy_capped as tc
    from topkbench.losses.topk_entropy_capped import _ent_f, _ent_h

    bs, kf, alpha, A = _capped_setup(seed, u)
    om = 1.0 - u / kf

    def ffun(t):
        return _ent_f(u, kf, alpha, A, t, *_sums(bs, u, t))

    n = bs.shape[0]
    t_root, _, status, _ = tc._ent_root_capped(
        bs, u, kf, alpha, A, math.nan, *(np.empty(n) for _ in range(3)),
        0, math.nan, NO_SUMS, math.nan,
    )  # fmt: skip
    assert status == STATUS_OK
    checked = 0
    for t in (t_root - 0.5, t_root - 1e-3, t_root + 1e-3, t_root + 1.0):
        S, D1, D2 = _sums(bs, u, t)
        if not (0.0 < S / om < alpha):  # outside F's domain (the h form is used there)
            continue
        checked += 1
        f, f1, f2 = ffun(t)
        d = 1e-6
        fm, f1m, _ = ffun(t - d)
        fq, f1q, _ = ffun(t + d)
        assert f1 > 0.0
        assert abs((fq - fm) / (2 * d) - f1) <= 1e-6 * f1, (t, f1)
        assert abs((f1q - f1m) / (2 * d) - f2) <= 1e-5 * (abs(f2) + f1), (t, f2)
        h, _, _ = _ent_h(u, kf, alpha, A, t, S, D1, D2)
        assert (f < 0.0) == (h > 0.0), (t, f, h)
    assert checked >= 3


@pytest.mark.parametrize("seed", range(4))
def test_capped_root_forms_agree(seed):
    """The capped root on F (where ``1 - s`` is not small) and on the h form (forced by a
    huge ``_Q_LOG``) agree to the stopping tolerance."""
    import topkbench.losses.topk_entropy_capped as tc

    bs, kf, alpha, A = _capped_setup(seed, 1, n=99)
    n = bs.shape[0]
    t_f, S_f, st_f, _ = tc._ent_root_capped.py_func(
        bs, 1, kf, alpha, A, math.nan, *(np.empty(n) for _ in range(3)), 0,
        math.nan, NO_SUMS, math.nan,
    )  # fmt: skip
    saved = tc._Q_LOG, tc._ent_g
    try:
        tc._Q_LOG = 2.0  # Q > 2 alpha never holds: every evaluation takes the h form
        tc._ent_g = tc._ent_g.py_func
        t_h, S_h, st_h, _ = tc._ent_root_capped.py_func(
            bs, 1, kf, alpha, A, math.nan, *(np.empty(n) for _ in range(3)), 0,
            math.nan, NO_SUMS, math.nan,
        )  # fmt: skip
    finally:
        tc._Q_LOG, tc._ent_g = saved
    assert st_f == st_h == STATUS_OK
    assert abs(t_f - t_h) <= 1e-11 * (1.0 + abs(t_h)), (t_f, t_h)
    assert abs(S_f - S_h) <= 1e-11 * (S_h + alpha)


def prox_warm(b, alpha, k, t_start):
    """``topk_ent_prox`` with a warm start: ``(x, t_keep, status)``."""
    b = np.ascontiguousarray(b, dtype=np.float64)
    n = b.shape[0]
    out = np.empty(n)
    scratch = [np.empty(n) for _ in range(5)]
    t_keep, status, _ = topk_ent_prox(
        b, alpha, k, out, scratch[0], scratch[1], np.empty(n, dtype=np.int64), scratch[2],
        scratch[3], scratch[4], t_start,
    )  # fmt: skip
    return out, t_keep, status


def _hint_status(b, alpha, k, t_start):
    """Whether the u = 0 root stops at t_start with a capped hint."""
    from topkbench.prox.roots import STATUS_CAPPED_HINT, _entropic_root

    n = b.shape[0]
    _, status, _, _ = _entropic_root(
        b.copy(), alpha, np.empty(n), np.empty(n), np.empty(n, np.int64), t_start, float(k)
    )
    return status == STATUS_CAPPED_HINT


def _sdca_like(rng, n=100, k=5):
    """A prox input shaped like bench sdca's (one -inf slot for the label, a few entries
    standing out), with alpha in [10, 1000] and a capped solution about half of the time."""
    alpha = float(10.0 ** rng.uniform(1, 3))
    b = rng.normal(-9.0, 1.5, n)
    n_dom = int(rng.integers(1, 4))
    b[:n_dom] += rng.uniform(0.0, 1.0, n_dom) * (4.0 + math.log(alpha))
    b = b[rng.permutation(n)]
    b[int(rng.integers(n))] = -np.inf
    return b, alpha, k


def test_prox_capped_hint_from_the_kept_warm_start():
    """A capped solution's t, kept as the warm start (as the SDCA epochs do), makes the next
    call on a perturbed input start its capped candidates there (the hint; asserted to occur,
    also from below the u = 0 root's bracket): the result is the cold call's, to the
    candidates' tolerance, and passes the KKT and duality-gap checks."""
    rng = np.random.default_rng(11)
    hinted = below = 0
    for _ in range(150):
        b, alpha, k = _sdca_like(rng)
        x0, t_keep, status = prox_warm(b, alpha, k, math.nan)
        assert status == STATUS_OK
        if not capped_mask(x0[np.isfinite(b)], k).any():
            continue
        b2 = b + rng.normal(0.0, 0.05, b.shape[0])  # the next epoch's input
        x_cold, _, _ = prox_warm(b2, alpha, k, math.nan)
        x_warm, t2, status = prox_warm(b2, alpha, k, t_keep)
        assert status == STATUS_OK
        if _hint_status(b2, alpha, k, t_keep):
            hinted += 1
            big = max(alpha, float(np.max(b2)))
            below += t_keep <= big - alpha - math.log(alpha)
        np.testing.assert_allclose(x_warm, x_cold, rtol=1e-9, atol=1e-15)
        fin = np.isfinite(b2)
        assert_prox_kkt(b2[fin], alpha, k, x_warm[fin])
        gap, tol = prox_duality_gap(b2[fin], alpha, k, x_warm[fin])
        assert gap <= tol, (gap, tol)
        assert math.isfinite(t2)
    assert hinted >= 20, hinted
    assert below >= 5, below


def test_prox_capped_hint_falls_back_to_the_root():
    """A hint whose candidates find no consistent set (the warm start suggests a cap, the
    solution has none) falls back to the u = 0 root: same result as the cold call.  Warm
    starts far above the root make the largest entry dominate; asserted to occur."""
    rng = np.random.default_rng(12)
    fallbacks = 0
    for _ in range(800):
        b, alpha, k = _sdca_like(rng)
        x0, t0, _ = prox_warm(b, alpha, k, math.nan)
        if capped_mask(x0[np.isfinite(b)], k).any():
            continue
        t_start = t0 + float(rng.uniform(0.5, 10.0))
        x_warm, t_keep, status = prox_warm(b, alpha, k, t_start)
        if not _hint_status(b, alpha, k, t_start):
            continue
        fallbacks += 1
        assert status == STATUS_OK
        # both roots are within h's tolerance 4 (n+1) eps alpha (alpha up to 1e3)
        np.testing.assert_allclose(x_warm, x0, rtol=1e-9, atol=1e-15)
        assert abs(t_keep - t0) <= 1e-10 * (1 + abs(t0))
    assert fallbacks >= 10, fallbacks
