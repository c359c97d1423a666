"""Newton's method in the primal (with the formed Hessian when ``d m`` is small; above that,
Newton-CG for the logistic losses and a Woodbury system over the examples' curvature for the
hinges), for every SDCA loss, certified by the dual its gradient defines (DESIGN §5).

**Why.** Any coordinate or first-order method needs about ``sqrt(C R^2 / mu)`` epochs per
factor e of the gap (accelerated SDCA, :mod:`topkbench.solvers.accelerated`), which is
thousands at the top of the papers' C grids on raw features.  Newton's method is affine
invariant: rescaling the feature columns does not change its iterates, and once near the
optimum it converges quadratically (semismoothly for the smoothed hinges) whatever C; far from
it, at large C, the line search may take many damped steps.  Its price is the Hessian,
``d m x d m``, formed in about ``n m^2 d^2`` flops, which for ``d m`` up to
:data:`NEWTON_MAX_DIM` (Letter: 16 x 26, emotions: 72 x 6) costs some tens of epochs' worth of
BLAS time, and a Cholesky factorization.

**The problem in the kernels' scale** (``P / lambda``, ``C = 1/(lambda n)``)::

    F(W) = 1/2 ||W||^2 + C sum_i L(y_i, W^T x_i)
    grad F = W + C X^T G,                 G_i = grad L(y_i, s_i),   s_i = W^T x_i
    hess F = I + C sum_i H_i (x) x_i x_i^T,   H_i = hess L(y_i, s_i)  (m x m)

With sample weights every ``C`` below becomes the example's ``C w_i`` (the loss term is ``C
sum_i w_i L``; :meth:`SDCAProblem.row_c`), the certificate's argument unchanged.

The losses, their gradients and (generalized) Hessians in the scores:

* LR^Multi ``L = logsumexp(s) - s_y``: ``G = p - e_y``, ``H = diag(p) - p p^T``,
  ``p = softmax(s)``.
* LR^ML (all-class form, :mod:`topkbench.losses.multilabel`) ``L = logsumexp(s) - mean_Y s``:
  ``G = p - 1_Y / |Y|``, the same H.  Examples with Y empty or complete carry no loss (the
  kernels give them loss 0 and block 0) and are skipped here too.
* LR^OVA ``L = sum_c log(1 + exp(-t_c s_c))`` (``t_c = +1`` for the label, -1 otherwise):
  ``G_c = -t_c sigmoid(-t_c s_c)``, ``H = diag(sigmoid(s) (1 - sigmoid(s)))``.
* SVM^OVA_gamma (gamma > 0), the Huber hinge of ``z_c = 1 - t_c s_c``: ``G_c = -t_c beta_c``,
  ``beta = clip(z / gamma, 0, 1)``, ``H = diag([0 < z_c < gamma] / gamma)``.
* SVM^Multi_gamma (gamma > 0, TPAMI Prop. 2 with k = 1): ``L = max_{v in Delta} <z, v> -
  gamma/2 ||v||^2`` over ``Delta = {v >= 0, sum v <= 1}`` on the off-label coordinates,
  ``z = 1 + s^{\\y} - s_y``; ``v = proj_Delta(z / gamma) = (z / gamma - t)_+`` and with
  ``M`` the map ``s -> s^{\\y} - s_y``: ``G = M^T v`` (``G_j = v_j``, ``G_y = -sum v``) and
  ``H = M^T J M / gamma``, J the projection's Jacobian on the support S of v: ``I_S`` when
  ``t = 0``, ``I_S - 1_S 1_S^T / |S|`` when the sum constraint binds (t > 0).  H is
  piecewise constant, so this is a semismooth Newton method.
* SVM^ML_gamma: ``G = sigma * proj_B(z)`` through the bipartite projection, whose Jacobian on
  its face is written out (:meth:`_Derivatives._bipartite_curvature`).
* The top-k hinges (gamma > 0): the gradient is the kernels' block update of a zero-norm
  example (:func:`topkbench.losses.dispatch.gradient_duals`; it maximizes ``<v, s> -
  L*(v)``), ``M^T`` times a projection onto the loss's top-k set, and ``H_i = M^T J M /
  gamma`` with J that projection's Jacobian on its face, written out on the gradient's
  support (:func:`topkbench.prox.topk.projection_jacobian`,
  :func:`topkbench.losses.topk_hinge.hinge_support_hessians`).  Top-k Ent's H_i
  are written out too (:meth:`_Derivatives._topk_ent_hessians`: the Jacobian of the top-k
  simplex maximizer on its partition, a diagonal plus rank two, mapped to the scores).
  Kato's weighted top-k hinge alone differences its gradient (:meth:`_Derivatives.
  _difference_hessians`).

Every analytic H_i is a diagonal plus at most three signed rank-one terms
(:class:`Curvature`); the Hessian is assembled from those products, or, for the hinges whose
H_i live on a few classes, from the examples' supports grouped by class pair
(:mod:`topkbench.solvers.hessian_kernels`), whichever costs less.  Above ``d m =
NEWTON_MAX_DIM`` the logistic losses take Newton-CG steps instead (:func:`_cg_direction`),
and the hinges solve ``(I + C Z Z^T) D = -grad`` by Woodbury's identity, Z holding one column
``u (x) x_i`` per example and eigenvector of its curvature (:func:`_woodbury_direction`): a
hinge's H_i vanish off the margin and have few directions on it, so the system has far fewer
than ``d m`` rows where ``d m`` is large (scene: 294 x 6).

**Nonsmooth hinges (gamma = 0): a continuation about proximal centres.**  Stage j smooths
the conjugate about a centre ``V`` in the dual (loss units)::

    L_{gamma,v}(s) = max_u <u, s> - L*(u) - gamma/2 ||P (u - v)||^2
                   = L_gamma(s + gamma P v) - gamma/2 ||P v||^2,

P the coordinates the loss's own smoothing regularizes (the off-label ones for the
multiclass hinges, TPAMI Prop. 2; all for SVM^ML and SVM^OVA, Props. 6 and 10, and for
Kato's weighted top-k hinge, :func:`_smoothing_centre`): the stage's
gradient, Hessian and loss are those of ``L_gamma`` at the shifted scores
(:func:`_smoothing_centre`).  The first centre is the starting dual; gamma starts at 1 (or
a warm start's last) and decreases as in the accelerated solver
(:func:`~topkbench.solvers.accelerated.next_stage_gamma`) down to :data:`PROX_MIN_GAMMA`
(further only where a stage's proximal step did not halve the gap, :data:`PROX_MIN_DECREASE`),
and each new stage moves the centre to the last stage's gradient dual.  The dual of stage j
is the gamma = 0 dual minus ``sum_i C_i gamma/2 ||P (u_i - v_i)||^2``, so its optimum is the
proximal point of the gamma = 0 dual at V (Rockafellar, SIAM J. Control Optim. 1976), and
moving the centre is the proximal point method: it converges to the gamma = 0 optimum with
gamma held, and once the centre is near the optimal dual the stage's optimum has its margin
examples inside their quadratic pieces instead of on the kinks, where Newton's steps are full.
TPAMI Props. 2, 6 and 10 keep the conjugate domain, so every stage's gradient dual is
feasible for gamma = 0, and every certificate is the gamma = 0 one.

**The certificate.** ``A = -C G`` is dual feasible (a gradient of a convex loss lies in the
domain of its conjugate) and is the dual the kernels pair with the scores ``s_i``: each
Fenchel-Young term ``C (L(s_i) + L*(-a_i / C)) + <a_i, s_i>`` is zero.  Summing them, with
``W_A = X^T A = W - grad F(W)``::

    (P(W) - D(A)) / lambda = 1/2 ||W||^2 + C sum L - C sum (-L*) + 1/2 ||W_A||^2
                           = 1/2 ||W||^2 - <W_A, W> + 1/2 ||W_A||^2 = 1/2 ||grad F(W)||^2,

so the duality gap of the pair (W, A) is exactly ``lambda/2 ||grad F(W)||^2``: Newton's
quadratic convergence of the gradient carries over to the certificate.  The reported gap is
nonetheless computed by the kernels from their loss and conjugate values, like every other
certificate (the identity is checked in the tests).  For a continuation stage the identity
holds for the stage's loss; the gamma = 0 gap adds the smoothing's share, and a stage ends
when its own gap is below a quarter of that share.

**Globalization.** Armijo's test at the full step, else the exact minimizer along the
Newton direction (:func:`_exact_step`), else backtracking; the scores along it are ``S + t X
Delta``, so a trial step costs no product with X; for the hinges one gradient evaluation
gives both the slope and the loss there (Fenchel-Young), and the examples whose gradient is
zero at both ends of the step are left out of the evaluations in between
(:func:`_line_search`).  Rounded or finite-difference H_i can
leave the assembled Hessian a few ulps short of positive definite; :func:`_newton_step` then
shifts its diagonal (Levenberg).  When
the line search fails (F no longer decreases: the rounding floor), the solver hands the run
back with its dual, which plain SDCA continues from.
"""

from __future__ import annotations

import copy
import math
import time
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.linalg.lapack import dpotrf, dpotrs
from scipy.special import expit, logsumexp

from topkbench.losses import dispatch as _k
from topkbench.losses import ids
from topkbench.losses.topk_hinge import hinge_support_hessians, is_hinge
from topkbench.solvers.accelerated import first_stage_gamma, next_stage_gamma
from topkbench.solvers.hessian_kernels import (
    assemble_support_hessian,
    structured_support_blocks,
    topk_ent_hessian_rows,
    woodbury_system,
)
from topkbench.solvers.problem import Run, SDCAProblem, features_t_dot, relative_gap

# the Hessian is (d m)^2 doubles and costs about n m^2 d^2 flops per iteration
NEWTON_MAX_DIM = 1024
# above NEWTON_MAX_DIM the hinges' Newton steps solve the Woodbury system of their examples'
# curvature (_woodbury_direction) while it has at most this many rows (a factorization of
# about a tenth of a second), on problems of at most WOODBURY_MAX_ROWS examples: a continuation
# has about one row per example at the margin, so larger problems (corel5k's 4,050 x 374:
# some 40,000 rows) would only pay for the refusal
WOODBURY_MAX_RANK = 3000
WOODBURY_MAX_ROWS = 3000
# eigenvalues of the support blocks below this fraction of the largest are left out of Z
WOODBURY_EIG_TOL = 1e-12
# within the dense limit a hinge's step takes the Woodbury system while it has at most this
# share of d m rows (its factorization then costs about half the dense one's, which leaves the
# Gram block and the eigendecompositions their share)
WOODBURY_DENSE_SHARE = 0.8
# the supports' sizes less one estimate the system's rows from above or below; only an
# estimate this many times past the limit refuses before the eigendecompositions
WOODBURY_PRECHECK = 2.0
# the cost model of a Newton phase (:func:`newton_cost_epochs`): the iterations a
# continuation for a nonsmooth hinge typically takes, those of a smooth loss (damped steps,
# then quadratic convergence), and how much faster per flop its dense products run than an
# epoch
NEWTON_ITERATIONS = 30
NEWTON_ITERATIONS_SMOOTH = 5
BLAS3_SPEEDUP = 4.0
# how much dearer per flop the assembly on the supports runs than the structured form's
# products (its large blocks are BLAS products too, its small ones compiled loops)
PAIRWISE_SLOWDOWN = 1.5
# Newton-CG (:func:`_cg_direction`): the residual it stops at, relative to the gradient, and
# its budget of Hessian-vector products per Newton iteration
CG_FORCING = 0.1
CG_MAX_ITERATIONS = 500
# the losses Newton-CG takes over where d m is above NEWTON_MAX_DIM: the logistic ones, whose
# curvature is bounded, so that a handful of preconditioned products solve each Newton system;
# the smoothed hinges' curvature C R^2 / gamma makes those systems long, and accelerated SDCA
# reaches eps first there (docs/conditioning.md has the measurement)
NEWTON_CG_LOSSES = (ids.LOSS_LR_MULTI, ids.LOSS_LR_ML, ids.LOSS_LR_OVA)
# the losses whose gradient and Hessian are written out here in structured form; the others
# take the kernels' gradient, with Hessians written on the supports (the top-k hinges), dense
# (top-k Ent) or differenced (Kato's weighted top-k hinge)
ANALYTIC_LOSSES = (
    ids.LOSS_LR_MULTI, ids.LOSS_LR_OVA, ids.LOSS_LR_ML, ids.LOSS_SVM_OVA, ids.LOSS_SVM_MULTI,
    ids.LOSS_SVM_ML,
)  # fmt: skip
# the losses whose gradient is an exact projection onto the conjugate's domain (the hinges,
# smoothed), so that one gradient evaluation also gives the loss by Fenchel-Young equality
# (:func:`topkbench.losses.dispatch.conjugate_terms`), and whose zero set {L = 0} = {grad L =
# 0} is convex (L >= 0 attains 0), so that an example with a zero gradient at both ends of a
# line segment has loss and gradient 0 all along it
FENCHEL_YOUNG_LOSSES = (
    ids.LOSS_SVM_MULTI, ids.LOSS_TOPK_SVM_ALPHA, ids.LOSS_TOPK_SVM_ALPHA_PSEUDO,
    ids.LOSS_TOPK_SVM_BETA, ids.LOSS_SVM_OVA, ids.LOSS_SVM_ML,
)  # fmt: skip
# SVM^ML_gamma: the bipartite projection's radius counts as active when sum p is this close
# to 1 (its kink; either Jacobian is a generalized one there)
RADIUS_TOL = 1e-12
# finite-difference step in the scores (:meth:`_Derivatives._difference_hessians`): relative
# to gamma for a smoothed hinge (whose gradient is piecewise linear with pieces of size
# ~gamma), absolute for top-k Ent (curvature ~1): large enough for rounding (~1e-16 / step); a
# difference across a kink mixes two pieces, which the stall rule of solve_newton catches
FD_STEP = 1e-6
# how much dearer per flop a product per class pair runs (d x d outputs) than one product
# over all pairs (:func:`_add_vech_blocks`), for dense per-example Hessians
DENSE_PAIR_SLOWDOWN = 3.0
# rows per block when forming the Hessian (a block's per-example Hessians: rows x m^2 doubles)
HESSIAN_ENTRIES = 1 << 23
ARMIJO = 1e-4
# the line search gives up when the step moves no entry of W by more than this relative amount
MIN_RELATIVE_STEP = 1e-15
# a continuation's smoothing decreases down to this and then stays, each further stage moving
# its centre instead (the proximal point method on the dual): smaller would make each stage's
# piecewise-quadratic problem take more damped Newton steps than it saves stages ...
PROX_MIN_GAMMA = 0.1
# ... as long as each stage ends with the gamma = 0 gap below this fraction of the last
# stage's; where the proximal steps make less progress than that, gamma decreases further
PROX_MIN_DECREASE = 0.5
# the hinges whose smoothing regularizes every class's dual coordinate (the others: all but
# the label's; :func:`_smoothing_centre`)
SMOOTHED_ON_ALL_CLASSES = (ids.LOSS_SVM_ML, ids.LOSS_SVM_OVA, ids.LOSS_WTOPK_SVM)
# the largest curvature C R^2 / gamma of a continuation stage: beyond it the Hessian's
# condition number leaves float64 (and the stage's share of the gap is below any useful eps)
MAX_CURVATURE = 1e12
# a run whose full Newton steps leave its gap (a continuation stage's own) above STALL_FACTOR
# times its best for STALL_ITERATIONS iterations is handed on: iterates on the kinks of a
# piecewise-quadratic loss, where a difference Hessian mixes two pieces, or at the rounding
# floor (damped steps, far from the optimum, are progress on F and do not count)
STALL_ITERATIONS = 50
STALL_FACTOR = 0.9
# the exact line search stops where the slope along the step is this fraction of the first
LINE_SEARCH_TOL = 0.1
LINE_SEARCH_ITERATIONS = 30


def newton_route(kind: str, n: int | None, d: int, m: int, loss_id: int) -> str | None:
    """How Newton's steps are solved on a problem of ``n`` examples (None: unknown) of this
    shape: ``"dense"`` (features with ``d m <= NEWTON_MAX_DIM``: the Hessian is formed and
    factored), ``"cg"`` (a logistic loss above that: Hessian-vector products,
    :func:`_cg_direction`), ``"woodbury"`` (a hinge above it, at most
    :data:`WOODBURY_MAX_ROWS` examples: :func:`_woodbury_direction`), or None (a Gram
    matrix, or none of these)."""
    if kind == "gram":
        return None
    if d * m <= NEWTON_MAX_DIM:
        return "dense"
    if loss_id in NEWTON_CG_LOSSES:
        return "cg"
    return "woodbury" if woodbury_applies(kind, n, loss_id) else None


def woodbury_applies(kind: str, n: int | None, loss_id: int) -> bool:
    """Whether Woodbury steps may be tried (within the dense limit too): features, at most
    :data:`WOODBURY_MAX_ROWS` examples, and a loss whose H_i live on its gradient's support
    (the hinges: SVM^Multi, the top-k hinges, SVM^ML and SVM^OVA, whose H_i is diagonal)."""
    hinge = is_hinge(loss_id) or loss_id in (ids.LOSS_SVM_ML, ids.LOSS_SVM_OVA)
    return kind != "gram" and hinge and n is not None and n <= WOODBURY_MAX_ROWS


def _route_of(prob: SDCAProblem) -> str | None:
    return newton_route(prob.kind, prob.n, prob.X.shape[1], prob.m, prob.loss_id)


def newton_cost_epochs(prob: SDCAProblem, smooth: bool = False) -> float:
    """What a Newton phase costs, in epochs of plain SDCA: :data:`NEWTON_ITERATIONS`
    iterations for a nonsmooth hinge's continuation (:data:`NEWTON_ITERATIONS_SMOOTH` for a
    smooth loss), each forming the Hessian (about ``n (d m)^2`` flops) and factoring it
    (``(d m)^3 / 3``), or on the Woodbury route the Gram matrix and the factorization of a
    system of ``r`` rows (``n nnz(X) + r^3 / 3``), ``r`` taken as ``n`` for a continuation
    (about one curvature direction per example at the margin) and ``2 n`` for a smooth hinge
    (most examples inside their quadratic pieces, several directions each; infinite when that
    passes :data:`WOODBURY_MAX_RANK`, which the route would refuse), against an
    epoch's ``4 nnz(X) m``; the factor
    :data:`BLAS3_SPEEDUP` is how much faster per flop the dense products run than the epoch
    kernels on these small problems.  Deterministic: a function of the shapes only."""
    d = prob.X.shape[1]
    dm = float(d * prob.m)
    nnz = prob.X.nnz if sp.issparse(prob.X) else prob.n * d
    if _route_of(prob) == "woodbury":
        r = float(prob.n) * (2.0 if smooth else 1.0)
        if r > WOODBURY_MAX_RANK:
            return math.inf  # a system the route would refuse: no hand-over to it
        iteration = prob.n * float(nnz) + r**3 / 3.0
    else:
        iteration = prob.n * dm * dm + dm**3 / 3.0
    iterations = NEWTON_ITERATIONS_SMOOTH if smooth else NEWTON_ITERATIONS
    return iterations * iteration / (BLAS3_SPEEDUP * 4.0 * nnz * prob.m)


def _simplex_project(w):
    """Row-wise projection onto ``{v >= 0, sum v <= 1}``; returns ``(v, t)`` with ``v = (w -
    t)_+`` and ``t = 0`` where the sum constraint does not bind."""
    pos = np.maximum(w, 0.0)
    t = np.zeros(w.shape[0])
    binds = pos.sum(axis=1) > 1.0
    if binds.any():
        u = -np.sort(-w[binds], axis=1)
        css = np.cumsum(u, axis=1) - 1.0
        ranks = np.arange(1, w.shape[1] + 1)
        rho = (u - css / ranks > 0.0).sum(axis=1)  # the support size
        t[binds] = css[np.arange(u.shape[0]), rho - 1] / rho
    return np.maximum(w - t[:, None], 0.0), t


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


class _Derivatives:
    """Gradient ``G`` (n x m) of the loss at the scores and its per-example Hessians, for the
    loss of ``prob`` smoothed by ``gamma`` (module docstring).  :meth:`gradient` keeps what
    :meth:`curvature` needs."""

    def __init__(self, prob: SDCAProblem):
        self.loss_id = prob.loss_id
        self.k = prob.k
        self.rho = prob.rho
        self.failures = 0  # inner root findings of the kernels' gradient that hit their limit
        yptr, yidx = self.y = prob.y
        n, m = prob.n, prob.m
        self.rows = np.arange(n)
        if self.loss_id not in ANALYTIC_LOSSES:
            return
        counts = np.diff(yptr)
        if self.loss_id in (ids.LOSS_LR_ML, ids.LOSS_SVM_ML):
            self.active = (counts > 0) & (counts < m)
            self.positive = np.zeros((n, m), dtype=bool)
            self.positive[np.repeat(self.rows, counts), yidx] = True
            T = self.positive / np.maximum(counts, 1)[:, None]
            T[~self.active] = 0.0
            self.target = T
        else:
            self.labels = yidx
            self.sign = -np.ones((n, m))
            self.sign[self.rows, yidx] = 1.0

    @property
    def fenchel_young(self) -> bool:
        """Whether :meth:`loss_sum` may take the loss from the gradient (module constant
        :data:`FENCHEL_YOUNG_LOSSES`)."""
        return self.loss_id in FENCHEL_YOUNG_LOSSES

    def conjugate_sum(self, A, Cs, gamma: float) -> float:
        """``sum_i -Cs_i L*_gamma(-A_i / Cs_i)`` for this object's rows
        (:func:`~topkbench.losses.dispatch.conjugate_terms`)."""
        yptr, yidx = self.y
        return _k.conjugate_terms(yptr, yidx, A, self.loss_id, Cs, gamma, self.k)

    def loss_sum(self, S, G, Cs, gamma: float) -> float:
        """``sum_i Cs_i L_gamma(S_i)`` from the gradient ``G`` at ``S`` (Fenchel-Young:
        ``C L(s) = C <g, s> - C L*(g)``, with ``A = -C G``: the conjugate sum minus ``<A,
        S>``), for the losses of :attr:`fenchel_young` only."""
        A = -Cs[:, None] * G
        return self.conjugate_sum(A, Cs, gamma) - float(np.vdot(A, S))

    def restricted(self, rows) -> _Derivatives:
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
        for name in ("active", "positive", "target", "labels", "sign"):
            if hasattr(self, name):
                setattr(sub, name, getattr(self, name)[rows])
        return sub

    def _kernel_gradient(self, S, gamma: float, a: int = 0, b: int | None = None):
        """``grad L_gamma`` at the scores ``S`` of the rows ``a:b`` by the kernels'
        zero-norm block update (:func:`topkbench.losses.dispatch.gradient_duals`, with C = 1)."""
        yptr, yidx = self.y
        b = S.shape[0] + a if b is None else b
        ptr = yptr[a : b + 1] - yptr[a]
        out = np.empty_like(S)
        self.failures += _k.gradient_duals(
            S, ptr, yidx[yptr[a] : yptr[b]], self.loss_id, 1.0, gamma, self.k, self.rho, out
        )
        return -out

    @property
    def kernel_gradient(self) -> bool:
        """Whether :meth:`gradient` is the kernels' (its state: the scores, gamma and G)."""
        return self.loss_id == ids.LOSS_SVM_ML or self.loss_id not in ANALYTIC_LOSSES

    def gradient(self, S, gamma: float):
        lid = self.loss_id
        if self.kernel_gradient:
            G = self._kernel_gradient(np.ascontiguousarray(S), gamma)
            self.state = (S, gamma, G)
            return G
        if lid in (ids.LOSS_LR_MULTI, ids.LOSS_LR_ML):
            P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
            if lid == ids.LOSS_LR_MULTI:
                # G_y = p_y - 1 as minus the other classes' sum: the dual block's coordinates
                # then sum to zero exactly, as the conjugate's domain requires
                G = P.copy()
                G[self.rows, self.labels] = 0.0
                G[self.rows, self.labels] = -G.sum(axis=1)
            else:
                P[~self.active] = 0.0
                G = P - self.target
            self.state = P
            return G
        if lid == ids.LOSS_LR_OVA:
            self.state = expit(S) * expit(-S)  # sigma (1 - sigma) without underflow
            return -self.sign * expit(-self.sign * S)
        if lid == ids.LOSS_SVM_OVA:
            z = 1.0 - self.sign * S
            self.state = ((z > 0.0) & (z < gamma)) / gamma
            return -self.sign * np.clip(z / gamma, 0.0, 1.0)
        # SVM^Multi_gamma: v over the off-label coordinates; the label's entry is held at 0,
        # which the projection maps to 0 (t = 0 leaves it at 0, t > 0 clips it)
        w = (1.0 + S - S[self.rows, self.labels][:, None]) / gamma
        w[self.rows, self.labels] = 0.0
        v, t = _simplex_project(w)
        self.state = (v > 0.0, t > 0.0, gamma)
        # for small gamma, w and t are large and sum v may exceed 1 by rounding (~ 1e-16 |z|
        # / gamma), which would make the dual infeasible and the certificate wrong
        v /= np.maximum(v.sum(axis=1), 1.0)[:, None]
        G = v
        G[self.rows, self.labels] = -v.sum(axis=1)
        return G

    def curvature(self, a: int, b: int) -> Curvature:
        """The Hessians of rows ``a:b`` (:class:`Curvature`) at the last :meth:`gradient`
        (the hinges' are assembled from :meth:`support_blocks` instead, where the top-k ones
        are written out; for those this is the differenced form the tests compare with)."""
        lid = self.loss_id
        if lid == ids.LOSS_TOPK_ENT:
            return Curvature(None, (), self._topk_ent_hessians(a, b))
        if lid not in ANALYTIC_LOSSES:
            return Curvature(None, (), self._difference_hessians(a, b))
        if lid in (ids.LOSS_LR_OVA, ids.LOSS_SVM_OVA):
            return Curvature(self.state[a:b])
        if lid in (ids.LOSS_LR_MULTI, ids.LOSS_LR_ML):
            P = self.state[a:b]
            return Curvature(P, ((-1.0, P),))
        if lid == ids.LOSS_SVM_ML:
            return self._bipartite_curvature(a, b)
        return self._simplex_curvature(a, b)

    def _simplex_curvature(self, a: int, b: int) -> Curvature:
        """SVM^Multi_gamma: ``H = M^T J M / gamma`` (module docstring) with ``M^T I_S M =
        sum_{j in S} (e_j - e_y)(e_j - e_y)^T = diag(1_S + (|S| - 1) e_y) + (e_y - 1_S)(e_y -
        1_S)^T - 1_S 1_S^T``, and the binding sum constraint's ``- u u^T / |S|``, ``u = 1_S -
        |S| e_y``."""
        support, binds, gamma = self.state
        sig = support[a:b].astype(np.float64)
        rows = np.arange(b - a)
        y = self.labels[a:b]
        size = sig.sum(axis=1)
        live = (size > 0.0)[:, None]
        diag = sig.copy()
        diag[rows, y] += size - 1.0
        ey_minus = -sig
        ey_minus[rows, y] += 1.0
        u = sig.copy()
        u[rows, y] = -size
        u *= np.where(binds[a:b], 1.0 / np.sqrt(np.maximum(size, 1.0)), 0.0)[:, None]
        root = 1.0 / math.sqrt(gamma)
        return Curvature(
            np.where(live, diag, 0.0) / gamma,
            ((1.0, np.where(live, ey_minus, 0.0) * root), (-1.0, sig * root), (-1.0, u * root)),
        )  # fmt: skip

    def _bipartite_curvature(self, a: int, b: int) -> Curvature:
        """SVM^ML_gamma (TPAMI Prop. 6): ``G = sigma * proj_B(z)`` with ``z_j = (1/2 + sigma_j
        u_j) / gamma`` and ``sigma = -1`` on Y, +1 off Y, B the bipartite simplex of radius 1
        (:mod:`topkbench.prox.bipartite`).  On the face of the projection's supports ``S_Y``,
        ``S_Ybar``, its Jacobian J is the projection onto the face's affine hull: with the
        radius inactive (``sum p < 1``) that hull is ``{<1, x_{S_Y}> = <1, y_{S_Ybar}>}``, so
        ``J = I_S - w w^T / |S|``, ``w = (1_{S_Y}, -1_{S_Ybar})``; with the radius active both
        sums are fixed and J is block diagonal, ``I - 1 1^T / |S_Y|`` and ``I - 1 1^T /
        |S_Ybar|``.  Since ``sigma * w = -1_S``, ``H = diag(sigma) J diag(sigma) / gamma`` is
        ``(I_S - 1_S 1_S^T / |S|) / gamma``, resp. ``(I_S - 1_{S_Y} 1_{S_Y}^T / |S_Y| -
        1_{S_Ybar} 1_{S_Ybar}^T / |S_Ybar|) / gamma``.  On the radius's kink (``sum p = 1`` to
        rounding) the second is taken: both are elements of the generalized Jacobian there."""
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

    @property
    def sparse_support(self) -> bool:
        """Whether each H_i lives on the support of the example's gradient (the hinges: their
        gradient is a projection onto a polytope), so that :meth:`support_blocks` applies."""
        return is_hinge(self.loss_id) or self.loss_id == ids.LOSS_SVM_ML

    def pairwise_cheaper(self, d: int, m: int) -> bool:
        """Whether the assembly on the supports (:meth:`support_blocks`) costs less than the
        structured form's symmetric products (analytic losses only; the others have no such
        form).  Pairwise: ``sum_i t_i (t_i + 1) / 2 d^2`` flops,
        :data:`PAIRWISE_SLOWDOWN` times dearer per flop than the BLAS; structured:
        ``(d m)^2 / 2`` per rank-one term and example with a gradient."""
        if self.loss_id not in ANALYTIC_LOSSES:
            return True
        if self.loss_id == ids.LOSS_SVM_ML:
            t, terms = (self.state[2] != 0.0).sum(axis=1), 2
        else:  # SVM^Multi_gamma: the support of v, and the label
            t, terms = self.state[0].sum(axis=1), 3
            t = t + (t > 0)
        pairwise = PAIRWISE_SLOWDOWN * float((t * (t + 1)).sum()) / 2.0 * d * d
        structured = terms * float((t > 0).sum()) * (d * m) ** 2 / 2.0
        return pairwise < structured

    def support_blocks(self, a: int, b: int):
        """The Hessians of rows ``a:b`` on their supports, as :func:`~topkbench.solvers.
        hessian_kernels.assemble_support_hessian` takes them: ``(tptr, tidx, hptr, hvals)``.
        Analytic losses restrict their structured form; the top-k hinges write their
        projections' Jacobians on the supports (:func:`~topkbench.losses.topk_hinge.
        hinge_support_hessians`)."""
        if self.loss_id in ANALYTIC_LOSSES:
            curv = self.curvature(a, b)
            U = (
                np.stack([u for _, u in curv.terms])
                if curv.terms
                else np.zeros((0, b - a, curv.diag.shape[1]))
            )
            mask = (curv.diag != 0.0) | (U != 0.0).any(axis=0)
            tptr, tidx, hptr = _support_index(mask)
            hvals = np.empty(hptr[-1])
            signs = np.array([sg for sg, _ in curv.terms], dtype=np.float64)
            structured_support_blocks(curv.diag, U, signs, tptr, tidx, hptr, hvals)
            return tptr, tidx, hptr, hvals
        S, gamma, G = self.state
        tptr, tidx, hptr = _support_index(G[a:b] != 0.0)
        hvals = np.empty(hptr[-1])
        yptr, yidx = self.y
        hinge_support_hessians(
            np.ascontiguousarray(S[a:b]), yptr[a : b + 1] - yptr[a], yidx[yptr[a] : yptr[b]],
            self.loss_id, gamma, self.k, tptr, tidx, hptr, hvals,
        )  # fmt: skip
        return tptr, tidx, hptr, hvals

    def _topk_ent_hessians(self, a: int, b: int):
        """Top-k Ent (TPAMI Prop. 17): the Hessians of rows ``a:b`` in the scores, from the
        kernels' gradient, as dense ``rows x m x m`` matrices (they are dense: every class
        has mass).

        In the coordinates ``a = s^{\\y} - s_y`` the gradient is the maximizer ``x`` of
        ``<a, x> - <x, log x> - (1-s) log(1-s)`` over the top-k simplex, ``s = <1, x>``
        (:mod:`topkbench.losses.topk_entropy`).  On its partition, ``U`` the ``u`` capped
        coordinates (``x_j = s/k``) and ``M`` the others (``x_j = e^{a_j - t}``), the
        stationarity conditions are ``(1 - rho) t = -log(1-s) - A_U/k + rho log(s/k)`` and
        ``(1 - rho) s = sum_M e^{a_j - t}`` (``rho = u/k``, ``A_U = sum_U a_j``).
        Differentiating both, with ``b = s (1-s) / (s + rho (1-s))`` and ``e = (1-rho) b +
        s``, gives ``dt = (<x_M, da> - (1-rho) b/k <1_U, da>) / ((1-rho) e)`` and ``ds =
        <x_M, da> / (1-rho) - s dt``; with ``dx_j = x_j (da_j - dt)`` on M and ``ds/k`` on U,

            J = dx/da = diag(x_M) + g11 x_M x_M^T + g12 (x_M 1_U^T + 1_U x_M^T)
                        + g22 1_U 1_U^T,
            g11 = -1 / ((1-rho) e),  g12 = b / (k e),  g22 = s b / (k^2 e),

        symmetric as a Hessian must be (``x_M`` is x with zeros on U).  At ``u = 0`` this is
        the softmax's ``diag(x) - x x^T``; at ``u = k`` (only when ``m - 1 = k``) the
        closed form ``s(1-s)/k^2 1 1^T``.  In the scores, ``H = T^T J T`` with ``T s = (s_j -
        s_y)_{j != y}``: ``H = J - e_y r^T - r e_y^T + <1, r> e_y e_y^T``, ``r = J 1``.  A
        coordinate within 1e-9 (relative) of the cap counts as capped: at the kink both
        pieces' Jacobians are generalized ones."""
        _, _, G = self.state
        G = G[a:b]
        k = float(self.k)
        rows = np.arange(b - a)
        yptr, yidx = self.y
        y = yidx[yptr[a:b]]
        x = G.copy()
        x[rows, y] = 0.0
        s = x.sum(axis=1)
        capped = (x >= (s / k)[:, None] * (1.0 - 1e-9)) & (x > 0.0)
        rho = capped.sum(axis=1) / k
        x_m = np.where(capped, 0.0, x)
        q = 1.0 - s
        live = s > 0.0
        bb = np.where(live, s * q / np.where(live, s + rho * q, 1.0), 0.0)
        e = np.where(live, (1.0 - rho) * bb + s, 1.0)
        free = rho < 1.0
        g11 = np.where(free & live, -1.0 / np.where(free, (1.0 - rho) * e, 1.0), 0.0)
        g12 = np.where(live, bb / (k * e), 0.0)
        g22 = np.where(live, s * bb / (k * k * e), 0.0)
        J = np.empty((b - a, x.shape[1], x.shape[1]))
        topk_ent_hessian_rows(x_m, capped, np.ascontiguousarray(y, dtype=np.int64), g11, g12,
                              g22, J)  # fmt: skip
        return J

    def _difference_hessians(self, a: int, b: int):
        """Forward differences of the kernels' gradient along each score (Kato's weighted
        top-k hinge; the tests' reference for the written ones).  A smoothed hinge's gradient
        is piecewise linear (a projection), so off a kink the difference is its Jacobian
        exactly; top-k Ent's is smooth (error ~ step)."""
        S, gamma, G = self.state
        m = S.shape[1]
        cols = np.empty((m, b - a, m))  # cols[c] = d G / d s_c, for every row
        base = np.ascontiguousarray(S[a:b])
        step = self._fd_step(gamma)
        for c in range(m):
            hi = base.copy()
            hi[:, c] += step
            cols[c] = (self._kernel_gradient(hi, gamma, a, b) - G[a:b]) / step
        H = cols.transpose(1, 2, 0)
        return 0.5 * (H + H.transpose(0, 2, 1))

    def _fd_step(self, gamma: float) -> float:
        # the differenced gradients: Kato's weighted top-k hinge (piecewise linear, pieces
        # ~gamma) and, in hess_apply, any loss without a written Hessian
        return FD_STEP * (1.0 if self.loss_id == ids.LOSS_TOPK_ENT else gamma)

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
        h = self._fd_step(gamma) / scale
        return (self._kernel_gradient(np.ascontiguousarray(S + h * T), gamma) - G) / h


def _support_index(mask):
    """``(tptr, tidx, hptr)`` of the supports ``mask`` (rows x m, bool): row i's classes are
    ``tidx[tptr[i]:tptr[i+1]]``, its block starts at ``hptr[i]``."""
    counts = mask.sum(axis=1)
    tptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=tptr[1:])
    hptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts * counts, out=hptr[1:])
    return tptr, np.nonzero(mask)[1].astype(np.int64), hptr


def _dense_rows(X, a: int, b: int) -> np.ndarray:
    return X[a:b].toarray() if sp.issparse(X) else np.asarray(X[a:b], dtype=np.float64)


def _hessian(X, deriv: _Derivatives, C: float, m: int, weights=None) -> np.ndarray:
    """``I + C sum_i w_i H_i (x) x_i x_i^T`` (``w_i`` the sample weights, 1 without) in the
    class-major order ``vec(W)[c d + j] = W[j, c]``, formed by row blocks.

    Structured ``H_i`` (:class:`Curvature`): the diagonal gives the class blocks ``X^T
    diag(h_c) X`` over the rows where ``h_ic != 0``, and each rank-one term ``u_i u_i^T (x)
    x_i x_i^T = z_i z_i^T`` with ``z_i = u_i (x) x_i`` gives one symmetric product ``Z^T Z``
    over the rows where ``u_i != 0`` (for the hinges, the examples with a nonzero gradient).
    Dense ``H_i`` (top-k Ent, the weighted top-k hinge) give every class pair's block at once, from
    the rows' ``vech(x_i x_i^T)`` (:func:`_add_vech_blocks`), or, when most of their entries
    are 0, block by block over the class pairs' nonzero rows."""
    n, d = X.shape
    H = np.zeros((m * d, m * d))
    rows = max(1, HESSIAN_ENTRIES // (m * m + m * d))
    if deriv.sparse_support and deriv.pairwise_cheaper(d, m):
        for a in range(0, n, rows):
            b = min(a + rows, n)
            w = np.ones(b - a) if weights is None else np.ascontiguousarray(weights[a:b])
            assemble_support_hessian(_dense_rows(X, a, b), w, *deriv.support_blocks(a, b), H)
        H *= C
        H[np.diag_indices_from(H)] += 1.0
        return H
    for a in range(0, n, rows):
        b = min(a + rows, n)
        Xb = _dense_rows(X, a, b)
        curv = deriv.curvature(a, b)
        if weights is not None:
            curv = curv.scaled(weights[a:b])
        if curv.dense is None:
            for c in range(m):
                h = curv.diag[:, c]
                nz = np.flatnonzero(h)
                if nz.size:
                    Xn = Xb[nz]
                    H[c * d : (c + 1) * d, c * d : (c + 1) * d] += Xn.T @ (h[nz, None] * Xn)
            for sign, U in curv.terms:
                nz = np.flatnonzero(U.any(axis=1))
                if nz.size:
                    Z = (U[nz, :, None] * Xb[nz, None, :]).reshape(nz.size, m * d)
                    if sign > 0:
                        H += Z.T @ Z
                    else:
                        H -= Z.T @ Z
            continue
        pc, pc2 = np.triu_indices(m)
        per_pair = curv.dense[:, pc, pc2]
        nnz = np.count_nonzero(per_pair, axis=0)
        # one product over all pairs, d (d + 1) / 2 x m (m + 1) / 2 multiply-adds per row,
        # against a product per pair over its nonzero rows, several times dearer per flop
        if (d + 1) * pc.size < DENSE_PAIR_SLOWDOWN * 2 * d * float(nnz.sum()) / (b - a):
            _add_vech_blocks(H, Xb, per_pair, d, m)
            continue
        Hb = np.ascontiguousarray(np.moveaxis(curv.dense, 0, -1))  # the example axis last
        for c, c2 in zip(pc, pc2, strict=True):
            w = Hb[c, c2]
            nz = np.flatnonzero(w)
            if nz.size == 0:
                continue
            Xn = Xb if 2 * nz.size > w.size else Xb[nz]
            wn = w if 2 * nz.size > w.size else w[nz]
            block = Xn.T @ (wn[:, None] * Xn)
            H[c * d : (c + 1) * d, c2 * d : (c2 + 1) * d] += block
            if c2 != c:
                H[c2 * d : (c2 + 1) * d, c * d : (c + 1) * d] += block.T
    H *= C
    H[np.diag_indices_from(H)] += 1.0
    return H


def _add_vech_blocks(H, Xb, per_pair, d: int, m: int) -> None:
    """Add ``sum_i dense_i (x) x_i x_i^T`` to ``H`` (class-major), given the upper triangles
    ``per_pair`` (rows x m (m + 1) / 2, in :func:`numpy.triu_indices` order) of the
    per-example ``dense_i``, by one product: the rows' ``vech(x_i x_i^T)`` against them, which
    gives every class pair's block at once (a product per pair has ``d x d`` outputs, too small
    for the BLAS to run at speed when d is small)."""
    j, j2 = np.triu_indices(d)
    pc, pc2 = np.triu_indices(m)
    B = np.zeros((j.size, pc.size))
    step = max(1, HESSIAN_ENTRIES // (8 * j.size))  # rows of vech products per chunk (8 MB)
    for a in range(0, Xb.shape[0], step):
        Xa = Xb[a : a + step]
        B += (Xa[:, j] * Xa[:, j2]).T @ per_pair[a : a + step]
    blocks = np.empty((pc.size, d, d))
    blocks[:, j, j2] = B.T
    blocks[:, j2, j] = B.T
    H4 = H.reshape(m, d, m, d)  # H4[c, :, c2, :] is the block (c, c2)
    H4[pc, :, pc2, :] += blocks
    off = pc != pc2
    H4[pc2[off], :, pc[off], :] += blocks[off]


def _line_search(prob: SDCAProblem, deriv: _Derivatives, W, S, D, SD, C: float, gamma: float,
                 slope: float, G0):  # fmt: skip
    """The step along the Newton direction ``D`` (scores ``SD``) from ``W`` (scores ``S``,
    gradient of the loss ``G0`` there): 1 when Armijo's test holds there, else the exact
    minimizer along ``D`` (:func:`_exact_step`), else halving until Armijo's test holds;
    None when the step falls below rounding (the caller hands the run on).  Returns ``(t,
    G_t)``, ``G_t`` the gradient at ``S + t SD`` when the search evaluated it there (the
    next iteration's, up to the rounding of the scores), else None.

    For the losses of :data:`FENCHEL_YOUNG_LOSSES` one gradient evaluation at a step gives
    both the slope and the loss there, and once the gradient at the full step is known, the
    examples whose gradient is zero at both ends are left out of every further evaluation:
    their zero set is convex, so they add nothing to F or its slope anywhere between."""
    Cs = prob.example_c(C)
    # F(W + t D) - F(W) = t <W, D> + t^2/2 ||D||^2 + C (sum L_t - sum L_0): the quadratic
    # part exactly, so that the test is not lost in the rounding of F when C is large
    wd, dd = float(np.vdot(W, D)), float(np.vdot(D, D))
    fy = deriv.fenchel_young
    if fy:
        loss0 = deriv.loss_sum(S, G0, Cs, gamma)
    else:
        no_dual = np.zeros_like(S)
        loss0 = prob.values(S, no_dual, 0.0, C, gamma)[0] * (C * prob.n)
    view = [deriv, S, SD, Cs]  # the rows still evaluated ...
    loss0_rows = [loss0]  # ... and their loss sum at t = 0 (the others' losses are 0)
    live_rows = [None]  # ... as indices (None: all)
    # step -> (loss sum of the rows in view, phi'(t), those rows, their gradient)
    memo: dict[float, tuple[float, float, np.ndarray | None, np.ndarray]] = {}

    def evaluate(t: float) -> tuple[float, float, np.ndarray | None, np.ndarray]:
        if t not in memo:
            der, S_, SD_, Cs_ = view
            S_t = S_ + t * SD_
            G_t = der.gradient(S_t, gamma)
            loss_t = der.loss_sum(S_t, G_t, Cs_, gamma) if fy else math.nan
            slope_t = t * dd + wd + float(np.vdot(Cs_[:, None] * G_t, SD_))
            memo[t] = loss_t, slope_t, live_rows[0], G_t
            if fy and t == 1.0:
                live = (G0 != 0.0).any(axis=1) | (G_t != 0.0).any(axis=1)
                if not live.all():
                    rows = np.flatnonzero(live)
                    sub = deriv.restricted(rows)
                    view[:] = [sub, S[rows], SD[rows], Cs[rows]]
                    live_rows[0] = rows
                    loss0_rows[0] = sub.loss_sum(S[rows], G0[rows], Cs[rows], gamma)
        return memo[t]

    def gradient_at(t: float | None):
        """The whole gradient at step t if it was evaluated (the rows out of view: 0)."""
        if t not in memo:
            return None
        rows, G_t = memo[t][2:]
        if rows is None:
            return G_t
        full = np.zeros_like(S)
        full[rows] = G_t
        return full

    def decrease(t: float) -> float:
        if fy:
            loss_t = evaluate(t)[0]
            base = loss0 if t == 1.0 else loss0_rows[0]
        else:
            loss_t = prob.values(S + t * SD, no_dual, 0.0, C, gamma)[0] * (C * prob.n)
            base = loss0
        return t * wd + 0.5 * t * t * dd + (loss_t - base)

    def slope_at(t: float) -> float:
        return evaluate(t)[1]

    def search() -> float | None:
        if decrease(1.0) <= ARMIJO * slope:
            return 1.0
        t = _exact_step(slope_at, slope)
        if t is not None and decrease(t) < 0.0:
            return t
        t_min = MIN_RELATIVE_STEP * max(float(np.abs(W).max()), 1.0) / float(np.abs(D).max() or 1.0)
        t = 0.5
        while t >= t_min:
            if decrease(t) <= ARMIJO * t * slope:
                return t
            t *= 0.5
        return None

    try:
        t = search()
    finally:
        if view[0] is not deriv:
            deriv.failures += view[0].failures
    return t, gradient_at(t)


def _cg_direction(prob: SDCAProblem, deriv: _Derivatives, C: float, grad):
    """The Newton direction ``D`` (d x m) solving ``H D = -grad`` approximately, by conjugate
    gradients with Hessian-vector products (Newton-CG; liblinear's TRON without the trust
    region, the line search globalizing instead).

    ``H V = V + X^T R`` with ``R_i = C w_i H_i (X V)_i``: two products with X, ``O(nnz m)``,
    and the per-example Hessians applied in their structured form (:class:`Curvature`), or,
    for the finite-difference losses, one gradient evaluation along ``X V``
    (:meth:`_Derivatives.hess_apply`).  The preconditioner is H's diagonal, ``1 + C sum_i w_i
    (H_i)_cc x_ij^2`` where the Hessians are analytic: it undoes the columns' scales, which is
    what makes raw features ill-conditioned.  CG stops at a residual of
    :data:`CG_FORCING` times the gradient's norm (a forcing term: the outer iteration still
    converges linearly fast, and far from the optimum no effort is wasted), or after
    :data:`CG_MAX_ITERATIONS` products; every iterate is a descent direction."""
    X = prob.X
    rc = prob.row_c(C)
    curv = deriv.curvature(0, prob.n) if deriv.loss_id in ANALYTIC_LOSSES else None
    if curv is not None:
        sq = X.multiply(X) if sp.issparse(X) else np.asarray(X, dtype=np.float64) ** 2
        precond = 1.0 + np.asarray(sq.T @ (rc * curv.diagonal()))
    else:
        precond = np.ones_like(grad)

    def hess_vec(V):
        return V + features_t_dot(X, rc * deriv.hess_apply(prob.scores(V), curv))

    D = np.zeros_like(grad)
    r = -grad
    z = r / precond
    p = z.copy()
    rz = float(np.vdot(r, z))
    stop = CG_FORCING * float(np.linalg.norm(grad))
    for _ in range(CG_MAX_ITERATIONS):
        Hp = hess_vec(p)
        pHp = float(np.vdot(p, Hp))
        if not pHp > 0.0:
            break
        alpha = rz / pHp
        D += alpha * p
        r -= alpha * Hp
        if float(np.linalg.norm(r)) <= stop:
            break
        z = r / precond
        rz_next = float(np.vdot(r, z))
        p = z + (rz_next / rz) * p
        rz = rz_next
    return D


def _exact_step(slope_at, slope0: float) -> float | None:
    """The step ``t`` in (0, 1] where the convex ``phi(t) = F(W + t D)`` is least, by the
    Illinois variant of regula falsi on ``phi'``, with ``phi'(0) = slope0 < 0``.

    For the smoothed hinges phi is piecewise quadratic with breakpoints a fraction gamma
    apart, and a semismooth Newton direction overshoots many of them: halving the step until
    Armijo's test holds then takes steps of 1/16 or less, iteration after iteration, where
    the minimizer along the direction is often several times further (the exact line search
    of Keerthi & DeCoste's finite Newton method, JMLR 2005).  ``phi'`` is piecewise linear
    there, so the secant steps are exact once both ends lie on one piece; for the smooth
    losses it is smooth and the iteration converges superlinearly.  None if ``phi'(1) <= 0``
    cannot be told apart from rounding (then the caller backtracks)."""
    lo, f_lo, hi = 0.0, slope0, 1.0
    f_hi = slope_at(1.0)
    if not f_hi > 0.0:
        return 1.0 if f_hi <= 0.0 else None
    side = 0
    for _ in range(LINE_SEARCH_ITERATIONS):
        t = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        if not lo < t < hi:
            t = 0.5 * (lo + hi)
        f = slope_at(t)
        if abs(f) <= LINE_SEARCH_TOL * abs(slope0):
            return t
        if f < 0.0:
            lo, f_lo = t, f
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            hi, f_hi = t, f
            if side == 1:
                f_lo *= 0.5
            side = 1
    return lo if lo > 0.0 else None


class _GramRows:
    """Gram blocks ``X_a X_a^T`` of the rows ``a`` with curvature, for the Woodbury steps:
    formed per call until their cost reaches that of the whole ``X X^T`` (rent or buy), which
    is then kept for the rest of the phase."""

    def __init__(self, X):
        self.X = X
        self.spent = 0.0
        self.full = None

    @staticmethod
    def _gram(X) -> np.ndarray:
        if X.dtype != np.float64:
            X = X.astype(np.float64)
        K = X @ X.T
        return K.toarray() if sp.issparse(K) else np.asarray(K)

    def block(self, rows, X_rows, pos, owner):
        """A Gram matrix and indices into it for the system's rows: ``X_rows X_rows^T`` (for
        ``X_rows = X[rows]``) with ``pos``, or the whole ``X X^T`` with ``owner`` (the
        example of each row, ``rows[pos]``)."""
        n = self.X.shape[0]
        if self.full is None:
            self.spent += float(rows.size) ** 2
            if self.spent < float(n) ** 2:
                return self._gram(X_rows), pos
            self.full = self._gram(self.X)
        return self.full, owner


def _woodbury_direction(prob: SDCAProblem, deriv: _Derivatives, C: float, grad,
                        gram: _GramRows, max_rank: int = WOODBURY_MAX_RANK):  # fmt: skip
    """``-hess F^{-1} grad`` (``grad`` d x m) through the examples' curvature instead of the
    ``d m x d m`` Hessian, for the hinges, whose ``H_i`` live on their gradient's support.

    Each support block (:meth:`_Derivatives.support_blocks`, symmetrized, times ``w_i``) is
    ``sum_p lambda_ip v_ip v_ip^T`` with ``lambda_ip > 0`` (negative rounding or
    finite-difference eigenvalues are dropped, which keeps the direction one of descent);
    with ``z_ip = sqrt(lambda_ip) v_ip (x) x_i`` (class-major), ``hess F = I + C Z Z^T`` and
    (Woodbury) ``hess F^{-1} g = g - C Z (I + C Z^T Z)^{-1} Z^T g``, where ``(Z^T Z)_{ip,jq} =
    <x_i, x_j> <u_ip, u_jq>`` (``u = sqrt(lambda) v`` in the classes) needs the Gram matrix of
    the examples with curvature only.  The system has one row per (example, eigenvalue), often
    far fewer than ``d m``.  None when it would have more than ``max_rank`` rows
    (:data:`WOODBURY_MAX_RANK` at most) or fails to factor."""
    n, m = prob.n, prob.m
    tptr, tidx, hptr, hvals = deriv.support_blocks(0, n)
    sizes = np.diff(tptr)
    limit = min(max_rank, WOODBURY_MAX_RANK)
    if int((sizes - 1).clip(0).sum()) > WOODBURY_PRECHECK * limit:
        # a block's rank is about its size less one (less where the radius or caps bind):
        # far past the limit, spare the eigendecompositions
        return None
    w = np.ones(n) if prob.weights is None else prob.weights  # positive (SDCAProblem)
    blocks = []  # (rows, U on their supports, classes) per support size
    top = 0.0
    for t in np.unique(sizes[sizes > 0]):
        rows = np.flatnonzero(sizes == t)
        idx = hptr[rows][:, None] + np.arange(t * t)
        B = hvals[idx].reshape(rows.size, t, t)
        lam, V = np.linalg.eigh(0.5 * (B + np.swapaxes(B, 1, 2)))
        lam *= w[rows, None]
        top = max(top, float(lam.max()))
        cls = tidx[tptr[rows][:, None] + np.arange(t)]
        blocks.append((rows, lam, V, cls))
    keep_min = WOODBURY_EIG_TOL * top
    owners, parts = [], []
    for rows, lam, V, cls in blocks:
        i, p = np.nonzero(lam > keep_min)
        if i.size == 0:
            continue
        U = np.zeros((i.size, m))
        U[np.arange(i.size)[:, None], cls[i]] = V[i, :, p] * np.sqrt(lam[i, p])[:, None]
        owners.append(rows[i])
        parts.append(U)
    if not owners:
        return -grad
    owner = np.concatenate(owners)
    R = np.concatenate(parts)
    if owner.size > limit:
        return None
    active, pos = np.unique(owner, return_inverse=True)
    Xa = prob.X[active]
    K, idx = gram.block(active, Xa, pos, owner)
    M = np.empty((owner.size, owner.size))
    woodbury_system(K, idx, R, C, M)
    b = np.einsum("pc,pc->p", R, np.asarray(Xa @ grad)[pos])
    z = _newton_step(M, b)  # -M^{-1} b
    if z is None:
        return None
    V = np.zeros((active.size, m))
    np.add.at(V, pos, z[:, None] * R)
    return -grad - C * np.asarray(features_t_dot(Xa, V))


def _newton_step(H, grad):
    """``-H^{-1} grad`` by Cholesky, factoring the symmetric ``H`` in place (LAPACK on its
    column-major view: no copy).  H = I + C sum H_i (x) x_i x_i^T is positive definite in
    exact arithmetic, but rounded H_i leave eigenvalues a few ulps of ``max H`` below zero,
    and difference H_i straddling a kink (all scores tied, as at W = 0) can be indefinite;
    the diagonal is then shifted by ``max diag(H)`` times 1e-12, 1e-10, ..., 10 until the
    factorization succeeds (a Levenberg step: still a descent direction), each attempt from
    H's original entries.  None if even that fails (non-finite H)."""
    if not np.isfinite(H).all():
        return None
    diag = np.diag(H).copy()
    scale = float(diag.max())
    F = H.T  # LAPACK's column-major view (H is symmetric): factored in place, no copy
    for shift in (0.0, *(scale * 10.0**e for e in range(-12, 2, 2))):
        if shift:
            # a failed factorization overwrote F's lower triangle, i.e. H's upper one
            upper = np.triu_indices(H.shape[0], 1)
            H[upper] = F[upper]
            H[np.diag_indices_from(H)] = diag + shift
        factor, info = dpotrf(F, lower=1, clean=0, overwrite_a=1)
        if info == 0:
            step, info = dpotrs(factor, -grad, lower=1)
            if info == 0:
                return step
    return None


def _smoothing_centre(prob: SDCAProblem, V) -> np.ndarray:
    """A dual block ``V`` (loss units, n x m) as a continuation stage's centre: its
    coordinates that the smoothing regularizes (``P V``), the label's zeroed for the
    multiclass hinges of TPAMI Prop. 2, whose smoothing acts on the other classes only; all
    of them for SVM^ML and SVM^OVA (Props. 6 and 10) and for Kato's weighted top-k hinge
    (its smoothing ``gamma/2 (||x||^2 + <1, x>^2)`` on the off-label block is ``gamma/2
    ||v||^2`` over all m coordinates, the label's being ``-<1, x>``)."""
    V = np.array(V, dtype=np.float64)
    if prob.loss_id not in SMOOTHED_ON_ALL_CLASSES:
        V[np.arange(prob.n), prob.y[1]] = 0.0
    return V


def solve_newton(
    prob: SDCAProblem,
    run: Run,
    A,
    C: float,
    gamma: float,
    W_start=None,
    gamma_start: float | None = None,
):
    """Continue ``run`` from the dual ``A`` by Newton's method on the primal, started at
    ``W = X^T A``, until the relative gap (of the loss smoothed by ``gamma``) is at most
    ``run.eps`` or a budget is spent.  Each Newton iteration counts as one epoch of ``run``
    (a pass over the data, plus the Hessian).

    Returns ``(status, A, W, primal, dual, gap, info)`` as
    :func:`topkbench.solvers.accelerated.solve_accelerated` does; status ``"running"`` hands
    the run on from the last gradient dual (line search or Cholesky failure, a stalled gap,
    or a continuation that would pass :data:`MAX_CURVATURE`).
    """
    n, m = prob.n, prob.m
    lam = 1.0 / (C * n)
    A_given = A
    deriv = _Derivatives(prob)
    gram = _GramRows(prob.X)
    route = _route_of(prob)
    woodbury_tries = woodbury_applies(prob.kind, prob.n, prob.loss_id)
    refused_at = None  # the continuation stage in which a Woodbury attempt was refused
    stage_gamma = first_stage_gamma(prob.loss_id, gamma)
    if gamma_start is not None and gamma <= gamma_start < stage_gamma:
        # a warm start's last smoothing, but not below the proximal floor: the smaller ones
        # were the previous C's answer to proximal steps that stopped paying there, and the
        # centre starts afresh here
        stage_gamma = max(gamma_start, min(stage_gamma, PROX_MIN_GAMMA))
    info = {"newton_from_epoch": run.epochs, "newton_iterations": 0, "gamma_stages": [stage_gamma]}
    no_dual = np.zeros((n, m))
    W = prob.rep_of(A)
    S = prob.scores(W)
    if W_start is not None:
        # a primal point near the optimum (the previous C of a path): start from it when its
        # objective is lower than that of the point the dual defines
        S_start = prob.scores(W_start)
        if (prob.values(S_start, no_dual, float(np.vdot(W_start, W_start)), C, stage_gamma)[0]
                < prob.values(S, no_dual, float(np.vdot(W, W)), C, stage_gamma)[0]):  # fmt: skip
            W, S = np.array(W_start, dtype=np.float64), S_start
    best_gap, since_best, full_step = math.inf, 0, False
    # a continuation smooths the loss about a centre in the dual: first the starting dual's
    centre, stage_end_gap = None, math.inf
    if stage_gamma != gamma:
        Cs = prob.example_c(C)[:, None]
        centre = _smoothing_centre(prob, np.divide(-np.asarray(A), Cs, out=np.zeros((n, m)),
                                                   where=Cs > 0.0))  # fmt: skip

    def stage_scores(S):
        """The scores at which the stage's loss takes the smoothed loss's values."""
        return S if centre is None else S + stage_gamma * centre

    G_next = None  # the line search's gradient at the new point, where it has one
    while True:
        if G_next is None:
            G = deriv.gradient(stage_scores(S), stage_gamma)
        else:
            G = G_next
        A = np.ascontiguousarray(-prob.row_c(C) * G)
        W_A = features_t_dot(prob.X, A)
        # the certificate of (W, A): P from W's scores, D from A with ||X^T A||^2
        sq_w, sq_a = float(np.vdot(W, W)), float(np.vdot(W_A, W_A))
        primal, dual = prob.values(S, A, sq_w, C, gamma)
        dual += 0.5 * lam * (sq_w - sq_a)
        gap = run.record(primal, dual, A, W)
        status = run.stop_status(gap)
        if status is not None:
            return status, A, W, primal, dual, gap, info
        t_iter = time.perf_counter()
        progress = gap  # the gap this stage's Newton steps reduce: its own
        if centre is not None:
            # the stage's own gap is lambda/2 ||grad F||^2 (module docstring)
            progress = relative_gap(primal, primal - 0.5 * lam * float(np.vdot(W - W_A, W - W_A)))
            smaller = next_stage_gamma(stage_gamma, gap, progress, run.eps)
            if smaller is not None:
                if gap < PROX_MIN_DECREASE * stage_end_gap:  # the proximal steps are paying
                    smaller = max(smaller, min(stage_gamma, PROX_MIN_GAMMA))
                stage_end_gap = gap
                if C * prob.r2 / smaller > MAX_CURVATURE:
                    return "running", A, W, primal, dual, gap, info
                best_gap, since_best, progress = math.inf, 0, None  # a new stage starts
                centre = _smoothing_centre(prob, G)
                stage_gamma = smaller
                info["gamma_stages"].append(stage_gamma)
                G = deriv.gradient(stage_scores(S), stage_gamma)
                W_A = features_t_dot(prob.X, -prob.row_c(C) * G)
        if progress is not None and progress < STALL_FACTOR * best_gap:
            best_gap, since_best = progress, 0
        elif progress is not None and full_step:
            since_best += 1
            if since_best >= STALL_ITERATIONS:
                return "running", A, W, primal, dual, gap, info
        D = None
        stage = len(info["gamma_stages"])
        if route == "dense" and woodbury_tries and refused_at != stage:
            # within the dense limit a hinge's Woodbury system may still be the smaller one;
            # once refused, not again within the stage (the refused attempt's root-finding
            # failures are the dense Hessian's again: counted once)
            failures = deriv.failures
            smaller = int(WOODBURY_DENSE_SHARE * prob.X.shape[1] * m)
            D = _woodbury_direction(prob, deriv, C, W - W_A, gram, max_rank=smaller)
            if D is None:
                refused_at, deriv.failures = stage, failures
        if route == "dense" and D is None:
            grad = (W - W_A).T.reshape(-1)
            step = _newton_step(_hessian(prob.X, deriv, C, m, prob.weights), grad)
            if step is None:
                return "running", A, W, primal, dual, gap, info
            D = np.ascontiguousarray(step.reshape(m, -1).T)
        elif route == "woodbury":
            D = _woodbury_direction(prob, deriv, C, W - W_A, gram)
            if D is None:
                if info["newton_iterations"] == 0:  # no step taken: hand on the dual given
                    info["newton_refused"] = True
                    return "running", A_given, W, primal, dual, gap, info
                return "running", A, W, primal, dual, gap, info
        elif route != "dense":
            D = _cg_direction(prob, deriv, C, W - W_A)
        SD = prob.scores(D)
        S_stage = stage_scores(S)
        t, G_next = _line_search(prob, deriv, W, S_stage, D, SD, C, stage_gamma,
                                 float(np.vdot(W - W_A, D)), G)  # fmt: skip
        if t is None:
            return "running", A, W, primal, dual, gap, info
        if G_next is not None and deriv.kernel_gradient:
            # what curvature() reads: the scores and smoothing of the gradient it differences
            deriv.state = (S_stage + t * SD, stage_gamma, G_next)
        else:
            G_next = None
        full_step = t == 1.0
        W = W + t * D
        S = prob.scores(W)  # the certificate needs P of W itself, not of the summed scores
        info["newton_iterations"] += 1
        run.failures += deriv.failures
        deriv.failures = 0
        run.epochs += 1
        run.epoch_seconds = time.perf_counter() - t_iter
