"""LR^Multi and top-k Ent: the block update, the loss and the conjugate value over the m
classes of an example (TPAMI 002 Props. 3-4, 15-17; LR^Multi is top-1 Ent, Table 1).  The
top-k entropy maths itself (the loss on the margins and the prox) is in
:mod:`topkbench.losses.topk_entropy`.

Block update, Props. 15-16: ``x_j = V(b_j - t) / alpha`` with ``alpha = C K``, ``b = q^{\\y} -
q_y`` and ``t`` the root of eq. (14) ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0`` for
k = 1 (U empty), and the top-k prox otherwise.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

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
