"""Frank-Wolfe solvers for the (smoothed) weighted top-k SVM (papers/004 §5-6; DESIGN §3).

Scale and conventions as SDCA (DESIGN §2, ``topkbench.kernels.sdca``): ``C = 1/(lambda n)``,
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
  ``topkbench.kernels.wtopk``), O(m log m) per example.
* **Gap**: ``<G, U - A>`` equals ``P^(W~) - D^(A)`` with ``P^ = 1/2 ||W~||^2 + C sum_i
  Phi(s~_i)`` (Kato eq. (27)); it is the stopping rule.  For gamma = 0, P^ is exactly P(W)/lambda.
  For gamma > 0, P^(W~) >= P_smooth(W) (the Moreau envelope is the minimum over the augmented
  block), so the reported primal is this upper bound and the gap a conservative certificate.
* **Line search** (Kato eq. (20)): along a direction ``d``, ``D^(A + t d)`` is a concave
  quadratic with maximizer ``t* = <G, d> / (||X^T d||^2 + gamma/C ||d||^2)``, clipped to
  ``[0, t_max]``.
* **Variants** (Lacoste-Julien & Jaggi 2015): ``standard`` (``d = U - A``, ``t_max = 1``),
  ``away`` (FW or away direction ``A - V`` for the worst active atom V, ``t_max = w_V/(1-w_V)``)
  and ``pairwise`` (``d = U - V``, ``t_max = w_V``).  The away and pairwise variants keep the
  active set of atoms (vertices of the product domain) with their weights; an atom is stored as
  each example's K sorted indices.

Stopping: relative gap ``(P - D)/max(|P|, |D|) <= eps``, or ``max_iter`` / ``time_limit``
(``ConvergenceWarning``, never claimed as convergence).  Each iteration costs two products with
the features (scores and ``X^T d``) plus O(n m log m).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConvergenceWarning
from topkbench.kernels import wtopk as _w
from topkbench.solvers.sdca import TracePoint, relative_gap

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
    """Products with the features (dense, CSR) or with a Gram matrix."""

    def __init__(self, X, gram: bool):
        self.gram = gram
        self.X = X

    def scores(self, A, W):
        return np.asarray(self.X @ A) if self.gram else np.asarray(self.X @ W)

    def primal_part(self, A, W) -> np.ndarray | None:
        return None if self.gram else np.asarray(self.X.T @ A)

    def sq_norm(self, A, W, S) -> float:
        """``||W||^2`` (= <A, K A> in kernel mode, with S = K A)."""
        return float(np.vdot(A, S)) if self.gram else float(np.vdot(W, W))

    def direction(self, d):
        """(``X^T d`` or ``K d``) for the line search and the incremental update."""
        return np.asarray(self.X @ d) if self.gram else np.asarray(self.X.T @ d)


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
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    n = X.shape[0]
    m = int(n_classes)
    y = np.ascontiguousarray(y, dtype=np.int64)
    rho = np.ascontiguousarray(rho, dtype=np.float64)
    K = rho.shape[0]
    ops = _Ops(X, gram)
    rows = np.arange(n)
    sm = gamma / C  # smoothing: weight of the augmented block
    A = np.zeros((n, m)) if A0 is None or variant != "standard" else np.array(A0, dtype=float)
    W = ops.primal_part(A, None)
    U = np.empty((n, m))
    atom = np.empty((n, K), dtype=np.int64)
    work = np.empty(m)
    order = np.empty(m, dtype=np.int64)
    # active set (away / pairwise): atoms as index arrays, weights; the zero atom starts it
    atoms: list[np.ndarray] = [np.full((n, K), -1, dtype=np.int64)]
    weights: list[float] = [1.0]
    lookup: dict[bytes, int] = {atoms[0].tobytes(): 0}
    steps = {"fw": 0, "away": 0, "pairwise": 0, "drop": 0}
    trace: list[TracePoint] = []
    lam = 1.0 / (C * n)
    start = time.perf_counter()
    it = 0
    status = "running"
    while True:
        S = ops.scores(A, W)
        St = S + sm * A if sm else S
        lsum = _w.wtopk_vertices(St, y, rho, C, U, atom, work, order)
        sq = ops.sq_norm(A, W, S) + (sm * float(np.vdot(A, A)) if sm else 0.0)
        p_hat = 0.5 * sq + C * lsum
        d_hat = float(A[rows, y].sum()) - 0.5 * sq
        primal, dual = lam * p_hat, lam * d_hat
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
        kind = "fw"
        if variant == "standard":
            d = U - A
            t_max = 1.0
        else:
            key = atom.tobytes()
            # worst active atom: smallest <G, V>
            vals = [_w.atom_inner(a, y, rho, C, G) for a in atoms]
            v = int(np.argmin(vals))
            g_fw = float(np.vdot(G, U)) - float(np.vdot(G, A))
            V = np.empty((n, m))
            _w.atom_matrix(atoms[v], y, rho, C, V)
            if variant == "pairwise":
                d = U - V
                t_max = weights[v]
                kind = "pairwise"
            elif g_fw >= float(np.vdot(G, A)) - vals[v]:
                d = U - A
                t_max = 1.0
            else:
                d = A - V
                wv = weights[v]
                t_max = wv / (1.0 - wv) if wv < 1.0 else np.inf
                kind = "away"
        Kd = ops.direction(d)
        num = float(np.vdot(G, d))
        den = float(np.vdot(d, Kd)) if gram else float(np.vdot(Kd, Kd))
        if sm:
            den += sm * float(np.vdot(d, d))
        t = min(max(num / den, 0.0), t_max) if den > 0.0 else t_max
        if not np.isfinite(t):
            t = 0.0
        A += t * d
        if W is not None:
            W += t * Kd
        steps[kind] += 1
        if variant != "standard" and t > 0.0:
            idx = lookup.get(key)
            if kind == "fw":
                weights = [w * (1.0 - t) for w in weights]
                if idx is None:
                    idx = len(atoms)
                    atoms.append(atom.copy())
                    weights.append(0.0)
                    lookup[key] = idx
                weights[idx] += t
            elif kind == "away":
                weights = [w * (1.0 + t) for w in weights]
                weights[v] -= t
            else:  # pairwise
                if idx is None:
                    idx = len(atoms)
                    atoms.append(atom.copy())
                    weights.append(0.0)
                    lookup[key] = idx
                weights[idx] += t
                weights[v] -= t
            # drop atoms whose weight vanished (drop steps of AFW / PFW)
            keep = [i for i, w in enumerate(weights) if w > 1e-14]
            if len(keep) < len(atoms):
                steps["drop"] += len(atoms) - len(keep)
                atoms = [atoms[i] for i in keep]
                weights = [weights[i] for i in keep]
                lookup = {a.tobytes(): i for i, a in enumerate(atoms)}
        it += 1
    seconds = time.perf_counter() - start
    if status != "converged" and warn:
        warnings.warn(
            f"Frank-Wolfe ({variant}) stopped on {status} after {it} iterations with relative "
            f"gap {gap:.3g} > eps = {eps:g}",
            ConvergenceWarning,
            stacklevel=2,
        )
    if gram:
        W = None
    return FWResult(A, W, primal, dual, gap, status, it, seconds, trace, steps)


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
        raise ConfigError(f"weights must be 1..{m} finite numbers; got {list(rho)}")
    if (rho < 0).any() or (np.diff(rho) > 0).any() or rho.sum() == 0:
        raise ConfigError(
            "weights must be non-negative and non-increasing (rho_1 >= rho_2 >= ... >= 0, not "
            f"all zero), else the loss is not convex (Kato §4); got {list(rho)}"
        )
    return np.trim_zeros(rho, "b")


def as_operator(X):
    """Features as the solver takes them: C-contiguous float64 or CSR."""
    if sp.issparse(X):
        return sp.csr_matrix(X, dtype=np.float64)
    return np.ascontiguousarray(X, dtype=np.float64)
