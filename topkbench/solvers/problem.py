"""What the plain and the accelerated SDCA loops share (DESIGN §5): the problem (features or
Gram matrix, labels, the epoch kernel, the objective and its certificate in the P(W) scale of
DESIGN §2), the certificate schedule and a run's bookkeeping (budgets, trace, permutations)::

    P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i),   C = 1 / (lambda n)
    relative gap = (P - D) / max(|P|, |D|)
"""

from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConvergenceWarning, SolverError
from topkbench.losses import dispatch as _k
from topkbench.losses import ids as _ids
from topkbench.solvers import epochs as _e

_BLAS = None  # threadpoolctl's controller, made on first use (it inspects the loaded libraries)


def blas_threads(n: int):
    """A context that holds the BLAS to ``n`` threads.

    The second-order phases multiply and factor matrices of a few hundred rows, where a
    second OpenBLAS thread costs more in wake-ups and spinning than it saves, most of all
    beside a second worker process on the same cores (docs/performance.md)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=n, user_api="blas")


class TracePoint(NamedTuple):
    epoch: int
    primal: float
    dual: float
    relative_gap: float
    seconds: float


def relative_gap(primal: float, dual: float) -> float:
    """(P - D) / max(|P|, |D|), and 0 when both vanish (DESIGN §2)."""
    scale = max(abs(primal), abs(dual))
    if scale == 0.0:
        return 0.0
    return (primal - dual) / scale


NEGATIVE_GAP_TOL = 1e-9


def check_certificate(primal: float, dual: float) -> None:
    """Weak duality: a feasible dual never exceeds the primal.  ``D > P`` beyond rounding (or
    a non-finite value) means the arithmetic failed, typically overflow or cancellation at an
    extreme C or gamma, and such a result is never reported, let alone as converged."""
    if not (np.isfinite(primal) and np.isfinite(dual)) or (
        relative_gap(primal, dual) < -NEGATIVE_GAP_TOL
    ):
        raise SolverError(
            f"invalid certificate: primal {primal:.6g} < dual {dual:.6g} (or not finite), which "
            "weak duality rules out; the arithmetic overflowed or lost its precision, most "
            "likely because C or gamma is extreme for these features: rescale the features "
            "(dataset.scale) or use a smaller C or gamma"
        )


def warn_budget_stop(solver: str, status: str, done: str, gap: float, eps: float,
                     stacklevel: int) -> None:  # fmt: skip
    """The ``ConvergenceWarning`` of a convex solver that stopped on a budget (``status``)
    after ``done`` (e.g. "120 epochs") at a relative gap above ``eps``; ``stacklevel`` counts
    from the caller of this function."""
    warnings.warn(
        f"{solver} stopped on {status} after {done} with relative gap {gap:.3g} > eps = {eps:g}",
        ConvergenceWarning,
        stacklevel=stacklevel + 1,
    )


def _as_features(X):
    """Return ("dense", X) as C-contiguous float64 (float32 kept: the epoch kernels read it,
    and a float32 memory-mapped matrix is used without a copy) or ("csr", X) with float64
    values (the float32 epochs keep their own float32 copy, ``SDCAProblem.data32``)."""
    if sp.issparse(X):
        Xc = sp.csr_matrix(X, dtype=np.float64)
        Xc.sum_duplicates()
        # the compiled kernels take int64 indices: converted once here, not at every product
        Xc.indptr, Xc.indices = Xc.indptr.astype(np.int64), Xc.indices.astype(np.int64)
        return "csr", Xc
    dtype = np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64
    return "dense", np.ascontiguousarray(X, dtype=dtype)


# Row blocks of the n x d / n x m products when a full float64 temporary would be large
# (float32 features, or an n x m score matrix above _BLOCK_ENTRIES): memory at n = 10^6 stays
# ~ the features plus A, and small problems keep the single BLAS call.
ROW_BLOCK = 16_384


_BLOCK_ENTRIES = 1 << 24


def _blocked(X, width: int) -> bool:
    return (not sp.issparse(X) and X.dtype != np.float64) or X.shape[0] * width > _BLOCK_ENTRIES


def _rows64(X, a: int, b: int):
    """Rows ``a:b`` of dense or CSR ``X``, dense float64 rows as float64 (no copy if already)."""
    return X[a:b] if sp.issparse(X) else np.asarray(X[a:b], dtype=np.float64)


def features_dot(X, W) -> np.ndarray:
    """The scores ``X W`` as a C-contiguous float64 n x m matrix: dense ``X`` by BLAS (by row
    blocks when :func:`_blocked`), CSR by :func:`~topkbench.solvers.epochs.csr_dot_dense`."""
    W = np.ascontiguousarray(W, dtype=np.float64)
    if not sp.issparse(X):
        if not _blocked(X, W.shape[1]):
            return np.ascontiguousarray(X @ W, dtype=np.float64)
        out = np.empty((X.shape[0], W.shape[1]))
        for a in range(0, X.shape[0], ROW_BLOCK):
            b = min(a + ROW_BLOCK, X.shape[0])
            out[a:b] = _rows64(X, a, b) @ W
        return out
    out = np.empty((X.shape[0], W.shape[1]))
    _e.csr_dot_dense(*_csr_arrays(X), W, out)
    return out


def _csr_arrays(X):
    """``(indptr, indices, data)`` of CSR ``X`` as the compiled products take them (int64,
    int64, float64; no copy when they already are, as :func:`_as_features` makes them)."""
    return (X.indptr.astype(np.int64, copy=False), X.indices.astype(np.int64, copy=False),
            np.asarray(X.data, dtype=np.float64))  # fmt: skip


# Rows of a certificate's score block: about 2 MB of scores, reused block after block, so
# that the n x m scores are never allocated whole (a fresh allocation of tens of MB costs its
# page faults at every certificate) and each block is still in cache when its loss terms are
# evaluated.
_SCORE_BLOCK_ENTRIES = 1 << 18


def _score_blocks(X, W):
    """``(a, b, X[a:b] W)`` over consecutive row blocks of dense or CSR ``X``, the scores in
    one buffer that the next block overwrites (consume each block before asking for the
    next).  CSR rows are scored as :func:`features_dot` scores them (the same floats)."""
    n, m = X.shape[0], W.shape[1]
    rows = max(1, min(n, _SCORE_BLOCK_ENTRIES // max(m, 1)))
    buf = np.empty((rows, m))
    W = np.ascontiguousarray(W, dtype=np.float64)
    csr = _csr_arrays(X) if sp.issparse(X) else None
    for a in range(0, n, rows):
        b = min(a + rows, n)
        out = buf[: b - a]
        if csr is not None:
            _e.csr_dot_dense(*csr, W, out, a)
        else:
            np.matmul(_rows64(X, a, b), W, out=out)
        yield a, b, out


def features_t_dot(X, A) -> np.ndarray:
    """``X^T A`` as a C-contiguous float64 d x m matrix: CSR by
    :func:`~topkbench.solvers.epochs.csr_t_dot_dense`, dense by BLAS (by row blocks when
    :func:`_blocked`)."""
    if sp.issparse(X):
        out = np.empty((X.shape[1], A.shape[1]))
        _e.csr_t_dot_dense(*_csr_arrays(X), np.ascontiguousarray(A, dtype=np.float64), out)
        return out
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
_NO_RHO = np.empty(0)  # the rank weights of the losses that have none


def example_c(C: float, weights, n: int) -> np.ndarray:
    """Each example's share ``C w_i`` of the loss term (``w_i = 1`` without sample weights):
    the ``Cs`` of the epoch kernels and :func:`~topkbench.losses.dispatch.objective_terms`."""
    if weights is None:
        return np.full(n, float(C))
    return float(C) * np.asarray(weights, dtype=np.float64)


def evaluate_objective(X, y, A, W, loss_id: int, C: float, gamma: float, k: int, gaps=None,
                       weights=None, rho=None):  # fmt: skip
    """Return (P, D) in the P(W) scale of DESIGN §2 for dual ``A`` and primal ``W``;
    ``y`` as accepted by :func:`as_label_csr`, ``weights`` the sample weights (None: all 1).
    The scores ``X W`` are formed by row blocks (:func:`_score_blocks`) for CSR features and
    when :func:`_blocked` (the kernel carries its running sums across blocks, so the result is
    the same as in one call).  ``gaps`` (length
    n), if given, receives the per-example Fenchel-Young gaps of
    :func:`topkbench.losses.dispatch.objective_terms` (P / lambda scale)."""
    n = A.shape[0]
    yptr, yidx = as_label_csr(y)
    g = _NO_GAPS if gaps is None else gaps
    Cs = example_c(C, weights, n)
    rho = _rank_weights(loss_id, rho, W.shape[1])
    if not W.any():
        # W = 0 (the start of every run): the scores are 0, no n x d x m product needed
        S = np.zeros((n, W.shape[1]))
        lsum, csum = _k.objective_terms(S, yptr, yidx, A, loss_id, Cs, gamma, k, rho, 0.0, 0.0, g)
    elif not sp.issparse(X) and not _blocked(X, W.shape[1]):
        S = features_dot(X, W)
        lsum, csum = _k.objective_terms(S, yptr, yidx, A, loss_id, Cs, gamma, k, rho, 0.0, 0.0, g)
    else:
        lsum = csum = 0.0
        for a, b, S in _score_blocks(X, W):
            ptr = yptr[a : b + 1] - yptr[a]
            lsum, csum = _k.objective_terms(
                S, ptr, yidx[yptr[a] : yptr[b]], A[a:b], loss_id, Cs[a:b], gamma, k, rho,
                lsum, csum, g[a:b] if g.shape[0] else g,
            )  # fmt: skip
    half_sq = 0.5 * float(np.vdot(W, W))
    lam = 1.0 / (C * n)
    return lam * (half_sq + lsum), lam * (csum - half_sq)


def evaluate_objective_gram(K, y, A, loss_id: int, C: float, gamma: float, k: int, gaps=None,
                            weights=None, rho=None):  # fmt: skip
    """(P, D) in the P(W) scale from a Gram matrix: scores ``K A``, ``||W||^2 = <A, K A>``;
    ``gaps`` and ``weights`` as in :func:`evaluate_objective`."""
    n = A.shape[0]
    S = np.ascontiguousarray(K @ A, dtype=np.float64)
    g = _NO_GAPS if gaps is None else gaps
    Cs = example_c(C, weights, n)
    rho = _rank_weights(loss_id, rho, A.shape[1])
    lsum, csum = _k.objective_terms(S, *as_label_csr(y), A, loss_id, Cs, gamma, k, rho, 0.0, 0.0, g)
    half_sq = 0.5 * float(np.vdot(A, S))
    lam = 1.0 / (C * n)
    return lam * (half_sq + lsum), lam * (csum - half_sq)


def _rank_weights(loss_id: int, rho, m: int) -> np.ndarray:
    """The ``rho`` argument of the kernels: zero-padded rank weights for the weighted top-k
    hinge (required: its kernels would read past a short array), empty for the others."""
    given = rho is not None and np.size(rho) > 0
    if given != (loss_id == _ids.LOSS_WTOPK_SVM):
        raise ValueError("rank weights go with the weighted top-k hinge, and only with it")
    return _padded(rho, m) if given else _NO_RHO


def _padded(rho, m: int) -> np.ndarray:
    """Rank weights as the kernels take them: float64, zero-padded to length m."""
    out = np.zeros(m)
    rho = np.asarray(rho, dtype=np.float64).ravel()
    out[: rho.shape[0]] = rho
    return out


class SDCAProblem:
    """The training problem as the epoch kernels see it: features (dense, float32 or CSR) or
    a Gram matrix, labels in CSR form, the loss and its parameters ``k``.

    A primal point is held in its *representation* ``rep``: ``W`` (d x m) for features, the
    coefficient matrix ``B`` (n x m, ``W = sum_r phi(x_r) B_r``) for a Gram matrix.  The dual
    ``A`` defines ``rep(A) = X^T A`` resp. ``A``.

    ``single``: the features are float32 (dense, or CSR with float32 values), and plain
    SDCA may run its epochs in float32 (:meth:`run_epochs`, :func:`keeps_single`).

    ``weights`` (positive, length n; None for all 1) weight the examples' losses: the problem
    is ``P(W) = lambda/2 ||W||^2 + 1/n sum_i w_i L(y_i, W^T x_i)``, and example i's dual block
    lives in the domain scaled by ``C w_i`` (its update is the unweighted one with ``C w_i``
    for C).  ``r2`` is then ``max_i w_i ||x_i||^2``, the largest curvature an update sees.
    """

    def __init__(self, X, y, *, gram: bool, n_classes: int, loss_id: int, k: int,
                 weights=None, rho=None):  # fmt: skip
        self.single = not gram and getattr(X, "dtype", None) == np.float32
        self.data32 = None
        if gram:
            self.kind, self.X = "gram", np.ascontiguousarray(X, dtype=np.float64)
            self.sqnorms = np.ascontiguousarray(np.diag(self.X))
        else:
            self.kind, self.X = _as_features(X)
            self.sqnorms = row_sqnorms(self.X)
            if self.single and self.kind == "csr":
                self.data32 = self.X.data.astype(np.float32)  # float32 values: exact
        self.n = self.X.shape[0]
        self.m = int(n_classes)
        self.y = as_label_csr(y)
        self.loss_id = loss_id
        self.k = k
        self.rho = _rank_weights(loss_id, rho, self.m)
        self.weights = None if weights is None else np.ascontiguousarray(weights, np.float64)
        curvature = self.sqnorms if weights is None else self.weights * self.sqnorms
        self.r2 = float(curvature.max()) if self.n else 0.0

    def example_c(self, C: float) -> np.ndarray:
        """``C w_i`` for every example (:func:`example_c`)."""
        return example_c(C, self.weights, self.n)

    def row_c(self, C: float):
        """``C w_i`` as a column to scale per-example rows (``C`` itself without weights)."""
        return C if self.weights is None else C * self.weights[:, None]

    def rep_of(self, A) -> np.ndarray:
        """The primal point the dual ``A`` defines: ``X^T A`` (features) or a copy of ``A``."""
        return np.array(A, dtype=np.float64) if self.kind == "gram" else features_t_dot(self.X, A)

    def run_epochs(
        self, A, rep, perms, C: float, gamma: float, troots, single: bool = False
    ) -> int:
        """``perms.shape[0]`` SDCA epochs on the dual ``A`` (scaled for ``C``) and the primal
        point ``rep``, updated in place; ``rep`` may carry a fixed offset (the proximal
        problems).  With ``single`` (and float32 features, :attr:`single`) the passes over W
        run in float32 (``sdca_epochs_*_single``): ``rep`` then holds a float32-rounded W,
        which the caller resynchronizes before a certificate.  Returns the count of failed
        inner root findings."""
        yptr, yidx = self.y
        Cs = self.example_c(C)
        if self.kind == "gram":
            return _e.sdca_epochs_gram(
                self.X, yptr, yidx, A, rep, perms, self.loss_id, Cs, gamma, self.k, self.rho,
                troots,
            )  # fmt: skip
        single = single and self.single
        if self.kind == "dense":
            kernel = _e.sdca_epochs_dense_single if single else _e.sdca_epochs_dense
            return kernel(
                self.X, yptr, yidx, self.sqnorms, A, rep, perms, self.loss_id, Cs, gamma,
                self.k, self.rho, troots,
            )  # fmt: skip
        kernel = _e.sdca_epochs_csr_single if single else _e.sdca_epochs_csr
        return kernel(
            self.X.indptr, self.X.indices, self.data32 if single else self.X.data, yptr, yidx,
            self.sqnorms, A, rep, perms, self.loss_id, Cs, gamma, self.k, self.rho, troots,
        )  # fmt: skip

    def objective(self, A, rep, C: float, gamma: float, gaps=None) -> tuple[float, float]:
        """(P, D) for the dual ``A`` and its own primal point ``rep = rep_of(A)``."""
        if self.kind == "gram":
            return evaluate_objective_gram(self.X, self.y, A, self.loss_id, C, gamma, self.k, gaps,
                                           self.weights, self.rho)  # fmt: skip
        return evaluate_objective(self.X, self.y, A, rep, self.loss_id, C, gamma, self.k, gaps,
                                  self.weights, self.rho)  # fmt: skip

    def scores(self, rep) -> np.ndarray:
        """The n x m training scores of the primal point ``rep``."""
        if self.kind == "gram":
            return np.ascontiguousarray(self.X @ rep)
        return features_dot(self.X, rep)

    def sq_norm(self, rep, S=None) -> float:
        """``||W||^2`` of the primal point ``rep`` (``<B, K B>`` from its scores ``S`` for a
        Gram matrix)."""
        if self.kind == "gram":
            return float(np.vdot(rep, self.scores(rep) if S is None else S))
        return float(np.vdot(rep, rep))

    def values(self, S, A, sq_norm: float, C: float, gamma: float) -> tuple[float, float]:
        """P at the primal point with scores ``S`` and ``||W||^2 = sq_norm``, and D of the dual
        ``A`` given ``||rep(A)||^2 = sq_norm`` (pass the pair's own values for a certificate;
        the loss sum only depends on ``S``, the conjugate sum only on ``A / C``)."""
        lsum, csum = _k.objective_terms(
            S,
            *self.y,
            A,
            self.loss_id,
            self.example_c(C),
            gamma,
            self.k,
            self.rho,
            0.0,
            0.0,
            _NO_GAPS,
        )
        lam = 1.0 / (C * self.n)
        return lam * (0.5 * sq_norm + lsum), lam * (csum - 0.5 * sq_norm)


AUTO_COST_FACTOR = 4.0
# ... and, for a long run that no certificate can hand over, at a fraction of the epochs it
# has run: a fit that needs 1,000 epochs then pays ~40 certificates instead of ~250 (a
# certificate costs about an epoch), while one near eps stops within that fraction of its
# epochs (earlier where the last two gaps predict eps)
AUTO_GROWTH = 0.125
# ... but not past this many permutation entries per batch (32 MB of int64 indices)
AUTO_MAX_ENTRIES = 1 << 22


def auto_batch(
    trace: list[TracePoint],
    eps: float,
    n: int,
    n_active: int,
    cap: int | None = None,
    grow: bool = False,
) -> int:
    """Epochs to run before the next certificate when ``eval_every="auto"``.

    A certificate costs two n x d x m products (the W resync and the scores) plus the loss terms,
    about one full epoch of SDCA or less (two BLAS products of 2 n d m flops each, against the
    epoch's ~4 n d m flops at a lower speed); an epoch with shrinking visits only ``n_active``
    examples.  So the batch is capped at ``AUTO_COST_FACTOR * n / n_active`` epochs, which keeps the
    certificates at about a fifth of the run or less; with ``grow`` (plain SDCA that no later
    certificate can hand over, :func:`~topkbench.solvers.plan.can_hand_over`), at
    ``AUTO_GROWTH`` times the epochs run so far where that is larger: a run of thousands of
    epochs then spends a few per cent of them on certificates, and as the batches grow
    geometrically it stops at most that fraction past the epoch a certificate after every
    epoch would have found.  Within the cap the batch ends where the gap
    is predicted to reach ``eps``, extrapolating the decay per epoch of the last two trace points
    (linear convergence); SDCA's gap decays at least that fast for the smooth losses and more slowly
    for the nonsmooth ones, so the prediction is seldom late. The first batch is one epoch (a rate
    needs two points).  Timings are not used: the same command evaluates at the same epochs, and
    shrinking (which follows the evaluations) gives the same trajectory.  ``cap``, if given,
    replaces the cap (the accelerated phase's certificates cost more and its epochs no less).
    """
    if len(trace) < 2:
        return 1
    prev, last = trace[-2], trace[-1]
    if cap is None:
        cap = max(1, int(AUTO_COST_FACTOR * n / max(n_active, 1)))
        if grow:
            # the batch's permutations are drawn at once (Run.permutations): bounded memory
            cap = max(cap, min(int(AUTO_GROWTH * last.epoch), AUTO_MAX_ENTRIES // max(n, 1)))
    g0, g1 = prev.relative_gap, last.relative_gap
    if not (eps < g1 < g0) or last.epoch <= prev.epoch:
        return cap
    rate = math.log(g0 / g1) / (last.epoch - prev.epoch)
    need = math.ceil(math.log(g1 / eps) / rate)
    return max(1, min(cap, need))


# Plain SDCA on float32 features runs its epochs in float32 (SDCAProblem.run_epochs) until a
# certificate below this relative gap: float32 scores carry rounding of ~1e-7 relative to
# sum_f |x_f w_f|, which bounds how close the float32 updates can bring the dual, and the
# run's last digits are left to float64.
SINGLE_MIN_GAP = 1e-5
# ... or until this many certificates in a row bring no new smallest gap (SDCA's gap is not
# monotone, so one rise is not a stall)
SINGLE_STALL = 3


def keeps_single(trace: list[TracePoint]) -> bool:
    """Whether plain SDCA runs its next batch in float32, at the start of a run or after a
    float32 batch ended in the certificate ``trace[-1]``: while the relative gap is at least
    :data:`SINGLE_MIN_GAP` and one of the last :data:`SINGLE_STALL` certificates set a new
    smallest gap.  A stall
    (badly scaled features, where the rounding of the float32 scores is large against the
    margins, could hold the run above eps) hands the run to float64 for good.  Only the
    trajectory depends on it: every certificate resynchronizes ``W = X^T A`` in float64."""
    gaps = [t.relative_gap for t in trace]
    if gaps[-1] < SINGLE_MIN_GAP:
        return False
    if len(gaps) <= SINGLE_STALL:
        return True
    return min(gaps[-SINGLE_STALL:]) < min(gaps[:-SINGLE_STALL])


def _active_set(gaps, A):
    """Mask of the examples the next epochs visit, or None for all of them: every example but
    those with a zero block and zero gap (so zero loss).  Support vectors are never skipped,
    even at a zero gap: whether their computed gap is 0 or a rounding error above is not
    robust (dense and CSR scores would skip different examples)."""
    if gaps is None:
        return None
    keep = gaps > 0.0
    rest = np.flatnonzero(~keep)  # only these rows' blocks are read (all n x m of A at scale)
    if rest.size:
        keep[rest] = np.any(A[rest] != 0.0, axis=1)
    return None if keep.all() else keep


class Run:
    """The bookkeeping one SDCA run shares between its plain and accelerated phases: the
    epoch count and budgets, the trace, the clock (``on_eval`` time excluded), the random
    stream of the permutations and the softmax warm starts ``troots``."""

    def __init__(self, n, *, eps, max_epochs, time_limit, seed, on_eval):
        self.eps = eps
        # plain SDCA's next batch in float32 (float32 features; keeps_single ends it)
        self.single = False
        self.single_epochs = 0
        self.max_epochs = max_epochs
        self.time_limit = time_limit
        self.on_eval = on_eval
        self.rng = np.random.default_rng(seed)
        self.troots = np.full(n, np.nan)
        self.n = n
        self.epochs = 0
        self.failures = 0
        self.epoch_seconds = 0.0
        self.trace: list[TracePoint] = []
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def budget_status(self) -> str | None:
        """``"max_epochs"`` or ``"time_limit"`` once a budget is spent, else None."""
        if self.epochs >= self.max_epochs:
            return "max_epochs"
        if self.time_limit is not None and self.elapsed() >= self.time_limit:
            return "time_limit"
        return None

    def epochs_left(self) -> int:
        """The epochs the budget has left."""
        return self.max_epochs - self.epochs

    def stop_status(self, gap: float) -> str | None:
        """``"converged"`` at a relative gap within eps, else :meth:`budget_status`."""
        return "converged" if gap <= self.eps else self.budget_status()

    def clip_batch(self, batch: int) -> int:
        """``batch`` epochs cut to what is left of the epoch and time budgets."""
        if self.time_limit is not None and self.epoch_seconds > 0.0:
            left = self.time_limit - self.elapsed()
            batch = max(1, min(batch, int(left / self.epoch_seconds)))
        return max(1, min(batch, self.max_epochs - self.epochs))

    def permutations(self, batch: int, active=None) -> np.ndarray:
        """The next ``batch`` epochs' permutations (drawn in full, then filtered by the
        ``active`` mask, so the random stream does not depend on shrinking)."""
        perms = np.stack([self.rng.permutation(self.n) for _ in range(batch)]).astype(np.int64)
        if active is not None:
            perms = perms[active[perms]].reshape(batch, -1)
        return perms

    def record(self, primal: float, dual: float, A, W) -> float:
        """Append a trace point for the certificate (P, D) and return its relative gap."""
        if not (np.isfinite(primal) and np.isfinite(dual)):
            raise SolverError(
                f"non-finite objective at epoch {self.epochs} (P={primal}, D={dual}); "
                "features may be too large in magnitude"
            )
        gap = relative_gap(primal, dual)
        seconds = 0.0 if not self.trace else self.elapsed()
        self.trace.append(TracePoint(self.epochs, primal, dual, gap, seconds))
        if self.on_eval is not None:
            paused = time.perf_counter()
            self.on_eval(self.epochs, A, W)
            self.start += time.perf_counter() - paused
        return gap
