"""Compiled assembly of Newton's Hessian from per-example Hessians that live on a few classes
(:mod:`topkbench.solvers.newton`).

``I + C sum_i w_i H_i (x) x_i x_i^T`` in the class-major order ``vec(W)[c d + j] = W[j, c]``:
example i adds ``w_i h_i[c, c'] x_i x_i^T`` to the ``d x d`` block (c, c') for each pair of
classes in its support.  For the hinges the support is the dual block's (a handful of the m
classes), so one pass over the examples costs ``sum_i |T_i|^2 d^2 / 2`` flops, against ``n (d
m)^2`` for a product over all class pairs.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def assemble_support_hessian(Xd, w, tptr, tidx, hptr, hvals, H):
    """Add ``w_i h_i[c, c'] x_i x_i^T`` to the blocks (c, c') with ``c <= c'`` of ``H``
    (``dm x dm``; the caller mirrors the strictly upper blocks).  ``Xd`` holds the rows as
    dense float64, ``h_i`` is the row-major ``|T_i| x |T_i|`` block at ``hvals[hptr[i]:]`` over
    the classes ``tidx[tptr[i]:tptr[i+1]]``."""
    n, d = Xd.shape
    xx = np.empty((d, d))
    for i in range(n):
        lo, hi = tptr[i], tptr[i + 1]
        t = hi - lo
        if t == 0 or w[i] == 0.0:
            continue
        for r in range(d):
            xr = Xd[i, r]
            for q in range(d):
                xx[r, q] = xr * Xd[i, q]
        base = hptr[i]
        for p in range(t):
            c = tidx[lo + p]
            for q in range(t):
                c2 = tidx[lo + q]
                if c2 < c:
                    continue
                coef = w[i] * hvals[base + p * t + q]
                if coef == 0.0:
                    continue
                for r in range(d):
                    row = c * d + r
                    off = c2 * d
                    for u in range(d):
                        H[row, off + u] += coef * xx[r, u]


@njit(cache=True)
def structured_support_blocks(diag, U, signs, tptr, tidx, hptr, hvals):
    """The blocks of :func:`assemble_support_hessian` from structured Hessians ``H_i =
    diag(diag_i) + sum_r signs_r U[r, i] U[r, i]^T`` on the supports ``tidx`` (the classes
    where ``diag_i`` or some ``U[r, i]`` is nonzero, found by the caller)."""
    n = diag.shape[0]
    R = U.shape[0]
    for i in range(n):
        lo, hi = tptr[i], tptr[i + 1]
        t = hi - lo
        base = hptr[i]
        for p in range(t):
            c = tidx[lo + p]
            for q in range(t):
                c2 = tidx[lo + q]
                v = diag[i, c] if p == q else 0.0
                for r in range(R):
                    v += signs[r] * U[r, i, c] * U[r, i, c2]
                hvals[base + p * t + q] = v
