"""The numba losses as the reference of the torch ones: per-example values and gradients."""

from __future__ import annotations

import numpy as np

from topkbench.losses.dispatch import loss_derivatives, objective_terms
from topkbench.losses.registry import get_method
from topkbench.solvers.ent_tr import ent_tr_loss_and_grad


def label_csr(y, m):
    """(yptr, yidx) of class indices or of a 0/1 matrix."""
    y = np.asarray(y)
    if y.ndim == 1:
        return np.arange(y.size + 1, dtype=np.int64), y.astype(np.int64)
    rows, cols = np.nonzero(y)
    ptr = np.zeros(y.shape[0] + 1, dtype=np.int64)
    np.add.at(ptr, rows + 1, 1)
    return np.cumsum(ptr), cols.astype(np.int64)


def weights_of(method, k):
    """The rank weights the tests give wtopk_svm for its k (each scheme in turn), else flat."""
    return ("flat", "linear", "exp")[k % 3] if method == "wtopk_svm" else "flat"


def rank_weights(method, k, m):
    """wtopk_svm's weights zero-padded to m, as the kernels take them (empty otherwise)."""
    if method != "wtopk_svm":
        return np.empty(0)
    from topkbench.solvers.frank_wolfe import weight_vector

    rho = np.zeros(m)
    w = weight_vector(weights_of(method, k), k, m)
    rho[: w.size] = w
    return rho


def numba_values(method, S, y, k, gamma):
    """``L(y_i, S_i)`` row by row from the kernels' objective terms."""
    loss_id = get_method(method).loss_id
    n, m = S.shape
    yptr, yidx = label_csr(y, m)
    out = np.empty(n)
    rho = rank_weights(method, k, m)
    for i in range(n):
        ptr = yptr[i : i + 2] - yptr[i]
        lab = yidx[yptr[i] : yptr[i + 1]]
        out[i] = objective_terms(np.ascontiguousarray(S[i : i + 1]), ptr, lab,
                                 np.zeros((1, m)), loss_id, np.ones(1), gamma, k, rho, 0.0,
                                 0.0, np.empty(0))[0]  # fmt: skip
    return out


HINGES = ("svm_multi", "topk_svm_alpha", "topk_svm_alpha_pseudo", "topk_svm_beta")


def numba_gradient(method, S, y, k, gamma):
    """``grad L(y_i, S_i)`` (n x m) from the kernels; for a hinge at gamma = 0, see
    :func:`limit_gradient`."""
    if method == "topk_ent_tr":
        return ent_tr_loss_and_grad(S, np.asarray(y), k)[1]
    if gamma == 0.0 and method in HINGES:
        return limit_gradient(method, S, y, k)
    if method == "svm_ml" and gamma == 0.0:
        return ml_limit_gradient(S, y)
    if method == "wtopk_svm" and gamma == 0.0:
        return wtopk_limit_gradient(S, y, rank_weights(method, k, S.shape[1]))
    if method == "svm_ova" and gamma == 0.0:
        sign = -np.ones_like(S)
        sign[np.arange(S.shape[0]), y] = 1.0
        return -sign * (1.0 - sign * S > 0)
    return smoothed_gradient(method, S, y, k, gamma)


def smoothed_gradient(method, S, y, k, gamma):
    """The kernels' gradient of the loss smoothed by ``gamma``."""
    m = S.shape[1]
    rho = rank_weights(method, k, m)
    deriv = loss_derivatives(get_method(method).loss_id, label_csr(y, m), m, k, rho)
    return deriv.gradient(np.ascontiguousarray(S), gamma)


def wtopk_limit_gradient(S, y, rho):
    """The weighted top-k hinge's gradient at gamma = 0 as the limit of Kato's smoothed ones:
    the maximizer p of <p, c> over P(rho) nearest R e_y, written group by group of tied
    margins (the label takes its group's largest weight; the others share the rest evenly);
    0 where the weighted sum is <= 0 to its rounding."""
    n, m = S.shape
    G = np.zeros_like(S)
    for i in range(n):
        c = 1.0 + S[i] - S[i, y[i]]
        c[y[i]] = 0.0
        order = np.argsort(-c, kind="stable")
        cs = c[order]
        if not (cs * rho).sum() > 8 * 2.0**-52 * np.abs(cs * rho).sum():  # 0 to its rounding
            continue
        p = np.zeros(m)
        start = 0
        while start < m:
            end = start
            while end + 1 < m and cs[end + 1] == cs[start]:
                end += 1
            group, w = order[start : end + 1], rho[start : end + 1]
            if y[i] in group:
                p[y[i]] = w[0]
                others = group[group != y[i]]
                if others.size:
                    p[others] = (w.sum() - w[0]) / others.size
            else:
                p[group] = w.mean()
            start = end + 1
        p[y[i]] = 0.0
        G[i] = p
        G[i, y[i]] = -p.sum()
    return G


def limit_gradient(method, S, y, k):
    """A hinge's gradient at gamma = 0 as the limit of the smoothed ones: the least-norm
    maximizer of <z, p> over the loss's set, written row by row from its definition (the
    kernels' projection of z / gamma loses ~ulp(z) / gamma to rounding for tiny gamma)."""
    n, m = S.shape
    G = np.zeros_like(S)
    for i in range(n):
        off = np.flatnonzero(np.arange(m) != y[i])
        z = 1.0 + S[i, off] - S[i, y[i]]
        top = np.sort(z)[::-1]
        slots, cap, signed = (1, 1.0, False) if method == "svm_multi" else (k, 1.0 / k, False)
        if method == "topk_svm_alpha_pseudo":
            if top[:k].sum() <= 0:
                continue
            signed = True
        if method == "topk_svm_alpha" and not top[k - 1] > 0:
            if not top[: k - 1].sum() > 0:  # (1/k) max{0, T_{k-1}, T_k} is 0
                continue
            slots, signed = k - 1, True  # T_{k-1} > 0 is the largest: the k - 1 largest
        bound = top[slots - 1]
        above, tied = z > bound, z == bound
        if not signed:
            above, tied = above & (z > 0), tied & (z > 0)
        p = np.where(above, cap, 0.0)
        if tied.any():
            p[tied] = min((slots - above.sum()) * cap / tied.sum(), cap)
        G[i, off] = p
        G[i, y[i]] = -p.sum()
    return G


def numba_ent_tr_values(S, y, k):
    return ent_tr_loss_and_grad(S, np.asarray(y), k)[0]


def ml_limit_gradient(S, Y):
    """SVM^ML's gradient at gamma = 0 as the limit of the smoothed ones: where the loss is
    positive, -1 shared by the labels at the smallest label score and +1 by the non-labels at
    the largest non-label score; 0 where Y is empty or complete."""
    G = np.zeros_like(S)
    for i in range(S.shape[0]):
        pos = Y[i] > 0
        if pos.all() or not pos.any():
            continue
        lo, hi = S[i, pos].min(), S[i, ~pos].max()
        if 1.0 + hi - lo > 0:
            at_min, at_max = pos & (S[i] == lo), ~pos & (S[i] == hi)
            G[i] = at_max / at_max.sum() - at_min / at_min.sum()
    return G
