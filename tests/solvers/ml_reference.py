"""Reference values for the multilabel SVM and LR tests: small problems, P and D recomputed
in numpy outside the solver (D after checking every block's conjugate domain), and cvxpy's
optimum.  The scale and the cvxpy formulations are those of ``test_multilabel_sdca.py``'s
docstring."""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.special as sps

import topkbench
from topkbench.errors import ConvergenceWarning
from topkbench.losses.ids import LOSS_SVM_ML
from topkbench.losses.multilabel import loss_value_ml


def make_ml_problem(n=16, d=3, m=4, seed=0, *, n_empty=1, n_full=1, zero_rows=(), sparse=False):
    """Gaussian features (some exact zeros) and a 0/1 indicator: rows ``0..n_empty-1`` empty,
    the next ``n_full`` complete, the others random with 0 < |Y| < m; rows in ``zero_rows`` of
    X are 0."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[rng.random(size=(n, d)) < 0.2] = 0.0
    for i in zero_rows:
        X[i] = 0.0
    Y = np.zeros((n, m), dtype=np.int64)
    for i in range(n):
        if i < n_empty:
            continue
        if i < n_empty + n_full:
            Y[i] = 1
            continue
        k = int(rng.integers(1, m))
        Y[i, rng.choice(m, size=k, replace=False)] = 1
    if sparse:
        X = sp.csr_matrix(X)
    return X, Y


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def kept_rows(Y):
    sizes = Y.sum(axis=1)
    return np.flatnonzero((sizes > 0) & (sizes < Y.shape[1]))


def fit_certified(X, Y, method, **kw):
    """fit with ConvergenceWarning as an error (no silent budget stops)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return topkbench.fit(X, Y, method, **kw)


def example_loss(method, y_row, s, gamma):
    """One example's loss: numpy closed forms, the kernel only for the smooth SVM (checked
    against cvxpy in tests/losses/test_multilabel_losses.py)."""
    mask = y_row.astype(bool)
    if method == "lr_ml":
        return float(sps.logsumexp(s) - s[mask].mean())
    if gamma == 0.0:
        return max(0.0, 1.0 + float(s[~mask].max()) - float(s[mask].min()))
    m = s.size
    labels = np.flatnonzero(mask).astype(np.int64)
    work, idx, msk = np.empty(m), np.empty(m, np.int64), np.zeros(m, np.bool_)
    s = np.ascontiguousarray(s)
    return loss_value_ml(LOSS_SVM_ML, labels, s, gamma, work, idx, msk, np.empty(0))


def primal_value(X, Y, W, method, gamma, C):
    """P(W) over the kept examples."""
    rows = kept_rows(Y)
    lam = 1.0 / (C * rows.size)
    S = dense(X) @ W
    losses = [example_loss(method, Y[i], S[i], gamma) for i in rows]
    return lam / 2 * float(np.sum(W * W)) + float(np.mean(losses))


def dual_value(X, Y, A, method, gamma, C, tol=1e-12):
    """D(A) in numpy after checking every block's domain; excluded rows must be 0."""
    rows = kept_rows(Y)
    excluded = np.setdiff1d(np.arange(Y.shape[0]), rows)
    assert not A[excluded].any()
    lam = 1.0 / (C * rows.size)
    W = dense(X).T @ A
    total = 0.0
    for i in rows:
        mask = Y[i].astype(bool)
        v = -A[i] / C
        if method == "svm_ml":
            assert np.all(v[mask] <= tol) and np.all(v[~mask] >= -tol), (i, v)
            assert -v[mask].sum() == pytest.approx(v[~mask].sum(), rel=1e-12, abs=tol)
            assert v[~mask].sum() <= 1.0 + tol
            total += float(v[~mask].sum()) - gamma / 2 * float(v @ v)
        else:
            q = v + mask / mask.sum()
            assert np.all(q >= -tol) and q.sum() == pytest.approx(1.0, abs=tol), (i, q)
            total += float(sps.entr(np.maximum(q, 0.0)).sum())
    return lam * (C * total - 0.5 * float(np.sum(W * W)))


def cvxpy_primal(X, Y, method, gamma, C, weights=None):
    """min 1/2 ||W||^2 + C sum_i w_i L over the kept examples (module docstring; w = 1
    without ``weights``); returns (P(W*) in the P scale, W*)."""
    X = dense(X)
    rows = kept_rows(Y)
    wt = np.ones(X.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    d, m = X.shape[1], Y.shape[1]
    W = cp.Variable((d, m))
    S = X @ W
    terms = []
    for i in rows:
        pos = np.flatnonzero(Y[i])
        neg = np.flatnonzero(Y[i] == 0)
        if method == "lr_ml":
            terms.append(wt[i] * (cp.log_sum_exp(S[i]) - cp.sum(S[i, pos]) / pos.size))
            continue
        w = cp.Variable(m) if gamma > 0 else S[i]
        loss = cp.pos(1 + cp.max(w[neg]) - cp.min(w[pos]))
        if gamma > 0:
            loss = loss + cp.sum_squares(S[i] - w) / (2 * gamma)
        terms.append(wt[i] * loss)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(W) + C * cp.sum(cp.hstack(terms))))
    problem.solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11, max_iter=500
    )
    assert problem.status == cp.OPTIMAL, problem.status
    return problem.value / (C * rows.size), W.value
