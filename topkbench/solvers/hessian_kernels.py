"""Compiled assembly of Newton's Hessian from per-example Hessians that live on a few classes
(:mod:`topkbench.solvers.newton_steps`).

``I + C sum_i w_i H_i (x) x_i x_i^T`` in the class-major order ``vec(W)[c d + j] = W[j, c]``:
example i adds ``w_i h_i[c, c'] x_i x_i^T`` to the ``d x d`` block (c, c') for each pair of
classes in its support.  For the hinges the support is the dual block's (a handful of the m
classes), so the assembly costs ``sum_i |T_i|^2 d^2 / 2`` flops, against ``n (d m)^2`` for
a product over all class pairs.

The coefficients are first grouped by class pair (:func:`pair_coefficients`); each block is
then ``X_P^T diag(h_P) X_P`` over the examples P that touch the pair.  A block with enough
work (:data:`BLAS_MIN_WORK` multiply-adds) is one BLAS product, which runs several times
faster per flop than compiled loops; the many small blocks of a wide label space with narrow
features are summed in compiled loops (:func:`add_small_blocks`), where a call per block
would cost more than its arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# a class pair's block ``|P| d^2`` multiply-adds from which one BLAS call (some microseconds)
# beats the compiled loops
BLAS_MIN_WORK = 16_000


@njit(cache=True)
def pair_coefficients(w, tptr, tidx, hptr, hvals, m):
    """The nonzero coefficients ``w_i h_i[c, c']`` (``c <= c'``) grouped by class pair:
    ``(ptr, rows, vals)``, pair ``p = c m + c'`` holding the examples
    ``rows[ptr[p]:ptr[p + 1]]`` (in order) and their coefficients.  ``h_i`` is the row-major
    ``|T_i| x |T_i|`` block at ``hvals[hptr[i]:]`` over the classes
    ``tidx[tptr[i]:tptr[i+1]]``."""
    n = tptr.shape[0] - 1
    ptr = np.zeros(m * m + 1, dtype=np.int64)
    for sweep in range(2):
        if sweep == 1:
            for p in range(m * m):
                ptr[p + 1] += ptr[p]
            fill = ptr[:-1].copy()
            rows = np.empty(ptr[-1], dtype=np.int64)
            vals = np.empty(ptr[-1])
        for i in range(n):
            lo, t, base = tptr[i], tptr[i + 1] - tptr[i], hptr[i]
            if w[i] == 0.0:
                continue
            for p in range(t):
                c = tidx[lo + p]
                for q in range(t):
                    c2 = tidx[lo + q]
                    h = hvals[base + p * t + q]
                    if c2 < c or h == 0.0:
                        continue
                    slot = c * m + c2
                    if sweep == 0:
                        ptr[slot + 1] += 1
                    else:
                        rows[fill[slot]] = i
                        vals[fill[slot]] = w[i] * h
                        fill[slot] += 1
    return ptr, rows, vals


@njit(cache=True)
def add_small_blocks(Xd, ptr, rows, vals, small, H):
    """Add the blocks of the pairs flagged in ``small`` to ``H`` (both (c, c') and its mirror
    (c', c)), each summed in a ``d x d`` buffer that stays in cache."""
    d = Xd.shape[1]
    m = H.shape[0] // d
    block = np.empty((d, d))
    for p in range(m * m):
        if not small[p] or ptr[p + 1] == ptr[p]:
            continue
        c, c2 = p // m, p % m
        block[:] = 0.0
        for j in range(ptr[p], ptr[p + 1]):
            i, v = rows[j], vals[j]
            for r in range(d):
                vr = v * Xd[i, r]
                for u in range(d):
                    block[r, u] += vr * Xd[i, u]
        for r in range(d):
            for u in range(d):
                H[c * d + r, c2 * d + u] += block[r, u]
                if c2 != c:
                    H[c2 * d + u, c * d + r] += block[r, u]


def assemble_support_hessian(Xd, w, tptr, tidx, hptr, hvals, H):
    """Add ``w_i h_i[c, c'] x_i x_i^T`` to the blocks (c, c') and (c', c) of ``H`` (``dm x
    dm``) for the pairs of classes in each example's support (module docstring)."""
    d = Xd.shape[1]
    m = H.shape[0] // d
    ptr, rows, vals = pair_coefficients(w, tptr, tidx, hptr, hvals, m)
    large = np.diff(ptr) * (d * d) >= BLAS_MIN_WORK
    add_small_blocks(Xd, ptr, rows, vals, ~large, H)
    for p in np.flatnonzero(large):
        c, c2 = divmod(int(p), m)
        Xn = Xd[rows[ptr[p] : ptr[p + 1]]]
        block = Xn.T @ (vals[ptr[p] : ptr[p + 1], None] * Xn)
        H[c * d : (c + 1) * d, c2 * d : (c2 + 1) * d] += block
        if c2 != c:
            H[c2 * d : (c2 + 1) * d, c * d : (c + 1) * d] += block.T


@njit(cache=True)
def woodbury_system(K, idx, R, C, M):
    """``M = I + C (R R^T) o K[idx][:, idx]`` (``o`` elementwise), the Woodbury system of
    :func:`~topkbench.solvers.newton_steps.woodbury_direction`: row p of ``R`` is a curvature
    direction (in the classes) of the example whose row and column of the Gram matrix ``K``
    are ``idx[p]``.  Row by row, without gathering the Gram block first: each row is
    accumulated over the m classes in a contiguous buffer (both triangles: writing the
    mirror image by columns costs more than the arithmetic it saves)."""
    r, m = R.shape
    RT = np.ascontiguousarray(R.T)
    acc = np.empty(r)
    for p in range(r):
        for q in range(r):
            acc[q] = 0.0
        for c in range(m):
            rp = R[p, c]
            if rp != 0.0:
                row = RT[c]
                for q in range(r):
                    acc[q] += rp * row[q]
        Kp = K[idx[p]]
        out = M[p]
        for q in range(r):
            out[q] = C * acc[q] * Kp[idx[q]]
        out[p] += 1.0
