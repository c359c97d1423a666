"""The active-set finish of SVM^ML_gamma: conjugate gradients on a face of the dual, with
projected searches between faces (GPCG: Moré & Toraldo, SIAM J. Optim. 1991), alternating
with plain SDCA epochs.

**Why.** At large C the nonsmooth multilabel hinge's optimum is degenerate: on corel5k
most examples sit at the radius (``sum p = C``) with several labels tied at the minimum
score and several non-labels tied at the maximum, and plain SDCA's coordinate steps creep
towards the ties (the gap shrinks by a few percent per ten epochs).  Once the face of the
optimum is known, the optimum on it solves a linear system, which conjugate gradients
reach in products that touch only the face's few entries per example.

**The dual as a quadratic program** (kernel scale ``P / lambda``, :mod:`topkbench.losses.
multilabel`).  With ``C_i = C w_i`` and ``sigma = +1`` on ``Y_i``, ``-1`` off it, the dual
is ``D(A) = -f(A)``::

    f(A) = 1/2 ||X^T A||^2 + sum_i gamma / (2 C_i) ||a_i||^2 - 1/2 sum_ij sigma_ij a_ij,

over the blocks ``a_i`` with ``a_Y >= 0``, ``a_Ybar <= 0`` and ``sum_Y a = -sum_Ybar a <= C_i``
(``C_i`` times the bipartite simplex, TPAMI Prop. 5; the smoothing of Prop. 6 only adds the
quadratic term).  Its gradient is ``S + gamma / C_i A - sigma / 2`` with ``S = X X^T A`` the
scores, its Hessian ``X X^T (x) I`` plus the diagonal.

**A face** is each block's support ``F_i`` and whether its radius binds.  On it the free
variables move in the tangent space ``{sum_{F_i} d = 0}`` (radius free: the two sides'
sums stay equal, since ``a_Ybar <= 0``), resp. ``{sum_{F_i cap Y} d = 0, sum_{F_i cap Ybar} d
= 0}`` (radius binding); the orthogonal projection onto it subtracts the mean, resp. each
side's mean (the Jacobian of the bipartite projection on its face, as in
:class:`~topkbench.losses.multilabel.BipartiteDerivatives`).  Projected conjugate gradients
minimize f over the face's affine hull; where a CG step would leave the domain (a support
entry crossing 0, a free block passing its radius), a projected search takes ``A(t) =
proj(A + t p)`` block by block onto ``C_i B`` with the entries off the support held at 0
(:func:`~topkbench.prox.bipartite.bipartite_thresholds`), halving ``t`` from the CG step
until Armijo's condition holds.  CG goes on from the new face with the Polak-Ribière
direction projected onto it: with thousands of blocks nearly every step meets some block's
boundary, and restarting CG there (Moré and Toraldo's choice) made three times as many
products on corel5k.  Entries that reach 0 stay fixed for the round.  Entries whose gradient
would bring them into the face are what the plain SDCA epochs between rounds add: each
maximizes the dual over a whole block.  Every round ends in the certificate of the run's own
problem (P of ``W = X^T A``, D of ``A``, their gap), after those epochs: a CG iterate sits on
the face's ties, where the primal point ``X^T A`` is a poor one that the epochs repair.  The
iterates stay dual feasible throughout.
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.sparse as sp
from numba import njit

from topkbench.losses.multilabel import RADIUS_TOL  # a block's radius binds within it
from topkbench.prox.bipartite import bipartite_thresholds
from topkbench.solvers.problem import Run, SDCAProblem, _csr_arrays, features_t_dot

# a round: conjugate gradients on the face for at most this many Hessian products (restarts
# and searches included) or down to this relative residual, then the certificate, then plain
# SDCA epochs to grow the face, then the certificate again
ROUND_PRODUCTS = 400
ROUND_EPOCHS = 5
CG_TOL = 1e-6
# Armijo's constant and the halvings of a projected search
ARMIJO = 1e-4
SEARCH_HALVINGS = 30
# entries within this of 0 (relative to C_i) after a step to the boundary are 0
SNAP = 1e-14


@njit(cache=True)
def _face_of(A, yptr, yidx, rc, mask):
    """The face of the dual ``A`` (n x m): ``(fptr, fcol, fsgn, a, bounded)``, block i's
    support in ``fcol[fptr[i]:fptr[i+1]]`` with its signs (``+1`` on Y) and values, and
    whether its radius binds.  ``mask`` is an all-False bool scratch of length m."""
    n, m = A.shape
    fptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        c = 0
        for j in range(m):
            if A[i, j] != 0.0:
                c += 1
        fptr[i + 1] = fptr[i] + c
    size = fptr[n]
    fcol = np.empty(size, dtype=np.int64)
    fsgn = np.empty(size, dtype=np.float64)
    a = np.empty(size)
    bounded = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        for q in range(yptr[i], yptr[i + 1]):
            mask[yidx[q]] = True
        f = fptr[i]
        total = 0.0
        for j in range(m):
            v = A[i, j]
            if v != 0.0:
                fcol[f] = j
                fsgn[f] = 1.0 if mask[j] else -1.0
                a[f] = v
                if mask[j]:
                    total += v
                f += 1
        bounded[i] = total >= rc[i] * (1.0 - RADIUS_TOL)
        for q in range(yptr[i], yptr[i + 1]):
            mask[yidx[q]] = False
    return fptr, fcol, fsgn, a, bounded


@njit(cache=True)
def _face_rep(xptr, xidx, xval, fptr, fcol, v, Wt):
    """``Wt = (X^T V)^T`` (m x d: a class's weights contiguous, as the face's entries of one
    example read them) for the face values ``v`` (V zero off the face)."""
    Wt[:] = 0.0
    for i in range(fptr.shape[0] - 1):
        for f in range(fptr[i], fptr[i + 1]):
            vf = v[f]
            if vf != 0.0:
                c = fcol[f]
                for q in range(xptr[i], xptr[i + 1]):
                    Wt[c, xidx[q]] += xval[q] * vf


@njit(cache=True)
def _face_scores(xptr, xidx, xval, fptr, fcol, fsgn, bounded, a, Wt, diag, v, out, out_t):
    """``out = (X W)_ij + diag * v`` on the face's entries, and ``out_t`` its projection onto
    the tangent space of the face of ``a`` (:func:`_tangent`): with ``Wt`` from
    :func:`_face_rep` of ``v``, the Hessian of f times ``v``, and its tangent part."""
    for i in range(fptr.shape[0] - 1):
        lo, hi = fptr[i], fptr[i + 1]
        for f in range(lo, hi):
            c = fcol[f]
            acc = 0.0
            for q in range(xptr[i], xptr[i + 1]):
                acc += xval[q] * Wt[c, xidx[q]]
            out[f] = acc + diag[f] * v[f]
            out_t[f] = out[f]
        _tangent_block(lo, hi, fsgn, bounded[i], a, out_t)


@njit(cache=True)
def _tangent_block(lo, hi, fsgn, bounded, a, v):
    """:func:`_tangent` on one block, entries ``lo:hi``."""
    sp_, np_, sn, nn = 0.0, 0, 0.0, 0
    for f in range(lo, hi):
        if a[f] == 0.0:
            v[f] = 0.0
        elif fsgn[f] > 0.0 or not bounded:
            sp_ += v[f]
            np_ += 1
        else:
            sn += v[f]
            nn += 1
    mp = sp_ / max(np_, 1)
    mn = sn / max(nn, 1)
    for f in range(lo, hi):
        if a[f] != 0.0:
            v[f] -= mp if (fsgn[f] > 0.0 or not bounded) else mn


@njit(cache=True)
def _tangent(fptr, fsgn, bounded, a, v):
    """Project ``v`` in place onto the tangent space of the face of ``a`` (module docstring):
    the entries at 0 are fixed (set to 0), the others lose their mean, resp. each side's."""
    for i in range(fptr.shape[0] - 1):
        _tangent_block(fptr[i], fptr[i + 1], fsgn, bounded[i], a, v)


@njit(cache=True)
def _max_step(fptr, fsgn, bounded, rc, a, p):
    """The largest ``t`` with ``a + t p`` in the domain (p in the face's tangent space)."""
    tmax = np.inf
    for i in range(fptr.shape[0] - 1):
        rise, level = 0.0, 0.0
        for f in range(fptr[i], fptr[i + 1]):
            if fsgn[f] > 0.0:
                rise += p[f]
                level += a[f]
                if p[f] < 0.0:
                    tmax = min(tmax, a[f] / -p[f])
            elif p[f] > 0.0:
                tmax = min(tmax, -a[f] / p[f])
        if not bounded[i] and rise > 0.0:
            tmax = min(tmax, max(rc[i] - level, 0.0) / rise)
    return tmax


@njit(cache=True)
def _project_blocks(fptr, fsgn, rc, a, bounded, b, bb, ix, iy, bmap, bbmap):
    """Project each block's face entries in place onto ``C_i B`` (entries off the face held
    at 0), and set whether its radius binds; blocks already in the domain are left as they
    are."""
    for i in range(fptr.shape[0] - 1):
        lo, hi = fptr[i], fptr[i + 1]
        nx, ny = 0, 0
        sx, sy = 0.0, 0.0
        inside = True
        for f in range(lo, hi):
            if fsgn[f] > 0.0:
                b[nx] = a[f]
                bmap[nx] = f
                nx += 1
                sx += a[f]
                inside = inside and a[f] >= 0.0
            else:
                bb[ny] = -a[f]
                bbmap[ny] = f
                ny += 1
                sy -= a[f]
                inside = inside and a[f] <= 0.0
        if inside and sx <= rc[i] and abs(sx - sy) <= RADIUS_TOL * rc[i]:
            bounded[i] = sx >= rc[i] * (1.0 - RADIUS_TOL)
            continue
        if nx == 0 or ny == 0:  # one side empty: the block's only point is 0
            for f in range(lo, hi):
                a[f] = 0.0
            bounded[i] = False
            continue
        t, s = bipartite_thresholds(b[:nx], bb[:ny], rc[i], ix, iy)
        sx = 0.0
        for q in range(nx):
            v = b[q] - t
            a[bmap[q]] = v if v > 0.0 else 0.0
            sx += a[bmap[q]]
        for q in range(ny):
            v = bb[q] - s
            a[bbmap[q]] = -v if v > 0.0 else 0.0
        bounded[i] = sx >= rc[i] * (1.0 - RADIUS_TOL)


@njit(cache=True)
def _snap(fptr, fsgn, rc, a):
    """Set to 0 the entries on the wrong side of 0 or within ``SNAP`` of it (relative to
    C_i): the ones a step to the boundary ends on."""
    for i in range(fptr.shape[0] - 1):
        for f in range(fptr[i], fptr[i + 1]):
            if fsgn[f] * a[f] <= SNAP * rc[i]:
                a[f] = 0.0


@njit(cache=True)
def _scatter(fptr, fcol, a, A):
    """Write the face's values into the dense dual ``A`` (zero elsewhere)."""
    A[:] = 0.0
    for i in range(fptr.shape[0] - 1):
        for f in range(fptr[i], fptr[i + 1]):
            A[i, fcol[f]] = a[f]


class _Face:
    """The dual on its face, f's gradient there, and the products of f's Hessian restricted
    to the face."""

    def __init__(self, prob: SDCAProblem, A, C: float, gamma: float, x):
        """``x``: the features' CSR arrays (:func:`~topkbench.solvers.problem._csr_arrays`)."""
        m = prob.m
        self.x = x
        self.rc = np.ascontiguousarray(prob.example_c(C), dtype=np.float64)
        self.gamma = gamma
        yptr, yidx = prob.y
        self.fptr, self.fcol, self.fsgn, self.a, self.bounded = _face_of(
            A, yptr, yidx, self.rc, np.zeros(m, dtype=np.bool_)
        )
        self.Wt = np.zeros((m, prob.X.shape[1]))
        self.work = (np.empty(m), np.empty(m), np.empty(m, np.int64), np.empty(m, np.int64),
                     np.empty(m, np.int64), np.empty(m, np.int64))  # fmt: skip
        self.products = 0
        sizes = np.diff(self.fptr)
        self.diag = np.repeat(self.gamma / self.rc, sizes)
        curvature = np.repeat(prob.sqnorms, sizes) + self.diag
        self.inv_diag = 1.0 / np.where(curvature > 0.0, curvature, 1.0)
        self.g = self.hess(self.a)[0] - 0.5 * self.fsgn

    def hess(self, v):
        """The Hessian of f times ``v`` on the face, and its tangent part."""
        _face_rep(*self.x, self.fptr, self.fcol, v, self.Wt)
        out, out_t = np.empty_like(v), np.empty_like(v)
        _face_scores(*self.x, self.fptr, self.fcol, self.fsgn, self.bounded, self.a, self.Wt,
                     self.diag, v, out, out_t)  # fmt: skip
        self.products += 1
        return out, out_t

    def projected(self, a):
        """``a`` projected block by block onto the domain, and the blocks' radius flags."""
        a, bounded = a.copy(), self.bounded.copy()
        _project_blocks(self.fptr, self.fsgn, self.rc, a, bounded, *self.work)
        return a, bounded

    def tangent(self, v):
        _tangent(self.fptr, self.fsgn, self.bounded, self.a, v)
        return v


def _cg_on_face(face: _Face, budget: int) -> None:
    """Projected CG on the face from its values for at most ``budget`` products, or until the
    residual is ``CG_TOL`` of its start.  Where a step
    would leave the domain, a projected search moves to a new face, and CG goes on there
    with the Polak-Ribiere direction projected onto the new face (restarting from the
    residual when that is no descent direction).  f is quadratic, so its changes and its
    gradient follow from the products along the steps (no evaluation of f itself).

    Preconditioned by the Hessian's diagonal, ``||x_i||^2 + gamma / C_i`` on block i's
    entries: constant on a block, it commutes with the tangent projection, so the
    preconditioned residual stays in the tangent space."""
    inv = face.inv_diag
    r = face.tangent(-face.g)
    z = inv * r
    rz = float(r @ z)
    r0 = math.sqrt(float(r @ r))
    if r0 == 0.0:
        return
    p = z.copy()
    start = face.products
    while face.products - start < budget:
        Hp, Hp_t = face.hess(p)
        pHp = float(p @ Hp_t)
        if not pHp > 0.0:
            break
        alpha = rz / pHp
        tmax = _max_step(face.fptr, face.fsgn, face.bounded, face.rc, face.a, p)
        if alpha >= tmax:
            _projected_search(face, p, Hp, alpha, tmax)
            r_next = face.tangent(-face.g)
            z_next = inv * r_next
            beta = max(float(z_next @ (r_next - face.tangent(r.copy()))) / rz, 0.0)
            p = z_next + beta * face.tangent(p)
            if not float(p @ r_next) > 0.0:
                p = z_next.copy()
            r, z, rz = r_next, z_next, float(r_next @ z_next)
        else:
            face.a += alpha * p
            face.g += alpha * Hp
            r -= alpha * Hp_t
            z = inv * r
            rz_next = float(r @ z)
            p = z + (rz_next / rz) * p
            rz = rz_next
        if math.sqrt(float(r @ r)) <= CG_TOL * r0:
            break


def _projected_search(face: _Face, p, Hp, alpha: float, tmax: float) -> None:
    """Move the face's point along ``t -> proj(a + t p)`` by Armijo's search from the CG
    step ``alpha`` down; if no trial passes, by the step to the domain's boundary ``tmax``
    (a descent step: f decreases along p up to ``alpha >= tmax``).  A trial's change of f is
    ``<g, s> + <s, H s> / 2`` for its step ``s``, and the gradient moves by ``H s``."""
    a, g = face.a, face.g
    t = alpha
    for _ in range(SEARCH_HALVINGS):
        t = max(t, tmax)
        trial, bounded = face.projected(a + t * p)
        step = trial - a
        Hs = face.hess(step)[0]
        slope = float(g @ step)
        if slope + 0.5 * float(step @ Hs) <= ARMIJO * slope:
            face.a, face.g, face.bounded = trial, g + Hs, bounded
            return
        if t == tmax:
            break
        t *= 0.5
    face.a, face.g = a + tmax * p, g + tmax * Hp
    # the entries that reached 0 are 0 (not a rounding error of either sign), and the blocks
    # that reached their radius bind
    _snap(face.fptr, face.fsgn, face.rc, face.a)
    _project_blocks(face.fptr, face.fsgn, face.rc, face.a, face.bounded, *face.work)


def solve_active_set(prob: SDCAProblem, run: Run, A, C: float, gamma: float):
    """Continue ``run`` from the dual ``A`` by rounds of CG on the dual's face and plain SDCA
    epochs (module docstring) until the relative gap is at most ``run.eps`` or a budget is
    spent; a round counts as one epoch of ``run``, its SDCA epochs as theirs.

    Returns ``(status, A, W, primal, dual, gap, info)`` as
    :func:`topkbench.solvers.accelerated.solve_accelerated` does (status never
    ``"running"``: the rounds go on until the gap or a budget stops them)."""
    x = _csr_arrays(prob.X if sp.issparse(prob.X) else sp.csr_matrix(prob.X))
    A = np.ascontiguousarray(A, dtype=np.float64)
    info = {"active_set_from_epoch": run.epochs, "active_set_rounds": 0,
            "active_set_products": 0}  # fmt: skip
    while True:
        t_round = time.perf_counter()
        face = _Face(prob, A, C, gamma, x)
        _cg_on_face(face, ROUND_PRODUCTS)
        _scatter(face.fptr, face.fcol, face.a, A)
        info["active_set_rounds"] += 1
        info["active_set_products"] += face.products
        W = features_t_dot(prob.X, A)
        run.epochs += 1
        batch = run.clip_batch(ROUND_EPOCHS) if run.budget_status() is None else 0
        if batch:
            perms = run.permutations(batch)
            run.failures += prob.run_epochs(A, W, perms, C, gamma, run.troots)
            run.epochs += batch
        run.epoch_seconds = (time.perf_counter() - t_round) / (batch + 1)
        W, primal, dual, gap = _certificate(prob, run, A, C, gamma)
        status = run.stop_status(gap)
        if status is not None:
            return status, A, W, primal, dual, gap, info


def _certificate(prob: SDCAProblem, run: Run, A, C: float, gamma: float):
    """``(W, P, D, gap)`` of the dual ``A`` and its primal point ``W = X^T A``, recorded."""
    W = features_t_dot(prob.X, A)
    primal, dual = prob.objective(A, W, C, gamma)
    return W, primal, dual, run.record(primal, dual, A, W)


__all__ = ["solve_active_set"]
