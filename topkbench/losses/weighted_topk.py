"""Kato & Hirohashi's weighted top-k hinge (papers/004, §4 eq. (8)): its SDCA block update,
smoothed value and conjugate, and the Frank-Wolfe vertex of its dual domain (§5, Lemma 3,
eq. (24)).

Loss: with ``c = 1 - e_y + s - s_y 1`` (so ``c_y = 0``; all m coordinates are sorted, the label
one included) and non-increasing weights ``rho_1 >= ... >= rho_K > 0`` (zero beyond K)::

    Phi(s; y) = max{0, sum_{r <= K} rho_r c_[r]}

``flat`` weights ``rho_r = 1/k`` give the top-k hinge alpha exactly as TPAMI Table 1 prints it
(the sum of the k largest of ``[c^{\\y}, 0]`` is ``max(T_k, T_{k-1})`` of ``c^{\\y}``, DESIGN §4.1).
It is convex because ``sum_r rho_r c_[r] = sum_r (rho_r - rho_{r+1}) T_r(c)`` with non-negative
coefficients.

Vertex (Lemma 3 in our scale, see ``topkbench.solvers.frank_wolfe``): the dual block maximizing
the linearized dual is ``a_i = -C g`` for a subgradient ``g`` of Phi at the current scores:
``g = sum_{r <= K, [r] != y} rho_r (e_[r] - e_y)`` when the weighted sum is positive, else 0.
**SDCA** (conventions of :mod:`topkbench.losses.dispatch`: ``x = -a^{\\y}`` is C times the
conjugate argument's off-label part, ``a_y = <1, x>``).  The conjugate's domain is ``C D`` with
``D`` the off-label part of ``conv({0} u P(rho))`` (:mod:`topkbench.prox.permutahedron`, which
derives it), and ``-L*(v) = <1, x>/C - gamma/2 (||x||^2 + <1,x>^2)/C^2``: Kato's smoothing
(eq. (25)) is a Moreau envelope over all m scores, so it penalizes ``v_y = -<1,x>/C`` too.
Maximizing the dual over the block (q = s - K a, K = ||x_i||^2) gives

    x = argmin_{x in C D} ||x - b||^2 + <1, x>^2,   b = (q^{\\y} - q_y + 1) / (K + gamma/C),

the biased projection of :func:`~topkbench.prox.permutahedron.wtopk_biased_projection`: the
bias coefficient is 1 for every gamma (the smoothing and the data term both carry
``||x||^2 + <1,x>^2``).  ``rho`` is zero-padded to length m for it.  The smoothed value is
``max_{x in D} <x, z> - gamma/2 (||x||^2 + <1,x>^2)`` at ``z = c^{\\y}``: the same projection of
``z / gamma`` with C = 1.

A vertex is stored as its K sorted indices (``-1`` for the zero vertex), which is all a
Frank-Wolfe atom needs (``n K`` int32 instead of ``n m`` floats).  Products of the features with
an atom's matrix cost ``O(nnz(X) K)`` instead of ``O(nnz(X) m)`` (``atom_xt_*``), and the
active set of the away-step / pairwise variants lives in flat arrays (``atoms[a]``, ``hashes``)
handled here: inner products with all atoms in one call, lookup by hash, compaction.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from topkbench.losses.curvature import LossDerivatives
from topkbench.prox.permutahedron import argsort_desc, wtopk_biased_projection


@njit(cache=True)
def _margins_sorted(s, y, K, work, order):
    """``work = c`` and ``order[:K]`` = indices of the K largest entries of ``c``, decreasing
    (ties by index; any order of ties gives a valid subgradient).  Small K (the usual k <= 10)
    is selected by insertion in O(m K) with no allocation; large K falls back to a sort."""
    m = s.shape[0]
    sy = s[y]
    for j in range(m):
        work[j] = 0.0 if j == y else 1.0 + s[j] - sy
    if K > 32:
        order[:] = np.argsort(-work, kind="mergesort")
        return
    cnt = 0
    for j in range(m):
        v = work[j]
        if cnt < K:
            pos = cnt
            cnt += 1
        elif v > work[order[K - 1]]:
            pos = K - 1
        else:
            continue
        while pos > 0 and work[order[pos - 1]] < v:
            order[pos] = order[pos - 1]
            pos -= 1
        order[pos] = j


@njit(cache=True)
def wtopk_value(s, y, rho, work, order):
    """``Phi(s; y)`` (module docstring); ``work`` float and ``order`` int scratch of length m."""
    _margins_sorted(s, y, rho.shape[0], work, order)
    total = 0.0
    for r in range(rho.shape[0]):
        total += rho[r] * work[order[r]]
    return total if total > 0.0 else 0.0


@njit(cache=True)
def wtopk_vertices(S, y, rho, C, U, atom, work, order):
    """For every row i of scores ``S``: the vertex ``U[i] = -C g_i`` (module docstring), its
    atom row ``atom[i]`` (K indices, or -1s), and the loss; returns ``sum_i Phi(S_i; y_i)``."""
    n, m = S.shape
    K = rho.shape[0]
    lsum = 0.0
    for i in range(n):
        yi = y[i]
        _margins_sorted(S[i], yi, K, work, order)
        total = 0.0
        for r in range(K):
            total += rho[r] * work[order[r]]
        for j in range(m):
            U[i, j] = 0.0
        if total > 0.0:
            lsum += total
            for r in range(K):
                j = order[r]
                atom[i, r] = j
                if j != yi:
                    U[i, j] -= C * rho[r]
                    U[i, yi] += C * rho[r]
        else:
            for r in range(K):
                atom[i, r] = -1
    return lsum


@njit(cache=True)
def atom_block(atom_row, yi, rho, C, out):
    """The dual block of one example's atom row (``out`` of length m, overwritten)."""
    for j in range(out.shape[0]):
        out[j] = 0.0
    for r in range(atom_row.shape[0]):
        j = atom_row[r]
        if j < 0:
            return
        if j != yi:
            out[j] -= C * rho[r]
            out[yi] += C * rho[r]


@njit(cache=True)
def atom_matrix(atom, y, rho, C, out):
    """All blocks of an atom (``out`` n x m)."""
    for i in range(atom.shape[0]):
        atom_block(atom[i], y[i], rho, C, out[i])


@njit(cache=True)
def atom_inner(atom, y, rho, C, G):
    """``<G, V>`` for the atom's matrix V without forming it (G n x m)."""
    total = 0.0
    for i in range(atom.shape[0]):
        yi = y[i]
        for r in range(atom.shape[1]):
            j = atom[i, r]
            if j < 0:
                break
            if j != yi:
                total += C * rho[r] * (G[i, yi] - G[i, j])
    return total


@njit(cache=True)
def atom_hash(atom):
    """FNV-1a hash of an atom's indices, 63 bits (lookup key in the active set)."""
    h = np.uint64(14695981039346656037)
    prime = np.uint64(1099511628211)
    for i in range(atom.shape[0]):
        for r in range(atom.shape[1]):
            h = (h ^ np.uint64(atom[i, r] + 1)) * prime
    return np.int64(h & np.uint64(0x7FFFFFFFFFFFFFFF))  # int64 for callers and arrays


@njit(cache=True)
def find_atom(atoms, hashes, size, atom, h):
    """Index of ``atom`` among ``atoms[:size]`` (hash, then exact comparison), or -1."""
    n, K = atom.shape
    for a in range(size):
        if hashes[a] != h:
            continue
        same = True
        for i in range(n):
            for r in range(K):
                if atoms[a, i, r] != atom[i, r]:
                    same = False
                    break
            if not same:
                break
        if same:
            return a
    return -1


@njit(cache=True)
def active_inner(atoms, size, y, rho, C, G, out):
    """``out[a] = <G, V_a>`` for the first ``size`` atoms."""
    for a in range(size):
        out[a] = atom_inner(atoms[a], y, rho, C, G)


@njit(cache=True)
def compact_active(atoms, weights, hashes, size, tol):
    """Drop atoms with weight <= ``tol`` (order kept); returns the new size."""
    keep = 0
    for a in range(size):
        if weights[a] > tol:
            if keep != a:
                atoms[keep] = atoms[a]
                weights[keep] = weights[a]
                hashes[keep] = hashes[a]
            keep += 1
    return keep


@njit(cache=True)
def _atom_row_coefs(atom_row, yi, rho, C, cols, coefs):
    """The non-zeros of one example's block of an atom's matrix: ``cols[:q]``, ``coefs[:q]``
    (at most K + 1, the label column last); returns q."""
    q = 0
    cy = 0.0
    for r in range(atom_row.shape[0]):
        j = atom_row[r]
        if j < 0:
            break
        if j != yi:
            cols[q] = j
            coefs[q] = -C * rho[r]
            cy += C * rho[r]
            q += 1
    if cy != 0.0:
        cols[q] = yi
        coefs[q] = cy
        q += 1
    return q


@njit(cache=True)
def atom_xt_dense(atom, y, rho, C, X, outT):
    """``outT += (X^T V)^T = V^T X`` for the atom's matrix V (n x m) and dense X (n x p);
    ``outT`` is m x p.  With X a symmetric Gram matrix this is ``(K V)^T``."""
    cols = np.empty(atom.shape[1] + 1, dtype=np.int64)
    coefs = np.empty(atom.shape[1] + 1)
    for i in range(atom.shape[0]):
        for a in range(_atom_row_coefs(atom[i], y[i], rho, C, cols, coefs)):
            j, c = cols[a], coefs[a]
            for q in range(X.shape[1]):
                outT[j, q] += c * X[i, q]


@njit(cache=True)
def atom_xt_csr(atom, y, rho, C, indptr, indices, data, outT):
    """``atom_xt_dense`` for CSR features."""
    cols = np.empty(atom.shape[1] + 1, dtype=np.int64)
    coefs = np.empty(atom.shape[1] + 1)
    for i in range(atom.shape[0]):
        for a in range(_atom_row_coefs(atom[i], y[i], rho, C, cols, coefs)):
            j, c = cols[a], coefs[a]
            for p in range(indptr[i], indptr[i + 1]):
                outT[j, indices[p]] += c * data[p]


@njit(cache=True)
def _weighted_margin_sum(s, y, rho, c, order):
    """``c`` = the margins ``1 - e_y + s - s_y 1`` (all m), ``order`` their descending order,
    and ``sum_r rho_r c_[r]`` (``rho`` zero-padded to length m)."""
    m = s.shape[0]
    sy = s[y]
    for j in range(m):
        c[j] = 0.0 if j == y else 1.0 + s[j] - sy
    argsort_desc(c, m, order)
    total = 0.0
    for r in range(m):
        if rho[r] == 0.0:
            break
        total += rho[r] * c[order[r]]
    return total


@njit(cache=True)
def wtopk_block(y, s, a, kii, C, gamma, rho, out, b, x, order, bs, z, d, bsum, bcnt):
    """SDCA block update of the weighted top-k hinge into ``out`` (module docstring).

    Scratch: ``b``, ``x``, ``bs``, ``z``, ``d``, ``bsum`` (float, m), ``order`` and ``bcnt``
    (int, m)."""
    m = s.shape[0]
    den = kii + gamma / C
    if den == 0.0:
        # zero-norm example, gamma = 0: the block maximizes <x, c^{\y}> over C D, a linear
        # program whose solution is the Frank-Wolfe vertex -C g (g a subgradient at s)
        total = _weighted_margin_sum(s, y, rho, b, order)
        for j in range(m):
            out[j] = 0.0
        if total > 0.0:
            for r in range(m):
                j = order[r]
                if rho[r] == 0.0:
                    break
                if j != y:
                    out[j] -= C * rho[r]
                    out[y] += C * rho[r]
        return
    qy = s[y] - kii * a[y]
    violated = False
    p = 0
    for j in range(m):
        if j != y:
            v = (s[j] - kii * a[j] - qy + 1.0) / den
            b[p] = v
            if v > 0.0:
                violated = True
            p += 1
    if not violated:
        # the domain lies in the nonnegative orthant and holds 0, where the objective's
        # gradient -2b is >= 0: x = 0
        for j in range(m):
            out[j] = 0.0
        return
    wtopk_biased_projection(b[: m - 1], rho, C, x, order, bs, z, d, bsum, bcnt)
    total = 0.0
    bound = 0.0
    for r in range(m):
        bound += rho[r]
    bound *= C
    p = 0
    for j in range(m):
        if j != y:
            v = x[p] if x[p] > 0.0 else 0.0
            out[j] = -v
            total += v
            p += 1
    if total > bound:
        # rounding can leave <1, x> a few ulps above C sum rho, outside the domain
        for j in range(m):
            if j != y:
                out[j] *= bound / total
        total = bound
    out[y] = total


@njit(cache=True)
def wtopk_loss(s, y, rho, gamma, b, x, order, bs, z, d, bsum, bcnt):
    """``Phi(s; y)`` (eq. (8)) for gamma = 0, its Moreau envelope (eq. (25)) for gamma > 0;
    ``rho`` zero-padded to length m, scratch as :func:`wtopk_block`."""
    m = s.shape[0]
    total = _weighted_margin_sum(s, y, rho, b, order)
    if gamma == 0.0:
        return total if total > 0.0 else 0.0
    # the margins are no longer needed: b holds the projection's target z^{\\y} / gamma
    sy = s[y]
    p = 0
    for j in range(m):
        if j != y:
            b[p] = (1.0 + s[j] - sy) / gamma
            p += 1
    wtopk_biased_projection(b[: m - 1], rho, 1.0, x, order, bs, z, d, bsum, bcnt)
    inner = 0.0
    sq = 0.0
    sm = 0.0
    for p in range(m - 1):
        v = x[p] if x[p] > 0.0 else 0.0
        inner += v * b[p] * gamma
        sq += v * v
        sm += v
    val = inner - 0.5 * gamma * (sq + sm * sm)
    return val if val > 0.0 else 0.0


@njit(cache=True)
def wtopk_neg_conj(a, y, C, gamma):
    """``-L*(v)`` at ``v = -a / C``: ``<1, x> - gamma/2 (||x||^2 + <1, x>^2)`` with ``x =
    -a^{\\y} / C`` (the label's entry ``v_y = -<1, x>`` is penalized by Kato's smoothing)."""
    total = 0.0
    sq = 0.0
    for j in range(a.shape[0]):
        if j != y:
            v = -a[j] / C
            total += v
            sq += v * v
    return total - 0.5 * gamma * (sq + total * total)


class WeightedTopkDerivatives(LossDerivatives):
    """Newton's derivatives of the smoothed weighted top-k hinge: the gradient is the block
    update of a zero-norm example (the projection above of ``z / gamma``), and its Hessians
    are differenced (no Jacobian of the permutahedron's projection is written here).  The
    smoothing covers all m scores (module docstring)."""

    smoothed_on_all_classes = True
