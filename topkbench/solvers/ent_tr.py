"""Truncated top-k entropy (TPAMI 002 §3.2, "top-k Ent_tr"): a nonconvex loss, so no duality
gap is claimed.

``L(y, f) = log(1 + sum_{j in J} exp(f_j - f_y))`` where ``J`` holds the ``m - k`` smallest
scores among ``j != y`` (the ``k - 1`` largest off-label scores are dropped).  For k = 1 it is
LR^Multi.  Following TPAMI §6.2 we start from the LR^Multi solution at the same C and then run
L-BFGS (scipy's L-BFGS-B without bounds: a quasi-Newton method with a Wolfe line search) on
``f(W) = 1/2 ||W||^2 + C sum_i L`` (= P(W) / lambda).  The loss is smooth except where the
k-th and (k+1)-th largest off-label scores tie; there we use the gradient of the branch that
``argpartition`` selects.  The result is a local optimum; we report its objective, the
gradient norm and the iteration count, and the status says which test stopped L-BFGS.

:func:`solve_ent_tr_gd` is the procedure the paper's numbers come from (TPAMI §6.2: "gradient
descent with line search" from the LR^Multi solution; the authors' libsdca v0.2.0,
``mex_gd``): batch gradient descent on ``F(W) = C sum_i L_i + 1/2 ||W||^2`` with an Armijo
line search, stopped on ``||grad F||_2 <= 1e-3`` in that scale or after 1,000 iterations.
A thousand such steps usually stop far from a local optimum, close to the LR^Multi start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.optimize as so
from numba import njit

from topkbench.prox.vecmath import exp_shifted, vmax, vsum
from topkbench.solvers.problem import TracePoint


def ent_tr_loss_and_grad(
    S: np.ndarray, y: np.ndarray, k: int, dropped: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example losses (n,) and their gradients with respect to the scores (n x m).

    With ``a_j = f_j - f_y``, J the off-label classes but the ``k - 1`` largest ``a_j``, and
    ``mu = max(0, max_J a_j)``: ``L = mu + log(e^-mu + sum_J e^(a_j - mu))``, ``dL/df_j =
    e^(a_j - mu) / Z`` on J, 0 on the dropped classes, and minus their sum at y.

    ``dropped`` (n x max(k - 1, 1) int64, all -1 at first, then only as the calls left it)
    remembers each row's dropped classes between calls on the same examples: a row whose
    remembered classes still lie strictly above every other off-label margin keeps them
    without a search.  It only saves work; the result
    is the same with or without it."""
    S = np.ascontiguousarray(S, dtype=np.float64)
    n, m = S.shape
    if dropped is None:
        dropped = np.full((n, max(int(k) - 1, 1)), -1, dtype=np.int64)
    elif (
        dropped.shape != (n, max(int(k) - 1, 1))
        or dropped.dtype != np.int64
        or not dropped.flags.c_contiguous
        or dropped.min() < -1
        or dropped.max() >= m
    ):
        raise ValueError(
            f"dropped must be a C-contiguous int64 array of shape {(n, max(int(k) - 1, 1))} "
            f"with entries in [-1, {m}): the one a previous call on these rows filled"
        )
    losses = np.empty(n)
    G = np.empty_like(S)
    _ent_tr_rows(S, np.ascontiguousarray(y, dtype=np.int64), int(k), losses, G, dropped)
    return losses, G


@njit(cache=True)
def _ent_tr_rows(S, y, k, losses, G, dropped):
    """:func:`ent_tr_loss_and_grad` row by row.  The ``k - 1`` largest off-label margins are the
    remembered ones when their smallest exceeds the largest of the rest (then no other class
    can enter, ties included); otherwise they are found by insertion into a short sorted list
    (ties keep the class seen first) and remembered.  Then the maximum, the exponentials and
    their sum as vector loops (:mod:`topkbench.prox.vecmath`)."""
    n, m = S.shape
    top = np.empty(max(k - 1, 1), dtype=np.int64)
    topv = np.empty(max(k - 1, 1))
    buf = np.empty(m)
    ex = np.empty(m)
    tmp = np.empty(m)
    for i in range(n):
        yi = y[i]
        sy = S[i, yi]
        for j in range(m):
            buf[j] = S[i, j] - sy
        buf[yi] = -np.inf
        known = k > 1 and k - 1 < m
        lowest = np.inf
        if known:
            for p in range(k - 1):
                j = dropped[i, p]
                if j < 0 or j == yi:
                    known = False
                    break
                lowest = min(lowest, buf[j])
        if known:
            for p in range(k - 1):
                topv[p] = buf[dropped[i, p]]
                buf[dropped[i, p]] = -np.inf
            rest = vmax(buf, m)
            if not lowest > rest:  # another class ties or passes: search again
                known = False
                for p in range(k - 1):
                    buf[dropped[i, p]] = topv[p]
        else:
            rest = -np.inf
        if k > 1 and not known:
            nt = 0
            for j in range(m):
                if j == yi:
                    continue
                a = buf[j]
                if nt < k - 1:
                    p = nt
                    nt += 1
                elif a > topv[nt - 1]:
                    p = nt - 1
                else:
                    continue
                while p > 0 and a > topv[p - 1]:
                    top[p] = top[p - 1]
                    topv[p] = topv[p - 1]
                    p -= 1
                top[p] = j
                topv[p] = a
            for p in range(nt):
                buf[top[p]] = -np.inf
                dropped[i, p] = top[p]
            if nt < k - 1:
                dropped[i, 0] = -1
        mx = max(rest if known else vmax(buf, m), 0.0)
        exp_shifted(buf, mx, m, ex, tmp)
        Z = math.exp(-mx) + vsum(ex, m)
        losses[i] = mx + math.log(Z)
        inv = 1.0 / Z
        total = 0.0
        for j in range(m):
            G[i, j] = ex[j] * inv
            total += G[i, j]
        G[i, yi] = -total


GD_EPS = 1e-3  # the authors' stopping rule: ||grad F||_2 <= GD_EPS (F's own scale)
GD_MAX_ITER = 1000  # ... or this many iterations
GD_MIN_STEP = 1e-9  # the line search fails below this step
GD_SUFF_DECREASE = 1e-5  # Armijo: F(W - t g) <= F(W) - t * GD_SUFF_DECREASE * ||g||_2


@dataclass
class EntTrResult:
    W: np.ndarray
    primal: float
    grad_norm: float
    iterations: int
    status: str
    message: str
    seconds: float
    trace: list[TracePoint]
    steps: list[float] | None = None  # gradient descent: the accepted step sizes


def _objective(X, y, k: int, C: float, d: int, m: int, weights=None):
    """``w -> (F(w), grad F)`` with ``F = 1/2 ||W||^2 + C sum_i w_i L_i`` (= P / lambda;
    ``w_i`` the sample weights, 1 without).  ``grad F`` is a function, so that a rejected
    line-search trial skips the product with ``X^T``; the dropped classes of each row are
    remembered from one call to the next (:func:`ent_tr_loss_and_grad`)."""
    dropped = np.full((X.shape[0], max(int(k) - 1, 1)), -1, dtype=np.int64)

    def fun(w):
        W = w.reshape(d, m)
        S = np.asarray(X @ W)
        losses, G = ent_tr_loss_and_grad(S, y, k, dropped)
        if weights is not None:
            losses, G = losses * weights, G * weights[:, None]
        f = 0.5 * float(w @ w) + C * float(losses.sum())
        return f, lambda: w + C * np.asarray(X.T @ G).ravel()

    return fun


def solve_ent_tr(
    X,
    y: np.ndarray,
    W0: np.ndarray,
    *,
    C: float,
    k: int,
    gtol: float = 1e-6,
    max_iter: int = 1000,
    weights=None,
) -> EntTrResult:
    """L-BFGS on the truncated top-k entropy objective from ``W0`` (d x m).

    Stops when the largest gradient component of ``P(W)`` relative to that at ``W0`` falls
    below ``gtol`` ("converged"), when the objective stops changing at rounding level before
    that ("stalled": gtol below what double precision resolves, seen for gtol <~ 1e-7), when
    the line search fails ("line_search", typically at a kink of the loss), or after
    ``max_iter`` iterations ("max_iter").  ``weights`` weight the examples' losses.
    """
    d, m = W0.shape
    n = X.shape[0] if weights is None else int(np.count_nonzero(weights))  # as fit counts
    lam = 1.0 / (C * n)
    y = np.asarray(y, dtype=np.int64)
    start = time.perf_counter()
    trace: list[TracePoint] = []

    objective = _objective(X, y, k, C, d, m, weights)

    def fun(w):
        f, grad = objective(w)
        return f, grad()

    f0, g0 = fun(W0.ravel())
    trace.append(TracePoint(0, lam * f0, np.nan, np.nan, 0.0))
    if g0.size == 0:  # no features: W is d x m empty, F is constant, the start is optimal
        return EntTrResult(W=W0.copy(), primal=lam * f0, grad_norm=0.0, iterations=0,
                           status="converged", message="no variables (the features have no "
                           "columns)", seconds=time.perf_counter() - start,
                           trace=trace)  # fmt: skip
    scale = max(1.0, float(np.abs(g0).max()))

    def callback(intermediate_result):
        trace.append(
            TracePoint(
                len(trace),
                lam * float(intermediate_result.fun),
                np.nan,
                np.nan,
                time.perf_counter() - start,
            )
        )

    res = so.minimize(
        fun,
        W0.ravel().copy(),
        jac=True,
        method="L-BFGS-B",
        callback=callback,
        options={"maxiter": int(max_iter), "gtol": gtol * scale, "ftol": 1e-15, "maxcor": 20},
    )
    f, g = fun(res.x)
    ginf = float(np.abs(g).max())
    if ginf <= gtol * scale:
        status = "converged"
    elif res.nit >= max_iter:
        status = "max_iter"
    elif "REL_REDUCTION_OF_F" in str(res.message):
        status = "stalled"  # f no longer changes at rounding level; gtol was out of reach
    else:
        status = "line_search"
    return EntTrResult(
        W=res.x.reshape(d, m),
        primal=lam * f,
        grad_norm=lam * float(np.linalg.norm(g)),
        iterations=int(res.nit),
        status=status,
        message=str(res.message),
        seconds=time.perf_counter() - start,
        trace=trace,
    )


def solve_ent_tr_gd(
    X,
    y: np.ndarray,
    W0: np.ndarray,
    *,
    C: float,
    k: int,
    eps: float = GD_EPS,
    max_iter: int = GD_MAX_ITER,
    weights=None,
) -> EntTrResult:
    """Batch gradient descent with an Armijo line search, as the paper ran Ent_tr.

    From ``W0`` with ``g = grad F(W)``: the first step is ``t = max(1e-9, min(1, 1/||g||))``;
    each iteration tries ``W - t g`` and halves ``t`` until ``F`` falls by at least
    ``t * 1e-5 * ||g||_2`` (status "line_search" when ``t`` drops below 1e-9; ``W`` keeps the
    last accepted point), and a step accepted without halving is doubled at the next
    iteration.  Stops on ``||g||_2 <= eps`` ("converged", in ``F``'s scale, absolute) or
    after ``max_iter`` iterations ("max_iter").  The reported ``primal`` and ``grad_norm`` are
    in the P(W) scale (times lambda), as for L-BFGS.
    """
    d, m = W0.shape
    n = X.shape[0] if weights is None else int(np.count_nonzero(weights))  # as fit counts
    lam = 1.0 / (C * n)
    y = np.asarray(y, dtype=np.int64)
    fun = _objective(X, y, k, C, d, m, weights)
    start = time.perf_counter()
    w = W0.ravel().copy()
    f, grad = fun(w)
    g = grad()
    norm = float(np.linalg.norm(g))
    trace = [TracePoint(0, lam * f, np.nan, np.nan, 0.0)]
    steps: list[float] = []
    it, status = 0, "converged"
    step = max(GD_MIN_STEP, min(1.0, 1.0 / norm)) if norm > 0 else 1.0
    step_before = 0.0
    while norm > eps:
        if it >= max_iter:
            status = "max_iter"
            break
        it += 1
        if step == step_before:  # the last step was accepted as it was tried: try twice it
            step *= 2.0
        step_before = step
        decrease = GD_SUFF_DECREASE * norm
        while True:
            w_new = w - step * g
            f_new, grad = fun(w_new)
            if f_new <= f - step * decrease:
                break
            step *= 0.5
            if step < GD_MIN_STEP:
                status = "line_search"
                break
        if status == "line_search":
            break
        w, f, g = w_new, f_new, grad()
        norm = float(np.linalg.norm(g))
        steps.append(step)
        trace.append(TracePoint(it, lam * f, np.nan, np.nan, time.perf_counter() - start))
    return EntTrResult(
        W=w.reshape(d, m),
        primal=lam * f,
        grad_norm=lam * norm,
        iterations=it,
        status=status,
        message=f"||grad F||_2 = {norm:.3g} (eps {eps:g})",
        seconds=time.perf_counter() - start,
        trace=trace,
        steps=steps,
    )
