"""Scalar root finders shared by the SDCA updates (TPAMI 002 §5.1-5.2).

* :func:`entropic_root`: eq. (14), ``V(alpha - t) + sum_j V(b_j - t) = alpha``.
* :func:`logistic_dual_root`: ``u + g + ck sigmoid(u) = 0`` (the LR^OVA dual update, and the
  degenerate all-capped case of the top-k entropic prox).
"""

from __future__ import annotations

import math

from numba import njit

from topkbench.kernels.lambertw import SERIES_T_MAX, lambertw_exp, lambertw_series

STATUS_OK = 0
STATUS_ROOT_NOT_CONVERGED = 1
NEWTON_MAX_ITER = 100
_ANCHOR_SPAN = 30.0  # _entropic_root: recompute e^{b_j - t_ref} when t moves farther
_EXP_MAX_ARG = 700.0


@njit(cache=True)
def _entropic_root(b, alpha, vals, ex, t_start):
    """Root ``t`` of ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0`` (TPAMI eq. (14)).

    Halley's method (``h' = -sum V/(1+V)``, ``h'' = sum V/(1+V)^3``, both free once V is known)
    inside the bracket of the module docstring, with bisection as the safeguard.  It stops when
    the residual is at rounding level, ``|h| <= 4 (m+1) eps alpha`` (a test on the step size
    alone can stall under rounding).  On return ``vals[j] = V(b_j - t)``.  Returns
    ``(t, status)``.

    Most arguments ``b_j - t`` lie below ``SERIES_T_MAX`` (mostly in [-17, -5] on the bench sdca
    problem), where V needs only ``e^{b_j - t}``; that is ``ex_j e^{t_ref - t}`` with ``ex_j =
    e^{b_j - t_ref}`` (scratch ``ex``, length >= len(b)) computed at an anchor ``t_ref``, so a
    Halley step costs one ``exp`` instead of m (with the Estrin series of V, lr_multi epoch
    0.20 -> 0.175 s and topk_ent 0.30 -> 0.22 s on bench sdca).  The anchor
    moves when ``|t - t_ref| > _ANCHOR_SPAN``: then every ``ex_j`` used (``b_j - t_ref <
    SERIES_T_MAX + _ANCHOR_SPAN``) is finite, and one that underflows stands for a V below
    ``e^-700``, far below the stopping tolerance.
    """
    mb = b.shape[0]
    big = alpha
    mx = 0.0
    for j in range(mb):
        if b[j] > big:
            big = b[j]
        if b[j] > mx:
            mx = b[j]
    la = math.log(alpha)
    nterms = mb + 1.0
    lo = big - alpha - la
    hi = big - alpha / nterms - (la - math.log(nterms))
    # start from the root of this example's previous update when there is one (it moves
    # little between epochs), else from the softmax solution (exact as alpha -> 0)
    t = t_start
    if not (lo < t < hi):
        acc = math.exp(-mx)
        for j in range(mb):
            acc += math.exp(b[j] - mx)
        t = mx + math.log(acc) - la
    if not (lo < t < hi):
        t = 0.5 * (lo + hi)
    tol = 4.0 * nterms * 2.220446049250313e-16 * alpha
    t_ref = math.nan
    for _it in range(NEWTON_MAX_ITER):
        if not abs(t - t_ref) <= _ANCHOR_SPAN:
            t_ref = t
            for j in range(mb):
                a = b[j] - t_ref
                ex[j] = math.exp(a) if a < _EXP_MAX_ARG else math.inf
        r = math.exp(t_ref - t)
        v = lambertw_exp(alpha - t)
        h = v - alpha
        w = v / (1.0 + v)
        d1 = w
        d2 = w / ((1.0 + v) * (1.0 + v))
        for j in range(mb):
            a = b[j] - t
            if a < SERIES_T_MAX:
                v = lambertw_series(ex[j] * r)
            else:
                v = lambertw_exp(a)
            vals[j] = v
            h += v
            w = v / (1.0 + v)
            d1 += w
            d2 += w / ((1.0 + v) * (1.0 + v))
        if abs(h) <= tol:
            return t, STATUS_OK
        if h > 0.0:
            lo = t
        else:
            hi = t
        den = 2.0 * d1 * d1 - h * d2
        if den > 0.0:
            t_new = t + 2.0 * h * d1 / den
        else:
            t_new = t + h / d1
        if not (lo < t_new < hi):
            t_new = 0.5 * (lo + hi)
        if abs(t_new - t) <= 1e-15 * max(1.0, abs(t)):
            for j in range(mb):
                vals[j] = lambertw_exp(b[j] - t_new)
            return t_new, STATUS_OK
        t = t_new
    return t, STATUS_ROOT_NOT_CONVERGED


@njit(cache=True)
def _sigmoid(u):
    if u >= 0:
        return 1.0 / (1.0 + math.exp(-u))
    e = math.exp(u)
    return e / (1.0 + e)


@njit(cache=True)
def _logistic_dual_root(g, ck, u0):
    """Root ``u`` of ``u + g + ck * sigmoid(u) = 0`` (``ck >= 0``), safeguarded Newton.

    ``f(u) = u + g + ck sigmoid(u)`` is increasing, convex for ``u <= 0`` and concave for
    ``u >= 0``, so Newton started between the root and 0 converges monotonically.  The sign of
    ``f(0) = g + ck/2`` tells on which side of 0 the root lies; ``u0`` (the previous root) is
    used when it is on the right side, else the start is ``min(-g, 0)`` / ``max(-g - ck, 0)``.
    (Started on the wrong side, plain Newton can bounce between both ends of the bracket
    forever, e.g. g = -3.6947..., ck = 1.88e6, u0 = -41.49.)
    """
    lo = -g - ck
    hi = -g
    if ck == 0.0:
        return hi, STATUS_OK
    if g + 0.5 * ck > 0.0:  # root < 0: start where f >= 0, u <= 0
        u = min(hi, 0.0)
        if lo <= u0 <= u and u0 + g + ck * _sigmoid(u0) >= 0.0:
            u = u0
    else:  # root >= 0: start where f <= 0, u >= 0
        u = max(lo, 0.0)
        if u <= u0 <= hi and u0 + g + ck * _sigmoid(u0) <= 0.0:
            u = u0
    for _it in range(NEWTON_MAX_ITER):
        sig = _sigmoid(u)
        f = u + g + ck * sig
        # f is known only to ~eps (|u| + |g| + ck); a step-size test alone can stall with
        # Newton alternating between two floats (e.g. g = -17.196..., ck = 24.49...)
        if abs(f) <= 4.0 * 2.220446049250313e-16 * (abs(u) + abs(g) + ck):
            return u, STATUS_OK
        if f > 0.0:
            hi = u
        elif f < 0.0:
            lo = u
        else:
            return u, STATUS_OK
        df = 1.0 + ck * sig * (1.0 - sig)
        u_new = u - f / df
        if not (lo <= u_new <= hi):
            u_new = 0.5 * (lo + hi)
        if abs(u_new - u) <= 1e-15 * max(1.0, abs(u)):
            return u_new, STATUS_OK
        u = u_new
    return u, STATUS_ROOT_NOT_CONVERGED
