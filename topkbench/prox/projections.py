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


@njit(cache=True)
def _fix_variables_knapsack(b, idx, size, r):
    """Variable fixing for ``sum_{j in S} (b_j - t) = r`` over the support in ``idx[:size]``.

    Returns ``(t, size)``; ``idx[:size]`` holds the final support (entries with b_j > t).
    """
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
