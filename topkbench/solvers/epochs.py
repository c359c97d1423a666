"""SDCA epochs in numba (DESIGN §5): dense (row-major W, padded and paired passes), CSR and
Gram-matrix variants, each visiting the examples in the given permutations and applying the
block update of :func:`topkbench.losses.dispatch.update_block` in place.

Conventions (scale ``P / lambda``, dual blocks, ``W = X^T A``) as in
:mod:`topkbench.losses.dispatch`.

On float32 features the dense and CSR epochs have ``_single`` variants whose passes over W
(scores, rank-1 updates) run in float32, while every block update and the dual stay float64.
A step then maximizes the dual over the block for scores off by float32 rounding (~1e-7 of
``sum_f |x_f w_f|``): the iterate is still feasible, so it is SDCA's trajectory perturbed,
not another problem, and the certificates (float64, from ``W = X^T A``) are unchanged.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from topkbench.losses.dispatch import _scratch, _update
from topkbench.solvers.prefetch import prefetch_at, prefetch_row

# A block change with at most m / _SPARSE_DELTA nonzeros (the hinge losses: an SVM^Multi
# support vector moves ~3 of its 100 dual variables) updates only those columns of W; the next
# scores then take a read-only pass, which is cheaper than the fused read-modify-write pass.
_SPARSE_DELTA = 4


@njit(cache=True)
def _sparse_change(nz, m):
    """Whether a change with ``nz`` nonzeros over m columns goes column by column."""
    return nz * _SPARSE_DELTA <= m


@njit(cache=True, error_model="numpy")
def _store_block(A, i, new, delta, cols):
    """``A[i] = new``; ``delta = new - old``; returns the number ``nz`` of nonzero entries of
    ``delta`` and, when the change is sparse enough for the column-wise update
    (:func:`_sparse_change`), lists their indices in ``cols``.

    The difference-and-store loop and the count vectorize (as two loops: fused, they did not;
    88 -> 50 ns per dense block at m = 100 with the row in cache); the compaction, a chain through
    its counter, runs only for sparse changes (the hinge losses near the optimum), not for the
    dense changes of the logistic and entropic losses."""
    m = new.shape[0]
    row = A[i]
    for j in range(m):
        delta[j] = new[j] - row[j]
        row[j] = new[j]
    nz = 0
    for j in range(m):
        nz += 1 if delta[j] != 0.0 else 0
    if _sparse_change(nz, m):
        q = 0
        for j in range(m):
            # branch-free: cols[q] is overwritten until a nonzero keeps it (which entries
            # of a block change are zero varies from example to example: a branch mispredicts)
            cols[q] = j
            q += delta[j] != 0.0
    return nz


@njit(cache=True)
def _update_columns_dense(X, i, delta, cols, nz, W):
    """``W[:, j] += x_i delta_j`` for the ``nz`` columns ``j`` in ``cols`` (the others have
    ``delta_j = 0``: the same W as the full update)."""
    for f in range(X.shape[1]):
        xf = X[i, f]
        for q in range(nz):
            j = cols[q]
            W[f, j] += xf * delta[j]


# Dense passes over W (d x m, row-major: one feature's m weights are contiguous).  Each example
# needs the scores s = W^T x_i and the rank-1 update W += x_i delta^T; W (100 KB at d = 128,
# m = 100) lives in L2, so the epoch is bound by moving W, not by flops.  Three measures: the
# updates of one pair of examples and the scores of the next pair share one pass over W
# (sdca_epochs_dense), each pass over the score vectors takes four feature rows (the score
# accumulators are loaded and stored once per four rows), and sparse block changes update only
# their columns (`topkbench bench sdca` measures the epochs against the flop bound).
# The passes are compiled with fastmath "contract" only: LLVM fuses each multiply-add into
# an FMA (one rounding instead of two; no reassociation, so the sums keep feature order).
_ROWS = 4


_LANES = 8  # float64 per AVX-512 vector: sdca_epochs_dense pads W's width to a multiple


@njit(cache=True)
def _four(X, i, f):
    """``X[i, f:f+4]`` as four scalars (inlined by LLVM; the passes below keep them in
    registers)."""
    return X[i, f], X[i, f + 1], X[i, f + 2], X[i, f + 3]


@njit(cache=True, fastmath={"contract"})
def _scores_dense(X, i, W, s):
    """``s = W^T x_i`` (sums in feature order)."""
    d = X.shape[1]
    m = W.shape[1]
    for j in range(m):
        s[j] = 0.0
    f = 0
    while f + _ROWS <= d:
        x0, x1, x2, x3 = _four(X, i, f)
        for j in range(m):
            s[j] = (((s[j] + x0 * W[f, j]) + x1 * W[f + 1, j]) + x2 * W[f + 2, j]) + x3 * W[
                f + 3, j
            ]
        f += _ROWS
    while f < d:
        xf = X[i, f]
        for j in range(m):
            s[j] += xf * W[f, j]
        f += 1


@njit(cache=True, fastmath={"contract"})
def _update_scores_dense(X, i, delta, nxt, W, s):
    """``W += x_i delta^T``, then ``s = W^T x_nxt`` with the new W, in one pass over W
    (``nxt < 0``: the update only)."""
    d = X.shape[1]
    m = W.shape[1]
    if nxt < 0:
        for f in range(d):
            xf = X[i, f]
            for j in range(m):
                W[f, j] += xf * delta[j]
        return
    for j in range(m):
        s[j] = 0.0
    f = 0
    while f + _ROWS <= d:
        x0, x1, x2, x3 = _four(X, i, f)
        n0, n1, n2, n3 = _four(X, nxt, f)
        for j in range(m):
            dj = delta[j]
            w0 = W[f, j] + x0 * dj
            W[f, j] = w0
            w1 = W[f + 1, j] + x1 * dj
            W[f + 1, j] = w1
            w2 = W[f + 2, j] + x2 * dj
            W[f + 2, j] = w2
            w3 = W[f + 3, j] + x3 * dj
            W[f + 3, j] = w3
            s[j] = (((s[j] + n0 * w0) + n1 * w1) + n2 * w2) + n3 * w3
        f += _ROWS
    while f < d:
        xf = X[i, f]
        xn = X[nxt, f]
        for j in range(m):
            w = W[f, j] + xf * delta[j]
            W[f, j] = w
            s[j] += xn * w
        f += 1


@njit(cache=True)
def _clear_pair(sc, sd):
    for j in range(sc.shape[0]):
        sc[j] = 0.0
        sd[j] = 0.0


@njit(cache=True, fastmath={"contract"})
def _scores_pair(X, c, d, W, sc, sd):
    """``sc = W^T x_c`` and ``sd = W^T x_d`` in one read-only pass over W (sums in feature
    order, as :func:`_scores_dense`).  Returns ``<x_c, x_d>``."""
    dim = X.shape[1]
    m = W.shape[1]
    _clear_pair(sc, sd)
    xcd = 0.0
    f = 0
    while f + _ROWS <= dim:
        c0, c1, c2, c3 = _four(X, c, f)
        d0, d1, d2, d3 = _four(X, d, f)
        xcd = (((xcd + c0 * d0) + c1 * d1) + c2 * d2) + c3 * d3
        for j in range(m):
            w0 = W[f, j]
            w1 = W[f + 1, j]
            w2 = W[f + 2, j]
            w3 = W[f + 3, j]
            sc[j] = (((sc[j] + c0 * w0) + c1 * w1) + c2 * w2) + c3 * w3
            sd[j] = (((sd[j] + d0 * w0) + d1 * w1) + d2 * w2) + d3 * w3
        f += _ROWS
    while f < dim:
        cf = X[c, f]
        df = X[d, f]
        xcd += cf * df
        for j in range(m):
            sc[j] += cf * W[f, j]
            sd[j] += df * W[f, j]
        f += 1
    return xcd


@njit(cache=True, fastmath={"contract"})
def _update_pair_scores_pair(X, a, da, b, db, c, d, W, sc, sd):
    """``W += x_a da^T + x_b db^T``, then ``sc = W^T x_c`` and ``sd = W^T x_d`` with the new W,
    all in one pass over W.  Returns ``<x_c, x_d>``."""
    dim = X.shape[1]
    m = W.shape[1]
    _clear_pair(sc, sd)
    xcd = 0.0
    f = 0
    while f + _ROWS <= dim:
        a0, a1, a2, a3 = _four(X, a, f)
        b0, b1, b2, b3 = _four(X, b, f)
        c0, c1, c2, c3 = _four(X, c, f)
        d0, d1, d2, d3 = _four(X, d, f)
        xcd = (((xcd + c0 * d0) + c1 * d1) + c2 * d2) + c3 * d3
        for j in range(m):
            ea = da[j]
            eb = db[j]
            w0 = (W[f, j] + a0 * ea) + b0 * eb
            W[f, j] = w0
            w1 = (W[f + 1, j] + a1 * ea) + b1 * eb
            W[f + 1, j] = w1
            w2 = (W[f + 2, j] + a2 * ea) + b2 * eb
            W[f + 2, j] = w2
            w3 = (W[f + 3, j] + a3 * ea) + b3 * eb
            W[f + 3, j] = w3
            sc[j] = (((sc[j] + c0 * w0) + c1 * w1) + c2 * w2) + c3 * w3
            sd[j] = (((sd[j] + d0 * w0) + d1 * w1) + d2 * w2) + d3 * w3
        f += _ROWS
    while f < dim:
        af = X[a, f]
        bf = X[b, f]
        cf = X[c, f]
        df = X[d, f]
        xcd += cf * df
        for j in range(m):
            w = (W[f, j] + af * da[j]) + bf * db[j]
            W[f, j] = w
            sc[j] += cf * w
            sd[j] += df * w
        f += 1
    return xcd


@njit(cache=True)
def _apply_change(X, i, delta, cols, nz, W, m):
    """``W += x_i delta^T`` for a block change with ``nz`` nonzeros (listed in ``cols``) over
    the first ``m`` columns: column by column when sparse (see ``_SPARSE_DELTA``), else one
    dense pass (over all of W's columns; those past m have ``delta = 0``)."""
    if not _sparse_change(nz, m):
        _update_scores_dense(X, i, delta, -1, W, delta)
    elif nz > 0:
        _update_columns_dense(X, i, delta, cols, nz, W)


@njit(cache=True)
def sdca_epochs_dense(X, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma, k, rho, troots):
    """Run ``perms.shape[0]`` SDCA epochs in place on dense ``X`` (n x d), ``W`` (d x m).

    Labels in CSR form: example ``i`` has ``yidx[yptr[i]:yptr[i+1]]`` (one label per example
    for the multiclass losses, the label set for the multilabel ones).  ``Cs[i] = C w_i > 0``
    is example i's share of the loss (``w_i`` its sample weight, 1 without weights): its
    block update is the unweighted one with C replaced by ``Cs[i]``.  ``rho``: the weighted
    top-k hinge's rank weights, zero-padded to length m (empty for the other losses).

    ``troots`` (length n, NaN-initialized, kept by the caller across calls) holds per-example
    starting points for the softmax root finding.  Returns the number of block updates whose
    inner root finding did not converge.

    Examples go in pairs ``(a, b)`` of consecutive entries of the permutation, with one pass
    over W per pair instead of one per example (W lives in L2 and moving it bounds the epoch).
    ``s_a`` is exact when ``a``'s update starts; ``b``'s scores were computed in the same pass
    as ``a``'s, before ``a``'s change ``delta_a`` reached W, and are completed by the rank-one
    identity ``W'^T x_b = W^T x_b + <x_a, x_b> delta_a`` (``W' = W + x_a delta_a^T``).  The
    pass after the pair then applies both changes and computes the next pair's scores
    (:func:`_update_pair_scores_pair`); when both changes together are sparse (at most
    ``m / _SPARSE_DELTA`` nonzeros, e.g. SVM^Multi near the optimum) they go column by column
    and the scores take a read-only pass (:func:`_scores_pair`).  Every example's update sees
    the scores of exactly the W the sequential algorithm has (same trajectory; rounding
    differs from a per-example loop at the last bits of the scores).

    The epochs run on a copy of W whose rows start on 64-byte boundaries, padded with zero
    columns to a multiple of ``_LANES`` (copied back at the end; the pass vectors likewise).
    LLVM vectorizes the passes' column loops in blocks of 4 x 8 and runs the rest element by
    element unless it is a whole vector, and a vector load that straddles two cache lines
    costs two (numpy's and numba's arrays are only 16- or 32-byte aligned, so with m = 100
    at least every other row of W did).
    The padded columns have zero scores and zero changes: the result is the unpadded loop's.
    """
    m = W.shape[1]
    Wp = _aligned_zeros(W.shape[0], _padded_width(m, W), W)
    Wp[:, :m] = W
    passes = _aligned_zeros(4, Wp.shape[1], Wp)
    failures = _epochs_dense_padded(
        X, yptr, yidx, sqnorms, A, Wp, m, perms, loss, Cs, gamma, k, rho, troots, passes,
        passes, False,
    )  # fmt: skip
    W[:, :] = Wp[:, :m]
    return failures


@njit(cache=True)
def sdca_epochs_dense_single(X, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma, k, rho,
                             troots):  # fmt: skip
    """:func:`sdca_epochs_dense` with the passes over W in float32: ``X`` is float32 and the
    working copy of W, the scores and the block changes the passes see are float32 (twice the
    entries per vector and half the bytes of W to move); each example's update still takes
    its scores in float64 and stores its block in float64.  The trajectory is SDCA's with
    scores rounded to float32: every dual iterate is feasible, and the certificates, which
    resynchronize ``W = X^T A`` in float64, are exact (the rule that allows it:
    :func:`topkbench.solvers.problem.keeps_single`)."""
    m = W.shape[1]
    Wp = _aligned_zeros(W.shape[0], _padded_width(m, X), X)
    Wp[:, :m] = W
    passes = _aligned_zeros(4, Wp.shape[1], X)
    failures = _epochs_dense_padded(
        X, yptr, yidx, sqnorms, A, Wp, m, perms, loss, Cs, gamma, k, rho, troots, passes,
        np.empty((4, m)), True,
    )  # fmt: skip
    W[:, :] = Wp[:, :m]
    return failures


@njit(cache=True)
def _padded_width(m, like):
    """m rounded up to a whole number of 64-byte vectors of ``like``'s dtype (``_LANES``
    float64, twice as many float32)."""
    lanes = _LANES * 8 // like.itemsize
    return -(-m // lanes) * lanes


@njit(cache=True)
def _aligned_zeros(r, c, like):
    """An r x c array of zeros of ``like``'s dtype whose first element sits on a 64-byte
    boundary (so every row does when c is a multiple of ``_LANES``).  numba's own arrays
    start 32 bytes past a line boundary, numpy's anywhere on 16 bytes; an AVX-512 load that
    straddles two cache lines costs two."""
    size = like.itemsize
    buf = np.zeros(r * c + 64 // size, dtype=like.dtype)
    off = ((-buf.ctypes.data) % 64) // size
    return buf[off : off + r * c].reshape((r, c))


@njit(cache=True)
def _epochs_dense_padded(X, yptr, yidx, sqnorms, A, W, m, perms, loss, Cs, gamma, k, rho, troots,
                         passes, upd, convert):  # fmt: skip
    """:func:`sdca_epochs_dense` on ``W`` with ``W.shape[1] >= m`` columns, those past m
    zero (the scores and block changes of the passes have W's width, the updates see their
    first m entries).

    ``passes`` (4 x W's width, W's dtype, zero) holds the passes' score and change vectors of
    a pair, ``upd`` (4 x at least m, float64) the same four as the updates see them.  Without
    ``convert`` they are the same array; with it (float32 passes) the scores are widened
    before an update and the changes narrowed after it."""
    n_epochs = perms.shape[0]
    npe = perms.shape[1]
    scratch = _scratch(m)
    new = scratch[1]
    s_full, s_b_full, delta_p, delta_b_p = passes[0], passes[1], passes[2], passes[3]
    s, s_b, delta, delta_b = upd[0][:m], upd[1][:m], upd[2], upd[3]
    # own index arrays: a's changed columns must survive b's update, which uses scratch[5]
    cols, cols_b = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    failures = 0
    for e in range(n_epochs):
        if npe == 0:
            continue
        xab = 0.0
        if npe >= 2:
            xab = _scores_pair(X, perms[e, 0], perms[e, 1], W, s_full, s_b_full)
        else:
            _scores_dense(X, perms[e, 0], W, s_full)
        for p in range(0, npe, 2):
            a = perms[e, p]
            b = perms[e, p + 1] if p + 1 < npe else -1
            for q in range(p + 2, min(p + 4, npe)):  # the next pair's data (solvers.prefetch)
                i = perms[e, q]
                prefetch_row(A, i)
                prefetch_at(troots, i)
                prefetch_at(sqnorms, i)
                prefetch_at(Cs, i)
                if yptr[i] < yptr[i + 1]:  # a multilabel example can have no label
                    prefetch_at(yidx, yptr[i])
            if convert:
                _copy(s_full, s, m)
            if _update(
                loss,
                yptr,
                yidx,
                a,
                s,
                A[a],
                sqnorms[a],
                Cs[a],
                gamma,
                k,
                rho,
                new,
                scratch,
                troots,
            ):
                failures += 1
            nz_a = _store_block(A, a, new, delta, cols)
            if convert:
                _copy(delta, delta_p, m)
            nz_b = 0
            if b >= 0:
                if convert:
                    _copy(s_b_full, s_b, m)
                if nz_a > 0:
                    for j in range(m):
                        s_b[j] += xab * delta[j]
                if _update(
                    loss,
                    yptr,
                    yidx,
                    b,
                    s_b,
                    A[b],
                    sqnorms[b],
                    Cs[b],
                    gamma,
                    k,
                    rho,
                    new,
                    scratch,
                    troots,
                ):
                    failures += 1
                nz_b = _store_block(A, b, new, delta_b, cols_b)
                if convert:
                    _copy(delta_b, delta_b_p, m)
            c = perms[e, p + 2] if p + 2 < npe else -1
            d = perms[e, p + 3] if p + 3 < npe else -1
            if d >= 0 and not _sparse_change(nz_a + nz_b, m):
                xab = _update_pair_scores_pair(
                    X, a, delta_p, b, delta_b_p, c, d, W, s_full, s_b_full
                )  # fmt: skip
                continue
            _apply_change(X, a, delta_p, cols, nz_a, W, m)
            if b >= 0:
                _apply_change(X, b, delta_b_p, cols_b, nz_b, W, m)
            if d >= 0:
                xab = _scores_pair(X, c, d, W, s_full, s_b_full)
            elif c >= 0:
                _scores_dense(X, c, W, s_full)
    return failures


@njit(cache=True)
def _copy(src, dst, m):
    """``dst[:m] = src[:m]`` (the float32 passes' vectors to and from the updates' float64
    ones)."""
    for j in range(m):
        dst[j] = src[j]


@njit(cache=True)
def _csr_row_scores(indptr, indices, data, i, W, s):
    """``s = W^T x_i`` for CSR row i: one pass over its nonzeros, each adding a scaled row of
    the row-major W."""
    m = W.shape[1]
    for j in range(m):
        s[j] = 0.0
    for q in range(indptr[i], indptr[i + 1]):
        xf = data[q]
        f = indices[q]
        for j in range(m):
            s[j] += xf * W[f, j]


@njit(cache=True)
def sdca_epochs_csr(
    indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma, k, rho, troots
):
    """As :func:`sdca_epochs_dense` for CSR features (``indptr``, ``indices``, ``data``)."""
    scratch = _scratch(W.shape[1])
    return _epochs_csr(indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma,
                       k, rho, troots, scratch, scratch[0], False)  # fmt: skip


@njit(cache=True)
def sdca_epochs_csr_single(
    indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma, k, rho, troots
):
    """:func:`sdca_epochs_csr` with float32 ``data`` and a float32 working copy of W, as
    :func:`sdca_epochs_dense_single` (each example's scores widened to float64 for its
    update, its block change narrowed to float32 for W's)."""
    m = W.shape[1]
    Ws = np.empty(W.shape, dtype=np.float32)
    Ws[:, :] = W
    scratch = _scratch(m)
    failures = _epochs_csr(indptr, indices, data, yptr, yidx, sqnorms, A, Ws, perms, loss, Cs,
                           gamma, k, rho, troots, scratch, np.empty(m, dtype=np.float32),
                           True)  # fmt: skip
    W[:, :] = Ws
    return failures


@njit(cache=True)
def _epochs_csr(indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss, Cs, gamma, k, rho,
                troots, scratch, sw, convert):  # fmt: skip
    """The CSR epochs: ``sw`` (W's dtype) receives the scores and then the block change the
    passes see; without ``convert`` it is ``scratch[0]``, the float64 vector the update sees,
    itself."""
    n_epochs = perms.shape[0]
    m = W.shape[1]
    s, new, cols = scratch[0], scratch[1], scratch[5]
    failures = 0
    for e in range(n_epochs):
        for p in range(perms.shape[1]):
            i = perms[e, p]
            _csr_row_scores(indptr, indices, data, i, W, sw)
            if convert:
                _copy(sw, s, m)
            if _update(
                loss,
                yptr,
                yidx,
                i,
                s,
                A[i],
                sqnorms[i],
                Cs[i],
                gamma,
                k,
                rho,
                new,
                scratch,
                troots,
            ):
                failures += 1
            nz = _store_block(A, i, new, s, cols)
            if not _sparse_change(nz, m):
                if convert:
                    _copy(s, sw, m)
                for q in range(indptr[i], indptr[i + 1]):
                    xf = data[q]
                    f = indices[q]
                    for j in range(m):
                        W[f, j] += xf * sw[j]
            elif nz > 0:
                if convert:
                    for c in range(nz):
                        sw[cols[c]] = s[cols[c]]
                for q in range(indptr[i], indptr[i + 1]):
                    xf = data[q]
                    f = indices[q]
                    for c in range(nz):
                        W[f, cols[c]] += xf * sw[cols[c]]
    return failures


@njit(cache=True)
def sdca_epochs_gram(K, yptr, yidx, A, B, perms, loss, Cs, gamma, k, rho, troots):
    """As :func:`sdca_epochs_dense` from a Gram matrix ``K`` (n x n): scores ``B^T K_i``.

    Kernel SDCA (DESIGN §5; TPAMI Props. 14-15 are stated with ``q = A K_i - K_ii a_i``): there
    is no W, so a step costs O(n m) and only the block ``A[i]`` changes.  ``B`` holds the
    coefficients of the primal point, ``W = sum_r phi(x_r) B_r``: plain SDCA passes ``A``
    itself; the proximal (accelerated) problems of :mod:`topkbench.solvers.accelerated` pass
    ``B = B0 + A`` with a fixed offset ``B0``, and every change of ``A[i]`` is added to ``B[i]``.
    """
    n_epochs = perms.shape[0]
    n = K.shape[0]
    m = A.shape[1]
    offset = B.ctypes.data != A.ctypes.data
    scratch = _scratch(m)
    s, new = scratch[0], scratch[1]
    failures = 0
    for e in range(n_epochs):
        for p in range(perms.shape[1]):
            i = perms[e, p]
            for j in range(m):
                s[j] = 0.0
            for r in range(n):
                kir = K[i, r]
                if kir != 0.0:
                    for j in range(m):
                        s[j] += kir * B[r, j]
            if _update(
                loss, yptr, yidx, i, s, A[i], K[i, i], Cs[i], gamma, k, rho, new, scratch, troots
            ):
                failures += 1
            _store_block(A, i, new, s, scratch[5])
            if offset:
                for j in range(m):
                    B[i, j] += s[j]
    return failures


@njit(cache=True)
def csr_dot_dense(indptr, indices, data, W, out, start=0):
    """``out = X[start:start + len(out)] W`` for CSR ``X`` (int64 ``indptr``/``indices``) and
    row-major ``W``, row by row as the epoch kernels form their scores.  scipy's
    CSR-times-dense product runs several times slower at the large-m shapes (n x m outputs of
    tens of MB) where the certificates need it."""
    for r in range(out.shape[0]):
        _csr_row_scores(indptr, indices, data, start + r, W, out[r])


@njit(cache=True)
def csr_t_dot_dense(indptr, indices, data, A, out):
    """``out = X^T A`` for CSR ``X`` (int64 ``indptr``/``indices``): each row's nonzeros add
    a scaled row of ``A`` to rows of ``out``, rows in order: each entry sums over the
    examples in order, as scipy's ``X.T @ A`` does (the same floats)."""
    m = A.shape[1]
    for f in range(out.shape[0]):
        for j in range(m):
            out[f, j] = 0.0
    for i in range(A.shape[0]):
        for q in range(indptr[i], indptr[i + 1]):
            xf = data[q]
            f = indices[q]
            for j in range(m):
                out[f, j] += xf * A[i, j]
