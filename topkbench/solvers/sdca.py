"""SDCA driver (DESIGN §5): epochs in numba, stopping rule and certificate in Python.

The numba kernels (``topkbench.kernels.sdca``) work in the scale ``P / lambda``; this module
reports primal, dual and relative gap in the P(W) scale of DESIGN §2::

    P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i),   C = 1 / (lambda n)
    relative gap = (P - D) / max(|P|, |D|)

Stopping: relative gap <= eps ("converged"), or ``max_epochs`` ("max_epochs"), or a wall-clock
budget ("time_limit"); the latter two emit a :class:`ConvergenceWarning` and never claim
convergence.  Every ``eval_every`` epochs (or on the schedule of :func:`auto_batch`) one trace point
(epoch, P, D, gap, seconds) is recorded.  The permutation of each epoch is ``rng.permutation(n)``
for ``rng = numpy.random.default_rng(seed)``, drawn in order, so a run is reproducible and a slow
reference implementation can follow it step for step.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConvergenceWarning, SolverError
from topkbench.kernels import sdca as _k
from topkbench.validation import check_k


class TracePoint(NamedTuple):
    epoch: int
    primal: float
    dual: float
    relative_gap: float
    seconds: float


@dataclass
class SDCAResult:
    A: np.ndarray
    W: np.ndarray | None  # None in kernel mode
    primal: float
    dual: float
    relative_gap: float
    status: str
    epochs: int
    seconds: float
    trace: list[TracePoint] = field(default_factory=list)


def relative_gap(primal: float, dual: float) -> float:
    """(P - D) / max(|P|, |D|), and 0 when both vanish (DESIGN §2)."""
    scale = max(abs(primal), abs(dual))
    if scale == 0.0:
        return 0.0
    return (primal - dual) / scale


def _as_features(X):
    """Return ("dense", X) as C-contiguous float64 (float32 kept: the epoch kernels accumulate
    in float64, and a float32 memory-mapped matrix is used without a copy) or ("csr", X)."""
    if sp.issparse(X):
        Xc = sp.csr_matrix(X, dtype=np.float64)
        Xc.sum_duplicates()
        return "csr", Xc
    dtype = np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64
    return "dense", np.ascontiguousarray(X, dtype=dtype)


# Row blocks of the n x d / n x m products when a full float64 temporary would be large
# (float32 features, or an n x m score matrix above _BLOCK_ENTRIES): memory at n = 10^6 stays
# ~ the features plus A (issue 7), and small problems keep the single BLAS call.
ROW_BLOCK = 16_384
_BLOCK_ENTRIES = 1 << 24


def _blocked(X, width: int) -> bool:
    return (not sp.issparse(X) and X.dtype != np.float64) or X.shape[0] * width > _BLOCK_ENTRIES


def _rows64(X, a: int, b: int):
    """Rows ``a:b`` of dense or CSR ``X``, dense float64 rows as float64 (no copy if already)."""
    return X[a:b] if sp.issparse(X) else np.asarray(X[a:b], dtype=np.float64)


def features_t_dot(X, A) -> np.ndarray:
    """``X^T A`` as a C-contiguous float64 d x m matrix, by row blocks when :func:`_blocked`."""
    if not _blocked(X, A.shape[1]):
        return np.ascontiguousarray(X.T @ A, dtype=np.float64)
    out = np.zeros((X.shape[1], A.shape[1]))
    for a in range(0, X.shape[0], ROW_BLOCK):
        b = min(a + ROW_BLOCK, X.shape[0])
        out += np.asarray(_rows64(X, a, b).T @ A[a:b])
    return out


def as_label_csr(y) -> tuple[np.ndarray, np.ndarray]:
    """Labels as the kernels take them: ``(yptr, yidx)`` with example ``i``'s labels in
    ``yidx[yptr[i]:yptr[i+1]]``.  ``y`` is a 1-D array of class indices (multiclass) or a
    sparse 0/1 indicator matrix (multilabel; indices sorted per row); a pair passes through.
    """
    if isinstance(y, tuple):
        return y
    if sp.issparse(y):
        Y = sp.csr_matrix(y)
        Y.sum_duplicates()
        Y.sort_indices()
        return Y.indptr.astype(np.int64), Y.indices.astype(np.int64)
    yidx = np.ascontiguousarray(y, dtype=np.int64)
    return np.arange(yidx.shape[0] + 1, dtype=np.int64), yidx


def row_sqnorms(X) -> np.ndarray:
    """``||x_i||^2`` in float64 (float32 rows are widened block by block)."""
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1)).ravel().astype(np.float64)
    if X.dtype == np.float64:
        return np.einsum("ij,ij->i", X, X)
    out = np.empty(X.shape[0])
    for a in range(0, X.shape[0], ROW_BLOCK):
        b = min(a + ROW_BLOCK, X.shape[0])
        rows = _rows64(X, a, b)
        out[a:b] = np.einsum("ij,ij->i", rows, rows)
    return out


_NO_GAPS = np.empty(0)


def evaluate_objective(X, y, A, W, loss_id: int, C: float, gamma: float, k: int, gaps=None):
    """Return (P, D) in the P(W) scale of DESIGN §2 for dual ``A`` and primal ``W``;
    ``y`` as accepted by :func:`as_label_csr`.  The scores ``X W`` are formed by row blocks
    when :func:`_blocked` (the kernel carries its running sums across blocks, so the result
    is the same as in one call).  ``gaps`` (length n), if given, receives the per-example
    Fenchel-Young gaps of :func:`topkbench.kernels.sdca.objective_terms` (P / lambda scale)."""
    n = A.shape[0]
    yptr, yidx = as_label_csr(y)
    g = _NO_GAPS if gaps is None else gaps
    if not W.any():
        # W = 0 (the start of every run): the scores are 0, no n x d x m product needed
        S = np.zeros((n, W.shape[1]))
        lsum, csum = _k.objective_terms(S, yptr, yidx, A, loss_id, C, gamma, k, 0.0, 0.0, g)
    elif not _blocked(X, W.shape[1]):
        S = np.ascontiguousarray(X @ W, dtype=np.float64)
        lsum, csum = _k.objective_terms(S, yptr, yidx, A, loss_id, C, gamma, k, 0.0, 0.0, g)
    else:
        lsum = csum = 0.0
        for a in range(0, n, ROW_BLOCK):
            b = min(a + ROW_BLOCK, n)
            S = np.ascontiguousarray(_rows64(X, a, b) @ W, dtype=np.float64)
            ptr = yptr[a : b + 1] - yptr[a]
            lsum, csum = _k.objective_terms(
                S, ptr, yidx[yptr[a] : yptr[b]], A[a:b], loss_id, C, gamma, k, lsum, csum,
                g[a:b] if g.shape[0] else g,
            )  # fmt: skip
    half_sq = 0.5 * float(np.vdot(W, W))
    lam = 1.0 / (C * n)
    primal = lam * (half_sq + C * lsum)
    dual = lam * (C * csum - half_sq)
    return primal, dual


def evaluate_objective_gram(K, y, A, loss_id: int, C: float, gamma: float, k: int, gaps=None):
    """(P, D) in the P(W) scale from a Gram matrix: scores ``K A``, ``||W||^2 = <A, K A>``;
    ``gaps`` as in :func:`evaluate_objective`."""
    n = A.shape[0]
    S = np.ascontiguousarray(K @ A, dtype=np.float64)
    g = _NO_GAPS if gaps is None else gaps
    lsum, csum = _k.objective_terms(S, *as_label_csr(y), A, loss_id, C, gamma, k, 0.0, 0.0, g)
    half_sq = 0.5 * float(np.vdot(A, S))
    lam = 1.0 / (C * n)
    return lam * (half_sq + C * lsum), lam * (C * csum - half_sq)


AUTO_COST_FACTOR = 4.0


def auto_batch(trace: list[TracePoint], eps: float, n: int, n_active: int) -> int:
    """Epochs to run before the next certificate when ``eval_every="auto"``.

    A certificate costs two n x d x m products (the W resync and the scores) plus the loss terms,
    about one full epoch of SDCA or less (two BLAS products of 2 n d m flops each, against the
    epoch's ~4 n d m flops at a lower speed); an epoch with shrinking visits only ``n_active``
    examples.  So the batch is capped at ``AUTO_COST_FACTOR * n / n_active`` epochs, which keeps the
    certificates at about a fifth of the run or less.  Within the cap the batch ends where the gap
    is predicted to reach ``eps``, extrapolating the decay per epoch of the last two trace points
    (linear convergence); SDCA's gap decays at least that fast for the smooth losses and more slowly
    for the nonsmooth ones, so the prediction is seldom late. The first batch is one epoch (a rate
    needs two points).  Timings are not used: the same command evaluates at the same epochs, and
    shrinking (which follows the evaluations) gives the same trajectory.
    """
    if len(trace) < 2:
        return 1
    cap = max(1, int(AUTO_COST_FACTOR * n / max(n_active, 1)))
    prev, last = trace[-2], trace[-1]
    g0, g1 = prev.relative_gap, last.relative_gap
    if not (eps < g1 < g0) or last.epoch <= prev.epoch:
        return cap
    rate = math.log(g0 / g1) / (last.epoch - prev.epoch)
    need = math.ceil(math.log(g1 / eps) / rate)
    return max(1, min(cap, need))


def _active_set(gaps, A):
    """Mask of the examples the next epochs visit, or None for all of them: every example but
    those with a zero block and zero gap (so zero loss).  Support vectors are never skipped,
    even at a zero gap: whether their computed gap is 0 or a rounding error above is not
    robust (dense and CSR scores would skip different examples)."""
    if gaps is None:
        return None
    keep = (gaps > 0.0) | np.any(A != 0.0, axis=1)
    return None if keep.all() else keep


def solve_sdca(
    X,
    y: np.ndarray,
    *,
    gram: bool = False,
    n_classes: int,
    loss_id: int,
    C: float,
    gamma: float = 0.0,
    k: int = 1,
    eps: float = 1e-3,
    max_epochs: int = 1000,
    time_limit: float | None = None,
    eval_every: int | str = 1,
    seed: int = 0,
    A0: np.ndarray | None = None,
    warn: bool = True,
    on_eval=None,
    shrink: bool = True,
) -> SDCAResult:
    """Minimize P(W) by SDCA; inputs are assumed validated (see :func:`topkbench.fit`).

    With ``gram=True``, ``X`` is a symmetric PSD Gram matrix (n x n) and the problem is the
    kernel one (scores ``K A``; no W is formed; ``result.W`` is None).
    ``A0`` (n x m) warm-starts the dual; ``W`` is recomputed as ``X^T A0`` so that the pair
    is consistent.  ``on_eval(epoch, A, W)``, if given, is called after every trace point
    (benchmarks use it to score a validation set); its time is excluded from the trace and
    from the time limit.

    ``eval_every="auto"``: the epochs between certificates are chosen by :func:`auto_batch`
    (from the trace and the active-set size only, so the run stays reproducible).

    Shrinking (``shrink=True``): every certificate evaluation also yields each example's
    Fenchel-Young gap ``g_i`` (:func:`topkbench.kernels.sdca.objective_terms`; ``sum_i g_i``
    is the duality gap).  ``g_i = 0`` means block i is already the maximizer of its update;
    the epochs until the next evaluation skip the examples with ``a_i = 0`` and ``g_i = 0``,
    i.e. zero loss (each epoch's permutation is still drawn in full and filtered, so the random
    stream is the same).  For the hinge losses these are the non-support vectors (most examples
    near the optimum of bench sdca's SVM^Multi problem); the smooth losses have no
    zero loss and are unaffected.  A skipped example whose block stops being optimal as W
    moves is visited again after the next evaluation; the stopping rule is the full duality
    gap, so shrinking never certifies a point that is not eps-optimal (cf. liblinear's
    shrinking, which it re-checks at the end).
    """
    if gram:
        kind, Xk = "gram", np.ascontiguousarray(X, dtype=np.float64)
    else:
        kind, Xk = _as_features(X)
    n = Xk.shape[0]
    m = int(n_classes)
    # the one check kept here: the kernels index the scores by k without bounds checks, so an
    # unvalidated k >= m would read past them (intermittent NaNs, not an error)
    check_k(k, m)
    y = as_label_csr(y)
    yptr, yidx = y
    if A0 is None:
        A = np.zeros((n, m), dtype=np.float64)
    else:
        A = np.array(A0, dtype=np.float64, order="C", copy=True)
        if A.shape != (n, m):
            raise SolverError(f"warm start A has shape {A.shape}, expected {(n, m)}")
    gaps = np.empty(n) if shrink else None
    if kind == "gram":
        W = None

        def objective():
            return evaluate_objective_gram(Xk, y, A, loss_id, C, gamma, k, gaps)
    else:
        sqnorms = row_sqnorms(Xk)
        W = features_t_dot(Xk, A) if A0 is not None else np.zeros((Xk.shape[1], m))

        def objective():
            return evaluate_objective(Xk, y, A, W, loss_id, C, gamma, k, gaps)

    if kind == "csr":
        indptr = Xk.indptr.astype(np.int64)
        indices = Xk.indices.astype(np.int64)
        data = Xk.data

    troots = np.full(n, np.nan)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    trace: list[TracePoint] = []
    primal, dual = objective()
    active = _active_set(gaps, A)
    gap = relative_gap(primal, dual)
    trace.append(TracePoint(0, primal, dual, gap, 0.0))
    if on_eval is not None:
        paused = time.perf_counter()
        on_eval(0, A, W)
        start += time.perf_counter() - paused
    epochs = 0
    epoch_seconds = 0.0
    status = "converged" if gap <= eps else "running"
    failures = 0
    while status == "running":
        if epochs >= max_epochs:
            status = "max_epochs"
            break
        if time_limit is not None and time.perf_counter() - start >= time_limit:
            status = "time_limit"
            break
        if eval_every == "auto":
            batch = auto_batch(trace, eps, n, n if active is None else int(active.sum()))
            if time_limit is not None and epoch_seconds > 0.0:
                left = time_limit - (time.perf_counter() - start)
                batch = max(1, min(batch, int(left / epoch_seconds)))
        else:
            batch = int(eval_every)
        batch = min(batch, max_epochs - epochs)
        t_batch = time.perf_counter()
        perms = np.stack([rng.permutation(n) for _ in range(batch)]).astype(np.int64)
        if active is not None:
            perms = perms[active[perms]].reshape(batch, -1)
        if kind == "gram":
            failures += _k.sdca_epochs_gram(Xk, yptr, yidx, A, perms, loss_id, C, gamma, k, troots)
        elif kind == "dense":
            failures += _k.sdca_epochs_dense(
                Xk, yptr, yidx, sqnorms, A, W, perms, loss_id, C, gamma, k, troots
            )
        else:
            failures += _k.sdca_epochs_csr(
                indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss_id, C, gamma, k,
                troots,
            )  # fmt: skip
        epochs += batch
        epoch_seconds = (time.perf_counter() - t_batch) / batch
        # resynchronize W = X^T A: D(A) is a certified lower bound only for the W that A
        # defines, and rank-1 updates accumulate rounding (A ~ C while W may be O(1))
        if W is not None:
            W[...] = features_t_dot(Xk, A)
        primal, dual = objective()
        active = _active_set(gaps, A)
        if not (np.isfinite(primal) and np.isfinite(dual)):
            raise SolverError(
                f"non-finite objective at epoch {epochs} (P={primal}, D={dual}); "
                "features may be too large in magnitude"
            )
        gap = relative_gap(primal, dual)
        trace.append(TracePoint(epochs, primal, dual, gap, time.perf_counter() - start))
        if on_eval is not None:
            paused = time.perf_counter()
            on_eval(epochs, A, W)
            start += time.perf_counter() - paused
        if gap <= eps:
            status = "converged"
    seconds = time.perf_counter() - start
    if failures:
        warnings.warn(
            f"{failures} block updates hit the inner root-finding iteration limit",
            ConvergenceWarning,
            stacklevel=2,
        )
    if status != "converged" and warn:
        warnings.warn(
            f"SDCA stopped on {status} after {epochs} epochs with relative gap {gap:.3g} "
            f"> eps = {eps:g}",
            ConvergenceWarning,
            stacklevel=2,
        )
    return SDCAResult(A, W, primal, dual, gap, status, epochs, seconds, trace)
