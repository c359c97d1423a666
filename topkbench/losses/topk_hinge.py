"""SVM^Multi_gamma and the top-k hinges alpha (printed, D_k), alpha pseudo (Delta_k^alpha)
and beta (Delta_k^beta), gamma >= 0 (TPAMI 002 Props. 1-2, 14; DESIGN §4.1).

Conventions as in :mod:`topkbench.losses.dispatch`: ``x = -a^{\\y} / C`` is the conjugate
argument in the loss's domain (the unit simplex for SVM^Multi) and ``a_y = C <1, x>``.

Block update, TPAMI Prop. 14 with the simplex replaced by the loss's conjugate domain (DESIGN
§4.1): ``x' = -a^{\\y}`` is ``argmin_{x in set(C)} ||x - b||^2 + rho <1,x>^2`` with ``b =
(q^{\\y} + (1 - q_y)) / (K + gamma/C)``, ``rho = K / (K + gamma/C)``, by the biased
projections of :mod:`topkbench.prox.topk` (:mod:`topkbench.prox.projections` for the
simplex).  The conjugate is ``-<1, x> + gamma/2 ||x||^2`` on the domain.

Newton's derivatives in the scores (gamma > 0; :mod:`topkbench.losses.curvature`).  TPAMI
Prop. 2 writes the smoothed loss as ``L = max_{v in set} <z, v> - gamma/2 ||v||^2`` on the
off-label coordinates, ``z = 1 + s^{\\y} - s_y``, so ``v`` is the projection of ``z / gamma``
onto the loss's set and, with ``M`` the map ``s -> s^{\\y} - s_y``, ``G = M^T v`` and ``H =
M^T J M / gamma``, J the projection's Jacobian on its face (piecewise constant: a semismooth
Newton method).  SVM^Multi writes both out (:class:`SimplexDerivatives`); the top-k hinges
take the gradient from the block update of a zero-norm example and write J on the gradient's
support (:func:`hinge_support_hessians`, :func:`topkbench.prox.topk.projection_jacobian`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from topkbench.losses.curvature import (
    Curvature,
    LossDerivatives,
    StructuredDerivatives,
    support_index,
)
from topkbench.losses.ids import (
    LOSS_SVM_MULTI,
    LOSS_TOPK_SVM_ALPHA,
    LOSS_TOPK_SVM_ALPHA_PSEUDO,
    LOSS_TOPK_SVM_BETA,
)
from topkbench.prox.projections import simplex_biased_threshold
from topkbench.prox.topk import (
    SET_ALPHA,
    SET_BETA,
    SET_DK,
    insert_top,
    projection_jacobian,
    topk_threshold,
)


@njit(cache=True)
def is_hinge(loss):
    """The SVM^Multi / top-k hinge family (linear conjugate on a polytope)."""
    return loss == LOSS_SVM_MULTI or (
        loss == LOSS_TOPK_SVM_ALPHA
        or loss == LOSS_TOPK_SVM_ALPHA_PSEUDO
        or loss == LOSS_TOPK_SVM_BETA
    )


@njit(cache=True)
def hinge_set(loss):
    if loss == LOSS_TOPK_SVM_ALPHA:
        return SET_DK
    if loss == LOSS_TOPK_SVM_ALPHA_PSEUDO:
        return SET_ALPHA
    return SET_BETA


@njit(cache=True)
def _no_violation(b):
    """Whether every entry of ``b`` is ``<= 0``."""
    for p in range(b.shape[0]):
        if b[p] > 0.0:
            return False
    return True


@njit(cache=True)
def _b_vector(y, s, a, kii, work):
    """``b_j = (s_j - K a_j) - (s_y - K a_y)`` over the m-1 coordinates ``j != y``, stored
    compactly in ``work[:m-1]`` (one loop with a test per j: measured faster than two
    vectorized loops around y, whose remainders are long for m ~ 100).  Returns the view."""
    m = s.shape[0]
    qy = s[y] - kii * a[y]
    p = 0
    for j in range(m):
        if j != y:
            work[p] = s[j] - kii * a[j] - qy
            p += 1
    return work[: m - 1]


@njit(cache=True)
def _hinge_loss(loss, z, gamma, k, srt, idx):
    """Top-k hinge family on ``z = (1 + f_j - f_y)_{j != y}`` (length m-1).

    gamma = 0: closed forms with ``T_j`` = sum of the j largest entries of z (DESIGN §4.1):
    pseudo alpha ``max(0, T_k)/k``, printed alpha ``max(0, T_{k-1}, T_k)/k``, beta
    ``sum_{j<=k} max(0, z_[j])/k``; SVM^Multi is ``max(0, max z)``.
    gamma > 0 (TPAMI Prop. 2): ``(<z,p> - ||p||^2/2)/gamma`` with ``p = clip(z - t, 0, c)`` the
    projection onto the set of radius gamma.  Using ``z_j = p_j + t`` on M and ``z_j = c + t +
    nu_j`` on U, ``<z,p> - ||p||^2/2 = t s + ||p||^2/2 + c sum_U nu_j`` with the exact ``s`` the
    projection returns (= gamma whenever the sum constraint is active); this form keeps full
    relative accuracy for tiny gamma (the direct form loses ~eps |z| / gamma).
    """
    n = z.shape[0]
    if gamma == 0.0:
        if loss == LOSS_SVM_MULTI:
            mx = 0.0
            for j in range(n):
                if z[j] > mx:
                    mx = z[j]
            return mx
        # only the k largest margins matter (T_{k-1}, T_k): select them, no full sort
        zs = srt[: insert_top(z, k, srt)]
        if loss == LOSS_TOPK_SVM_BETA:
            total = 0.0
            for j in range(k):
                if zs[j] > 0.0:
                    total += zs[j]
            return total / k
        head = 0.0
        for j in range(k - 1):
            head += zs[j]
        full = head + zs[k - 1]
        best = max(0.0, full)
        if loss == LOSS_TOPK_SVM_ALPHA:
            best = max(best, head)
        return best / k
    if loss == LOSS_SVM_MULTI:
        t = simplex_biased_threshold(z, 0.0, gamma, idx)
        c = math.inf
        s = 0.0
        for j in range(n):
            if z[j] > t:
                s += z[j] - t
        if t > 0.0:
            s = gamma
    else:
        t, c, s = topk_threshold(hinge_set(loss), z, k, 0.0, gamma, srt)
    pp = 0.0
    nu = 0.0
    for j in range(n):
        v = z[j] - t
        if v > c:
            nu += v - c
            v = c
        if v > 0.0:
            pp += v * v
    val = (t * s + 0.5 * pp + c * nu if nu > 0.0 else t * s + 0.5 * pp) / gamma
    return val if val > 0.0 else 0.0


@njit(cache=True)
def hinge_block(loss, y, s, a, kii, C, gamma, k, out, work, srt, idx):
    """SVM^Multi / top-k hinge block update into ``out`` (module docstring); ``work``,
    ``srt`` (float) and ``idx`` (int) are scratch of length m."""
    m = s.shape[0]
    b = _b_vector(y, s, a, kii, work)
    den = kii + gamma / C
    if den == 0.0:
        # zero-norm example, nonsmooth loss: any x in the domain with <1,x> = C
        # maximizes -L*; the uniform point lies in every top-k set (k <= m-1)
        for j in range(m):
            out[j] = -C / (m - 1)
        out[y] = C
        return
    rho = kii / den
    for p in range(m - 1):
        b[p] = (b[p] + 1.0) / den
    if loss != LOSS_SVM_MULTI and _no_violation(b):
        # no margin violated even without this block: every top-k domain lies in the
        # nonnegative orthant and contains 0, where the objective's gradient -b >= 0,
        # so x = 0 is the projection (most updates near the optimum; skips the
        # selection and sweeps; the simplex's own threshold is cheap, svm_multi keeps it)
        for j in range(m):
            out[j] = 0.0
        return
    if loss == LOSS_SVM_MULTI:
        t = simplex_biased_threshold(b, rho, C, idx)
        c = math.inf
    else:
        t, c, _ = topk_threshold(hinge_set(loss), b, k, rho, C, srt)
    total = 0.0
    p = 0
    for j in range(m):
        if j != y:
            v = b[p] - t
            if v > c:
                v = c
            if v < 0.0:
                v = 0.0
            out[j] = -v
            total += v
            p += 1
    if total > C:
        # b ~ 1/den is huge when |x_i|^2 and gamma/C are tiny; (b - t)_+ then carries
        # an absolute error ~eps max|b| and can leave Delta(C) (seen: <1,x> = C (1 +
        # 5e-5) for |x_i| ~ 1e-3, C = 1e-3), so that D(A) > P(W).  Scale back onto
        # the boundary to keep the dual feasible and the gap a certificate (scaling
        # keeps every cap and cone constraint of the top-k sets).
        for j in range(m):
            if j != y:
                out[j] *= C / total
        total = C
    out[y] = total


@njit(cache=True)
def hinge_neg_conj(a, y, C, gamma):
    """``<1, x> - gamma/2 ||x||^2`` with ``x = -a^{\\y} / C`` (no log: the certificate
    evaluates this for every example)."""
    total = 0.0
    sq = 0.0
    for j in range(a.shape[0]):
        if j != y:
            x = -a[j] / C
            total += x
            sq += x * x
    return total - 0.5 * gamma * sq


@njit(cache=True)
def hinge_support_hessians(S, yptr, yidx, loss, gamma, k, tptr, tidx, hptr, hvals):
    """Each example's Hessian of the smoothed top-k hinge ``L_gamma`` (gamma > 0, not
    SVM^Multi) in the scores, on the support ``T_i = tidx[tptr[i]:tptr[i+1]]`` of its
    gradient, into ``hvals[hptr[i]:]`` as a row-major ``|T_i| x |T_i|`` block.

    The gradient is ``M^T x`` with ``x`` the projection of ``b = z / gamma``, ``z = (1 + s_j -
    s_y)_{j != y}``, onto the loss's set of radius 1 (the zero-norm block update), and ``M``
    the map ``s -> (s_j - s_y)_{j != y}``; so ``H = M^T J M / gamma`` with J the projection's
    Jacobian (:func:`topkbench.prox.topk.projection_jacobian`), which lives on the support of
    x: on the off-label classes of T_i ``H = J / gamma``, against the label ``-J 1 / gamma``,
    and at the label ``<1, J 1> / gamma``."""
    n, m = S.shape
    kind = hinge_set(loss)
    b = np.empty(m)
    work = np.empty(m)
    sup = np.empty(m, dtype=np.int64)
    J = np.empty((m, m))
    for i in range(n):
        lo = tptr[i]
        size = tptr[i + 1] - lo
        if size == 0:
            continue
        y = yidx[yptr[i]]
        sy = S[i, y]
        p = 0
        for j in range(m):
            if j != y:
                b[p] = ((S[i, j] - sy) + 1.0) / gamma  # as hinge_block's zero-norm update
                p += 1
        bv = b[: m - 1]
        t, c, _ = topk_threshold(kind, bv, k, 0.0, 1.0, work)
        q = 0
        ypos = -1
        for p in range(size):
            j = tidx[lo + p]
            if j == y:
                ypos = p
            else:
                sup[q] = j if j < y else j - 1
                q += 1
        projection_jacobian(kind, bv, k, 1.0, t, c, sup[:q], J)
        base = hptr[i]
        total = 0.0
        for p in range(size):
            if p == ypos:
                continue
            pp = p if p < ypos or ypos < 0 else p - 1
            row = 0.0
            for p2 in range(size):
                if p2 == ypos:
                    continue
                qq = p2 if p2 < ypos or ypos < 0 else p2 - 1
                hvals[base + p * size + p2] = J[pp, qq] / gamma
                row += J[pp, qq]
            total += row
            if ypos >= 0:
                hvals[base + p * size + ypos] = -row / gamma
                hvals[base + ypos * size + p] = -row / gamma
        if ypos >= 0:
            hvals[base + ypos * size + ypos] = total / gamma


def _simplex_project(w):
    """Row-wise projection onto ``{v >= 0, sum v <= 1}``; returns ``(v, t)`` with ``v = (w -
    t)_+`` and ``t = 0`` where the sum constraint does not bind."""
    pos = np.maximum(w, 0.0)
    t = np.zeros(w.shape[0])
    binds = pos.sum(axis=1) > 1.0
    if binds.any():
        u = -np.sort(-w[binds], axis=1)
        css = np.cumsum(u, axis=1) - 1.0
        ranks = np.arange(1, w.shape[1] + 1)
        rho = (u - css / ranks > 0.0).sum(axis=1)  # the support size
        t[binds] = css[np.arange(u.shape[0]), rho - 1] / rho
    return np.maximum(w - t[:, None], 0.0), t


class _HingeFamily:
    """What the smoothed hinges share: the gradient is an exact projection onto the
    conjugate's domain, and each H_i lives on its support, at the margin."""

    fenchel_young = True
    sparse_support = True
    support_curvature = True


class SimplexDerivatives(_HingeFamily, StructuredDerivatives):
    """SVM^Multi_gamma (gamma > 0, TPAMI Prop. 2 with k = 1): ``v = proj_Delta(z / gamma) =
    (z / gamma - t)_+`` over ``Delta = {v >= 0, sum v <= 1}``, ``G = M^T v`` (``G_j = v_j``,
    ``G_y = -sum v``) and ``H = M^T J M / gamma`` with J the projection's Jacobian on the
    support S of v: ``I_S`` when ``t = 0``, ``I_S - 1_S 1_S^T / |S|`` when the sum constraint
    binds (t > 0)."""

    kernel_gradient = False
    row_arrays = ("labels",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labels = self.y[1]

    def gradient(self, S, gamma: float):
        # v over the off-label coordinates; the label's entry is held at 0, which the
        # projection maps to 0 (t = 0 leaves it at 0, t > 0 clips it)
        w = (1.0 + S - S[self.rows, self.labels][:, None]) / gamma
        w[self.rows, self.labels] = 0.0
        v, t = _simplex_project(w)
        self.state = (v > 0.0, t > 0.0, gamma)
        # for small gamma, w and t are large and sum v may exceed 1 by rounding (~ 1e-16 |z|
        # / gamma), which would make the dual infeasible and the certificate wrong
        v /= np.maximum(v.sum(axis=1), 1.0)[:, None]
        G = v
        G[self.rows, self.labels] = -v.sum(axis=1)
        return G

    def curvature(self, a: int, b: int) -> Curvature:
        """``H = M^T J M / gamma`` with ``M^T I_S M = sum_{j in S} (e_j - e_y)(e_j - e_y)^T =
        diag(1_S + (|S| - 1) e_y) + (e_y - 1_S)(e_y - 1_S)^T - 1_S 1_S^T``, and the binding
        sum constraint's ``- u u^T / |S|``, ``u = 1_S - |S| e_y``."""
        support, binds, gamma = self.state
        sig = support[a:b].astype(np.float64)
        rows = np.arange(b - a)
        y = self.labels[a:b]
        size = sig.sum(axis=1)
        live = (size > 0.0)[:, None]
        diag = sig.copy()
        diag[rows, y] += size - 1.0
        ey_minus = -sig
        ey_minus[rows, y] += 1.0
        u = sig.copy()
        u[rows, y] = -size
        u *= np.where(binds[a:b], 1.0 / np.sqrt(np.maximum(size, 1.0)), 0.0)[:, None]
        root = 1.0 / math.sqrt(gamma)
        return Curvature(
            np.where(live, diag, 0.0) / gamma,
            ((1.0, np.where(live, ey_minus, 0.0) * root), (-1.0, sig * root), (-1.0, u * root)),
        )  # fmt: skip

    def support_sizes(self) -> tuple[np.ndarray, int]:
        t = self.state[0].sum(axis=1)  # the support of v, and the label
        return t + (t > 0), 3


class TopkHingeDerivatives(_HingeFamily, LossDerivatives):
    """The top-k hinges alpha, alpha pseudo and beta (gamma > 0): the kernels' gradient, and
    the Hessians on its support written by :func:`hinge_support_hessians` (module
    docstring); :meth:`curvature` is the differenced form the tests compare with."""

    def support_blocks(self, a: int, b: int):
        S, gamma, G = self.state
        tptr, tidx, hptr = support_index(G[a:b] != 0.0)
        hvals = np.empty(hptr[-1])
        yptr, yidx = self.y
        hinge_support_hessians(
            np.ascontiguousarray(S[a:b]), yptr[a : b + 1] - yptr[a], yidx[yptr[a] : yptr[b]],
            self.loss_id, gamma, self.k, tptr, tidx, hptr, hvals,
        )  # fmt: skip
        return tptr, tidx, hptr, hvals
