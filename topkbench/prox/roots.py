"""Scalar root finders shared by the SDCA updates (TPAMI 002 §5.1-5.2).

* :func:`entropic_root`: eq. (14), ``V(alpha - t) + sum_j V(b_j - t) = alpha``.
* :func:`logistic_dual_root`: ``u + g + ck sigmoid(u) = 0`` (the LR^OVA dual update, and the
  degenerate all-capped case of the top-k entropic prox).
"""

from __future__ import annotations

import math

from numba import njit

from topkbench.prox.lambertw import (
    SERIES_T_MAX,
    lambertw_exp,
    lambertw_series,
    lambertw_series_rough,
)
from topkbench.prox.vecmath import exp_shifted, vmax

STATUS_OK = 0
STATUS_ROOT_NOT_CONVERGED = 1
# _entropic_root with k_hint: stopped after its first (rough) evaluation, whose values put the
# largest entry above the top-k cap (internal to the top-k entropic prox, never returned by it)
STATUS_CAPPED_HINT = 2
NEWTON_MAX_ITER = 100
_EPS = 2.220446049250313e-16
_TAYLOR_SPAN = 1e-3  # _entropic_root: steps this short move V by _v_step
_ANCHOR_SPAN = 30.0  # _entropic_root: recompute e^{b_j - t_ref} when t moves farther
_Q_LOG = 1e-3  # _softmax_g: the log form where 1 - s > _Q_LOG (no cancellation in alpha - S)
_SIXTH = 1.0 / 6.0  # _v_step's Taylor coefficients as products: LLVM keeps x / 6.0 a division
_TWENTYFOURTH = 1.0 / 24.0  # (vdivpd, ~10 cycles per AVX-512 vector on Zen 4), x * c is a mul


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _series_values(ex, r, n, vals, cut):
    """``vals[j] = V`` from :func:`~topkbench.prox.lambertw.lambertw_series` at ``x =
    min(ex_j r, cut)``, ``j < n`` (branch-free, vectorized; entries beyond the series range
    are clamped here and overwritten by the caller)."""
    for j in range(n):
        vals[j] = lambertw_series(min(ex[j] * r, cut))


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _series_values_rough(ex, r, n, vals, cut):
    """:func:`_series_values` with :func:`~topkbench.prox.lambertw.lambertw_series_rough`
    (~1.3e-10 relative, ~half the cost)."""
    for j in range(n):
        vals[j] = lambertw_series_rough(min(ex[j] * r, cut))


@njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _v_sums(vals, n):
    """``(sum V_j, sum V_j/(1+V_j), sum V_j/(1+V_j)^3)`` over ``j < n``: h, -h' and h'' of eq.
    (14) without the ``alpha`` term.  ``reassoc`` lets LLVM split the sums into vector lanes
    (the order is fixed by the compiled code: a run is reproducible on one machine)."""
    h = 0.0
    d1 = 0.0
    d2 = 0.0
    for j in range(n):
        v = vals[j]
        inv = 1.0 / (1.0 + v)
        w = v * inv
        h += v
        d1 += w
        d2 += w * inv * inv
    return h, d1, d2


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _v_step(v, delta):
    """``V(x - delta)`` from ``v = V(x)`` by Taylor's formula to fourth order, with the
    derivatives of V written in V (from ``V' = V/(1+V)``): ``V'' = V/(1+V)^3``, ``V''' =
    V (1-2V)/(1+V)^5``, ``V'''' = V (1 - 8V + 6V^2)/(1+V)^7``.  Every derivative is at most
    ``V'`` in size, so for ``|delta| <= _TAYLOR_SPAN`` the remainder is below ``V' |delta|^5
    / 120 < 1e-17 V'`` (``tests/prox/test_sdca_roots.py``)."""
    inv = 1.0 / (1.0 + v)
    i2 = inv * inv
    w = v * inv
    e2 = w * i2
    e3 = e2 * (1.0 - 2.0 * v) * i2
    e4 = e2 * (1.0 + v * (6.0 * v - 8.0)) * i2 * i2
    return v - delta * (w - delta * (0.5 * e2 - delta * (e3 * _SIXTH - delta * e4 * _TWENTYFOURTH)))


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _v_taylor(vals, n, delta):
    """``vals[j] = V(x_j)`` -> ``V(x_j - delta)`` by :func:`_v_step` (branch-free)."""
    for j in range(n):
        vals[j] = _v_step(vals[j], delta)


@njit(cache=True, error_model="numpy")
def _v_values(b, t, t_ref, ex, vals, near, n_near, cut, rough):
    """``vals[j] = V(b_j - t)``: the series from the anchored exponentials ``ex_j = e^{b_j -
    t_ref}`` for all j (``rough``: its degree-5 version), then the closed form for the listed
    ``near`` entries whose argument is at least ``SERIES_T_MAX``."""
    if rough:
        _series_values_rough(ex, math.exp(t_ref - t), b.shape[0], vals, cut)
    else:
        _series_values(ex, math.exp(t_ref - t), b.shape[0], vals, cut)
    for q in range(n_near):
        j = near[q]
        a = b[j] - t
        if a >= SERIES_T_MAX:
            vals[j] = lambertw_exp(a)


@njit(cache=True, error_model="numpy")
def _softmax_g(alpha, t, hs, d1, d2, tol):
    """``(g, g', g'', done, r)`` for :func:`_entropic_root` at t, from the sums ``(hs, d1,
    d2) = (S, -S', S'')`` over the entries: g is increasing with the root of eq. (14), ``done``
    says t is that root to rounding, and ``r^2 |delta|^3`` bounds the error left after a
    Halley step of length ``delta`` (its early exit).

    With ``Q = alpha - S``, eq. (14) says ``V(alpha - t) = Q``, i.e. ``V^{-1}(Q) = alpha - t``
    (``V^{-1}(v) = v + log v``), so the root is also that of

        g(t) = t - S + log Q,   g' = 1 + D1 (1 + 1/Q),   g'' = -D2 (1 + 1/Q) - (D1 / Q)^2

    (``D1 = -S'``, ``D2 = S''``): no Lambert W, one logarithm, which shortens the scalar chain
    after each pass (root 0.649 -> 0.629 us on bench sdca's problem, where ``Q / alpha =
    1 - s > 0.99``).  Near the root ``g ~ -(1 + 1/Q) h`` (h the residual of eq. (14),
    ``V^{-1}' = 1 + 1/v``), so h's tolerance carries over as ``(1 + 1/Q) tol`` (plus the
    rounding of ``t - S``).  Halley's error constant ``|g''^2 / (4 g'^2) - g''' / (6 g')|`` is
    below ``(1 + D1/Q)^2 = r^2``: every ``V^{(k)}`` is at most ``V'`` in size, which gives
    ``|g''| <= (1 + q) g'`` and ``|g'''| <= (1 + q)(1 + 2q) g'`` with ``q = D1 / Q <= g'``.

    Where ``Q`` is below ``_Q_LOG alpha`` (``1 - s`` small; Q then cancels) g is ``-h`` itself,
    ``h = V(alpha - t) + S - alpha`` with ``h' = -(D1 + V'(alpha - t))`` and ``h'' = D2 +
    V''(alpha - t)``; there ``|h'''| <= |h'|`` and ``|h''| <= |h'|`` give ``r = 1``.
    """
    Q = alpha - hs
    if Q > _Q_LOG * alpha:
        iq = 1.0 / Q
        c = 1.0 + iq
        q = d1 * iq
        g = (t - hs) + math.log(Q)
        done = abs(g) <= c * tol + 4.0 * _EPS * abs(t)
        return g, 1.0 + d1 * c, -d2 * c - q * q, done, 1.0 + q
    v = lambertw_exp(alpha - t)
    inv = 1.0 / (1.0 + v)
    w = v * inv
    h = (v - alpha) + hs
    return -h, d1 + w, -(d2 + w * inv * inv), abs(h) <= tol, 1.0


@njit(cache=True, error_model="numpy")
def _entropic_bracket(b, alpha, near, t_start, k_hint):
    """:func:`_entropic_root`'s bracket ``[lo, hi]`` (module docstring), whether a capped
    hint's ``t_start`` lies below it, and the entries that can leave the series range inside
    it (listed in ``near``); returns ``(mx, log alpha, m + 1, lo, hi, hint_below, n_near)``
    with ``mx = max(0, max b)``."""
    mb = b.shape[0]
    bmax = vmax(b, mb)
    big = max(alpha, bmax)
    la = math.log(alpha)
    nterms = mb + 1.0
    # widened by a few ulps: the root can sit on the computed lo (one dominant b_j, tiny alpha)
    slack = 8.0 * 2.220446049250313e-16 * (abs(big) + alpha + abs(la) + math.log(nterms))
    lo = big - alpha - la - slack
    hi = big - alpha / nterms - (la - math.log(nterms)) + slack
    # a capped hint's warm start (the top-k prox keeps the capped solution's t, which can lie
    # below the u = 0 root's bracket) is evaluated there all the same: its values decide
    hint_below = k_hint > 1.0 and lo - _ANCHOR_SPAN < t_start <= lo
    t_low = t_start if hint_below else lo  # no evaluation below it
    n_near = 0
    if bmax - t_low >= SERIES_T_MAX:
        for j in range(mb):
            if b[j] - t_low >= SERIES_T_MAX:
                near[n_near] = j
                n_near += 1
    return max(0.0, bmax), la, nterms, lo, hi, hint_below, n_near


@njit(cache=True, error_model="numpy")
def _entropic_root(b, alpha, vals, ex, near, t_start, k_hint):
    """Root ``t`` of ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0`` (TPAMI eq. (14)).

    Halley's method on the increasing g of :func:`_softmax_g` (the log form ``t - S + log(alpha
    - S)`` where ``1 - s`` is not small, else ``-h``; the sums ``S``, ``-S' = sum V/(1+V)`` and
    ``S'' = sum V/(1+V)^3`` are free once V is known) inside the bracket of the module
    docstring, with bisection as the safeguard.  It stops when the residual is at rounding
    level, ``|h| <= 4 (m+1) eps alpha`` or its image under the log form (a test on the step
    size alone can stall under rounding).  On return ``vals[j] = V(b_j - t)`` and ``ex[j] =
    e^{b_j - t_ref}`` (the last anchor, see below; the top-k entropic prox reuses them).
    Returns ``(t, status, t_ref, sums)`` with ``sums = (S, -S', S'')`` at t (the prox's
    consistency test and first capped candidate use them instead of another pass; after the
    early exit S comes by Taylor's formula from the last evaluation, within ``D1 |delta|^3 /
    6``; S' and S'', which only steer steps, to first order and as evaluated).  Scratch:
    ``ex`` (float) and ``near`` (int), length >= len(b).

    Cost (an SDCA update of lr_multi / topk_ent solves this once, ~3 Halley steps from the
    example's previous root): most arguments ``b_j - t`` lie below ``SERIES_T_MAX`` (mostly in
    [-17, -5] on the bench sdca problem), where V needs only ``e^{b_j - t} = ex_j e^{t_ref -
    t}`` with ``ex_j = e^{b_j - t_ref}`` computed at an anchor ``t_ref`` (moved when ``|t -
    t_ref| > _ANCHOR_SPAN``; every ``ex_j`` used then has ``b_j - t_ref < SERIES_T_MAX +
    _ANCHOR_SPAN``, far inside the clamp of :func:`~topkbench.prox.vecmath.exp_shifted`).
    The few entries that can leave the series range inside the bracket (``b_j >= lo +
    SERIES_T_MAX``: t stays above the initial ``lo``, or above a capped hint's ``t_start``
    below it, see below) are listed once in ``near`` and get the closed form; everything else
    runs as branch-free loops that LLVM vectorizes (the exponentials, the series and the three
    sums), with ``error_model="numpy"`` so that divisions carry no zero check.

    ``k_hint > 1`` (the top-k entropic prox with ``k = k_hint``; 0 turns it off): after the
    first evaluation from a warm start, if its values put the largest entry above the top-k
    cap, ``(k - 1) V_max > S - V_max`` (the prox's test for a capped solution, there at the
    root), the iteration stops with ``STATUS_CAPPED_HINT``: t is ``t_start``, ``ex`` holds
    ``e^{b_j - t_start}`` (``t_ref = t_start``), ``vals`` the rough values and the sums are
    theirs.  The prox then looks for its capped solution from there
    (:func:`~topkbench.losses.topk_entropy.topk_ent_prox`) and comes back for the root only
    if it finds none.  The warm start the prox keeps for a capped solution is that solution's
    t, which can lie below this root's bracket (the u = 0 root is then far, and unneeded): a
    ``t_start`` up to ``_ANCHOR_SPAN`` below ``lo`` is evaluated all the same when
    ``k_hint > 1`` (from where the step, if no hint, is clipped into the bracket).
    """
    mb = b.shape[0]
    mx, la, nterms, lo, hi, hint_below, n_near = _entropic_bracket(b, alpha, near, t_start,
                                                                   k_hint)  # fmt: skip
    # start from the root of this example's previous update when there is one (it moves
    # little between epochs), else from the softmax solution (exact as alpha -> 0)
    t = t_start
    t_ref = math.nan
    if not (lo < t < hi or hint_below):
        exp_shifted(b, mx, mb, ex, vals)
        # these exponentials are anchored at mx >= max b: the first evaluation reuses them
        # when t lands within _ANCHOR_SPAN of mx (a cold start then costs one exp pass)
        t_ref = mx
        acc = math.exp(-mx)
        for j in range(mb):
            acc += ex[j]
        t = mx + math.log(acc) - la
    if not (lo < t < hi or hint_below):
        t = 0.5 * (lo + hi)
    tol = 4.0 * nterms * 2.220446049250313e-16 * alpha
    cut = math.exp(SERIES_T_MAX)
    t_vals = math.nan  # vals[j] = V(b_j - t_vals)
    # the first evaluation (from the previous root) takes the rough series (~1.3e-10,
    # lambertw_series_rough): it only aims the first step, which is never the last one (its
    # values are not reused: the next evaluation is exact, without Taylor's shortcut)
    rough = lo < t_start < hi or hint_below
    for _it in range(NEWTON_MAX_ITER):
        shift = t - t_vals
        if abs(shift) <= _TAYLOR_SPAN:
            # a short step (the last ones before convergence): V moved by Taylor's formula,
            # branch-free for every entry, instead of the series and the closed forms
            _v_taylor(vals, mb, shift)
        else:
            if not abs(t - t_ref) <= _ANCHOR_SPAN:
                t_ref = t
                exp_shifted(b, t_ref, mb, ex, vals)
            _v_values(b, t, t_ref, ex, vals, near, n_near, cut, rough)
        t_vals = math.nan if rough else t
        hs, d1, d2 = _v_sums(vals, mb)
        if rough and k_hint > 1.0:
            v_max = vmax(vals, mb)
            if (k_hint - 1.0) * v_max > hs - v_max:
                return t, STATUS_CAPPED_HINT, t_ref, (hs, d1, d2)
        g, g1, g2, done, r = _softmax_g(alpha, t, hs, d1, d2, tol)
        if not rough:  # (a rough g may have the wrong sign near the root)
            if done:
                return t, STATUS_OK, t_ref, (hs, d1, d2)
            if g < 0.0:
                lo = t
            else:
                hi = t
        den = 2.0 * g1 * g1 - g * g2
        halley = den > 0.0
        if halley:
            t_new = t - 2.0 * g * g1 / den
        else:
            t_new = t - g / g1
        # the ends are allowed: a step at rounding level can land on one
        if not (lo <= t_new <= hi):
            t_new = 0.5 * (lo + hi)
            halley = False
        delta = t_new - t
        if rough:  # the next evaluation, at t_new (possibly t itself), is exact
            rough = False
            t = t_new
            continue
        if halley and delta * delta * abs(delta) * (r * r) <= _EPS * max(1.0, abs(t)):
            # Halley's error after this step is below r^2 |delta|^3 (_softmax_g), so t_new is
            # the root to rounding, and V at t_new is one Taylor step from V at t (_v_step).
            # Saves the evaluation that would only confirm it; also ends a step at rounding
            # level, where the residual's floor ~ ulp(t) |g'| can stay above the tolerance
            # when |t| is large.
            _v_taylor(vals, mb, delta)
            sums = (hs - delta * (d1 - 0.5 * delta * d2), d1 - delta * d2, d2)
            return t_new, STATUS_OK, t_ref, sums
        t = t_new
    return t, STATUS_ROOT_NOT_CONVERGED, t_ref, _v_sums(vals, mb)


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
