"""Euclidean (biased) projections onto the effective domains of conjugate losses.

Each projection returns its *threshold* and lets the caller apply it (``x = max(b - t, 0)``),
so that smoothed losses can use <x, p> and <p, p> without forming ``p`` (STYLE.md,
"Numerical kernels").

Problems solved here (TPAMI, 002 §5.2, Prop. 14; NIPS, 001 §4):

* ``simplex_threshold``: the continuous quadratic knapsack
  ``argmin_x ||x - b||^2  s.t.  x >= 0, <1, x> = r`` (projection onto the face of the simplex),
  by the variable fixing algorithm of Michelot / Kiwiel (TPAMI ref. [65]): keep a candidate
  support ``S``, set ``t = (sum_S b - r) / |S|``, drop every ``j`` with ``b_j <= t``, repeat.
  ``t`` increases monotonically, so indices dropped once never come back; no sorting is needed
  and in practice very few passes are made.

* ``simplex_biased_threshold``: ``argmin_x ||x - b||^2 + rho <1, x>^2  s.t.  x >= 0, <1,x> <= r``
  with ``rho >= 0`` (the SDCA update of SVM^Multi_gamma, Prop. 14 with k = 1).
  Derivation (written out because the paper only states it): the KKT conditions are
  ``x_j = max(0, b_j - t)`` with ``t = rho s + mu``, ``s = <1, x>``, ``mu >= 0``,
  ``mu (s - r) = 0``.  Case ``mu = 0``: ``t = rho sum_j (b_j - t)_+``, whose right side
  decreases in ``t``; with support ``S``, ``t = rho sum_S b / (1 + rho |S|)``, found by the
  same variable fixing (start from ``S = {b_j > 0}``; removing ``b_j <= t`` can only increase
  the root).  If the resulting ``s <= r`` it is optimal.  Otherwise ``s = r`` and ``t`` is the
  knapsack threshold above; ``mu = t - rho r >= 0`` holds because the knapsack ``t`` exceeds
  the case-1 ``t`` (``sum (b - t)_+`` is decreasing and is ``> r`` at the case-1 root).

All functions take a caller-owned integer work array ``idx`` of length >= len(b), so the SDCA
inner loop allocates nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# below this many entries variable fixing's few passes cost less than Condat's branchy one
_CONDAT_MIN_SIZE = 32


@njit(cache=True)
def _condat_support(b, idx, size, r):
    """Condat's one-pass search for the support of ``sum_{j in S} (b_j - t)_+ = r`` over the
    indices ``idx[:size]``; compacts the support found into ``idx[:size']`` and returns
    ``size'``.

    (L. Condat, "Fast projection onto the simplex and the l1 ball", Math. Program. 158, 2016,
    Alg. 3; our implementation.)  A running set ``v`` with its threshold ``rho = (sum_v b -
    r)/|v|`` takes each entry above ``rho``; an entry that alone exceeds ``rho + r`` restarts
    ``v`` from itself and parks the old ``v`` (whose entries may still qualify) in ``vt``;
    after the pass ``vt``'s entries above ``rho`` rejoin, and entries at or below ``rho`` are
    dropped until none is.  Every update moves ``rho`` towards the root from below, so the
    result is exactly the support in exact arithmetic; in practice one pass plus a short
    clean-up, where variable fixing alone repeats full passes over a support that shrinks
    slowly (hundreds of negatives against a few positives in SVM^ML).

    The running threshold is kept as its numerator ``S - r`` (``S`` the sum over ``v``) and
    the count ``c`` of ``v``, and each test ``y > rho`` is made as ``c y > S - r``: the pass's
    chain of dependent operations is then one addition per entry, not one division.

    In place: ``vt`` is kept in ``idx[:nvt]`` and ``v`` right after it; both hold only
    entries already read, so they never overtake the read position.  Returns -1 if an entry
    is NaN (a NaN fails every test and would be dropped; the caller's threshold must be NaN,
    as variable fixing's is)."""
    j0 = idx[0]
    num = b[j0] - r  # S - r over v
    nan = b[j0] != b[j0]
    nvt = 0
    nv = 1
    for p in range(1, size):
        j = idx[p]
        y = b[j]
        nan |= y != y
        if y * nv > num:
            num += y
            if num > (nv + 1) * (y - r):
                idx[nvt + nv] = j
                nv += 1
            else:
                nvt += nv
                idx[nvt] = j
                nv = 1
                num = y - r
    if nan:
        return -1
    if nvt > 0:
        kept = 0
        for p in range(nvt):
            j = idx[p]
            y = b[j]
            if y * nv > num:
                nv += 1
                num += y
                idx[kept] = j
                kept += 1
        for p in range(nv - kept):
            idx[kept + p] = idx[nvt + p]
    while True:
        kept = 0
        count = nv
        for p in range(nv):
            j = idx[p]
            y = b[j]
            if y * count > num:
                idx[kept] = j
                kept += 1
            elif count > 1:
                count -= 1
                num -= y
        if kept == nv or kept == 0:  # 0: only by rounding (the largest entry always stays)
            return nv
        nv = kept


@njit(cache=True)
def _fix_variables_knapsack(b, idx, size, r):
    """Variable fixing for ``sum_{j in S} (b_j - t) = r`` over the support in ``idx[:size]``.

    Returns ``(t, size)``; ``idx[:size]`` holds the final support (entries with b_j > t).
    Large sets first go through :func:`_condat_support`; the loop here then confirms its
    support (one pass when it is exact) and sets ``t`` from the sum over it, so rounding in
    Condat's running threshold never reaches the result.
    """
    if size > _CONDAT_MIN_SIZE and r < np.inf:  # r = inf: every entry, t = -inf
        found = _condat_support(b, idx, size, r)
        if found < 0:
            return np.nan, size
        size = found
    t = 0.0
    while True:
        total = 0.0
        for p in range(size):
            total += b[idx[p]]
        t = (total - r) / size
        new_size = 0
        for p in range(size):
            j = idx[p]
            if b[j] > t:
                idx[new_size] = j
                new_size += 1
        if new_size == size or new_size == 0:
            return t, size
        size = new_size


@njit(cache=True)
def simplex_threshold(b: np.ndarray, r: float, idx: np.ndarray) -> float:
    """Threshold ``t`` with ``sum_j max(b_j - t, 0) = r`` (``r > 0``).

    The projection of ``b`` onto ``{x >= 0, <1, x> = r}`` is ``max(b - t, 0)``.
    """
    m = b.shape[0]
    for j in range(m):
        idx[j] = j
    t, _ = _fix_variables_knapsack(b, idx, m, r)
    return t


@njit(cache=True)
def simplex_biased_threshold(b: np.ndarray, rho: float, r: float, idx: np.ndarray) -> float:
    """Threshold ``t`` of ``argmin_{x >= 0, <1,x> <= r} ||x - b||^2 + rho <1,x>^2``.

    The solution is ``x = max(b - t, 0)``; ``t >= 0``.  ``rho = 0`` gives the plain projection
    onto the simplex of radius ``r``.  See the module docstring for the derivation.
    """
    m = b.shape[0]
    size = 0
    for j in range(m):
        if b[j] > 0.0:
            idx[size] = j
            size += 1
    if size == 0:
        return 0.0
    # case mu = 0: t = rho * sum_S b / (1 + rho |S|)
    t = 0.0
    while True:
        total = 0.0
        for p in range(size):
            total += b[idx[p]]
        t = rho * total / (1.0 + rho * size)
        new_size = 0
        for p in range(size):
            j = idx[p]
            if b[j] > t:
                idx[new_size] = j
                new_size += 1
        if new_size == size:
            break
        size = new_size
        if size == 0:
            return t
    s = total - size * t
    if s <= r:
        return t
    # case <1, x> = r; the knapsack threshold exceeds the case-1 one, so the current
    # support is a superset of the final one and variable fixing can continue from it
    t, _ = _fix_variables_knapsack(b, idx, size, r)
    return t


@njit(cache=True)
def apply_threshold(b: np.ndarray, t: float, out: np.ndarray) -> float:
    """``out = max(b - t, 0)``; returns ``<1, out>``."""
    s = 0.0
    for j in range(b.shape[0]):
        v = b[j] - t
        if v > 0.0:
            out[j] = v
            s += v
        else:
            out[j] = 0.0
    return s
