"""Top-k entropy: the loss (TPAMI 002 Prop. 4, Prop. 17) and the SDCA prox (Props. 15-16,
eqs. (11)-(14)); DESIGN §4.2.

Notation: ``n`` coordinates (the m-1 classes other than the label), ``x`` in the top-k simplex
Delta_k^alpha, ``s = <1, x>``, ``U = {j : x_j = s/k}`` (always the |U| largest entries of the
input, TPAMI §5.2), ``M`` the rest, ``rho = |U|/k`` (the paper's rho; not the projection bias).

**Loss (Prop. 17).**  ``L(a) = max_{x in Delta_k^alpha} <a,x> - <x, log x> - (1-s) log(1-s)``.
For a candidate ``u = |U|`` everything is closed form; we evaluate it in the log domain
(``log Z`` by log-sum-exp, ``log Q = (1-rho) log(1-rho) - rho log k - (1-rho) log Z - A``,
``s = sigmoid(-log Q)``, ``1 - s = sigmoid(log Q)``, ``t = log Z + log(1+Q) - log(1-rho)``) so
that scores of any magnitude neither overflow nor cancel.  A candidate is accepted when it is
consistent with its partition (``a_j - t >= log(s/k)`` on U, ``<=`` on M); by strict concavity
the consistent candidate is the maximizer.  ``u = k`` is possible only when ``n = k`` (every
coordinate capped); then ``s = sigmoid(A + log k)`` and ``L = log(1 + k e^A)`` with
``A = sum_j a_j / k``.

**Prox (Prop. 15-16).**  ``min_{x in Delta_k^alpha} alpha/2 (<x,x> + s^2) - <b,x> + <x, log x> +
(1-s) log(1-s)``.  For ``u = 0`` this is eq. (14) (:func:`~topkbench.prox.roots.
_entropic_root`).  The candidates ``u >= 1`` (the paper's 2x2 system (13), reduced to one
scalar equation in t, and the search for the consistent U) are in
:mod:`topkbench.losses.topk_entropy_capped`.  Of the candidates ``u = 0, 1, ..., k-1`` the
consistent one is optimal (strict convexity).
``u = k`` (``n = k``) has ``x = (s/k) 1`` and ``s = sigmoid(w)`` with ``w + alpha (1 + 1/k)
sigmoid(w) - B/k - log k = 0``, the logistic dual equation. As ``alpha -> 0`` the prox becomes
the maximizer of Prop. 17 with ``a = b``, which is used below ``alpha = 1e-16`` (see
``ALPHA_TINY``; this also covers zero-norm examples, DESIGN §4.3).  With a warm start whose
first (rough) evaluation already puts the largest entry above the cap, the capped search
starts there and the ``u = 0`` root runs only if it finds no consistent set (the capped hint,
:func:`topk_ent_prox`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from topkbench.losses.topk_entropy_capped import (
    _CONSISTENCY_TOL,
    GUESS_EXACT,
    GUESS_ROUGH,
    _capped_output,
    _capped_search,
)
from topkbench.prox.roots import (
    STATUS_CAPPED_HINT,
    STATUS_OK,
    _entropic_root,
    _logistic_dual_root,
    _sigmoid,
)
from topkbench.prox.topk import sort_descending
from topkbench.prox.vecmath import vmax, vsum

# Below this alpha the prox is the alpha = 0 solution (Prop. 17 with a = b) to double precision:
# the alpha-terms enter the stationarity conditions as alpha x_j and alpha (1 - s), both at most
# alpha, so they move every log x_j (and log(1 - s)) by less than 2 alpha < eps relative.
ALPHA_TINY = 1e-16


@njit(cache=True)
def _softplus(z):
    """log(1 + e^z) without overflow."""
    if z > 0.0:
        return z + math.log1p(math.exp(-z))
    return math.log1p(math.exp(z))


@njit(cache=True)
def _logsumexp_range(v, lo, hi):
    mx = v[lo]
    for j in range(lo, hi):
        if v[j] > mx:
            mx = v[j]
    acc = 0.0
    for j in range(lo, hi):
        acc += math.exp(v[j] - mx)
    return mx + math.log(acc)


@njit(cache=True)
def topk_ent_solve_sorted(as_, k):
    """Prop. 17 on ``as_`` sorted descending: returns ``(loss, t, log_cap, u)``.

    The maximizer is ``x_j = exp(min(a_j - t, log_cap))`` with ``log_cap = log(s/k)``.
    """
    n = as_.shape[0]
    kf = float(k)
    best_u = 0
    best_v = math.inf
    best = (0.0, 0.0, 0.0)
    head = 0.0  # sum of the u largest entries
    for u in range(min(k, n)):
        if u > 0:
            head += as_[u - 1]
        rho = u / kf
        om = 1.0 - rho
        A = head / kf
        log_z = _logsumexp_range(as_, u, n)
        log_q = -rho * math.log(kf) - om * log_z - A
        if u > 0:
            log_q += om * math.log(om)
        sp_q = _softplus(log_q)  # log(1 + Q)
        t = log_z + sp_q - math.log(om)
        log_cap = -sp_q - math.log(kf)  # log(s/k)
        viol = as_[u] - t - log_cap
        if u > 0:
            viol = max(viol, log_cap - (as_[u - 1] - t))
        if viol < best_v:
            best_v = viol
            best_u = u
            s = _sigmoid(-log_q)
            if u == 0:
                loss = _softplus(log_z)
            else:
                log1ms = -_softplus(-log_q)  # log(1 - s)
                loss = s * (A + om * t - rho * log_cap) - math.exp(log1ms) * log1ms
            best = (loss, t, log_cap)
        if viol <= _CONSISTENCY_TOL * (1.0 + abs(t)):
            return best[0], best[1], best[2], u
    if n == k:
        # every coordinate capped: x = (s/k) 1, s = sigmoid(A + log k)
        A = (head + as_[n - 1]) / kf
        z = A + math.log(kf)
        s = _sigmoid(z)
        log_cap = math.log(s) - math.log(kf)
        # x_j = exp(min(a_j - t, log_cap)) = s/k needs t <= min_j a_j - log_cap
        return _softplus(z), as_[n - 1] - log_cap, log_cap, k
    return best[0], best[1], best[2], best_u


@njit(cache=True)
def topk_ent_loss(a, k, work):
    """Top-k Ent loss (Prop. 4 / 17) of ``a = (f_j - f_y)_{j != y}``; ``work`` is scratch."""
    n = a.shape[0]
    as_ = work[:n]
    sort_descending(a, as_)
    loss, _, _, _ = topk_ent_solve_sorted(as_, k)
    return loss


@njit(cache=True)
def topk_ent_prox(b, alpha, k, out, vals, srt, near, ex, tmp, pos, t_start):
    """Solve eq. (11) for ``b`` (length n), writing ``x`` into ``out`` (``out`` may be ``b``).

    ``vals``, ``srt``, ``ex``, ``tmp``, ``pos`` (float) and ``near`` (int) are scratch arrays
    (length >= n; ``pos`` >= min(n, _LAZY_MAX + 1), with ``_LAZY_MAX`` of
    :mod:`~topkbench.losses.topk_entropy_capped`); ``t_start`` warm-starts the search (NaN
    for none).  Returns ``(t0, status, s)`` where ``t0`` is the warm start to keep for the next
    call (the ``u = 0`` root, or for a capped solution the root of its set U; NaN when there is
    none) and ``s = sum x`` (the SDCA block needs it).

    A capped hint (``1 < k < n``): the first, rough evaluation of the ``u = 0`` root at
    ``t_start`` tests whether the largest entry is above the cap there
    (:func:`~topkbench.prox.roots._entropic_root`, ``k_hint``).  If it is, the capped
    candidates start from that point (one Halley step aimed from the rough sums, then full
    evaluations: ``GUESS_ROUGH``) and the ``u = 0`` root is skipped; it is run only if they
    find no consistent set.  With the capped solution's t kept as the warm start, an example
    that stays capped between SDCA epochs (most examples do after the first few epochs) skips
    the root's exact evaluation.  When
    ``1 - s`` is below rounding level (huge b) the computed ``sum x`` can exceed 1 by a few
    ulps; ``x`` is then scaled onto ``sum x = 1`` (which keeps every cap ``x_j <= s/k``), so
    the result is always in the domain.
    """
    t0, status = _topk_ent_prox_raw(b, alpha, k, out, vals, srt, near, ex, tmp, pos, t_start)
    n = b.shape[0]
    total = vsum(out, n)
    if total > 1.0:
        for j in range(n):
            out[j] /= total
        total = vsum(out, n)
    return t0, status, total


@njit(cache=True)
def _topk_ent_prox_raw(b, alpha, k, out, vals, srt, near, ex, tmp, pos, t_start):
    n = b.shape[0]
    kf = float(k)
    if alpha < ALPHA_TINY:
        bs = srt[:n]
        sort_descending(b, bs)
        _, t, log_cap, _ = topk_ent_solve_sorted(bs, k)
        for j in range(n):
            out[j] = math.exp(min(b[j] - t, log_cap))
        return math.nan, STATUS_OK
    k_hint = kf if 1 < k < n else 0.0
    t0, status, t_ref0, sums0 = _entropic_root(b, alpha, vals, srt, near, t_start, k_hint)
    hinted = status == STATUS_CAPPED_HINT
    if hinted:
        # the warm start's values put the largest entry above the cap (roots._entropic_root,
        # k_hint): the capped candidates start there, from the root's exponentials anchored
        # at t_start, without the u = 0 root; back to the root if they find no solution
        found, u, ks, best_t, best_s, status, anchor, anchor_lo, lazy = _capped_search(
            b, alpha, k, vals, srt, ex, tmp, pos, t_start, t_ref0, GUESS_ROUGH, math.nan, sums0
        )  # fmt: skip
        if found:
            _capped_output(
                b, alpha, k, out, vals, srt, ex, tmp, pos, True, u, ks, best_t, best_s, anchor,
                anchor_lo, lazy,
            )  # fmt: skip
            return best_t, status
        t0, status, t_ref0, sums0 = _entropic_root(b, alpha, vals, srt, near, t_start, 0.0)
    consistent = k == 1
    v_top = math.nan  # V(max_j b_j - t0), the largest of the root's values
    if not consistent:
        v_top = vmax(vals, n)
        consistent = kf * max(0.0, v_top) <= sums0[0] * (1.0 + _CONSISTENCY_TOL)
    if consistent:
        for j in range(n):
            out[j] = vals[j] / alpha
        return t0, status
    found, u, ks, best_t, best_s, status, anchor, anchor_lo, lazy = _capped_search(
        b, alpha, k, vals, srt, ex, tmp, pos, t0, t_ref0, GUESS_EXACT, v_top, sums0
    )  # fmt: skip
    bs = tmp[:n]
    if not found and n == k:
        # x = (s/k) 1 with s = sigmoid(w), w + alpha (1 + 1/k) sigmoid(w) - B/k - log k = 0
        B = 0.0
        for j in range(n):
            B += bs[j]
        w, st = _logistic_dual_root(-B / kf - math.log(kf), alpha * (1.0 + 1.0 / kf), 0.0)
        s = _sigmoid(w)
        for j in range(n):
            out[j] = s / kf
        return t0, st
    _capped_output(
        b, alpha, k, out, vals, srt, ex, tmp, pos, found, u, ks, best_t, best_s, anchor,
        anchor_lo, lazy,
    )  # fmt: skip
    return best_t if found else t0, status


def prox(b, alpha: float, k: int) -> np.ndarray:
    """Convenience wrapper (allocates) of :func:`topk_ent_prox` for tests and benchmarks."""
    b = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty_like(b)
    topk_ent_prox(
        b, float(alpha), int(k), out, np.empty_like(b), np.empty_like(b),
        np.empty(b.shape[0], dtype=np.int64), np.empty_like(b), np.empty_like(b),
        np.empty_like(b), math.nan,
    )  # fmt: skip
    return out


def loss(a, k: int) -> float:
    a = np.ascontiguousarray(a, dtype=np.float64)
    return float(topk_ent_loss(a, int(k), np.empty_like(a)))
