"""LR^Multi and top-k Ent: the block update, the loss and the conjugate value over the m
classes of an example (TPAMI 002 Props. 3-4, 15-17; LR^Multi is top-1 Ent, Table 1).  The
top-k entropy maths itself (the loss on the margins and the prox) is in
:mod:`topkbench.losses.topk_entropy`.

Block update, Props. 15-16: ``x_j = V(b_j - t) / alpha`` with ``alpha = C K``, ``b = q^{\\y} -
q_y`` and ``t`` the root of eq. (14) ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0`` for
k = 1 (U empty), and the top-k prox otherwise.

Newton's derivatives in the scores (:mod:`topkbench.losses.curvature`): LR^Multi ``L =
logsumexp(s) - s_y`` has ``G = p - e_y`` and ``H = diag(p) - p p^T``, ``p = softmax(s)``
(:class:`SoftmaxDerivatives`); top-k Ent's H is the Jacobian of the top-k simplex maximizer
on its partition (:class:`TopkEntDerivatives`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy.special import logsumexp

from topkbench.losses.curvature import Curvature, LossDerivatives, StructuredDerivatives
from topkbench.losses.ids import LOSS_LR_MULTI, LOSS_TOPK_ENT
from topkbench.losses.topk_entropy import topk_ent_prox
from topkbench.losses.topk_hinge import _b_vector
from topkbench.prox.vecmath import exp_shifted, log_into, vdot, vsum


@njit(cache=True)
def is_entropic(loss):
    """LR^Multi and top-k Ent (negative-entropy conjugate)."""
    return loss == LOSS_LR_MULTI or loss == LOSS_TOPK_ENT


@njit(cache=True, error_model="numpy")
def _b_full(y, s, a, kii, work):
    """``b_j = (s_j - K a_j) - (s_y - K a_y)`` for every j, with ``b_y = -inf``, in
    ``work[:m]`` (returned): the label keeps its slot, where the entropic prox gives ``x_y =
    V(-inf) / alpha = 0``, so that this loop and the block's output loop vectorize (99 classes:
    145 -> 50 ns for both against the compact vector of :func:`_b_vector`)."""
    m = s.shape[0]
    qy = s[y] - kii * a[y]
    for j in range(m):
        work[j] = (s[j] - kii * a[j]) - qy
    work[y] = -np.inf
    return work[:m]


@njit(cache=True, error_model="numpy")
def _entropic_out(y, C, x, sx, out):
    """``out = -C x`` except ``out[y] = C sx`` with ``sx = <1, x>`` (x over all m slots, ``x_y
    = 0``)."""
    m = out.shape[0]
    for j in range(m):
        out[j] = -C * x[j]
    out[y] = C * sx


@njit(cache=True)
def _entropic_block(loss, y, s, a, kii, C, k, out, work, vals, srt, idx, extra, troots, i):
    """LR^Multi / top-k Ent block update (see :func:`update_block`): the prox of eq. (11) at
    ``b`` (LR^Multi is top-1 Ent, TPAMI Table 1), x written over b.

    The prox runs on all m slots with ``b_y = -inf`` (:func:`_b_full`): the label's
    coordinate is 0 and every other one is the prox of the m - 1 real entries (the extra slot
    adds nothing to any sum and is never among the k largest).  Not when ``k = m - 1``: that
    prox has its own all-capped case for ``k = n`` (every coordinate at the cap), which the
    extra slot would hide; the compact vector of :func:`_b_vector` serves it."""
    m = s.shape[0]
    kk = 1 if loss == LOSS_LR_MULTI else k
    # two call sites of the prox on purpose: one shared call (b chosen first) was slower
    if kk == 1 or kk < m - 1:
        b = _b_full(y, s, a, kii, work)
        t0, status, sx = topk_ent_prox(
            b, C * kii, kk, b, vals, srt, idx, extra[0], extra[1], extra[2], troots[i]
        )  # fmt: skip
        troots[i] = t0
        # the prox keeps <1, x> <= 1 (it rescales rounding excess itself)
        _entropic_out(y, C, b, sx, out)
        return status
    b = _b_vector(y, s, a, kii, work)
    t0, status, sx = topk_ent_prox(
        b, C * kii, kk, b, vals, srt, idx, extra[0], extra[1], extra[2], troots[i]
    )  # fmt: skip
    troots[i] = t0
    p = 0
    for j in range(m):
        if j != y:
            out[j] = -C * b[p]
            p += 1
    out[y] = C * sx
    return status


@njit(cache=True)
def _lr_multi_loss(s, y, ex, tmp):
    """``log sum_j e^{s_j} - s_y`` (LR^Multi, TPAMI Table 1), shifted by ``max s``; ``ex`` and
    ``tmp`` are scratch.  Vectorized exp (:func:`~topkbench.prox.vecmath.exp_shifted`)."""
    m = s.shape[0]
    mx = s[0]
    for j in range(m):
        mx = max(mx, s[j])
    exp_shifted(s, mx, m, ex, tmp)
    return mx + math.log(vsum(ex, m)) - s[y]


@njit(cache=True)
def _xlogx(x):
    return x * math.log(x) if x > 0.0 else 0.0


@njit(cache=True)
def _entropic_neg_conj(a, y, C, x, lx, tmp):
    """``-<x, log x> - (1 - <1,x>) log(1 - <1,x>)`` with ``x_j = -a_j / C`` for ``j != y``
    (LR^Multi and top-k Ent, TPAMI Props. 3-4); ``x``, ``lx``, ``tmp`` are scratch.
    Vectorized log (``x log x = 0`` at ``x = 0`` through the clamp of
    :func:`~topkbench.prox.vecmath.log_into`)."""
    m = a.shape[0]
    for j in range(m):
        x[j] = -a[j] / C
    x[y] = 0.0
    total = vsum(x, m)
    log_into(x, m, lx, tmp)
    return -vdot(x, lx, m) - _xlogx(1.0 - total)


@njit(cache=True)
def topk_ent_hessian_rows(x_m, capped, y, g11, g12, g22, J):
    """Top-k Ent's per-example Hessians in the scores (the formula of
    :meth:`TopkEntDerivatives.curvature`), one row at a time into ``J`` (rows x m x m):
    ``diag(x_M) + g11 x_M x_M^T + g12 (x_M 1_U^T + 1_U x_M^T) + g22 1_U 1_U^T`` in the
    coordinates ``s^{\\y} - s_y``, then mapped to the scores with ``r = J 1``: ``J - e_y r^T -
    r e_y^T + <1, r> e_y e_y^T``."""
    n, m = x_m.shape
    r = np.empty(m)
    for i in range(n):
        a, b, c = g11[i], g12[i], g22[i]
        for p in range(m):
            xp = x_m[i, p]
            up = 1.0 if capped[i, p] else 0.0
            for q in range(m):
                xq = x_m[i, q]
                uq = 1.0 if capped[i, q] else 0.0
                J[i, p, q] = a * (xp * xq) + b * (xp * uq + up * xq) + c * (up * uq)
            J[i, p, p] += xp
        total = 0.0
        for p in range(m):
            acc = 0.0
            for q in range(m):
                acc += J[i, p, q]
            r[p] = acc
            total += acc
        yi = y[i]
        for q in range(m):
            J[i, yi, q] -= r[q]
        for p in range(m):
            J[i, p, yi] -= r[p]
        J[i, yi, yi] += total


class SoftmaxCurvature(StructuredDerivatives):
    """The softmax's Hessian ``H = diag(p) - p p^T`` (LR^Multi and LR^ML), ``p`` kept in
    :attr:`state` by the gradient; the curvature is bounded (by 1/2), so Newton-CG's systems
    are short."""

    kernel_gradient = False
    bounded_curvature = True
    smoothness = 1.0  # the negative-entropy conjugate is 1-strongly convex

    def curvature(self, a: int, b: int) -> Curvature:
        P = self.state[a:b]
        return Curvature(P, ((-1.0, P),))


class SoftmaxDerivatives(SoftmaxCurvature):
    """LR^Multi: ``G = p - e_y`` with ``p = softmax(s)``."""

    row_arrays = ("labels",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labels = self.y[1]

    def gradient(self, S, gamma: float):
        P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
        # G_y = p_y - 1 as minus the other classes' sum: the dual block's coordinates then sum
        # to zero exactly, as the conjugate's domain requires
        G = P.copy()
        G[self.rows, self.labels] = 0.0
        G[self.rows, self.labels] = -G.sum(axis=1)
        self.state = P
        return G


class TopkEntDerivatives(LossDerivatives):
    """Top-k Ent (TPAMI Prop. 17): the kernels' gradient, and the Hessians in the scores
    written out as dense ``m x m`` matrices (they are dense: every class has mass).

    In the coordinates ``a = s^{\\y} - s_y`` the gradient is the maximizer ``x`` of ``<a, x> -
    <x, log x> - (1-s) log(1-s)`` over the top-k simplex, ``s = <1, x>``
    (:mod:`topkbench.losses.topk_entropy`).  On its partition, ``U`` the ``u`` capped
    coordinates (``x_j = s/k``) and ``M`` the others (``x_j = e^{a_j - t}``), the stationarity
    conditions are ``(1 - rho) t = -log(1-s) - A_U/k + rho log(s/k)`` and ``(1 - rho) s =
    sum_M e^{a_j - t}`` (``rho = u/k``, ``A_U = sum_U a_j``).  Differentiating both, with ``b =
    s (1-s) / (s + rho (1-s))`` and ``e = (1-rho) b + s``, gives ``dt = (<x_M, da> - (1-rho)
    b/k <1_U, da>) / ((1-rho) e)`` and ``ds = <x_M, da> / (1-rho) - s dt``; with ``dx_j = x_j
    (da_j - dt)`` on M and ``ds/k`` on U,

        J = dx/da = diag(x_M) + g11 x_M x_M^T + g12 (x_M 1_U^T + 1_U x_M^T)
                    + g22 1_U 1_U^T,
        g11 = -1 / ((1-rho) e),  g12 = b / (k e),  g22 = s b / (k^2 e),

    symmetric as a Hessian must be (``x_M`` is x with zeros on U).  At ``u = 0`` this is the
    softmax's ``diag(x) - x x^T``; at ``u = k`` (only when ``m - 1 = k``) the closed form
    ``s(1-s)/k^2 1 1^T``.  In the scores, ``H = T^T J T`` with ``T s = (s_j - s_y)_{j !=
    y}``: ``H = J - e_y r^T - r e_y^T + <1, r> e_y e_y^T``, ``r = J 1``.  A coordinate within
    1e-9 (relative) of the cap counts as capped: at the kink both pieces' Jacobians are
    generalized ones."""

    fd_relative_to_gamma = False  # smooth: curvature ~1 whatever gamma
    smoothness = 1.0  # a negative-entropy conjugate, as LR^Multi's

    def curvature(self, a: int, b: int) -> Curvature:
        _, _, G = self.state
        G = G[a:b]
        k = float(self.k)
        rows = np.arange(b - a)
        yptr, yidx = self.y
        y = yidx[yptr[a:b]]
        x = G.copy()
        x[rows, y] = 0.0
        s = x.sum(axis=1)
        capped = (x >= (s / k)[:, None] * (1.0 - 1e-9)) & (x > 0.0)
        rho = capped.sum(axis=1) / k
        x_m = np.where(capped, 0.0, x)
        q = 1.0 - s
        live = s > 0.0
        bb = np.where(live, s * q / np.where(live, s + rho * q, 1.0), 0.0)
        e = np.where(live, (1.0 - rho) * bb + s, 1.0)
        free = rho < 1.0
        g11 = np.where(free & live, -1.0 / np.where(free, (1.0 - rho) * e, 1.0), 0.0)
        g12 = np.where(live, bb / (k * e), 0.0)
        g22 = np.where(live, s * bb / (k * k * e), 0.0)
        J = np.empty((b - a, x.shape[1], x.shape[1]))
        topk_ent_hessian_rows(x_m, capped, np.ascontiguousarray(y, dtype=np.int64), g11, g12,
                              g22, J)  # fmt: skip
        return Curvature(None, (), J)
