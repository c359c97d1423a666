"""The one switch on the loss ids: block update, loss value, conjugate value and the
certificate's sums for every SDCA loss (TPAMI, 002 §5.1 eq. (9), §5.2; DESIGN §5), and the
family that gives a loss's derivatives for Newton's method (:func:`loss_derivatives`).

Problem (DESIGN §2), with ``C = 1/(lambda n)``::

    P(W) = lambda/2 ||W||_F^2 + 1/n sum_i L(y_i, W^T x_i)
    D(A) = -1/n sum_i L*(y_i, -lambda n a_i) - lambda/2 ||W||_F^2,   W = sum_i x_i a_i^T

Internally everything is in the scale ``P / lambda`` (``1/2 ||W||^2 + C sum_i L``), which keeps
numbers O(1) for tiny ``lambda``; the Python wrappers report the P(W) scale.

Dual blocks ``a_i`` (rows of ``A``, length m) are stored in the paper's scale; each family
module says what its block holds: :mod:`~topkbench.losses.topk_hinge` (SVM^Multi and the
top-k hinges), :mod:`~topkbench.losses.entropic` (LR^Multi, top-k Ent),
:mod:`~topkbench.losses.ova` (SVM^OVA, LR^OVA), :mod:`~topkbench.losses.multilabel`
(SVM^ML, LR^ML).  A block update is the exact maximization of D over ``a_i``, all other
blocks fixed, from ``s = W^T x_i`` (current scores), ``K = ||x_i||^2`` and ``q = s - K a_i``.

Zero-norm examples (DESIGN §4.3): with ``K = 0`` the block does not affect W, and the update
reduces to maximizing ``-L*(-a/C) - <a, s>``, i.e. ``-a / C = grad L(s)``; each family handles
it explicitly so the duality gap still closes (and :func:`gradient_duals` uses it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from topkbench.losses import ids
from topkbench.losses.curvature import LossDerivatives, LossKernels
from topkbench.losses.entropic import (
    SoftmaxDerivatives,
    TopkEntDerivatives,
    _entropic_block,
    _entropic_neg_conj,
    _lr_multi_loss,
    is_entropic,
)
from topkbench.losses.ids import LOSS_LR_MULTI, LOSS_SVM_OVA, LOSS_TOPK_ENT, LOSS_WTOPK_SVM
from topkbench.losses.multilabel import (
    BipartiteDerivatives,
    SoftmaxMLDerivatives,
    is_multilabel,
    loss_value_ml,
    neg_conjugate_value_ml,
    update_block_ml,
)
from topkbench.losses.ova import (
    HuberOVADerivatives,
    LogisticOVADerivatives,
    _lr_ova_block,
    _lr_ova_loss,
    _lr_ova_neg_conj,
    _svm_ova_block,
    svm_ova_loss,
    svm_ova_neg_conj,
)
from topkbench.losses.topk_entropy import topk_ent_loss
from topkbench.losses.topk_hinge import (
    SimplexDerivatives,
    TopkHingeDerivatives,
    _hinge_loss,
    hinge_block,
    hinge_neg_conj,
    is_hinge,
)
from topkbench.losses.weighted_topk import (
    WeightedTopkDerivatives,
    wtopk_block,
    wtopk_loss,
    wtopk_neg_conj,
)
from topkbench.prox.roots import STATUS_OK
from topkbench.prox.vecmath import vdot


@njit(cache=True)
def update_block(loss, y, s, a, kii, C, gamma, k, out, work, vals, srt, idx, extra, troots, i):
    """New dual block for one example into ``out`` (see module docstring). Returns a status.

    ``work``, ``vals``, ``srt`` (float) and ``idx`` (int) are scratch arrays of length m,
    ``extra`` a float scratch of shape (3, m).
    ``troots[i]`` keeps the example's last root of eq. (14) as the next starting point (NaN if
    none); it only affects the number of iterations, not the result.
    """
    status = STATUS_OK
    if is_entropic(loss):
        return _entropic_block(
            loss, y, s, a, kii, C, k, out, work, vals, srt, idx, extra, troots, i
        )
    if is_hinge(loss):
        hinge_block(loss, y, s, a, kii, C, gamma, k, out, work, srt, idx)
    elif loss == LOSS_SVM_OVA:
        _svm_ova_block(y, s, a, kii, C, gamma, out)
    else:  # LOSS_LR_OVA
        status = _lr_ova_block(y, s, a, kii, C, out, work, vals, srt, extra)
    return status


@njit(cache=True)
def _scratch(m):
    """Per-call scratch of the epoch kernels (allocated once per call, not per example):
    scores, new block, the ``work``, ``vals``, ``srt``, ``idx`` arrays of update_block, the
    all-False label mask of the multilabel updates, the block change ``delta``,
    update_block's ``extra`` (3 x m), and one more float and int array of length m (the
    weighted top-k update's)."""
    return (
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m, dtype=np.int64),
        np.zeros(m, dtype=np.bool_),
        np.empty(m),
        np.empty((3, m)),
        np.empty(m),
        np.empty(m, dtype=np.int64),
    )


@njit(cache=True)
def _update(loss, yptr, yidx, i, s, a, kii, C, gamma, k, rho, out, scratch, troots):
    """Dispatch one block update: labels of example ``i`` are ``yidx[yptr[i]:yptr[i+1]]``
    (exactly one for the multiclass losses); ``rho`` holds the weighted top-k hinge's rank
    weights, zero-padded to length m (empty for the other losses)."""
    _, _, work, vals, srt, idx, mask, _, extra, more, more_idx = scratch
    if is_multilabel(loss):
        labels = yidx[yptr[i] : yptr[i + 1]]
        return update_block_ml(
            loss, labels, s, a, kii, C, gamma, out, work, vals, idx, troots, i, mask
        )
    if loss == LOSS_WTOPK_SVM:
        wtopk_block(yidx[yptr[i]], s, a, kii, C, gamma, rho, out, work, vals, idx, srt,
                    extra[0], extra[1], extra[2], more_idx)  # fmt: skip
        return STATUS_OK
    return update_block(
        loss, yidx[yptr[i]], s, a, kii, C, gamma, k, out, work, vals, srt, idx, extra, troots, i
    )


@njit(cache=True)
def gradient_duals(S, yptr, yidx, loss, C, gamma, k, rho, out):
    """``out[i] = -C grad L_gamma(Y_i, S_i)`` for every row of the scores ``S``: the block
    update of an example with ``||x_i||^2 = 0`` (then ``q = s`` and the update maximizes
    ``-C L*(-a / C) - <a, s>``, whose maximizer is ``-C`` times the gradient; DESIGN §4.3's
    zero-norm branches).  Meant for smooth losses: at gamma = 0 the hinges' zero-norm branch
    returns a fixed point of the domain, not a subgradient at ``S_i``.
    Returns the count of failed inner root findings."""
    n, m = S.shape
    scratch = _scratch(m)
    troots = np.full(n, np.nan)
    a = np.zeros(m)
    failures = 0
    for i in range(n):
        if (
            _update(loss, yptr, yidx, i, S[i], a, 0.0, C, gamma, k, rho, out[i], scratch, troots)
            != STATUS_OK
        ):
            failures += 1
    return failures


@njit(cache=True)
def loss_value(loss, y, s, gamma, k, work, srt, idx, extra):
    """Primal loss ``L(y, s)`` for one example with scores ``s``; ``work``, ``srt``, ``extra``
    (float) and ``idx`` (int) are scratch arrays of length m."""
    m = s.shape[0]
    sy = s[y]
    if is_hinge(loss) or loss == LOSS_TOPK_ENT:
        shift = 1.0 if is_hinge(loss) else 0.0
        p = 0
        for j in range(m):
            if j != y:
                work[p] = shift + s[j] - sy
                p += 1
        z = work[: m - 1]
        if loss == LOSS_TOPK_ENT:
            return topk_ent_loss(z, k, srt)
        return _hinge_loss(loss, z, gamma, k, srt, idx)
    elif loss == LOSS_LR_MULTI:
        return _lr_multi_loss(s, y, work, srt)
    elif loss == LOSS_SVM_OVA:
        return svm_ova_loss(s, y, gamma)
    else:
        return _lr_ova_loss(s, y, work, srt, extra)


@njit(cache=True)
def neg_conjugate_value(loss, y, a, C, gamma, k, x, lx, tmp):
    """``-L*(y, -a / C)`` for one dual block ``a`` (the example's share of D / (lambda C));
    ``x``, ``lx``, ``tmp`` are float scratch of length m.

    The hinge family shares ``<1,x> - gamma/2 ||x||^2`` and the entropic family
    ``-<x, log x> - (1-s) log(1-s)`` (TPAMI Props. 1-4); they differ only in the domain, which
    the updates keep feasible.
    """
    if is_hinge(loss):
        return hinge_neg_conj(a, y, C, gamma)
    elif is_entropic(loss):
        return _entropic_neg_conj(a, y, C, x, lx, tmp)
    elif loss == LOSS_SVM_OVA:
        return svm_ova_neg_conj(a, y, C, gamma)
    else:
        return _lr_ova_neg_conj(a, y, C, x, lx, tmp)


@njit(cache=True)
def _neg_conj_row(loss, yptr, yidx, i, a, C, gamma, k, mask, x, lx, tmp):
    """``-L*(Y_i, -a / C)`` for example i's dual block ``a``, any loss; ``mask`` is the
    all-False bool scratch of the multilabel losses, ``x``, ``lx``, ``tmp`` float scratch of
    length m."""
    if is_multilabel(loss):
        return neg_conjugate_value_ml(loss, yidx[yptr[i] : yptr[i + 1]], a, C, gamma, mask)
    if loss == LOSS_WTOPK_SVM:
        return wtopk_neg_conj(a, yidx[yptr[i]], C, gamma)
    return neg_conjugate_value(loss, yidx[yptr[i]], a, C, gamma, k, x, lx, tmp)


@njit(cache=True)
def conjugate_terms(yptr, yidx, A, loss, Cs, gamma, k):
    """``sum_i -Cs_i L*(Y_i, -A_i / Cs_i)``: the conjugate part of :func:`objective_terms`
    alone, O(m) per example for the hinges (no projection).  With ``A_i = -Cs_i grad
    L_gamma(S_i)`` it gives the loss sum without evaluating the loss: by Fenchel-Young
    equality ``L(s) = <g, s> - L*(g)`` at ``g = grad L(s)``, so ``sum_i Cs_i L(S_i) =
    conjugate_terms(A) - <A, S>``."""
    n, m = A.shape
    x = np.empty(m)
    lx = np.empty(m)
    tmp = np.empty(m)
    mask = np.zeros(m, dtype=np.bool_)
    csum = 0.0
    for i in range(n):
        csum += Cs[i] * _neg_conj_row(loss, yptr, yidx, i, A[i], Cs[i], gamma, k, mask, x, lx,
                                      tmp)  # fmt: skip
    return csum


@njit(cache=True)
def objective_terms(S, yptr, yidx, A, loss, Cs, gamma, k, rho, lsum0, csum0, gaps):
    """Return ``(lsum0 + sum_i Cs_i L(Y_i, S_i), csum0 + sum_i -Cs_i L*(Y_i, -A_i / Cs_i))``
    for scores ``S`` (n x m), labels in CSR form (see :func:`sdca_epochs_dense`) and the
    examples' shares ``Cs_i = C w_i`` (``w_i`` the sample weights, 1 without), i.e. the loss
    and conjugate parts of ``P / lambda`` and ``D / lambda``; the running sums ``lsum0``,
    ``csum0`` let callers go through the rows in blocks.

    If ``gaps`` has length n, it receives each example's Fenchel-Young gap in the ``P /
    lambda`` scale, ``g_i = Cs_i (L(Y_i, S_i) + L*(Y_i, -A_i/Cs_i)) + <A_i, S_i> >= 0``.  With
    ``S = X W`` and ``W = X^T A``, ``sum_i <A_i, S_i> = ||W||^2``, so ``sum_i g_i = (P - D) /
    lambda``; ``g_i = 0`` exactly when ``-A_i / Cs_i`` is a subgradient of the loss at ``S_i``,
    i.e. when block i is already the maximizer of its SDCA update (shrinking in
    :func:`topkbench.solvers.sdca.solve_sdca`).  Pass an empty array to skip.  ``rho`` as in
    :func:`_update`."""
    n, m = S.shape
    want_gaps = gaps.shape[0] == n
    work = np.empty(m)
    srt = np.empty(m)
    x = np.empty(m)
    lx = np.empty(m)
    tmp = np.empty(m)
    idx = np.empty(m, dtype=np.int64)
    mask = np.zeros(m, dtype=np.bool_)
    ml = is_multilabel(loss)
    wt = loss == LOSS_WTOPK_SVM
    if wt:  # the weighted top-k projection's scratch
        bs = np.empty(m)
        d = np.empty(m)
        bsum = np.empty(m)
        bcnt = np.empty(m, dtype=np.int64)
    lsum = lsum0
    csum = csum0
    for i in range(n):
        C = Cs[i]
        if ml:
            labels = yidx[yptr[i] : yptr[i + 1]]
            li = loss_value_ml(loss, labels, S[i], gamma, work, idx, mask, A[i])
        elif wt:
            y = yidx[yptr[i]]
            li = wtopk_loss(S[i], y, rho, gamma, work, x, idx, bs, srt, d, bsum, bcnt)
        else:
            y = yidx[yptr[i]]
            li = loss_value(loss, y, S[i], gamma, k, work, srt, idx, tmp)
        ci = _neg_conj_row(loss, yptr, yidx, i, A[i], C, gamma, k, mask, x, lx, tmp)
        lsum += C * li
        csum += C * ci
        if want_gaps:
            gaps[i] = C * (li - ci) + vdot(A[i], S[i], m)
    return lsum, csum


_KERNELS = LossKernels(gradient_duals, conjugate_terms)
# each loss's derivatives in the scores (:mod:`topkbench.losses.curvature`), by family
DERIVATIVES: dict[int, type[LossDerivatives]] = {
    ids.LOSS_SVM_MULTI: SimplexDerivatives,
    ids.LOSS_LR_MULTI: SoftmaxDerivatives,
    ids.LOSS_SVM_OVA: HuberOVADerivatives,
    ids.LOSS_LR_OVA: LogisticOVADerivatives,
    ids.LOSS_TOPK_SVM_ALPHA: TopkHingeDerivatives,
    ids.LOSS_TOPK_SVM_ALPHA_PSEUDO: TopkHingeDerivatives,
    ids.LOSS_TOPK_SVM_BETA: TopkHingeDerivatives,
    ids.LOSS_TOPK_ENT: TopkEntDerivatives,
    ids.LOSS_SVM_ML: BipartiteDerivatives,
    ids.LOSS_LR_ML: SoftmaxMLDerivatives,
    ids.LOSS_WTOPK_SVM: WeightedTopkDerivatives,
}


def derivatives_family(loss_id: int) -> type[LossDerivatives]:
    """The class of a loss's derivatives; its class attributes say what a solver may do with
    the loss (:class:`~topkbench.losses.curvature.LossDerivatives`)."""
    return DERIVATIVES[loss_id]


def loss_derivatives(loss_id: int, y, m: int, k: int = 1, rho=None) -> LossDerivatives:
    """The derivatives of loss ``loss_id`` for the labels ``y = (yptr, yidx)`` (CSR rows) of
    ``m`` classes, with the top-k ``k`` and the weighted hinge's rank weights ``rho``."""
    return DERIVATIVES[loss_id](_KERNELS, loss_id, y, m, k, rho)
