"""V(t) = W0(exp(t)), the Lambert W function of the exponent (TPAMI, 002 §5.1, Fig. 2).

V solves ``v + log v = t``. It is convex and increasing, ``V'(t) = V/(1+V)``, ``V(t) ~ exp(t)``
for ``t -> -inf`` and ``V(t) ~ t - log t`` for ``t -> +inf``.

Algorithm: Winitzki's closed-form start ``L (1 - log(1+L)/(2+L))`` with ``L = log(1 + e^t)``
(computed without overflow), then two steps of Fritsch's fourth-order iteration
(Fritsch, Shafer & Crowley 1973), written in terms of ``t`` so that ``exp(t)`` is never formed
for large ``t``. For ``t < -40`` we return ``exp(t)``: there ``V = e^t e^{-V}`` with
``V < 5e-18``, i.e. the relative error of ``exp(t)`` is below one ulp. Accuracy is tested
against ``scipy.special.lambertw(exp(t))`` in ``tests/kernels/test_lambertw.py``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def lambertw_exp(t: float) -> float:
    """Return V(t) = W0(e^t) for a scalar ``t`` (any float; ``nan`` propagates)."""
    if t < -20.0:
        # V = e^t exp(-V) = e^t (1 - e^t + O(e^{2t})); e^{2t} < 5e-18 here
        et = math.exp(t)
        return et - et * et
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
