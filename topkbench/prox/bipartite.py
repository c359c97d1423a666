"""Euclidean projection onto the bipartite simplex B(r) (TPAMI, 002 §3.3 eq. (7), §5.3 eq. (17)).

Problem (17)::

    (p, pbar) = argmin_{x in R^m_+, y in R^n_+}  1/2 ||x - b||^2 + 1/2 ||y - bbar||^2
                s.t.  <1, x> = <1, y> <= r

It is the SDCA update of SVM^ML_gamma (Prop. 18, radius C) and the inner problem of the smooth
loss (Prop. 6, radius gamma).

KKT (our derivation; the paper states only the algorithm).  With a multiplier ``mu`` for
``<1,x> = <1,y>`` and ``nu >= 0`` for the radius, ``x = (b - t)_+`` and ``y = (bbar - s)_+``
with ``t = mu + nu``, ``s = -mu``, so ``t + s = nu >= 0`` and ``nu (<1,x> - r) = 0``.  Hence:

1. *radius active* (``nu > 0``): both blocks are separate knapsack projections with sum ``r``,
   thresholds ``t'``, ``s'``; this is the solution iff ``t' + s' >= 0`` (step 1 of §5.3);
2. *radius inactive* (``nu = 0``): ``s = -t`` with ``g(t) = sum (b - t)_+ - sum (bbar + t)_+ = 0``;
   ``g`` is non-increasing, so the root is found by variable fixing (steps 2-5) or by sorting.
   If ``max b + max bbar <= 0`` the solution is 0 (any ``t`` in ``[max b, -max bbar]``).

**Correction to TPAMI §5.3, step 5** (checked numerically, ``tests/prox/test_bipartite.py``):
on the free sets ``I_x``, ``I_y`` the candidate ``t`` equalizes ``sum_{I_x}(b - t)`` and
``sum_{I_y}(bbar + t)``, so ``g(t) = Delta_y - Delta_x``.  If ``Delta_x > Delta_y`` then
``g(t) < 0``, the root ``t* < t``, and it is the **y** variables in ``I_y^L`` that are certainly
zero at ``t*`` (``bbar_j + t* < bbar_j + t <= 0``) and may be fixed; if ``Delta_x < Delta_y`` the
x variables in ``I_x^L`` are.  The paper prints the opposite assignment ("If Delta_x > Delta_y,
update I_x ..."); implemented literally it stalls on most inputs: step 5 then removes an
empty set and steps 2-5 repeat forever at a ``t`` that is not a root (1,952 of 2,000 small
random problems in the check of ``tests/prox/test_bipartite.py``).  With the corrected
rule each non-final pass removes at least one index (the side fixed has a strictly negative
Delta), so the loop ends after at most ``m + n`` passes; in practice a handful.

The sorting baseline (Shalev-Shwartz & Singer, TPAMI ref. [60]) sorts both blocks and walks
the merged breakpoints of ``g`` downwards.  Both return the thresholds ``(t, s)`` and leave
applying them to the caller (STYLE.md, "Numerical kernels").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from topkbench.prox.projections import _fix_variables_knapsack

METHOD_VARIABLE_FIXING = 0
METHOD_SORTING = 1


@njit(cache=True)
def _equal_sum_variable_fixing(b, bb, ix, nx, iy, ny, offset):
    """Root ``t`` of ``sum (b - t)_+ = sum (bbar + offset + t)_+`` by variable fixing (corrected
    step 5) over the free sets ``ix[:nx]``, ``iy[:ny]``.

    Assumes ``max b + max bbar > 0`` (a solution with positive mass), which keeps both free
    sets non-empty, and that every index outside the free sets is zero at the root.  Returns
    ``(t, nx, ny)``: the free sets left in ``ix[:nx]``, ``iy[:ny]`` hold every index that is
    positive at ``t`` (and possibly some at zero).
    """
    sx = 0.0
    for p in range(nx):
        sx += b[ix[p]]
    sy = 0.0
    for p in range(ny):
        sy += bb[iy[p]] + offset
    while True:
        t = (sx - sy) / (nx + ny)
        dx = 0.0
        for p in range(nx):
            v = b[ix[p]] - t
            if v <= 0.0:
                dx += v
        dy = 0.0
        for p in range(ny):
            v = bb[iy[p]] + offset + t
            if v <= 0.0:
                dy += v
        if dx == dy:
            return t, nx, ny
        if dx > dy:  # g(t) < 0: t* < t, y's with bbar + t <= 0 are zero at t*
            size = 0
            for p in range(ny):
                j = iy[p]
                if bb[j] + offset + t > 0.0:
                    iy[size] = j
                    size += 1
                else:
                    sy -= bb[j] + offset
            ny = size
        else:  # g(t) > 0: t* > t, x's with b - t <= 0 are zero at t*
            size = 0
            for p in range(nx):
                j = ix[p]
                if b[j] - t > 0.0:
                    ix[size] = j
                    size += 1
                else:
                    sx -= b[j]
            nx = size
        if nx + ny == 0:  # unreachable when max b + max bbar > 0; keeps the loop total
            return t, nx, ny


@njit(cache=True)
def _candidates(b, r, idx):
    """Put into ``idx`` the indices with ``b_j > max b - r``, the only ones that can be positive
    in the projection onto B(r), and return their count and ``max b``.

    Both blocks' sums are at most r, and the largest entry alone contributes ``max b - t``, so
    ``t >= max b - r`` whether the radius binds (``sum = r``) or not (``sum < r``, and then
    ``t > max b - r``); an entry at or below that is 0.  With many negatives far below the
    largest (SVM^ML with hundreds of labels), the variable fixing then starts from a few."""
    mx = -np.inf
    for j in range(b.shape[0]):
        if b[j] > mx:
            mx = b[j]
    cut = mx - r
    size = 0
    for j in range(b.shape[0]):
        if b[j] > cut:
            idx[size] = j
            size += 1
    return size, mx


@njit(cache=True)
def bipartite_thresholds(b, bb, r, ix, iy, offset=0.0):
    """Thresholds ``(t, s)`` of the projection of ``(b, bbar + offset)`` onto ``B(r)``
    (``r > 0``): ``p = (b - t)_+``, ``pbar = (bbar - s)_+``.  Variable fixing, no sorting (TPAMI
    §5.3), from the entries within ``r`` of each block's largest (:func:`_candidates`; see
    :func:`bipartite_from_candidates`).

    ``offset``: the problem depends on the two blocks only through their relative position, so
    callers whose entries are huge next to ``r`` (SDCA with ``C ||x||^2`` tiny, the smooth loss
    with tiny gamma) pass each block shifted to a maximum of 0 and the sum of the two shifts as
    ``offset``; then ``(b - t)_+`` keeps full relative accuracy (unshifted, ``b - t`` would cancel
    to rounding noise of size ``eps max|b|`` while the answer is of size ``r``).

    ``ix`` and ``iy`` are integer work arrays of lengths ``>= len(b)``, ``>= len(bbar)``.
    """
    nx, mx = _candidates(b, r, ix)
    ny, my = _candidates(bb, r, iy)
    t, s, _, _ = bipartite_from_candidates(b, bb, r, ix, nx, iy, ny, offset, mx, my)
    return t, s


@njit(cache=True)
def bipartite_from_candidates(b, bb, r, ix, nx, iy, ny, offset, mx, my):
    """Thresholds ``(t, s, nx, ny)`` of the projection of ``(b, bbar + offset)`` onto ``B(r)``,
    given candidate sets ``ix[:nx]`` (indices into ``b``) and ``iy[:ny]`` (into ``bbar``) that
    hold every entry within ``r`` of its block's largest, and those largest ``mx``, ``my``.  On
    return ``ix[:nx]``, ``iy[:ny]`` hold every index that is positive in the projection.  ``b``
    and ``bbar`` may be one array, indexed by the two sets.

    Step 1 solves the two knapsacks with sum ``r`` by variable fixing
    (:func:`~topkbench.prox.projections._fix_variables_knapsack`).  If the radius is inactive,
    the equal-sum root satisfies ``t* > t'`` and ``-t* > s'`` (TPAMI App. C.6), so the indices
    fixed at zero in step 1 stay zero, and steps 2-5 start from the step-1 supports instead
    of all indices.
    """
    t1, nx = _fix_variables_knapsack(b, ix, nx, r)
    s1, ny = _fix_variables_knapsack(bb, iy, ny, r)  # threshold on bbar; on bbar + offset: + offset
    if t1 + s1 + offset >= 0.0:
        return t1, s1, nx, ny
    if mx + my + offset <= 0.0:
        return mx, -mx - offset, 0, 0  # both blocks 0, and t + s = 0 (nu = 0) as KKT asks
    # equal sums (the offset is moderate here: the radius is inactive, so it is below the
    # spread that step 1 resolved)
    t, nx, ny = _equal_sum_variable_fixing(b, bb, ix, nx, iy, ny, offset)
    return t, -t - offset, nx, ny


@njit(cache=True)
def _simplex_threshold_sorted(bs, r):
    """Threshold of the knapsack ``sum (b - t)_+ = r`` from ``bs`` = b sorted descending."""
    acc = 0.0
    t = bs[0] - r
    for j in range(bs.shape[0]):
        acc += bs[j]
        cand = (acc - r) / (j + 1)
        if bs[j] > cand:
            t = cand
        else:
            break
    return t


@njit(cache=True)
def bipartite_thresholds_sorted(b, bb, r, xs, ys):
    """As :func:`bipartite_thresholds`, by sorting (the baseline of TPAMI Table 2, ref. [60]).

    ``xs`` and ``ys`` are float work arrays of lengths ``>= len(b)``, ``>= len(bbar)``.
    """
    nx = b.shape[0]
    ny = bb.shape[0]
    for j in range(nx):
        xs[j] = -b[j]
    xs[:nx].sort()
    for j in range(nx):
        xs[j] = -xs[j]
    for j in range(ny):
        ys[j] = -bb[j]
    ys[:ny].sort()
    for j in range(ny):
        ys[j] = -ys[j]
    t1 = _simplex_threshold_sorted(xs[:nx], r)
    s1 = _simplex_threshold_sorted(ys[:ny], r)
    if t1 + s1 >= 0.0:
        return t1, s1
    if xs[0] + ys[0] <= 0.0:
        return xs[0], -xs[0]
    # walk t downwards over the merged breakpoints {b_j} and {-bbar_j}; between breakpoints
    # g(t) = (sx - i t) - (sy + jy t) with i active x's and jy active y's
    i = 0
    q = ny  # y's with bbar_j + t > 0: ys[:q] (all of them for t above every breakpoint)
    sx = 0.0
    sy = 0.0
    for j in range(ny):
        sy += ys[j]
    while True:
        has_x = i < nx
        has_y = q > 0
        if not has_x and not has_y:
            break
        if has_x and (not has_y or xs[i] >= -ys[q - 1]):
            bp = xs[i]
            is_x = True
        else:
            bp = -ys[q - 1]
            is_x = False
        if (sx - i * bp) - (sy + q * bp) >= 0.0:
            break
        if is_x:
            sx += xs[i]
            i += 1
        else:
            q -= 1
            sy -= ys[q]
    t = (sx - sy) / (i + q)
    return t, -t


@njit(cache=True)
def bipartite_thresholds_by(method, b, bb, r, iwork_x, iwork_y, fwork_x, fwork_y):
    if method == METHOD_SORTING:
        return bipartite_thresholds_sorted(b, bb, r, fwork_x, fwork_y)
    return bipartite_thresholds(b, bb, r, iwork_x, iwork_y)


def project_bipartite(
    b: np.ndarray, bbar: np.ndarray, r: float, method: str = "variable_fixing"
) -> tuple[np.ndarray, np.ndarray]:
    """Projection of ``(b, bbar)`` onto ``B(r)`` (eq. (17)) as arrays ``(p, pbar)``.

    ``method`` is ``"variable_fixing"`` (TPAMI §5.3, corrected step 5) or ``"sorting"``.
    """
    b = np.ascontiguousarray(b, dtype=np.float64)
    bb = np.ascontiguousarray(bbar, dtype=np.float64)
    if b.size == 0 or bb.size == 0:
        return np.zeros_like(b), np.zeros_like(bb)
    code = METHOD_SORTING if method == "sorting" else METHOD_VARIABLE_FIXING
    t, s = bipartite_thresholds_by(
        code,
        b,
        bb,
        float(r),
        np.empty(b.size, np.int64),
        np.empty(bb.size, np.int64),
        np.empty(b.size),
        np.empty(bb.size),
    )
    return np.maximum(b - t, 0.0), np.maximum(bb - s, 0.0)


@njit(cache=True)
def project_batch(method, data, r, out):
    """Thresholds of the projection of every row of ``data`` onto ``B(r)``, the row split into
    ``b = row[:d/2]`` and ``bbar = row[d/2:]``; ``out[q] = (t, s)``.  One compiled loop, so
    that ``topkbench bench bipartite`` times the algorithms, not the call overhead."""
    half = data.shape[1] // 2
    rest = data.shape[1] - half
    ix = np.empty(half, np.int64)
    iy = np.empty(rest, np.int64)
    fx = np.empty(half)
    fy = np.empty(rest)
    for q in range(data.shape[0]):
        row = data[q]
        t, s = bipartite_thresholds_by(method, row[:half], row[half:], r, ix, iy, fx, fy)
        out[q, 0] = t
        out[q, 1] = s
