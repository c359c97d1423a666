"""Frank-Wolfe solvers for the (smoothed) weighted top-k SVM (papers/004 §5-6; DESIGN §3).

Scale and conventions as SDCA (DESIGN §2, ``topkbench.losses.dispatch``): ``C = 1/(lambda n)``,
``W = sum_i x_i a_i^T`` (Kato's ``A^T / (lambda n)`` is our ``A / C``), and internally the scale
``P / lambda``.  With ``-Phi*(-a/C; y) = a_y / C`` (Kato Thm. 2) the dual is::

    D^(A) = sum_i a_{i,y_i} - 1/2 ||W||^2 - gamma / (2 C) ||A||^2,   a_i in C (-dom Phi*)

where the last term is the smoothing of Kato eq. (25): the Moreau envelope over **all** m
score coordinates, i.e. ``+gamma/2 ||v||^2`` on the whole conjugate argument -- unlike TPAMI
Prop. 2, which smooths only the off-label coordinates, so ``wtopk_svm`` with gamma > 0 is not
``topk_svm_alpha`` with the same gamma.  By Kato Prop. 5 this is the unsmoothed problem on the
augmented features ``[x_i; sqrt(gamma/C) e_i]``: scores ``s~_i = W^T x_i + (gamma/C) a_i``,
Gram ``K + (gamma/C) I``; nothing augmented is ever formed.

* **Gradient** ``G_i = e_{y_i} - s~_i``; the **vertex** maximizing ``<G, U>`` is
  ``U_i = -C grad Phi(s~_i)`` (Kato Lemma 3 / eq. (24), a subgradient of the weighted hinge;
  ``topkbench.losses.weighted_topk``), O(m K) per example (insertion; a sort for K > 32).
* **Gap**: ``<G, U - A>`` equals ``P^(W~) - D^(A)`` with ``P^ = 1/2 ||W~||^2 + C sum_i
  Phi(s~_i)`` (Kato eq. (27)); it is the stopping rule.  For gamma = 0, P^ is exactly P(W)/lambda.
  For gamma > 0, P^(W~) >= P_smooth(W) (the Moreau envelope is the minimum over the augmented
  block), so the reported primal is this upper bound and the gap a conservative certificate.
  The primal values of Frank-Wolfe iterates oscillate (the zigzag Kato §7.2 mentions) while
  the dual never decreases, so the certificate is ``min_t P^(W~_t) - D^(A_T)``: the best
  primal so far against the current dual, and the solver returns that best iterate.  Traces
  record this certificate (a gap that never increases).
* **Line search** (Kato eq. (20)): along a direction ``d``, ``D^(A + t d)`` is a concave
  quadratic with maximizer ``t* = <G, d> / (||X^T d||^2 + gamma/C ||d||^2)``, clipped to
  ``[0, t_max]``.
* **Variants** (Lacoste-Julien & Jaggi 2015): ``standard`` (``d = U - A``, ``t_max = 1``),
  ``away`` (FW or away direction ``A - V`` for the worst active atom V, ``t_max = w_V/(1-w_V)``)
  and ``pairwise`` (``d = U - V``, ``t_max = w_V``).  The away and pairwise variants keep the
  active set of atoms (vertices of the product domain) with their weights; an atom is stored as
  each example's K sorted indices (``4 n K`` bytes), in flat arrays handled by compiled kernels.

Products: the scores ``X W`` cost ``O(nnz(X) m)``; the direction's ``X^T d`` is assembled from
``W = X^T A`` and the atoms' products ``X^T U``, ``X^T V``, which cost ``O(nnz(X) K)`` because a
vertex has at most K + 1 non-zeros per example (in kernel mode ``K U`` against ``S = K A``).

Stopping: relative gap ``(P - D)/max(|P|, |D|) <= eps``, or ``max_iter`` / ``time_limit``
(``ConvergenceWarning``, never claimed as convergence).  Each iteration costs one product
with the features, one or two atom products and O(n m K).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from topkbench.losses import weighted_topk as _w
from topkbench.solvers.problem import (
    TracePoint,
    check_certificate,
    relative_gap,
    warn_budget_stop,
)

VARIANTS = ("standard", "away", "pairwise")


@dataclass
class FWResult:
    A: np.ndarray
    W: np.ndarray | None
    primal: float
    dual: float
    relative_gap: float
    status: str
    iterations: int
    seconds: float
    trace: list[TracePoint] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)  # fw / away / pairwise / drop counts


class _Ops:
    """Products with the features (dense, CSR) or with a Gram matrix.  ``base`` is the product
    of the current dual: ``W = X^T A`` (features) or the scores ``S = K A`` (Gram)."""

    def __init__(self, X, gram: bool, m: int):
        self.gram = gram
        self.X = np.ascontiguousarray(X, dtype=np.float64) if gram else X
        self.csr = sp.issparse(X)
        self.m = m

    def scores(self, A, W):
        return np.asarray(self.X @ A) if self.gram else np.asarray(self.X @ W)

    def primal_part(self, A) -> np.ndarray | None:
        return None if self.gram else np.asarray(self.X.T @ A)

    def sq_norm(self, A, W, S) -> float:
        """``||W||^2`` (= <A, K A> in kernel mode, with S = K A)."""
        return float(np.vdot(A, S)) if self.gram else float(np.vdot(W, W))

    def atom_product(self, atom, y, rho, C) -> np.ndarray:
        """``X^T V`` (or ``K V``) for an atom's matrix V, in O(nnz(X) K)
        (:mod:`topkbench.losses.weighted_topk`)."""
        X = self.X
        outT = np.zeros((self.m, X.shape[1]))
        if self.csr:
            _w.atom_xt_csr(atom, y, rho, C, X.indptr, X.indices, X.data, outT)
        else:
            _w.atom_xt_dense(atom, y, rho, C, X, outT)
        return outT.T


class _ActiveSet:
    """Atoms (each example's K indices, int32), their convex weights and hashes, in flat arrays
    grown by doubling; the zero atom starts it.  Memory: ``4 n K`` bytes per atom."""

    def __init__(self, n: int, K: int):
        self.atoms = np.full((8, n, K), -1, dtype=np.int32)
        self.weights = np.zeros(8)
        self.hashes = np.zeros(8, dtype=np.int64)
        self.weights[0] = 1.0
        self.hashes[0] = _w.atom_hash(self.atoms[0])
        self.size = 1
        self.vals = np.empty(8)

    def worst(self, y, rho, C, G) -> tuple[int, float]:
        """The active atom with the smallest ``<G, V>`` and that value."""
        _w.active_inner(self.atoms, self.size, y, rho, C, G, self.vals)
        v = int(np.argmin(self.vals[: self.size]))
        return v, float(self.vals[v])

    def index(self, atom) -> int:
        """Index of ``atom``, added with weight 0 if it is not active."""
        h = _w.atom_hash(atom)
        idx = int(_w.find_atom(self.atoms, self.hashes, self.size, atom, h))
        if idx >= 0:
            return idx
        if self.size == self.atoms.shape[0]:
            cap = 2 * self.size
            self.atoms = np.concatenate([self.atoms, np.full_like(self.atoms, -1)])
            self.weights = np.r_[self.weights, np.zeros(self.size)]
            self.hashes = np.r_[self.hashes, np.zeros(self.size, dtype=np.int64)]
            self.vals = np.empty(cap)
        idx = self.size
        self.atoms[idx] = atom
        self.weights[idx] = 0.0
        self.hashes[idx] = h
        self.size += 1
        return idx

    def drop(self) -> int:
        """Drop atoms whose weight vanished (drop steps of AFW / PFW); returns how many."""
        old = self.size
        self.size = int(_w.compact_active(self.atoms, self.weights, self.hashes, self.size, 1e-14))
        return old - self.size

    def move(self, kind: str, v: int | None, atom, t: float) -> int:
        """Carry a step of length ``t > 0`` over to the weights, so that ``A = sum_a w_a V_a``
        stays exact: a FW step moves ``t`` of every weight's mass to ``atom`` (``w <- (1-t) w +
        t e_U``, the vertex added if new), an away step moves it from atom ``v`` to the others
        (``w <- (1+t) w - t e_V``), a pairwise step moves ``t`` from ``v`` to ``atom``; then
        drops the atoms whose weight vanished and returns how many."""
        if kind == "away":
            self.weights[: self.size] *= 1.0 + t
            self.weights[v] -= t
        else:
            idx = self.index(atom)  # may grow the arrays; v keeps its index
            if kind == "fw":
                self.weights[: self.size] *= 1.0 - t
            else:
                self.weights[v] -= t
            self.weights[idx] += t
        return self.drop()


def solve_frank_wolfe(
    X,
    y: np.ndarray,
    *,
    gram: bool = False,
    n_classes: int,
    rho: np.ndarray,
    C: float,
    gamma: float = 0.0,
    variant: str = "standard",
    eps: float = 1e-3,
    max_iter: int = 1000,
    time_limit: float | None = None,
    warn: bool = True,
    A0: np.ndarray | None = None,
) -> FWResult:
    """Maximize D^ by Frank-Wolfe (module docstring); inputs are assumed validated.

    ``A0`` warm-starts from a feasible dual (standard variant only; the active-set variants
    start from the zero atom, since a warm dual has no known decomposition into atoms).
    The returned ``A``/``W`` are the iterate with the smallest primal (the one the gap
    certifies); ``dual`` is the last (largest) dual value.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    n = X.shape[0]
    m = int(n_classes)
    y = np.ascontiguousarray(y, dtype=np.int64)
    rho = np.ascontiguousarray(rho, dtype=np.float64)
    ops = _Ops(X, gram, m)
    A = np.zeros((n, m)) if A0 is None or variant != "standard" else np.array(A0, dtype=float)
    res = _iterate(ops, y, rho, C, gamma, variant, A, eps=eps, max_iter=max_iter,
                   time_limit=time_limit)  # fmt: skip
    if res.status != "converged" and warn:
        warn_budget_stop(f"Frank-Wolfe ({variant})", res.status, f"{res.iterations} iterations",
                         res.relative_gap, eps, stacklevel=2)  # fmt: skip
    check_certificate(res.primal, res.dual)
    return res


def _iterate(ops: _Ops, y: np.ndarray, rho: np.ndarray, C: float, gamma: float, variant: str,
             A: np.ndarray, *, eps: float, max_iter: int,
             time_limit: float | None) -> FWResult:  # fmt: skip
    """Frank-Wolfe iterations from the feasible dual ``A`` (updated in place) until the
    certificate ``min_t P^(W~_t) - D^(A_T)`` (module docstring) is within ``eps`` or a budget
    is spent; returns the best iterate with the certificate, the trace and the step counts.

    Every iteration solves the linear maximization over the product domain (each example's
    vertex ``U_i``), which also yields ``P^`` of the current point, then moves along the
    variant's direction (:func:`_direction`) by the exact line search (:func:`_step_size`).
    """
    n, m = A.shape
    K = rho.shape[0]
    rows = np.arange(n)
    sm = gamma / C  # smoothing: weight of the augmented block
    W = ops.primal_part(A)
    U = np.empty((n, m))
    V = np.empty((n, m))
    atom = np.empty((n, K), dtype=np.int32)
    work = np.empty(m)
    order = np.empty(m, dtype=np.int64)
    active = _ActiveSet(n, K) if variant != "standard" else None
    steps = {"fw": 0, "away": 0, "pairwise": 0, "drop": 0}
    trace: list[TracePoint] = []
    lam = 1.0 / (C * n)
    p_best, d_best = np.inf, -np.inf
    A_best, W_best = A, W
    start = time.perf_counter()
    it = 0
    while True:
        S = ops.scores(A, W)
        St = S + sm * A if sm else S
        lsum = _w.wtopk_vertices(St, y, rho, C, U, atom, work, order)
        sq = ops.sq_norm(A, W, S) + (sm * float(np.vdot(A, A)) if sm else 0.0)
        p_hat = 0.5 * sq + C * lsum
        d_hat = float(A[rows, y].sum()) - 0.5 * sq
        # every iterate's primal bounds the optimum: certify with the best one (FW iterates'
        # primal values oscillate, Kato §7.2), and return that iterate
        if p_hat < p_best:
            p_best = p_hat
            A_best = A.copy()
            W_best = W.copy() if W is not None else None
        d_best = max(d_best, d_hat)
        primal, dual = lam * p_best, lam * d_best
        gap = relative_gap(primal, dual)
        trace.append(TracePoint(it, primal, dual, gap, time.perf_counter() - start))
        if gap <= eps:
            status = "converged"
            break
        if it >= max_iter:
            status = "max_epochs"
            break
        if time_limit is not None and time.perf_counter() - start >= time_limit:
            status = "time_limit"
            break
        G = -St
        G[rows, y] += 1.0
        base = S if ops.gram else W  # X^T A (or K A)
        kind, v, d, num, t_max, Kd = _direction(variant, ops, active, G, A, U, V, atom, base,
                                                y, rho, C)  # fmt: skip
        t = _step_size(d, Kd, num, t_max, sm, ops.gram)
        A += t * d
        if W is not None:
            W += t * Kd
        steps[kind] += 1
        if active is not None and t > 0.0:
            steps["drop"] += active.move(kind, v, atom, t)
        it += 1
    seconds = time.perf_counter() - start
    return FWResult(A_best, W_best, primal, dual, gap, status, it, seconds, trace, steps)


def _direction(
    variant: str, ops: _Ops, active: _ActiveSet | None, G, A, U, V, atom, base, y, rho, C: float
) -> tuple[str, int | None, np.ndarray, float, float, np.ndarray]:
    """The step of ``variant`` at the gradient ``G`` (Lacoste-Julien & Jaggi 2015), as ``(kind,
    v, d, <G, d>, t_max, X^T d)`` (``K d`` in kernel mode), from the vertex ``U`` (with its
    ``atom``) and ``base = X^T A`` (or ``K A``).

    ``standard``: the FW direction ``U - A``, ``t_max = 1``.  ``pairwise``: ``U - V`` for the
    active atom ``V`` (index ``v``) with the smallest ``<G, V>``, ``t_max = w_V``.  ``away``:
    the FW direction, or the away direction ``A - V`` with ``t_max = w_V / (1 - w_V)`` when it
    ascends faster.  ``V`` receives the atom's matrix; ``v`` is None for ``standard``.
    """
    g_a = float(np.vdot(G, A))
    g_u = float(np.vdot(G, U))
    if variant == "standard":
        d, num, t_max = U - A, g_u - g_a, 1.0
        return "fw", None, d, num, t_max, ops.atom_product(atom, y, rho, C) - base
    v, g_v = active.worst(y, rho, C, G)
    _w.atom_matrix(active.atoms[v], y, rho, C, V)
    if variant == "pairwise":
        d, num, t_max = U - V, g_u - g_v, active.weights[v]
        Kd = ops.atom_product(atom, y, rho, C) - ops.atom_product(active.atoms[v], y, rho, C)
        return "pairwise", v, d, num, t_max, Kd
    if g_u - g_a >= g_a - g_v:
        d, num, t_max = U - A, g_u - g_a, 1.0
        return "fw", v, d, num, t_max, ops.atom_product(atom, y, rho, C) - base
    wv = active.weights[v]
    d, num = A - V, g_a - g_v
    t_max = wv / (1.0 - wv) if wv < 1.0 else np.inf
    return "away", v, d, num, t_max, base - ops.atom_product(active.atoms[v], y, rho, C)


def _step_size(d, Kd, num: float, t_max: float, sm: float, gram: bool) -> float:
    """The exact line search of Kato eq. (20): along ``d``, ``D^(A + t d)`` is a concave
    quadratic maximized at ``t* = <G, d> / (||X^T d||^2 + gamma/C ||d||^2)`` (``num`` is
    ``<G, d>``, ``Kd`` is ``X^T d``, or ``K d`` with ``<d, K d>`` in kernel mode, ``sm`` is
    ``gamma/C``), clipped to ``[0, t_max]``; ``t_max`` on a flat direction and 0 if ``t`` is not
    finite."""
    den = float(np.vdot(d, Kd)) if gram else float(np.vdot(Kd, Kd))
    if sm:
        den += sm * float(np.vdot(d, d))
    t = min(max(num / den, 0.0), t_max) if den > 0.0 else t_max
    if not np.isfinite(t):
        t = 0.0
    return t


def weight_vector(weights, k: int, m: int) -> np.ndarray:
    """Kato §7.3 weight schemes for ranks 1..k (zero beyond): ``flat`` 1/k, ``linear``
    ``2 (k+1-j) / ((k+1) k)``, ``exp`` ``exp(-j/k)`` normalized; or a user sequence, which must
    be non-negative, non-increasing, not all zero and of length <= m (convexity, Kato §4)."""
    from topkbench.errors import ConfigError

    if isinstance(weights, str):
        j = np.arange(1, k + 1, dtype=float)
        if weights == "flat":
            return np.full(k, 1.0 / k)
        if weights == "linear":
            return 2.0 * (k + 1 - j) / ((k + 1) * k)
        if weights == "exp":
            e = np.exp(-j / k)
            return e / e.sum()
        raise ConfigError(
            f"weights must be flat, linear, exp or a non-increasing list; got {weights!r}"
        )
    rho = np.asarray(list(weights), dtype=float).ravel()
    if rho.size == 0 or rho.size > m or not np.isfinite(rho).all():
        raise ConfigError(f"weights must be 1..{m} finite numbers; got {[float(v) for v in rho]}")
    if (rho < 0).any() or (np.diff(rho) > 0).any() or rho.sum() == 0:
        raise ConfigError(
            "weights must be non-negative and non-increasing (rho_1 >= rho_2 >= ... >= 0, not "
            f"all zero), else the loss is not convex (Kato §4); got {[float(v) for v in rho]}"
        )
    return np.trim_zeros(rho, "b")


def as_operator(X):
    """Features as the solver takes them: C-contiguous float64 or CSR."""
    if sp.issparse(X):
        return sp.csr_matrix(X, dtype=np.float64)
    return np.ascontiguousarray(X, dtype=np.float64)
