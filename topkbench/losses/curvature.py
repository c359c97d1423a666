"""Second-order derivatives of the losses in the scores, for Newton's method in the primal
(:mod:`topkbench.solvers.newton`): the per-example gradient ``G_i = grad L_gamma(y_i, s_i)``
and Hessian ``H_i`` of every SDCA loss, in the scale of DESIGN §2 (a loss term, not yet
times C).

Each loss family's module gives a subclass of :class:`LossDerivatives` beside its value,
conjugate and block update: :mod:`~topkbench.losses.entropic` (LR^Multi, top-k Ent),
:mod:`~topkbench.losses.ova` (LR^OVA, SVM^OVA), :mod:`~topkbench.losses.topk_hinge`
(SVM^Multi, the top-k hinges), :mod:`~topkbench.losses.multilabel` (LR^ML, SVM^ML) and
:mod:`~topkbench.losses.weighted_topk` (Kato's weighted top-k hinge);
:func:`topkbench.losses.dispatch.loss_derivatives` picks the family of a loss id.  The class
attributes say what the solver may do with a family (its route and its line search); the
solver never asks which loss it has.  The compiled switch hands in the kernels' zero-norm
gradient and conjugate sums (:class:`LossKernels`).

The Hessians come in two forms (:class:`Curvature`): structured, a diagonal plus at most
three signed rank-one terms per example (every loss whose Hessian is written out in closed
form), or dense ``m x m`` matrices (top-k Ent, and the differenced Hessians of the losses
without a written one).  The hinges, whose gradient is a projection onto a polytope, also
give their Hessians on the gradient's support (:meth:`LossDerivatives.support_blocks`):
``H_i`` vanishes off it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import njit

# finite-difference step in the scores (:meth:`LossDerivatives.difference_hessians`): relative
# to gamma for a smoothed hinge (whose gradient is piecewise linear with pieces of size
# ~gamma), absolute for top-k Ent (curvature ~1): large enough for rounding (~1e-16 / step); a
# difference across a kink mixes two pieces, which the stall rule of solve_newton catches
FD_STEP = 1e-6


class Curvature(NamedTuple):
    """The Hessians ``H_i`` of the loss in the scores for a block of rows, in one of two forms:
    structured, ``H_i = diag(diag_i) + sum_r sign_r u_ri u_ri^T`` with ``terms = ((sign_r,
    U_r), ...)`` (``U_r`` rows x m; every analytic loss has this form with at most three
    terms), or ``dense`` (rows x m x m) for the others."""

    diag: np.ndarray | None
    terms: tuple[tuple[float, np.ndarray], ...] = ()
    dense: np.ndarray | None = None

    def scaled(self, w) -> Curvature:
        """Each row's Hessian times ``w_i >= 0`` (the sample weights)."""
        if self.dense is not None:
            return Curvature(None, (), self.dense * w[:, None, None])
        root = np.sqrt(w)[:, None]
        return Curvature(self.diag * w[:, None], tuple((sg, U * root) for sg, U in self.terms))

    def apply(self, T) -> np.ndarray:
        """``H_i t_i`` for every row ``t_i`` of ``T``."""
        if self.dense is not None:
            return np.einsum("icd,id->ic", self.dense, T)
        out = self.diag * T
        for sg, U in self.terms:
            out += (sg * np.einsum("ic,ic->i", U, T))[:, None] * U
        return out

    def diagonal(self) -> np.ndarray:
        """The diagonals of the ``H_i`` (rows x m)."""
        if self.dense is not None:
            return np.einsum("icc->ic", self.dense)
        out = self.diag.copy()
        for sg, U in self.terms:
            out += sg * U * U
        return out


def support_index(mask):
    """``(tptr, tidx, hptr)`` of the supports ``mask`` (rows x m, bool): row i's classes are
    ``tidx[tptr[i]:tptr[i+1]]``, its block starts at ``hptr[i]``."""
    counts = mask.sum(axis=1)
    tptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=tptr[1:])
    hptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts * counts, out=hptr[1:])
    return tptr, np.nonzero(mask)[1].astype(np.int64), hptr


@njit(cache=True)
def structured_support_blocks(diag, U, signs, tptr, tidx, hptr, hvals):
    """The support blocks of structured Hessians ``H_i = diag(diag_i) + sum_r signs_r U[r, i]
    U[r, i]^T`` on the supports ``tidx`` (the classes where ``diag_i`` or some ``U[r, i]`` is
    nonzero, found by the caller), each a row-major ``|T_i| x |T_i|`` block at
    ``hvals[hptr[i]:]``."""
    n = diag.shape[0]
    R = U.shape[0]
    for i in range(n):
        lo, hi = tptr[i], tptr[i + 1]
        t = hi - lo
        base = hptr[i]
        for p in range(t):
            c = tidx[lo + p]
            for q in range(t):
                c2 = tidx[lo + q]
                v = diag[i, c] if p == q else 0.0
                for r in range(R):
                    v += signs[r] * U[r, i, c] * U[r, i, c2]
                hvals[base + p * t + q] = v


class LossKernels(NamedTuple):
    """The compiled switch's functions the derivatives call (:mod:`topkbench.losses.dispatch`,
    which builds the derivatives and hands them in): ``gradient_duals(S, yptr, yidx, loss, C,
    gamma, k, rho, out)`` and ``conjugate_terms(yptr, yidx, A, loss, Cs, gamma, k)``."""

    gradient_duals: Callable
    conjugate_terms: Callable


class LossDerivatives:
    """Gradient ``G`` (n x m) of a loss at the scores and its per-example Hessians, for the
    loss smoothed by ``gamma`` (gamma = 0: the loss itself).  :meth:`gradient` keeps what
    :meth:`curvature` needs in ``state``.

    This base class takes the gradient from the kernels' block update of a zero-norm example
    (:func:`topkbench.losses.dispatch.gradient_duals`: it maximizes ``<v, s> - L*(v)``) and
    differences it for the Hessians; a family overrides what it writes out.  The class
    attributes describe the family to the solver:

    * ``fenchel_young``: the gradient is an exact projection onto the conjugate's domain (the
      smoothed hinges), so one gradient evaluation also gives the loss by Fenchel-Young
      equality (:meth:`loss_sum`), and the zero set ``{L = 0} = {grad L = 0}`` is convex (L
      >= 0 attains 0): an example with a zero gradient at both ends of a segment has loss and
      gradient 0 all along it.
    * ``kernel_gradient``: :attr:`state` is ``(S, gamma, G)``, the scores, smoothing and
      gradient, so a gradient computed elsewhere can be adopted (:meth:`adopt_gradient`).
    * ``sparse_support``: each ``H_i`` lives on the support of the example's gradient (a
      projection onto a polytope), so :meth:`support_blocks` are small.
    * ``support_curvature``: the ``H_i`` vanish off the margin and have few directions on it
      (the hinges), the premise of the Woodbury steps.
    * ``bounded_curvature``: the curvature is bounded whatever the smoothing (the logistic
      losses), the premise of Newton-CG.
    * ``bipartite_dual``: the conjugate is a quadratic on ``C`` times the bipartite simplex
      (SVM^ML_gamma), the premise of the active-set finish
      (:mod:`topkbench.solvers.active_set`).
    * ``class_separable``: the loss is a sum over classes of functions of one score each (the
      one-vs-all losses), so its ``H_i`` are diagonal and ``hess F`` is block diagonal by
      class: Newton's system splits into m systems of d unknowns, one per class.
    * ``smoothed_on_all_classes``: the loss's smoothing regularizes every class's dual
      coordinate (SVM^ML, SVM^OVA: TPAMI Props. 6 and 10; Kato's weighted hinge), not only
      the off-label ones (TPAMI Prop. 2).
    * ``fd_relative_to_gamma``: a differenced Hessian's step scales with gamma (a smoothed
      hinge's gradient has pieces of size ~gamma).
    * ``smoothness``: ``mu`` such that the loss is (1/mu)-smooth in the scores whatever
      gamma; None for the hinges, which are (1/gamma)-smooth once smoothed by gamma.
    * ``row_arrays``: the per-example attributes :meth:`restricted` takes rows of.
    """

    fenchel_young = False
    kernel_gradient = True
    sparse_support = False
    support_curvature = False
    bounded_curvature = False
    class_separable = False
    bipartite_dual = False
    smoothed_on_all_classes = False
    fd_relative_to_gamma = True
    smoothness: float | None = None
    row_arrays: tuple[str, ...] = ()

    def __init__(self, kernels: LossKernels, loss_id: int, y, m: int, k: int = 1, rho=None):
        self.kernels = kernels
        self.loss_id = loss_id
        self.k = k
        self.rho = rho
        self.failures = 0  # inner root findings of the kernels' gradient that hit their limit
        self.y = y
        self.m = m
        self.rows = np.arange(y[0].shape[0] - 1)

    # -- gradients and loss values -------------------------------------------------------

    def gradient(self, S, gamma: float):
        """``grad L_gamma`` at the scores ``S`` (n x m), keeping :attr:`state`."""
        G = self.kernel_gradient_at(np.ascontiguousarray(S), gamma)
        self.state = (S, gamma, G)
        return G

    def adopt_gradient(self, S, gamma: float, G) -> bool:
        """Take ``G``, evaluated at ``S`` with ``gamma`` (the line search's last one), as
        the state :meth:`curvature` reads; False where the state is more than the gradient
        (the caller then evaluates :meth:`gradient` afresh)."""
        if not self.kernel_gradient:
            return False
        self.state = (S, gamma, G)
        return True

    def kernel_gradient_at(self, S, gamma: float, a: int = 0, b: int | None = None):
        """``grad L_gamma`` at the scores ``S`` of the rows ``a:b`` by the kernels'
        zero-norm block update (:func:`topkbench.losses.dispatch.gradient_duals`, with C = 1)."""
        yptr, yidx = self.y
        b = S.shape[0] + a if b is None else b
        ptr = yptr[a : b + 1] - yptr[a]
        out = np.empty_like(S)
        self.failures += self.kernels.gradient_duals(
            S, ptr, yidx[yptr[a] : yptr[b]], self.loss_id, 1.0, gamma, self.k, self.rho, out
        )
        return -out

    def conjugate_sum(self, A, Cs, gamma: float) -> float:
        """``sum_i -Cs_i L*_gamma(-A_i / Cs_i)`` for this object's rows
        (:func:`~topkbench.losses.dispatch.conjugate_terms`)."""
        yptr, yidx = self.y
        return self.kernels.conjugate_terms(yptr, yidx, A, self.loss_id, Cs, gamma, self.k)

    def loss_sum(self, S, G, Cs, gamma: float) -> float:
        """``sum_i Cs_i L_gamma(S_i)`` from the gradient ``G`` at ``S`` (Fenchel-Young:
        ``C L(s) = C <g, s> - C L*(g)``, with ``A = -C G``: the conjugate sum minus ``<A,
        S>``), for the families with :attr:`fenchel_young` only."""
        A = -Cs[:, None] * G
        return self.conjugate_sum(A, Cs, gamma) - float(np.vdot(A, S))

    def restricted(self, rows) -> LossDerivatives:
        """The same derivatives for the examples ``rows`` only (their gradients and loss
        sums; :meth:`curvature` is not meant for the copy)."""
        sub = copy.copy(self)
        yptr, yidx = self.y
        counts = np.diff(yptr)[rows]
        ptr = np.zeros(rows.size + 1, dtype=yptr.dtype)
        np.cumsum(counts, out=ptr[1:])
        within = np.arange(ptr[-1]) - np.repeat(ptr[:-1], counts)
        sub.y = (ptr, np.ascontiguousarray(yidx[np.repeat(yptr[rows], counts) + within]))
        sub.rows = np.arange(rows.size)
        sub.failures = 0
        for name in self.row_arrays:
            setattr(sub, name, getattr(self, name)[rows])
        return sub

    def smoothing_centre(self, V) -> np.ndarray:
        """A dual block ``V`` (loss units, n x m) as a smoothing continuation's centre: its
        coordinates that the loss's smoothing regularizes, the label's zeroed for the
        multiclass hinges of TPAMI Prop. 2, whose smoothing acts on the other classes only;
        all of them where :attr:`smoothed_on_all_classes` (SVM^ML and SVM^OVA, Props. 6 and
        10, and Kato's weighted top-k hinge, whose smoothing ``gamma/2 (||x||^2 + <1,
        x>^2)`` on the off-label block is ``gamma/2 ||v||^2`` over all m coordinates, the
        label's being ``-<1, x>``)."""
        V = np.array(V, dtype=np.float64)
        if not self.smoothed_on_all_classes:
            V[self.rows, self.y[1]] = 0.0
        return V

    # -- curvature -----------------------------------------------------------------------

    def curvature(self, a: int, b: int) -> Curvature:
        """The Hessians of rows ``a:b`` (:class:`Curvature`) at the last :meth:`gradient`;
        here the differenced form (the families with written Hessians override it)."""
        return Curvature(None, (), self.difference_hessians(a, b))

    def structured_curvature(self, a: int, b: int) -> Curvature | None:
        """The structured Hessians of rows ``a:b`` where the family writes them out (what
        Newton-CG applies and preconditions with), else None (Hessian-vector products by
        differences, :meth:`hess_apply`)."""
        return None

    def support_sizes(self) -> tuple[np.ndarray, int] | None:
        """For a structured :attr:`sparse_support` family, the size of each example's support
        and the number of rank-one terms of its structured form (the cost of either
        assembly); None where only the support blocks are written."""
        return None

    def support_blocks(self, a: int, b: int):
        """The Hessians of rows ``a:b`` on their supports, as :func:`~topkbench.solvers.
        hessian_kernels.assemble_support_hessian` takes them: ``(tptr, tidx, hptr, hvals)``;
        here the structured form restricted to its support."""
        curv = self.curvature(a, b)
        U = (
            np.stack([u for _, u in curv.terms])
            if curv.terms
            else np.zeros((0, b - a, curv.diag.shape[1]))
        )
        mask = (curv.diag != 0.0) | (U != 0.0).any(axis=0)
        tptr, tidx, hptr = support_index(mask)
        hvals = np.empty(hptr[-1])
        signs = np.array([sg for sg, _ in curv.terms], dtype=np.float64)
        structured_support_blocks(curv.diag, U, signs, tptr, tidx, hptr, hvals)
        return tptr, tidx, hptr, hvals

    def difference_hessians(self, a: int, b: int):
        """Forward differences of the kernels' gradient along each score (Kato's weighted
        top-k hinge; the tests' reference for the written ones).  A smoothed hinge's gradient
        is piecewise linear (a projection), so off a kink the difference is its Jacobian
        exactly; top-k Ent's is smooth (error ~ step)."""
        S, gamma, G = self.state
        m = S.shape[1]
        cols = np.empty((m, b - a, m))  # cols[c] = d G / d s_c, for every row
        base = np.ascontiguousarray(S[a:b])
        step = self.fd_step(gamma)
        for c in range(m):
            hi = base.copy()
            hi[:, c] += step
            cols[c] = (self.kernel_gradient_at(hi, gamma, a, b) - G[a:b]) / step
        H = cols.transpose(1, 2, 0)
        return 0.5 * (H + H.transpose(0, 2, 1))

    def fd_step(self, gamma: float) -> float:
        """The step of the differenced gradients (:data:`FD_STEP`, times gamma where
        :attr:`fd_relative_to_gamma`)."""
        return FD_STEP * (gamma if self.fd_relative_to_gamma else 1.0)

    def hess_apply(self, T, curv: Curvature | None) -> np.ndarray:
        """``H_i t_i`` for every row: from the curvature where it is analytic, else a forward
        difference of the gradient along ``T`` (one gradient evaluation, exact off the kinks
        of the hinges' piecewise-linear gradients)."""
        if curv is not None:
            return curv.apply(T)
        S, gamma, G = self.state
        scale = float(np.abs(T).max())
        if scale == 0.0:
            return np.zeros_like(T)
        h = self.fd_step(gamma) / scale
        return (self.kernel_gradient_at(np.ascontiguousarray(S + h * T), gamma) - G) / h


class StructuredDerivatives(LossDerivatives):
    """A family whose Hessians are written out in the structured form: Newton-CG applies and
    preconditions with them."""

    def structured_curvature(self, a: int, b: int) -> Curvature | None:
        return self.curvature(a, b)


__all__ = ["Curvature", "LossDerivatives", "StructuredDerivatives", "support_index"]
