"""V(t) = W0(exp(t)), the Lambert W function of the exponent (TPAMI, 002 §5.1, Fig. 2).

V solves ``v + log v = t``. It is convex and increasing, ``V'(t) = V/(1+V)``, ``V(t) ~ exp(t)``
for ``t -> -inf`` and ``V(t) ~ t - log t`` for ``t -> +inf``.

Algorithm for ``t < -3`` (where the SDCA softmax updates spend most evaluations: on the
``bench sdca`` problem the arguments of eq. (14) lie mostly in [-17, -5]): ``V = x g(x)`` at
``x = e^t`` with ``g(x) = W0(x)/x``, whose Lagrange series ``sum_{n>=1} (-n)^(n-1)/n! x^(n-1)``
converges for ``|x| < 1/e``.  On ``[0, e^-3]`` the series needs 18 terms for double
precision; the degree-10 polynomial interpolating g at Chebyshev points there (computed at
import from the series in 50-digit arithmetic, :func:`_economized_series`) is within 6e-17
of g (the nearest singularity, -1/e, is 16 half-widths from the interval, so the
interpolants converge like 31^-n).  Checked against ``scipy.special.lambertw``: at most 1 ulp
on a 4,001-point grid.  The evaluation costs one ``exp`` and a short polynomial instead of
four logarithms.

Algorithm otherwise: a start accurate to about 1e-4 (Chebyshev interpolants on [-3, 1) and
[1, 5), de Bruijn's asymptotic expansion above 5), then one step of Fritsch's fourth-order
iteration (Fritsch, Shafer & Crowley 1973), written in terms of ``t`` so that ``exp(t)`` is
never formed for large ``t`` (details in :func:`lambertw_exp`).  Accuracy is tested against
``scipy.special.lambertw(exp(t))`` and an extended-precision Newton in
``tests/prox/test_lambertw.py``.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
from numba import njit

SERIES_T_MAX = -3.0  # V(t) by the series below this t


def _economized_series(deg: int, terms: int = 80) -> tuple[float, ...]:
    """Power-basis coefficients of the degree-``deg`` polynomial that interpolates ``g(x) =
    W0(x)/x`` at the Chebyshev points of ``[0, e^SERIES_T_MAX]``.  g comes from its Lagrange
    series, ``terms`` terms (the omitted ones are below ``(e x)^terms < e^-160`` relative
    there), and the Vandermonde system is solved, all in 50-digit decimal arithmetic, so that
    the coefficients are the interpolant's to double precision."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        series = [
            decimal.Decimal((-n) ** (n - 1)) / decimal.Decimal(math.factorial(n))
            for n in range(1, terms + 1)
        ]
        half = decimal.Decimal(math.exp(SERIES_T_MAX)) / 2
        npts = deg + 1
        rows = []
        for i in range(npts):
            x = half * (1 + decimal.Decimal(math.cos(math.pi * (2 * i + 1) / (2 * npts))))
            g = sum(c * x**j for j, c in enumerate(series))
            rows.append([x**j for j in range(npts)] + [g])
        for i in range(npts):  # Gauss-Jordan elimination with partial pivoting
            piv = max(range(i, npts), key=lambda r: abs(rows[r][i]))
            rows[i], rows[piv] = rows[piv], rows[i]
            for r in range(npts):
                if r != i:
                    f = rows[r][i] / rows[i][i]
                    rows[r] = [a - f * b for a, b in zip(rows[r], rows[i], strict=True)]
        return tuple(float(rows[i][npts] / rows[i][i]) for i in range(npts))


# the interpolants of g (as scalars: numba freezes them into the code): degree 10 for V,
# degree 5 for the rough V
(_G0, _G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9, _G10) = _economized_series(10)
(_R0, _R1, _R2, _R3, _R4, _R5) = _economized_series(5)


def _v_reference(t: float) -> float:
    """V(t) to rounding in Python floats (Newton on ``v + log v = t`` from ``max(t, e^t)``-ish
    starts); used only to build the interpolants below at import."""
    v = math.exp(t) if t < 1.0 else t - math.log(t) + 0.5
    for _ in range(60):
        v_new = v - (v + math.log(v) - t) * v / (1.0 + v)
        if v_new == v:
            break
        v = v_new
    return v


def _interpolant(f, a: float, b: float, deg: int) -> tuple[float, ...]:
    """Power-basis coefficients (in ``u`` in [-1, 1], ``t = a + (u + 1)(b - a)/2``) of the
    degree-``deg`` interpolant of ``f`` at Chebyshev points."""
    c = np.polynomial.chebyshev.chebinterpolate(
        lambda u: np.array([f(0.5 * (b - a) * x + 0.5 * (a + b)) for x in np.atleast_1d(u)]),
        deg,
    )
    return tuple(float(x) for x in np.polynomial.chebyshev.cheb2poly(c))


# lambertw_exp's starts: W(x)/x on [-3, 1] (degree 8, error ~2e-5) and V on [1, 5] (degree 6,
# ~4e-6); one Fritsch step takes either to rounding
(_LO0, _LO1, _LO2, _LO3, _LO4, _LO5, _LO6, _LO7, _LO8) = _interpolant(
    lambda t: _v_reference(t) / math.exp(t), -3.0, 1.0, 8
)
(_MI0, _MI1, _MI2, _MI3, _MI4, _MI5, _MI6) = _interpolant(_v_reference, 1.0, 5.0, 6)


@njit(cache=True, fastmath={"contract"})
def lambertw_series_rough(x: float) -> float:
    """:func:`lambertw_series` with the degree-5 interpolant of ``g = W0(x)/x``: for ``x <=
    e^-3`` within 1.3e-10 relative, for an iterate that exact evaluations correct afterwards
    (the first evaluation of the softmax root, ``roots._entropic_root``; it replaced the
    series' first 8 terms, 4e-9)."""
    x2 = x * x
    q0 = (_R0 + _R1 * x) + (_R2 + _R3 * x) * x2
    return x * (q0 + (_R4 + _R5 * x) * (x2 * x2))


@njit(cache=True, fastmath={"contract"})
def lambertw_series(x: float) -> float:
    """V(t) for ``t < SERIES_T_MAX`` from ``x = e^t`` (callers that know e^t cheaply, such as
    the softmax root finding, skip the ``exp``): ``x g(x)`` with the degree-10 interpolant of
    the module docstring, by Estrin's scheme (pairs, then powers x^2, x^4, x^8).  No branch
    and a dependency chain of four levels, so the evaluations of consecutive coordinates
    overlap in the CPU (bench sdca's lr_multi and topk_ent epochs, see
    :func:`topkbench.prox.roots._entropic_root`); against the 18-term series it replaced,
    99 entries 87 -> 58 ns."""
    x2 = x * x
    x4 = x2 * x2
    x8 = x4 * x4
    q0 = (_G0 + _G1 * x) + (_G2 + _G3 * x) * x2
    q1 = (_G4 + _G5 * x) + (_G6 + _G7 * x) * x2
    q2 = (_G8 + _G9 * x) + _G10 * x2
    return x * ((q0 + q1 * x4) + q2 * x8)


@njit(cache=True, fastmath={"contract"})
def _fritsch_step(w, z):
    """One step of Fritsch's fourth-order iteration for ``w + log w = t`` from ``w`` with the
    residual ``z = t - w - log w`` (Fritsch, Shafer & Crowley 1973)."""
    w1 = 1.0 + w
    q = 2.0 * w1 * (w1 + (2.0 / 3.0) * z)
    return w * (1.0 + z * (q - z) / (w1 * (q - 2.0 * z)))


@njit(cache=True, fastmath={"contract"})
def lambertw_exp(t: float) -> float:
    """Return V(t) = W0(e^t) for a scalar ``t`` (any float; ``nan`` propagates).

    Below ``SERIES_T_MAX`` the Lagrange series; above it a start accurate to ~1e-4 and one
    step of Fritsch's iteration (fourth order, so the start's error ends below rounding;
    within 2 ulp of the exact value, ``tests/prox/test_lambertw.py``):

    * ``-3 <= t < 1``: ``e^t P(t)`` with ``P`` the degree-8 interpolant of ``V(t) e^{-t} =
      W(x)/x`` (values in [0.57, 0.96]) at Chebyshev points; residual ``log(e^t / w) - w``
      (no cancellation for small w);
    * ``1 <= t < 5``: the degree-6 interpolant of V;
    * ``5 <= t <= 1e8``: the asymptotic expansion to ``O((log t / t)^4)`` (de Bruijn);
    * ``t > 1e8``: ``t - log t + log t / t`` (already exact to rounding).

    Two logarithms and one exponential at most, against five for the previous closed form
    (Winitzki's start and two Fritsch steps).  Measured in a loop of independent calls: 53 ->
    19 ns for t in [150, 350] (the alpha term of eq. (14) on bench sdca's problem), 67 -> 19 ns
    on [-3, 0]; in the softmax root's dependent chain, 93 -> 67 ns per alpha-term
    evaluation."""
    if t < SERIES_T_MAX:
        # Lagrange series in x = e^t (module docstring); x <= e^-3 < 1/e
        return lambertw_series(math.exp(t))
    if t > 1e8:
        # asymptotic series V = t - log t + log t / t + O((log t / t)^2)
        ell = math.log(t)
        return t - ell + ell / t
    if t < 1.0:
        et = math.exp(t)
        u = 0.5 * t + 0.5
        w = et * (
            _LO0 + u * (_LO1 + u * (_LO2 + u * (_LO3 + u * (_LO4 + u * (_LO5 + u * (
                _LO6 + u * (_LO7 + u * _LO8)))))))
        )  # fmt: skip
        return _fritsch_step(w, math.log(et / w) - w)
    if t < 5.0:
        u = 0.5 * t - 1.5
        w = _MI0 + u * (_MI1 + u * (_MI2 + u * (_MI3 + u * (_MI4 + u * (_MI5 + u * _MI6)))))
    else:
        ell = math.log(t)
        it = 1.0 / t
        corr = 1.0 + it * (0.5 * (ell - 2.0) + it * (ell * (ell * (1.0 / 3.0) - 1.5) + 1.0))
        w = t - ell + ell * it * corr
    return _fritsch_step(w, (t - w) - math.log(w))


@njit(cache=True)
def lambertw_exp_inverse(v: float) -> float:
    """Return V^{-1}(v) = v + log v for ``v > 0``."""
    return v + math.log(v)


@njit(cache=True)
def lambertw_exp_array(t: np.ndarray, out: np.ndarray) -> None:
    """Elementwise V(t) into ``out`` (used by tests and benchmarks)."""
    for i in range(t.shape[0]):
        out[i] = lambertw_exp(t[i])
