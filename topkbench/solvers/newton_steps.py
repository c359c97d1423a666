"""Newton's steps: the Hessian assembled from the losses' per-example curvature, and the
three ways of solving ``hess F D = -grad F`` (:mod:`topkbench.solvers.newton` drives them;
:func:`topkbench.solvers.plan.newton_route` chooses).

In the kernels' scale (``P / lambda``, ``C = 1/(lambda n)``)::

    F(W) = 1/2 ||W||^2 + C sum_i w_i L(y_i, W^T x_i)
    grad F = W + C X^T G,                     G_i = grad L(y_i, s_i),   s_i = W^T x_i
    hess F = I + C sum_i w_i H_i (x) x_i x_i^T,   H_i = hess L(y_i, s_i)  (m x m)

(``w_i`` the sample weights, 1 without), with ``H_i`` from the loss's family
(:class:`~topkbench.losses.curvature.Curvature`).

* **Dense** (:func:`hessian`, :func:`newton_step`): the ``d m x d m`` Hessian formed from
  the structured products, or, for the hinges whose ``H_i`` live on a few classes, from the
  examples' supports grouped by class pair (:mod:`topkbench.solvers.hessian_kernels`),
  whichever costs less, then factored by Cholesky.
* **Newton-CG** (:func:`cg_direction`): Hessian-vector products at ``O(nnz m)`` each, as
  liblinear's TRON does, for the logistic losses above the dense limit.
* **Woodbury** (:func:`woodbury_direction`): ``(I + C Z Z^T) D = -grad`` by Woodbury's
  identity, Z holding one column ``u (x) x_i`` per example and eigenvector of its
  curvature: a hinge's ``H_i`` vanish off the margin and have few directions on it, so the
  system has far fewer than ``d m`` rows where ``d m`` is large.
* **Separable** (:func:`separable_direction`): a class-separable hinge's Hessian is block
  diagonal by class, each block solved on its own (Woodbury's identity on the class's margin
  examples, or the formed d x d block); Newton-CG likewise runs one CG per class for a
  class-separable logistic loss.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.linalg.blas import dsyrk
from scipy.linalg.lapack import dpotrf, dpotrs

from topkbench.losses.curvature import LossDerivatives
from topkbench.solvers import plan
from topkbench.solvers.hessian_kernels import (
    assemble_support_hessian,
    woodbury_system,
)
from topkbench.solvers.problem import SDCAProblem, features_t_dot

# eigenvalues of the support blocks below this fraction of the largest are left out of Z
WOODBURY_EIG_TOL = 1e-12
# the supports' sizes less one estimate the system's rows from above or below; only an
# estimate this many times past the limit refuses before the eigendecompositions
WOODBURY_PRECHECK = 2.0
# how much dearer per flop the assembly on the supports runs than the structured form's
# products (its large blocks are BLAS products too, its small ones compiled loops)
PAIRWISE_SLOWDOWN = 1.5
# Newton-CG (:func:`cg_direction`): the residual it stops at, relative to the gradient, and
# its budget of Hessian-vector products per Newton iteration
CG_FORCING = 0.1
CG_MAX_ITERATIONS = 500
# the whole Gram matrix X X^T is kept for a phase's Woodbury steps only up to this size
GRAM_MAX_BYTES = 1 << 29
# how much dearer per flop a product per class pair runs (d x d outputs) than one product
# over all pairs (:func:`_add_vech_blocks`), for dense per-example Hessians
DENSE_PAIR_SLOWDOWN = 3.0
# rows per block when forming the Hessian (a block's per-example Hessians: rows x m^2 doubles)
HESSIAN_ENTRIES = 1 << 23


def _pairwise_cheaper(deriv: LossDerivatives, d: int, m: int) -> bool:
    """Whether the assembly on the supports (:meth:`~topkbench.losses.curvature.
    LossDerivatives.support_blocks`) costs less than the structured form's symmetric products
    (where the family has one; else the supports are all there is).  Pairwise: ``sum_i t_i
    (t_i + 1) / 2 d^2`` flops, :data:`PAIRWISE_SLOWDOWN` times dearer per flop than the BLAS;
    structured: ``(d m)^2 / 2`` per rank-one term and example with a gradient."""
    sizes = deriv.support_sizes()
    if sizes is None:
        return True
    t, terms = sizes
    pairwise = PAIRWISE_SLOWDOWN * float((t * (t + 1)).sum()) / 2.0 * d * d
    structured = terms * float((t > 0).sum()) * (d * m) ** 2 / 2.0
    return pairwise < structured


def _dense_rows(X, a: int, b: int) -> np.ndarray:
    return X[a:b].toarray() if sp.issparse(X) else np.asarray(X[a:b], dtype=np.float64)


def hessian(X, deriv: LossDerivatives, C: float, m: int, weights=None) -> np.ndarray:
    """``I + C sum_i w_i H_i (x) x_i x_i^T`` (``w_i`` the sample weights, 1 without) in the
    class-major order ``vec(W)[c d + j] = W[j, c]``, formed by row blocks.

    Structured ``H_i`` (:class:`~topkbench.losses.curvature.Curvature`): the diagonal gives
    the class blocks ``X^T diag(h_c) X`` over the rows where ``h_ic != 0``, and each rank-one
    term ``u_i u_i^T (x) x_i x_i^T = z_i z_i^T`` with ``z_i = u_i (x) x_i`` gives one
    symmetric product ``Z^T Z`` over the rows where ``u_i != 0`` (for the hinges, the
    examples with a nonzero gradient).  Dense ``H_i`` (top-k Ent, the weighted top-k hinge)
    give every class pair's block at once, from the rows' ``vech(x_i x_i^T)``
    (:func:`_add_vech_blocks`), or, when most of their entries are 0, block by block over the
    class pairs' nonzero rows.  The hinges' ``H_i``, which live on their gradient's support,
    are assembled from their support blocks where that costs less
    (:func:`_pairwise_cheaper`)."""
    n, d = X.shape
    H = np.zeros((m * d, m * d))
    rows = max(1, HESSIAN_ENTRIES // (m * m + m * d))
    if deriv.sparse_support and _pairwise_cheaper(deriv, d, m):
        for a in range(0, n, rows):
            b = min(a + rows, n)
            w = np.ones(b - a) if weights is None else np.ascontiguousarray(weights[a:b])
            assemble_support_hessian(_dense_rows(X, a, b), w, *deriv.support_blocks(a, b), H)
        H *= C
        H[np.diag_indices_from(H)] += 1.0
        return H
    for a in range(0, n, rows):
        b = min(a + rows, n)
        Xb = _dense_rows(X, a, b)
        curv = deriv.curvature(a, b)
        if weights is not None:
            curv = curv.scaled(weights[a:b])
        if curv.dense is None:
            for c in range(m):
                h = curv.diag[:, c]
                nz = np.flatnonzero(h)
                if nz.size:
                    Xn = Xb[nz]
                    H[c * d : (c + 1) * d, c * d : (c + 1) * d] += Xn.T @ (h[nz, None] * Xn)
            for sign, U in curv.terms:
                nz = np.flatnonzero(U.any(axis=1))
                if nz.size:
                    Z = (U[nz, :, None] * Xb[nz, None, :]).reshape(nz.size, m * d)
                    if sign > 0:
                        H += Z.T @ Z
                    else:
                        H -= Z.T @ Z
            continue
        pc, pc2 = np.triu_indices(m)
        per_pair = curv.dense[:, pc, pc2]
        nnz = np.count_nonzero(per_pair, axis=0)
        # one product over all pairs, d (d + 1) / 2 x m (m + 1) / 2 multiply-adds per row,
        # against a product per pair over its nonzero rows, several times dearer per flop
        if (d + 1) * pc.size < DENSE_PAIR_SLOWDOWN * 2 * d * float(nnz.sum()) / (b - a):
            _add_vech_blocks(H, Xb, per_pair, d, m)
            continue
        Hb = np.ascontiguousarray(np.moveaxis(curv.dense, 0, -1))  # the example axis last
        for c, c2 in zip(pc, pc2, strict=True):
            w = Hb[c, c2]
            nz = np.flatnonzero(w)
            if nz.size == 0:
                continue
            Xn = Xb if 2 * nz.size > w.size else Xb[nz]
            wn = w if 2 * nz.size > w.size else w[nz]
            block = Xn.T @ (wn[:, None] * Xn)
            H[c * d : (c + 1) * d, c2 * d : (c2 + 1) * d] += block
            if c2 != c:
                H[c2 * d : (c2 + 1) * d, c * d : (c + 1) * d] += block.T
    H *= C
    H[np.diag_indices_from(H)] += 1.0
    return H


def _add_vech_blocks(H, Xb, per_pair, d: int, m: int) -> None:
    """Add ``sum_i dense_i (x) x_i x_i^T`` to ``H`` (class-major), given the upper triangles
    ``per_pair`` (rows x m (m + 1) / 2, in :func:`numpy.triu_indices` order) of the
    per-example ``dense_i``, by one product: the rows' ``vech(x_i x_i^T)`` against them, which
    gives every class pair's block at once (a product per pair has ``d x d`` outputs, too small
    for the BLAS to run at speed when d is small)."""
    j, j2 = np.triu_indices(d)
    pc, pc2 = np.triu_indices(m)
    B = np.zeros((j.size, pc.size))
    step = max(1, HESSIAN_ENTRIES // (8 * j.size))  # rows of vech products per chunk (8 MB)
    for a in range(0, Xb.shape[0], step):
        Xa = Xb[a : a + step]
        B += (Xa[:, j] * Xa[:, j2]).T @ per_pair[a : a + step]
    blocks = np.empty((pc.size, d, d))
    blocks[:, j, j2] = B.T
    blocks[:, j2, j] = B.T
    H4 = H.reshape(m, d, m, d)  # H4[c, :, c2, :] is the block (c, c2)
    H4[pc, :, pc2, :] += blocks
    off = pc != pc2
    H4[pc2[off], :, pc[off], :] += blocks[off]


def cg_direction(prob: SDCAProblem, deriv: LossDerivatives, C: float, grad):
    """The Newton direction ``D`` (d x m) solving ``H D = -grad`` approximately, by conjugate
    gradients with Hessian-vector products (Newton-CG; liblinear's TRON without the trust
    region, the line search globalizing instead).

    ``H V = V + X^T R`` with ``R_i = C w_i H_i (X V)_i``: two products with X, ``O(nnz m)``,
    and the per-example Hessians applied in their structured form (:class:`~topkbench.losses.
    curvature.Curvature`), or, for the finite-difference losses, one gradient evaluation along
    ``X V`` (:meth:`~topkbench.losses.curvature.LossDerivatives.hess_apply`).  The
    preconditioner is H's diagonal, ``1 + C sum_i w_i (H_i)_cc x_ij^2`` where the Hessians are
    analytic: it undoes the columns' scales, which is what makes raw features
    ill-conditioned.  CG stops at a residual of
    :data:`CG_FORCING` times the gradient's norm (a forcing term: the outer iteration still
    converges linearly fast, and far from the optimum no effort is wasted), or after
    :data:`CG_MAX_ITERATIONS` products; every iterate is a descent direction."""
    X = prob.X
    rc = prob.row_c(C)
    curv = deriv.structured_curvature(0, prob.n)
    if curv is not None:
        sq = X.multiply(X) if sp.issparse(X) else np.asarray(X, dtype=np.float64) ** 2
        precond = 1.0 + np.asarray(sq.T @ (rc * curv.diagonal()))
    else:
        precond = np.ones_like(grad)

    def hess_vec(V):
        return V + features_t_dot(X, rc * deriv.hess_apply(prob.scores(V), curv))

    # a class-separable loss's H is block diagonal by class: its m systems run in lockstep,
    # each with its own step sizes and stopping test (one CG over all of them would search
    # the union of their spectra); otherwise one system, reduced over everything
    axis = 0 if deriv.class_separable else None

    def dot(U, V):
        return np.einsum("jc,jc->c", U, V) if axis == 0 else float(np.vdot(U, V))

    D = np.zeros_like(grad)
    r = -grad
    z = r / precond
    p = z.copy()
    rz = dot(r, z)
    stop = CG_FORCING * np.sqrt(dot(grad, grad))
    live = np.ones(grad.shape[1], dtype=bool) if axis == 0 else True
    for _ in range(CG_MAX_ITERATIONS):
        Hp = hess_vec(p)
        pHp = dot(p, Hp)
        live = live & (pHp > 0.0)
        if not np.any(live):
            break
        alpha = np.where(live, rz / np.where(live, pHp, 1.0), 0.0)
        D += alpha * p
        r -= alpha * Hp
        live = live & (np.sqrt(dot(r, r)) > stop)
        if not np.any(live):
            break
        z = r / precond
        rz_next = dot(r, z)
        p = np.where(live, z + (rz_next / np.where(live, rz, 1.0)) * p, 0.0)
        rz = rz_next
    return D


class GramRows:
    """Gram blocks ``X_a X_a^T`` of the rows ``a`` with curvature, for the Woodbury steps:
    formed per call until their cost reaches that of the whole ``X X^T`` (rent or buy), which
    is then kept for the rest of the phase if it takes at most :data:`GRAM_MAX_BYTES`."""

    def __init__(self, X):
        self.X = X
        self.spent = 0.0
        self.full = None

    @staticmethod
    def _gram(X) -> np.ndarray:
        if X.dtype != np.float64:
            X = X.astype(np.float64)
        K = X @ X.T
        return K.toarray() if sp.issparse(K) else np.asarray(K)

    def block(self, rows, X_rows, pos, owner):
        """A Gram matrix and indices into it for the system's rows: ``X_rows X_rows^T`` (for
        ``X_rows = X[rows]``) with ``pos``, or the whole ``X X^T`` with ``owner`` (the
        example of each row, ``rows[pos]``)."""
        if self.full is None:
            self.spent += float(rows.size) ** 2
            if not self.buy_if(0.0):
                return self._gram(X_rows), pos
        return self.full, owner

    def buy_if(self, more: float) -> bool:
        """Whether the whole ``X X^T`` is kept, forming it now if the blocks' sizes spent so
        far plus ``more`` (in squared rows) reach ``n^2`` and it takes at most
        :data:`GRAM_MAX_BYTES`."""
        n = self.X.shape[0]
        affordable = 8.0 * n * n <= GRAM_MAX_BYTES
        if self.full is None and affordable and self.spent + more >= float(n) ** 2:
            self.full = self._gram(self.X)
        return self.full is not None


def woodbury_direction(prob: SDCAProblem, deriv: LossDerivatives, C: float, grad,
                       gram: GramRows, max_rank: int | None = None):  # fmt: skip
    """``-hess F^{-1} grad`` (``grad`` d x m) through the examples' curvature instead of the
    ``d m x d m`` Hessian, for the hinges, whose ``H_i`` live on their gradient's support.

    Each support block (:meth:`~topkbench.losses.curvature.LossDerivatives.support_blocks`,
    symmetrized, times ``w_i``) is ``sum_p lambda_ip v_ip v_ip^T`` with ``lambda_ip > 0``
    (negative rounding or finite-difference eigenvalues are dropped, which keeps the direction
    one of descent);
    with ``z_ip = sqrt(lambda_ip) v_ip (x) x_i`` (class-major), ``hess F = I + C Z Z^T`` and
    (Woodbury) ``hess F^{-1} g = g - C Z (I + C Z^T Z)^{-1} Z^T g``, where ``(Z^T Z)_{ip,jq} =
    <x_i, x_j> <u_ip, u_jq>`` (``u = sqrt(lambda) v`` in the classes) needs the Gram matrix of
    the examples with curvature only.  The system has one row per (example, eigenvalue), often
    far fewer than ``d m``.  None when it would have more than ``max_rank`` rows
    (:data:`~topkbench.solvers.plan.WOODBURY_MAX_RANK` at most) or fails to factor."""
    n, m = prob.n, prob.m
    tptr, tidx, hptr, hvals = deriv.support_blocks(0, n)
    sizes = np.diff(tptr)
    limit = plan.WOODBURY_MAX_RANK if max_rank is None else min(max_rank, plan.WOODBURY_MAX_RANK)
    if int((sizes - 1).clip(0).sum()) > WOODBURY_PRECHECK * limit:
        # a block's rank is about its size less one (less where the radius or caps bind):
        # far past the limit, spare the eigendecompositions
        return None
    w = np.ones(n) if prob.weights is None else prob.weights  # positive (SDCAProblem)
    blocks = []  # (rows, U on their supports, classes) per support size
    top = 0.0
    for t in np.unique(sizes[sizes > 0]):
        rows = np.flatnonzero(sizes == t)
        idx = hptr[rows][:, None] + np.arange(t * t)
        B = hvals[idx].reshape(rows.size, t, t)
        lam, V = np.linalg.eigh(0.5 * (B + np.swapaxes(B, 1, 2)))
        lam *= w[rows, None]
        top = max(top, float(lam.max()))
        cls = tidx[tptr[rows][:, None] + np.arange(t)]
        blocks.append((rows, lam, V, cls))
    keep_min = WOODBURY_EIG_TOL * top
    owners, parts = [], []
    for rows, lam, V, cls in blocks:
        i, p = np.nonzero(lam > keep_min)
        if i.size == 0:
            continue
        U = np.zeros((i.size, m))
        U[np.arange(i.size)[:, None], cls[i]] = V[i, :, p] * np.sqrt(lam[i, p])[:, None]
        owners.append(rows[i])
        parts.append(U)
    if not owners:
        return -grad
    owner = np.concatenate(owners)
    R = np.concatenate(parts)
    if owner.size > limit:
        return None
    active, pos = np.unique(owner, return_inverse=True)
    Xa = prob.X[active]
    K, idx = gram.block(active, Xa, pos, owner)
    M = np.empty((owner.size, owner.size))
    woodbury_system(K, idx, R, C, M)
    b = np.einsum("pc,pc->p", R, np.asarray(Xa @ grad)[pos])
    z = newton_step(M, b)  # -M^{-1} b
    if z is None:
        return None
    V = np.zeros((active.size, m))
    np.add.at(V, pos, z[:, None] * R)
    return -grad - C * np.asarray(features_t_dot(Xa, V))


def separable_direction(prob: SDCAProblem, deriv: LossDerivatives, C: float, grad,
                        gram: GramRows):  # fmt: skip
    """``-hess F^{-1} grad`` for a class-separable hinge (SVM^OVA: ``H_i`` diagonal), class
    by class.  ``hess F`` is block diagonal, class c's block ``I + C X^T diag(h_c) X`` with
    ``h_ic = w_i (H_i)_cc``, nonzero only on the r_c examples at c's margin; each block is
    solved by Woodbury's identity on those examples,

        D_c = -g_c + C X_c^T diag(u) (I + C diag(u) K_c diag(u))^{-1} diag(u) X_c g_c,

    ``u = sqrt(h_c)``, ``X_c`` their rows and ``K_c = X_c X_c^T`` (a block of the Gram
    matrix, :class:`GramRows`), in ``r_c^3 / 3`` flops once the Gram matrix is kept (else
    ``r_c^2 d`` more), or by the d x d block formed from them where that costs less
    (``r_c d^2 + d^3 / 3``).  ``X_c g_c`` and the ``X_c^T`` products of all classes are two
    products with X.  Where one coupled system over every class would have ``sum_c r_c``
    rows (tens of thousands where every example is at some class's margin), the largest here
    has ``min(r_c, d)``.  None when one would have more than
    :data:`~topkbench.solvers.plan.WOODBURY_MAX_RANK` rows or fails to factor."""
    h = deriv.curvature(0, prob.n).diag
    if prob.weights is not None:
        h = h * prob.weights[:, None]
    X, d = prob.X, prob.X.shape[1]
    counts = np.count_nonzero(h, axis=0)
    if int(np.minimum(counts, d).max(initial=0)) > plan.WOODBURY_MAX_RANK:
        return None
    XG = prob.scores(grad)
    V = np.zeros_like(XG)  # C diag(u) z of each class, on its rows
    D = -grad
    few = counts[counts < d].astype(float)  # the classes whose systems are their examples'
    gram.buy_if(float((few * few).sum()))
    for c in np.flatnonzero(counts):
        rows = np.flatnonzero(h[:, c])
        r = rows.size
        u = np.sqrt(h[rows, c])
        gram_flops = 0.0 if gram.full is not None else r * r * d
        if gram_flops + r**3 / 3.0 <= r * d * d + d**3 / 3.0:
            # the whole Gram matrix once kept: no gather of the rows
            K, idx = (
                (gram.full, rows)
                if gram.full is not None
                else gram.block(rows, X[rows], np.arange(r), rows)
            )
            M = np.empty((r, r))
            woodbury_system(K, idx, u[:, None], C, M)  # one class: R is its root column
            z = newton_step(M, u * XG[rows, c])
            if z is None:
                return None
            V[rows, c] = C * u * z
        else:
            Xu = _dense_rows(X[rows], 0, r) * u[:, None]
            H = dsyrk(C, Xu.T)  # the upper triangle of C Xu^T Xu (Xu.T: no copy)
            H = np.triu(H) + np.triu(H, 1).T
            H[np.diag_indices_from(H)] += 1.0
            step = newton_step(H, grad[:, c])
            if step is None:
                return None
            D[:, c] = step
    return D - features_t_dot(X, V)


def newton_step(H, grad):
    """``-H^{-1} grad`` by Cholesky, factoring the symmetric ``H`` in place (LAPACK on its
    column-major view: no copy).  H = I + C sum H_i (x) x_i x_i^T is positive definite in
    exact arithmetic, but rounded H_i leave eigenvalues a few ulps of ``max H`` below zero,
    and difference H_i straddling a kink (all scores tied, as at W = 0) can be indefinite;
    the diagonal is then shifted by ``max diag(H)`` times 1e-12, 1e-10, ..., 10 until the
    factorization succeeds (a Levenberg step: still a descent direction), each attempt from
    H's original entries.  None if even that fails (non-finite H)."""
    if not np.isfinite(H).all():
        return None
    diag = np.diag(H).copy()
    scale = float(diag.max())
    F = H.T  # LAPACK's column-major view (H is symmetric): factored in place, no copy
    for shift in (0.0, *(scale * 10.0**e for e in range(-12, 2, 2))):
        if shift:
            # a failed factorization overwrote F's lower triangle, i.e. H's upper one
            upper = np.triu_indices(H.shape[0], 1)
            H[upper] = F[upper]
            H[np.diag_indices_from(H)] = diag + shift
        factor, info = dpotrf(F, lower=1, clean=0, overwrite_a=1)
        if info == 0:
            step, info = dpotrs(factor, -grad, lower=1)
            if info == 0:
                return step
    return None
