"""V(t) = W0(exp(t)) (TPAMI 002 §5.1; DESIGN §4.6): accuracy, asymptotics, monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special as sps
from hypothesis import given
from hypothesis import strategies as st

from topkbench.prox.lambertw import lambertw_exp, lambertw_exp_array, lambertw_exp_inverse

ULPS = 4.0


def V(t: np.ndarray) -> np.ndarray:
    t = np.ascontiguousarray(t, dtype=np.float64)
    out = np.empty_like(t)
    lambertw_exp_array(t, out)
    return out


def scipy_V(t: np.ndarray) -> np.ndarray:
    with np.errstate(under="ignore"):
        return sps.lambertw(np.exp(t)).real


def ulp_error(value: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|value - reference| in units of the last place of the reference."""
    return np.abs(value - reference) / np.spacing(np.abs(reference))


def extended_precision_V(t: float) -> np.longdouble:
    """Newton on v + log v = t in the platform's extended precision, started at V(t).

    Independent of scipy, valid for every t (x86 long double has 64 mantissa bits: the
    reference is ~2000x more precise than a double).
    """
    T = np.longdouble(t)
    v = np.longdouble(lambertw_exp(t))
    if v == 0:
        return v
    for _ in range(4):
        v = v - (v + np.log(v) - T) / (1 + 1 / v)
    return v


extended_is_wider = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant


def test_dense_grid_against_scipy():
    t = np.concatenate(
        [
            np.linspace(-745.0, 709.0, 100_001),
            np.linspace(-50.0, 50.0, 50_001),
            np.linspace(-1.0, 1.0, 10_001),
            # both sides of the branch points of the implementation
            np.nextafter(-8.0, [-np.inf, np.inf]),
            np.nextafter(-3.0, [-np.inf, np.inf]),
            np.nextafter(40.0, [-np.inf, np.inf]),
            np.nextafter(1.0, [-np.inf, np.inf]),
            [-8.0, -3.0, 40.0, 1.0, 0.0, -745.0, 709.0],
        ]
    )
    ref = scipy_V(t)
    ok = ref > 0  # exp underflows to 0 below t ~ -745.13
    assert ok.all()
    err = ulp_error(V(t), ref)
    worst = int(np.argmax(err))
    assert err.max() <= ULPS, f"{err.max()} ulps at t = {t[worst]!r}"


@given(st.floats(min_value=-745.0, max_value=709.0, allow_nan=False))
def test_random_points_against_scipy(t):
    ref = scipy_V(np.array([t]))[0]
    assert ulp_error(lambertw_exp(t), ref) <= ULPS


@pytest.mark.skipif(not extended_is_wider, reason="long double is not wider than double")
@given(
    st.one_of(
        st.floats(min_value=-745.0, max_value=1e300, allow_nan=False),
        st.floats(min_value=-60.0, max_value=60.0),
        st.floats(min_value=1e5, max_value=1e12),
    )
)
def test_against_extended_precision_newton(t):
    v = lambertw_exp(t)
    ref = extended_precision_V(t)
    if ref == 0:
        assert v == 0.0
        return
    err = float(abs(np.longdouble(v) - ref) / np.longdouble(np.spacing(float(ref))))
    assert err <= ULPS, f"{err} ulps at t = {t!r}"


@pytest.mark.parametrize(
    "t", [710.0, 1e3, 3e4, 1e8, np.nextafter(1e8, 2e8), 1e9, 1e15, 1e20, 1e100, 1e200, 1e300]
)
def test_residual_for_large_t(t):
    """v + log v = t; the residual g(v) = (t - v) - log v is computed without cancellation
    (Sterbenz: t - v is exact for v in [t/2, 2t]) and a v-error of delta moves it by
    delta (1 + 1/v)."""
    v = lambertw_exp(t)
    assert t / 2 <= v <= t
    residual = (t - v) - math.log(v)
    assert abs(residual) / (1.0 + 1.0 / v) <= ULPS * np.spacing(v)


def test_exponential_asymptote_for_very_negative_t():
    t = -np.geomspace(20.0, 745.0, 2000)
    v = V(t)
    with np.errstate(under="ignore"):
        e = np.exp(t)
    # V = e^t e^{-V}, so V / e^t = e^{-V} = 1 - O(e^t)
    ok = e > np.finfo(float).tiny  # normal numbers: relative precision is meaningful
    rel = np.abs(v[ok] / e[ok] - np.exp(-v[ok]))
    assert rel.max() <= 4 * np.finfo(float).eps
    assert np.all(v[~ok] <= 2 * e[~ok] + 5e-324)
    assert lambertw_exp(-800.0) == 0.0
    assert lambertw_exp(-np.inf) == 0.0


def test_logarithmic_asymptote_for_large_t():
    """V(t) = t - log t + log t / t + O((log t / t)^2)."""
    t = np.geomspace(1e3, 1e300, 3000)
    v = V(t)
    lt = np.log(t)
    approx = t - lt + lt / t
    bound = (lt / t) ** 2 + 4 * np.spacing(t)
    assert np.all(np.abs(v - approx) <= bound)
    # and the cruder statement of the paper: V(t) - (t - log t) -> 0
    assert np.all(np.abs(v - (t - lt)) <= 2 * lt / t + 4 * np.spacing(t))


def test_monotone_on_dense_grids():
    for lo, hi in [(-745.0, 709.0), (-45.0, 45.0), (-2.0, 2.0), (1e7, 1e9)]:
        v = V(np.linspace(lo, hi, 200_001))
        assert np.all(np.diff(v) >= 0.0), (lo, hi)
    # across the implementation's branch points, float by float: V is accurate to a few
    # ulps, not correctly rounded, so between adjacent floats it may dip by its error but
    # never by more (a jump at a branch point would show up here)
    for b in (-8.0, -3.0, 1.0, 40.0, 1e8):
        t = np.array([b])
        steps = [t]
        for _ in range(200):
            steps.insert(0, np.nextafter(steps[0], -np.inf))
            steps.append(np.nextafter(steps[-1], np.inf))
        v = V(np.concatenate(steps))
        running_max = np.maximum.accumulate(v)
        assert np.all(running_max - v <= ULPS * np.spacing(v)), b
        assert v[-1] > v[0], b


def test_derivative_identity():
    """V'(t) = V / (1 + V) (TPAMI §5.2), checked by central differences."""
    t = np.linspace(-30.0, 60.0, 901)
    h = 1e-5
    fd = (V(t + h) - V(t - h)) / (2 * h)
    v = V(t)
    np.testing.assert_allclose(fd, v / (1 + v), rtol=1e-8, atol=0)


@given(st.floats(min_value=-700.0, max_value=1e15, allow_nan=False))
def test_inverse_of_V(t):
    v = lambertw_exp(t)
    back = lambertw_exp_inverse(v)
    # t -> v is contracting (V' < 1), so the round trip error is the error of v times
    # (1 + 1/v) plus rounding in v + log v
    tol = ULPS * np.spacing(v) * (1 + 1 / v) + 2 * np.spacing(abs(t)) + 2 * np.spacing(abs(v))
    assert abs(back - t) <= tol + np.spacing(abs(math.log(v)))


@given(st.floats(min_value=1e-300, max_value=1e300))
def test_V_of_inverse(v):
    t = lambertw_exp_inverse(v)
    # V' = v/(1+v): an error of ulp(t)/2 in t moves V by at most that much
    tol = ULPS * np.spacing(v) + np.spacing(abs(t)) * (v / (1 + v))
    assert abs(lambertw_exp(t) - v) <= tol


def test_special_values():
    assert math.isnan(lambertw_exp(math.nan))
    assert lambertw_exp(0.0) == pytest.approx(0.5671432904097838, rel=2e-16)  # omega constant
    assert lambertw_exp(1.0) == 1.0  # 1 + log 1 = 1


def test_series_interpolant_of_w_over_x():
    """The degree-10 interpolant of g(x) = W0(x)/x behind ``lambertw_series`` is within 1e-16
    relative of g on [0, e^-3] (a degree-9 one is not: 1.7e-16), against g's Lagrange series
    summed in 40-digit decimal arithmetic; ``lambertw_series`` itself stays within 2 ulp of
    the extended-precision Newton on the series range."""
    import decimal

    from topkbench.prox import lambertw as lw

    coefs = lw._economized_series(10)
    assert coefs == (lw._G0, lw._G1, lw._G2, lw._G3, lw._G4, lw._G5, lw._G6, lw._G7, lw._G8,
                     lw._G9, lw._G10)  # fmt: skip
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        series = [
            decimal.Decimal((-n) ** (n - 1)) / decimal.Decimal(math.factorial(n))
            for n in range(1, 80)
        ]
        xs = np.concatenate(
            [np.linspace(0.0, math.exp(-3.0), 401), np.exp(np.linspace(-40, -3, 101))]
        )
        worst = 0.0
        for x in xs:
            X = decimal.Decimal(float(x))
            g = decimal.Decimal(0)
            for c in reversed(series):  # Horner (0**0 is undefined in decimal)
                g = g * X + c
            p = 0.0
            for c in reversed(coefs):
                p = p * float(x) + c
            worst = max(worst, float(abs((decimal.Decimal(p) - g) / g)))
    assert worst <= 1e-16, worst
    if extended_is_wider:
        for t in np.linspace(-40.0, -3.0, 2001):
            v = lw.lambertw_series(math.exp(t))
            ref = extended_precision_V(t)
            err = float(abs(np.longdouble(v) - ref) / np.longdouble(np.spacing(float(ref))))
            assert err <= 2.0, (t, err)
