"""Inner root finding of the SDCA block updates (TPAMI 002 eq. (14), Props. 15-16 with k = 1;
LR^OVA's logistic dual root), over wide ranges of alpha = C |x|^2 and b (DESIGN §4.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import V_reference
from scipy.optimize import brentq

from topkbench.prox.roots import STATUS_OK, _entropic_root, _logistic_dual_root


def softmax_prox_reference(b, alpha):
    """argmin_{x in unit simplex} alpha/2 (|x|^2 + s^2) - <b,x> + <x, log x> + (1-s) log(1-s),
    s = <1,x> (TPAMI (11), k = 1), solved in l = log(1 - s) rather than eq. (14)'s t:
    stationarity is log x_j + alpha x_j = b_j - alpha s + l, so
    alpha x_j = V(log alpha + l + b_j - alpha s), and l solves sum_j x_j = 1 - e^l
    (increasing minus decreasing in l: one root in (-inf, 0))."""

    def residual(ell):
        s = -math.expm1(ell)
        x = np.array([V_reference(math.log(alpha) + ell + bj - alpha * s) for bj in b]) / alpha
        return x, x.sum() + math.expm1(ell)

    lo = -1.0
    while residual(lo)[1] > 0.0:
        lo *= 2.0
    ell = brentq(lambda e: residual(e)[1], lo, 0.0, xtol=1e-300, rtol=8.9e-16, maxiter=1000)
    return residual(ell)[0]


def kernel_prox(b, alpha):
    b = np.ascontiguousarray(b, dtype=np.float64)
    vals = np.empty_like(b)
    t, status, _, _ = _entropic_root(
        b, float(alpha), vals, np.empty_like(b), np.empty(b.shape[0], dtype=np.int64), math.nan,
        0.0,
    )  # fmt: skip
    return t, status, vals / alpha


@settings(max_examples=150)
@given(
    b=hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(-50.0, 50.0)),
    log_alpha=st.floats(-6.0, 8.0),
)
def test_entropic_root_solves_the_prox(b, log_alpha):
    alpha = 10.0**log_alpha
    t, status, x = kernel_prox(b, alpha)
    assert status == STATUS_OK
    # eq. (14) at the returned t: V(alpha - t) + sum_j V(b_j - t) = alpha
    h = V_reference(alpha - t) + sum(V_reference(bj - t) for bj in b) - alpha
    assert abs(h) <= 1e-12 * alpha * (len(b) + 1) + 1e-300
    x_ref = softmax_prox_reference(b, alpha)
    np.testing.assert_allclose(x, x_ref, rtol=1e-10, atol=1e-13)
    assert np.all(x >= 0.0) and x.sum() <= 1.0 + 1e-14


@pytest.mark.parametrize("alpha", [1e-8, 1e-3, 1.0, 1e3, 1e8])
@pytest.mark.parametrize("bscale", [1e-3, 1.0, 1e2, 1e3])
def test_entropic_root_extreme_inputs(alpha, bscale):
    rng = np.random.default_rng(int(alpha * 7 + bscale))
    for _ in range(5):
        b = bscale * rng.normal(size=rng.integers(1, 8))
        t, status, x = kernel_prox(b, alpha)
        assert status == STATUS_OK
        assert np.all(np.isfinite(x)) and np.all(x >= 0.0) and x.sum() <= 1.0 + 1e-14
        # stationarity of (11), written without 1 - s where s rounds to 1: the
        # differences (log x_j + alpha x_j - b_j) are equal for all j in the support
        pos = x > 1e-300
        if pos.sum() > 1:
            r = np.log(x[pos]) + alpha * x[pos] - b[pos]
            assert np.ptp(r) <= 1e-12 * (1.0 + np.abs(b).max() + alpha)
        if bscale <= 100:
            np.testing.assert_allclose(x, softmax_prox_reference(b, alpha), rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize(
    "g, ck, u0",
    [
        (-3.6947612213957557, 1883090.8329838736, -41.49173134778318),  # Newton used to cycle
        (-17.19617019622404, 24.497868589365908, 0.6526280548457558),  # step test used to stall
        (-3.5244894412229804, 6648245.729899018, -33.64398677037407),
        (5.0, 1e8, 0.0),
        (-5.0, 1e-8, 3.0),
        (0.0, 1.0, 0.0),
        (40.0, 1e3, -40.0),
    ],
)
def test_logistic_dual_root_cases(g, ck, u0):
    u, status = _logistic_dual_root(g, ck, u0)
    assert status == STATUS_OK
    ref = brentq(lambda u: u + g + ck * sps.expit(u), -g - ck, -g, xtol=1e-300, rtol=8.9e-16)
    assert sps.expit(u) == pytest.approx(sps.expit(ref), rel=1e-13, abs=1e-15)


@settings(max_examples=300)
@given(
    g=st.floats(-1e3, 1e3),
    log_ck=st.floats(-8.0, 9.0),
    u0=st.one_of(st.just(0.0), st.floats(-100.0, 100.0)),
)
def test_logistic_dual_root(g, log_ck, u0):
    """Root of u + g + ck sigmoid(u) = 0, i.e. beta = sigmoid(u) maximises the LR^OVA block,
    from any warm start u0."""
    ck = 10.0**log_ck
    u, status = _logistic_dual_root(g, ck, u0)
    assert status == STATUS_OK

    def f(u):
        return u + g + ck * sps.expit(u)

    lo, hi = -g - ck, -g
    if f(lo) < 0.0 < f(hi):
        ref = brentq(f, lo, hi, xtol=1e-300, rtol=8.9e-16)
    else:
        ref = lo if f(lo) >= 0.0 else hi
    assert sps.expit(u) == pytest.approx(sps.expit(ref), rel=1e-12, abs=1e-15)


def test_entropic_root_with_entries_outside_the_series_range():
    """Entries whose argument b_j - t reaches the closed-form range of V (>= -3) mixed with
    series ones: the same root and values as a scalar evaluation."""
    b = np.array([2.0, 1.5, -40.0, -3.0, -10.0, 0.5, -700.0, -800.0])
    for alpha in (1e-3, 0.5, 5.0, 300.0):
        t, status, x = kernel_prox(b, alpha)
        assert status == STATUS_OK
        h = V_reference(alpha - t) + sum(V_reference(bj - t) for bj in b) - alpha
        assert abs(h) <= 1e-12 * alpha * (len(b) + 1)
        want = np.array([V_reference(bj - t) for bj in b]) / alpha
        np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-300)


def test_v_step_is_taylor_to_rounding():
    """_v_step moves V by up to _TAYLOR_SPAN with the fourth-order formula: the derivatives of
    V written in V are right (a wrong one shows at delta = 1e-3 as an error of ~1e-12 or more)
    and the remainder is below rounding.  Steps are powers of two, so that ``x - delta`` is
    exact and the reference sees no rounding of its argument."""
    from topkbench.prox.roots import _TAYLOR_SPAN, _v_step

    assert 2.0**-10 <= _TAYLOR_SPAN
    for x in (-700.0, -40.0, -5.0, -3.0, -0.5, 0.0, 0.75, 3.0, 18.0, 400.0, 1e6):
        v = V_reference(x)
        for delta in (2.0**-10, -(2.0**-10), 2.0**-12, -(2.0**-20), 0.0):
            want = V_reference(x - delta)
            assert abs(_v_step(v, delta) - want) <= 4e-16 * want + 1e-300, (x, delta)


@pytest.mark.parametrize("offset", [0.0, 1e-9, 1e-4, 0.05, -0.3, 2.0])
def test_entropic_root_from_a_warm_start(offset):
    """A warm start (the SDCA case: the example's previous root) takes a first step from the
    series' first 8 terms: the root is the cold start's to the stopping tolerance, from the
    root itself (offset 0: that evaluation must not be accepted, it is rough), from starts a
    Taylor step away and from starts far off; the values are V at the returned root, and so
    are the sums returned with it."""
    rng = np.random.default_rng(11)
    for alpha in (0.3, 40.0, 300.0):
        b = rng.normal(-6.0, 2.0, 99)
        b[:2] += 5.0
        n = b.shape[0]
        vals0 = np.empty(n)
        t0, st0, _, _ = _entropic_root(
            b, alpha, vals0, np.empty(n), np.empty(n, np.int64), math.nan, 0.0
        )
        vals = np.empty(n)
        t, st, _, sums = _entropic_root(
            b, alpha, vals, np.empty(n), np.empty(n, np.int64), t0 + offset, 0.0
        )
        assert st0 == st == STATUS_OK
        # |h| <= 4 (n+1) eps alpha at both, and |h'| = sum V/(1+V) >= alpha/(1+alpha) at the
        # root (the n+1 values are at most alpha and sum to alpha)
        bound = 8 * (n + 1) * 2.3e-16 * (1.0 + alpha) + 4e-16 * abs(t0)
        assert abs(t - t0) <= bound, (alpha, t, t0)
        want = np.array([V_reference(bj - t) for bj in b])
        np.testing.assert_allclose(vals, want, rtol=1e-12)
        # the sums returned with the root are those of V at t: S to rounding; -S' and S'',
        # which only steer steps, to first order and from the last evaluation after the
        # early exit
        inv = 1.0 / (1.0 + want)
        assert abs(sums[0] - want.sum()) <= 1e-12 * want.sum()
        assert abs(sums[1] - (want * inv).sum()) <= 1e-9 * sums[1]
        assert abs(sums[2] - (want * inv**3).sum()) <= 1e-4 * sums[2]


def test_lambertw_series_rough_error():
    """The rough series (degree-5 interpolant): within 1.5e-10 relative of V on the series
    range (x <= e^-3), and short of the full series' accuracy (so the rough evaluation is a
    different function)."""
    from topkbench.prox.lambertw import lambertw_series, lambertw_series_rough

    x = np.exp(np.linspace(-40.0, -3.0, 2001))
    full = np.array([lambertw_series(v) for v in x])
    rough = np.array([lambertw_series_rough(v) for v in x])
    err = np.abs(rough - full) / full
    assert err.max() <= 1.5e-10
    assert err.max() >= 1e-12


def _softmax_sums(b, t):
    v = np.array([V_reference(bj - t) for bj in b])
    inv = 1.0 / (1.0 + v)
    return v.sum(), (v * inv).sum(), (v * inv**3).sum()


@pytest.mark.parametrize("alpha, shift", [(250.0, -8.0), (2.0, -1.0), (0.5, 30.0), (1e-3, 6.0)])
def test_softmax_g_derivatives_and_forms(alpha, shift):
    """``_softmax_g``'s g' and g'' against central differences (step 1e-7), and its sign
    against eq. (14)'s residual h (g < 0 exactly where h > 0), at points around the root.
    The log form holds where ``1 - s`` is of order 1; ``b`` large against alpha puts the root
    where ``Q = alpha - S`` is below ``_Q_LOG alpha``, and ``g = -h`` there."""
    from topkbench.prox.roots import _Q_LOG, _softmax_g

    def form(t):
        return alpha - _softmax_sums(b, t)[0] > _Q_LOG * alpha

    def gfun(t):
        return _softmax_g(alpha, t, *_softmax_sums(b, t), 0.0)

    rng = np.random.default_rng(3)
    b = rng.normal(shift, 1.0, 12)
    t0, status, _ = kernel_prox(b, alpha)
    assert status == STATUS_OK
    assert form(t0) == (shift < 0.0)
    checked = 0
    d = 1e-7
    for t in (t0 - 0.3, t0 - 1e-3, t0 - 1e-5, t0 + 1e-5, t0 + 2e-3, t0 + 0.5):
        g, g1, g2, _, r = gfun(t)
        h = V_reference(alpha - t) + _softmax_sums(b, t)[0] - alpha
        assert (g < 0.0) == (h > 0.0), (t, g, h)
        assert g1 > 0.0 and r >= 1.0
        if not form(t - d) == form(t) == form(t + d):
            continue
        checked += 1
        gm, g1m, *_ = gfun(t - d)
        gq, g1q, *_ = gfun(t + d)
        assert abs((gq - gm) / (2 * d) - g1) <= 1e-6 * g1, (t, g1)
        assert abs((g1q - g1m) / (2 * d) - g2) <= 1e-5 * (abs(g2) + g1), (t, g2)
    assert checked >= 4
