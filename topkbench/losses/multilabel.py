"""Multilabel losses: SVM^ML_gamma and LR^ML (TPAMI, 002 §3.3, Props. 5-7, 18-20).

Conventions as in :mod:`topkbench.losses.dispatch` (scale ``P / lambda``, ``C = 1/(lambda n)``,
dual blocks ``a_i`` in the paper's scale, ``v = -a_i / C`` the conjugate argument).  An
example's label set ``Y`` (``k = |Y|``) is a sorted index slice; ``Ybar`` is its complement;
``mask`` (bool, length m) marks ``Y`` while a block is processed.

**SVM^ML** ``L(u) = max{0, 1 + max_Ybar u_j - min_Y u_y}`` (Prop. 5): the conjugate domain is
``S_Y = {v_Y <= 0, v_Ybar >= 0, -sum v_Y = sum v_Ybar <= 1}`` with ``L*(v) = -sum_Ybar v_j``.
Writing ``p = -v_Y`` and ``pbar = v_Ybar``, ``(p, pbar)`` lies in the bipartite simplex B(1).
Smoothing (Prop. 6) adds ``gamma/2 ||v||^2`` over **all** m coordinates (DESIGN §2), and
``L*_gamma(v) = 1/2 (sum_Y v_y - sum_Ybar v_j) + gamma/2 ||v||^2`` on ``S_Y``; both forms of the
linear part agree on ``S_Y``, and the symmetric one is used for the dual value because it
stays exact when rounding leaves ``sum p`` and ``sum pbar`` a few ulps apart.

*Smooth loss* (Prop. 6): ``L_gamma(u) = (<b,p> - ||p||^2/2 + <bbar,pbar> - ||pbar||^2/2) /
gamma`` with ``b = 1/2 - u_Y``, ``bbar = 1/2 + u_Ybar`` and ``(p, pbar)`` their projection onto
``B(gamma)``.  With ``p = (b - t)_+``, ``pbar = (bbar - s)_+`` the bracket equals
``(t + s) S + (||p||^2 + ||pbar||^2)/2`` (``S`` the common sum, ``= gamma`` whenever
``t + s > 0``), which keeps full relative accuracy for tiny gamma.  Singleton ``Y`` does *not*
give smooth SVM^Multi (that one smooths only ``v^{\\y}``; DESIGN §2).

*Update* (Prop. 18, checked by our derivation): maximizing the dual over ``a_i`` with ``q = s -
K a_i`` (``K = ||x_i||^2``) is ``max <p, 1/2 - q_Y> + <pbar, 1/2 + q_Ybar> - den/2 (||p||^2 +
||pbar||^2)`` over ``B(C)``, ``den = K + gamma/C``; i.e. ``(p, pbar) = proj_{B(C)}((1/2 - q_Y)/den,
(1/2 + q_Ybar)/den)``, and ``a_Y = p``, ``a_Ybar = -pbar``.  ``den = 0`` (zero-norm example,
gamma = 0) leaves a linear objective ``C`` at any point with sum C: the uniform one is taken
(DESIGN §4.3).

**LR^ML** ``L(u) = log sum_j exp(u_j) - (1/k) sum_Y u_y``.  TPAMI prints the inner sum of
(LR^ML) over ``j in Y``, which would ignore the negative labels; the cross-entropy it is
derived from (the display above it) sums over all classes, and Prop. 7's conjugate matches the
all-class form, which we use.  ``L*(v) = sum_j p_j log p_j`` with ``p = v + 1_Y / k`` in the unit
simplex (Prop. 7).  *Update* (Prop. 20): ``a = -C (p - 1_Y / k)`` with ``p_j = V(c_j - t)/alpha``,
``alpha = C K``, ``c_j = q_j + [j in Y] alpha / k`` and ``t`` the root of eq. (19)
``sum_j V(c_j - t) = alpha``.  Shifting ``t`` by ``c_{y0} - alpha`` (``y0`` the first label)
turns (19) into eq. (14) of LR^Multi, so the same bracketed Halley solver
(:func:`topkbench.prox.roots._entropic_root`) is used.  For ``alpha -> 0`` the update
tends to ``p = softmax(q)``, used below ``alpha = 1e-16`` (zero-norm examples included).

Examples with ``Y`` empty or complete carry no ranking constraint; the Python layer excludes
them from training.  The kernels still treat them safely: block 0, loss 0, conjugate 0.

Newton's derivatives in the scores (:mod:`topkbench.losses.curvature`): LR^ML has ``G = p -
1_Y / |Y|`` and LR^Multi's ``H = diag(p) - p p^T`` (:class:`SoftmaxMLDerivatives`);
SVM^ML_gamma has ``G = sigma * proj_B(z)`` through the bipartite projection, whose Jacobian
on its face is written out (:class:`BipartiteDerivatives`).  Examples with Y empty or
complete get gradient and Hessian 0, as in the kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy.special import logsumexp

from topkbench.losses.curvature import Curvature, StructuredDerivatives
from topkbench.losses.entropic import SoftmaxCurvature
from topkbench.losses.ids import LOSS_LR_ML, LOSS_SVM_ML  # noqa: E402
from topkbench.prox.bipartite import bipartite_from_candidates
from topkbench.prox.lambertw import lambertw_exp
from topkbench.prox.roots import STATUS_OK, _entropic_root

ALPHA_TINY = 1e-16
# SVM^ML_gamma's Hessian: the bipartite projection's radius counts as active when sum p is
# this close to 1 (its kink; either Jacobian is a generalized one there)
RADIUS_TOL = 1e-12


@njit(cache=True)
def is_multilabel(loss):
    return loss == LOSS_SVM_ML or loss == LOSS_LR_ML


@njit(cache=True)
def _xlogx(x):
    return x * math.log(x) if x > 0.0 else 0.0


@njit(cache=True)
def _set_mask(mask, labels, value):
    for p in range(labels.shape[0]):
        mask[labels[p]] = value


@njit(cache=True)
def _softmax_into(q, out):
    """``out = softmax(q)`` (overflow-safe)."""
    m = q.shape[0]
    mx = q[0]
    for j in range(m):
        if q[j] > mx:
            mx = q[j]
    total = 0.0
    for j in range(m):
        out[j] = math.exp(q[j] - mx)
        total += out[j]
    for j in range(m):
        out[j] /= total


@njit(cache=True)
def _max_off(u, mask, m):
    """``max_j u_j`` over the entries off ``mask`` (``-inf`` if none), in eight running
    maxima: a single one is a chain of dependent compares, which LLVM does not split into
    vector lanes (a floating-point max reduction is reassociated only under fast-math); the
    maximum does not depend on the order."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -math.inf
    j = 0
    while j + 8 <= m:
        a0 = max(a0, -math.inf if mask[j] else u[j])
        a1 = max(a1, -math.inf if mask[j + 1] else u[j + 1])
        a2 = max(a2, -math.inf if mask[j + 2] else u[j + 2])
        a3 = max(a3, -math.inf if mask[j + 3] else u[j + 3])
        a4 = max(a4, -math.inf if mask[j + 4] else u[j + 4])
        a5 = max(a5, -math.inf if mask[j + 5] else u[j + 5])
        a6 = max(a6, -math.inf if mask[j + 6] else u[j + 6])
        a7 = max(a7, -math.inf if mask[j + 7] else u[j + 7])
        j += 8
    while j < m:
        a0 = max(a0, -math.inf if mask[j] else u[j])
        j += 1
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@njit(cache=True, fastmath={"reassoc"})
def _sum_off_support(w, old, mask, m):
    """``(sum_S w_j, |S|)`` over ``S``, the negatives where the block ``old`` is nonzero
    (``reassoc`` splits the sum into vector lanes; it only sets the candidates' cut, and any
    rounding of it still leaves a lower bound up to the last bits)."""
    total = 0.0
    count = 0
    for j in range(m):
        on = old[j] < 0.0 and not mask[j]
        total += w[j] if on else 0.0
        count += on
    return total, count


@njit(cache=True)
def _ml_projection(u, mask, labels, den, r, w, idx, old):
    """Thresholds of the SVM^ML projection ``(p, pbar) = proj_{B(r)}((1/2 - u_Y)/den,
    (1/2 + u_Ybar)/den)`` (module docstring), with each block shifted to a maximum of 0 in
    ``w`` (length m; may be ``u`` itself)::

        w_j = (min_Y u - u_j) / den  on Y,      w_j = (u_j - max_Ybar u) / den  off Y.

    Shifting before the division keeps full accuracy when ``1/den`` is huge (tiny ``C
    ||x||^2``, tiny gamma); the shifts sum to ``offset = (1 + max_Ybar u - min_Y u)/den``
    (:func:`~topkbench.prox.bipartite.bipartite_thresholds`).

    Only negatives above a cut can be positive, and only they go to the projection
    (:func:`~topkbench.prox.bipartite.bipartite_from_candidates`), so its knapsack never walks
    the many negatives of a large label space.  The cut is ``-r`` (within ``r`` of the
    largest), raised by ``old``, a dual block whose negative support is likely close to the
    projection's (the previous block in an SDCA update, the current one in a loss value; an
    empty array for none): for any set ``S`` of negatives, ``(sum_S w - r)/|S|`` is at most
    the knapsack threshold over ``S`` (variable fixing's first iterate), which is at most the
    threshold over all negatives (``sum_S (w - t)_+`` is smaller at every ``t``).  With ``S``
    the block's negative support, a support that moved little leaves few candidates.

    Returns ``(t, s, offset, nx, ny)``: ``p_j = (w_j - t)_+`` for ``j`` in ``idx[:nx]``,
    ``pbar_j = (w_j - s)_+`` for ``j`` in ``idx[k:k+ny]``; every other entry is 0.
    """
    m = u.shape[0]
    k = labels.shape[0]
    umin = math.inf
    for p in range(k):
        umin = min(umin, u[labels[p]])
    umax = _max_off(u, mask, m)
    ix = idx[:k]
    iy = idx[k:]
    nx = 0
    for p in range(k):
        j = labels[p]
        v = (umin - u[j]) / den
        w[j] = v
        if v > -r:
            ix[nx] = j
            nx += 1
    # the negatives shifted, in a pass with no reduction in it (LLVM vectorizes it)
    for j in range(m):
        shifted = (u[j] - umax) / den
        w[j] = w[j] if mask[j] else shifted
    cut = -r
    if old.shape[0] == m:
        hsum, hcount = _sum_off_support(w, old, mask, m)
        if hcount > 0:
            cut = max(cut, (hsum - r) / hcount)
    # branch-free compaction (iy[ny] is overwritten until a candidate keeps it) up to the
    # last negative: iy has room for every negative, and before the last one fewer than all
    # have been counted
    end = m
    while end > 0 and mask[end - 1]:
        end -= 1
    ny = 0
    for j in range(end):
        iy[ny] = j
        ny += (not mask[j]) and w[j] > cut
    offset = (1.0 + umax - umin) / den
    t, sb, nx, ny = bipartite_from_candidates(w, w, r, ix, nx, iy, ny, offset, 0.0, 0.0)
    return t, sb, offset, nx, ny


@njit(cache=True)
def update_block_ml(loss, labels, s, a, kii, C, gamma, out, work, vals, idx, troots, i, mask):
    """New dual block of one multilabel example into ``out`` (module docstring).

    ``labels`` are the example's sorted label indices; ``work``, ``vals`` (float) and ``idx``
    (int) are scratch arrays of length m; ``mask`` is an all-False bool array of length m
    (restored on return).  Returns a status.
    """
    m = s.shape[0]
    k = labels.shape[0]
    if k == 0 or k == m:
        for j in range(m):
            out[j] = 0.0
        return STATUS_OK
    status = STATUS_OK
    _set_mask(mask, labels, True)
    if loss == LOSS_SVM_ML:
        den = kii + gamma / C
        if den == 0.0:
            for j in range(m):
                out[j] = C / k if mask[j] else -C / (m - k)
            _set_mask(mask, labels, False)
            return status
        # b = (1/2 - q_Y)/den, bbar = (1/2 + q_Ybar)/den with q = s - K a (into vals, then
        # shifted in place)
        for j in range(m):
            vals[j] = s[j] - kii * a[j]
        t, sb, _, nx, ny = _ml_projection(vals, mask, labels, den, C, vals, idx, a)
        for j in range(m):
            out[j] = 0.0
        sum_p = 0.0
        for q in range(nx):
            j = idx[q]
            v = vals[j] - t
            if v > 0.0:
                out[j] = v
                sum_p += v
        sum_pb = 0.0
        for q in range(k, k + ny):
            j = idx[q]
            v = vals[j] - sb
            if v > 0.0:
                out[j] = -v
                sum_pb += v
        # rounding can leave the two sums (or their common value vs C) a few ulps apart;
        # scale onto the domain S_Y so that D(A) stays a certified lower bound
        target = min(sum_p, sum_pb, C)
        fy = target / sum_p if sum_p > target else 1.0
        fn = target / sum_pb if sum_pb > target else 1.0
        if fy != 1.0 or fn != 1.0:
            for j in range(m):
                out[j] *= fy if mask[j] else fn
    else:  # LOSS_LR_ML
        alpha = C * kii
        if alpha < ALPHA_TINY:
            for j in range(m):
                work[j] = s[j] - kii * a[j]
            _softmax_into(work[:m], vals)
            for j in range(m):
                out[j] = -C * (vals[j] - (1.0 / k if mask[j] else 0.0))
            _set_mask(mask, labels, False)
            return status
        y0 = labels[0]
        inv_k = 1.0 / k
        q0 = s[y0] - kii * a[y0]
        p = 0
        for j in range(m):
            if j != y0:
                shift = alpha * inv_k if mask[j] else 0.0
                work[p] = (s[j] - kii * a[j]) - q0 + shift - alpha * inv_k + alpha
                p += 1
        # out is free until the block is written below
        t0, status, _, _ = _entropic_root(work[: m - 1], alpha, vals, out, idx, troots[i], 0.0)
        troots[i] = t0
        from_root = vals[: m - 1]
        v0 = lambertw_exp(alpha - t0)
        total = v0
        for p in range(m - 1):
            total += from_root[p]
        p = 0
        for j in range(m):
            if j == y0:
                pj = v0 / total
            else:
                pj = from_root[p] / total
                p += 1
            out[j] = -C * (pj - (inv_k if mask[j] else 0.0))
    _set_mask(mask, labels, False)
    return status


@njit(cache=True)
def loss_value_ml(loss, labels, s, gamma, work, idx, mask, hint):
    """Primal loss ``L(Y, s)`` of one example (module docstring); 0 when ``Y`` is empty or
    complete.  ``work`` (float), ``idx`` (int) are scratch of length m; ``mask`` all-False.
    ``hint``: the example's dual block (length m) or an empty array; the smooth SVM^ML loss's
    projection takes its negatives as candidates' hint (:func:`_ml_projection`; any block
    gives the same value, one near ``-C`` times the gradient the fewest candidates)."""
    m = s.shape[0]
    k = labels.shape[0]
    if k == 0 or k == m:
        return 0.0
    _set_mask(mask, labels, True)
    value = 0.0
    if loss == LOSS_SVM_ML:
        if gamma == 0.0:
            min_pos = math.inf
            max_neg = -math.inf
            for j in range(m):
                if mask[j]:
                    if s[j] < min_pos:
                        min_pos = s[j]
                elif s[j] > max_neg:
                    max_neg = s[j]
            value = 1.0 + max_neg - min_pos
            value = value if value > 0.0 else 0.0
        else:
            # b = 1/2 - u_Y, bbar = 1/2 + u_Ybar
            t, sb, offset, nx, ny = _ml_projection(s, mask, labels, 1.0, gamma, work, idx, hint)
            sq = 0.0
            for q in range(nx):
                v = work[idx[q]] - t
                if v > 0.0:
                    sq += v * v
            for q in range(k, k + ny):
                v = work[idx[q]] - sb
                if v > 0.0:
                    sq += v * v
            ts = t + sb + offset  # t + s of the unshifted problem
            value = ((ts * gamma if ts > 0.0 else 0.0) + 0.5 * sq) / gamma
            value = value if value > 0.0 else 0.0
    else:
        mx = s[0]
        for j in range(m):
            if s[j] > mx:
                mx = s[j]
        acc = 0.0
        pos = 0.0
        for j in range(m):
            acc += math.exp(s[j] - mx)
            if mask[j]:
                pos += s[j]
        value = mx + math.log(acc) - pos / k
    _set_mask(mask, labels, False)
    return value


@njit(cache=True, fastmath={"reassoc"})
def _signed_sum_and_squares(a, mask, m):
    """``(sum_Y a_j - sum_Ybar a_j, sum_j a_j^2)`` (``reassoc``: the sums in vector lanes)."""
    lin = 0.0
    sq = 0.0
    for j in range(m):
        v = a[j]
        lin += v if mask[j] else -v
        sq += v * v
    return lin, sq


@njit(cache=True)
def neg_conjugate_value_ml(loss, labels, a, C, gamma, mask):
    """``-L*(Y, -a / C)`` for one dual block ``a`` (module docstring); 0 for ``Y`` empty or
    complete.  ``mask`` is an all-False bool array of length m."""
    m = a.shape[0]
    k = labels.shape[0]
    if k == 0 or k == m:
        return 0.0
    _set_mask(mask, labels, True)
    value = 0.0
    if loss == LOSS_SVM_ML:
        lin, sq = _signed_sum_and_squares(a, mask, m)
        value = 0.5 * (lin / C) - 0.5 * gamma * (sq / (C * C))
    else:
        inv_k = 1.0 / k
        ent = 0.0
        for j in range(m):
            pj = -a[j] / C + (inv_k if mask[j] else 0.0)
            ent += _xlogx(pj)
        value = -ent
    _set_mask(mask, labels, False)
    return value


class _LabelSets:
    """The label sets as the multilabel derivatives read them: ``positive`` (n x m, Y),
    ``active`` (0 < |Y| < m: the examples with a ranking constraint) and ``target`` (``1_Y /
    |Y|`` on the active rows, 0 elsewhere)."""

    row_arrays = ("active", "positive", "target")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        y, m = self.y, self.m
        yptr, yidx = y
        n = self.rows.size
        counts = np.diff(yptr)
        self.active = (counts > 0) & (counts < m)
        self.positive = np.zeros((n, m), dtype=bool)
        self.positive[np.repeat(self.rows, counts), yidx] = True
        T = self.positive / np.maximum(counts, 1)[:, None]
        T[~self.active] = 0.0
        self.target = T


class SoftmaxMLDerivatives(_LabelSets, SoftmaxCurvature):
    """LR^ML in the all-class form ``L = logsumexp(s) - mean_Y s``: ``G = p - 1_Y / |Y|``,
    LR^Multi's H."""

    def gradient(self, S, gamma: float):
        P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
        P[~self.active] = 0.0
        self.state = P
        return P - self.target


class BipartiteDerivatives(_LabelSets, StructuredDerivatives):
    """SVM^ML_gamma (TPAMI Prop. 6): ``G = sigma * proj_B(z)`` with ``z_j = (1/2 + sigma_j
    u_j) / gamma`` and ``sigma = -1`` on Y, +1 off Y, B the bipartite simplex of radius 1
    (:mod:`topkbench.prox.bipartite`), from the kernels' block update.  On the face of the
    projection's supports ``S_Y``, ``S_Ybar``, its Jacobian J is the projection onto the
    face's affine hull: with the radius inactive (``sum p < 1``) that hull is ``{<1, x_{S_Y}>
    = <1, y_{S_Ybar}>}``, so ``J = I_S - w w^T / |S|``, ``w = (1_{S_Y}, -1_{S_Ybar})``; with
    the radius active both sums are fixed and J is block diagonal, ``I - 1 1^T / |S_Y|`` and
    ``I - 1 1^T / |S_Ybar|``.  Since ``sigma * w = -1_S``, ``H = diag(sigma) J diag(sigma) /
    gamma`` is ``(I_S - 1_S 1_S^T / |S|) / gamma``, resp. ``(I_S - 1_{S_Y} 1_{S_Y}^T / |S_Y|
    - 1_{S_Ybar} 1_{S_Ybar}^T / |S_Ybar|) / gamma``.  On the radius's kink (``sum p = 1`` to
    rounding, :data:`RADIUS_TOL`) the second is taken: both are elements of the generalized
    Jacobian there.  The smoothing regularizes every class (Prop. 6)."""

    fenchel_young = True
    sparse_support = True
    support_curvature = True
    bipartite_dual = True
    smoothed_on_all_classes = True

    def curvature(self, a: int, b: int) -> Curvature:
        _, gamma, G = self.state
        G = G[a:b]
        pos = self.positive[a:b]
        on_y = (G < 0.0) & pos
        off_y = (G > 0.0) & ~pos
        n_y = on_y.sum(axis=1)
        n_off = off_y.sum(axis=1)
        radius = (-np.where(pos, G, 0.0).sum(axis=1) >= 1.0 - RADIUS_TOL) & (n_y > 0) & (n_off > 0)
        support = on_y | off_y
        root = 1.0 / math.sqrt(gamma)
        first = np.where(radius[:, None], on_y, support).astype(np.float64)
        first /= np.sqrt(np.maximum(first.sum(axis=1), 1.0))[:, None]
        second = np.where(radius[:, None], off_y, False).astype(np.float64)
        second /= np.sqrt(np.maximum(n_off, 1))[:, None]
        return Curvature(support / gamma, ((-1.0, first * root), (-1.0, second * root)))

    def support_sizes(self) -> tuple[np.ndarray, int]:
        return (self.state[2] != 0.0).sum(axis=1), 2
