"""V(t) = W0(exp(t)), the Lambert W function of the exponent (TPAMI, 002 §5.1, Fig. 2).

V solves ``v + log v = t``. It is convex and increasing, ``V'(t) = V/(1+V)``, ``V(t) ~ exp(t)``
for ``t -> -inf`` and ``V(t) ~ t - log t`` for ``t -> +inf``.

Algorithm for ``t < -3`` (where the SDCA softmax updates spend most evaluations: on the
``bench sdca`` problem the arguments of eq. (14) lie mostly in [-17, -5]): the Lagrange series
``W0(x) = sum_{n>=1} (-n)^(n-1)/n! x^n`` at ``x = e^t`` (radius 1/e), 18 terms.  The first
omitted term is below 1e-19 relative (checked against ``scipy.special.lambertw``: at most 1
ulp on a 4,001-point grid), and the evaluation costs one ``exp`` and a short polynomial
instead of four logarithms.

Algorithm otherwise: Winitzki's closed-form start ``L (1 - log(1+L)/(2+L))`` with
``L = log(1 + e^t)`` (computed without overflow), then two steps of Fritsch's fourth-order iteration
(Fritsch, Shafer & Crowley 1973), written in terms of ``t`` so that ``exp(t)`` is never formed
for large ``t``. Accuracy is tested
against ``scipy.special.lambertw(exp(t))`` in ``tests/kernels/test_lambertw.py``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Lagrange series coefficients of W0 at 0: c_n = (-n)^(n-1) / n!, n = 1 .. 18
_W_SERIES = np.array([(-n) ** (n - 1) / math.factorial(n) for n in range(1, 19)])


SERIES_T_MAX = -3.0  # V(t) by the Lagrange series below this t

# the coefficients as scalars (numba freezes them into the code)
(_A0, _A1, _A2, _A3, _A4, _A5, _A6, _A7, _A8) = (float(c) for c in _W_SERIES[:9])
(_A9, _A10, _A11, _A12, _A13, _A14, _A15, _A16, _A17) = (float(c) for c in _W_SERIES[9:])


@njit(cache=True, fastmath={"contract"})
def lambertw_series(x: float) -> float:
    """V(t) for ``t < SERIES_T_MAX`` from ``x = e^t`` (callers that know e^t cheaply, such as
    the softmax root finding, skip the ``exp``): the 18-term Lagrange series of the module
    docstring, by Estrin's scheme (pairs, then powers x^2, x^4, x^8, x^16).  No branch on the
    number of terms and a dependency chain of five levels instead of Horner's 18, so the
    evaluations of consecutive coordinates overlap in the CPU (bench sdca's lr_multi and
    topk_ent epochs, see :func:`topkbench.kernels.roots._entropic_root`)."""
    x2 = x * x
    x4 = x2 * x2
    x8 = x4 * x4
    x16 = x8 * x8
    q0 = (_A0 + _A1 * x) + (_A2 + _A3 * x) * x2
    q1 = (_A4 + _A5 * x) + (_A6 + _A7 * x) * x2
    q2 = (_A8 + _A9 * x) + (_A10 + _A11 * x) * x2
    q3 = (_A12 + _A13 * x) + (_A14 + _A15 * x) * x2
    r0 = q0 + q1 * x4
    r1 = q2 + q3 * x4
    return x * ((r0 + r1 * x8) + (_A16 + _A17 * x) * x16)


@njit(cache=True)
def lambertw_exp(t: float) -> float:
    """Return V(t) = W0(e^t) for a scalar ``t`` (any float; ``nan`` propagates)."""
    if t < SERIES_T_MAX:
        # Lagrange series in x = e^t (module docstring); x <= e^-3 < 1/e
        return lambertw_series(math.exp(t))
    if t > 1e8:
        # asymptotic series V = t - log t + log t / t + O((log t / t)^2)
        ell = math.log(t)
        return t - ell + ell / t
    if t < 1.0:
        et = math.exp(t)
        ell = math.log1p(et)
    else:
        et = 0.0
        ell = t + math.log1p(math.exp(-t))
    w = ell * (1.0 - math.log1p(ell) / (2.0 + ell))
    for _ in range(2):
        # residual of w + log w = t; for t < 1 as log(e^t / w) - w (no cancellation when
        # w is tiny), for larger t ordered to avoid cancellation when t is huge
        if t < 1.0:
            z = math.log(et / w) - w
        else:
            z = (t - w) - math.log(w)
        w1 = 1.0 + w
        q = 2.0 * w1 * (w1 + (2.0 / 3.0) * z)
        denom = w1 * (q - 2.0 * z)
        if denom == 0.0:
            break
        w = w * (1.0 + z * (q - z) / denom)
    return w


@njit(cache=True)
def lambertw_exp_inverse(v: float) -> float:
    """Return V^{-1}(v) = v + log v for ``v > 0``."""
    return v + math.log(v)


@njit(cache=True)
def lambertw_exp_array(t: np.ndarray, out: np.ndarray) -> None:
    """Elementwise V(t) into ``out`` (used by tests and benchmarks)."""
    for i in range(t.shape[0]):
        out[i] = lambertw_exp(t[i])
