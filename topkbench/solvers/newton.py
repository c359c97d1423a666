"""Newton's method in the primal for every SDCA loss, certified by the dual its gradient
defines (DESIGN §5): the driver.  Its parts live beside it: the route and its cost model in
:mod:`topkbench.solvers.plan`, the Hessian and the step directions (dense Cholesky,
Newton-CG, Woodbury, per class) in :mod:`topkbench.solvers.newton_steps`, the line search in
:mod:`topkbench.solvers.line_search`, and each loss's gradient and Hessians in its family's
module (:mod:`topkbench.losses.curvature`).

**Why.** Any coordinate or first-order method needs about ``sqrt(C R^2 / mu)`` epochs per
factor e of the gap (accelerated SDCA, :mod:`topkbench.solvers.accelerated`), which is
thousands at the top of the papers' C grids on raw features.  Newton's method is affine
invariant: rescaling the feature columns does not change its iterates, and once near the
optimum it converges quadratically (semismoothly for the smoothed hinges) whatever C; far from
it, at large C, the line search may take many damped steps.

**The problem in the kernels' scale** (``P / lambda``, ``C = 1/(lambda n)``)::

    F(W) = 1/2 ||W||^2 + C sum_i L(y_i, W^T x_i),    grad F = W + C X^T G,

``G_i = grad L(y_i, s_i)`` at the scores ``s_i = W^T x_i``.  With sample weights every ``C``
becomes the example's ``C w_i`` (the loss term is ``C sum_i w_i L``;
:meth:`SDCAProblem.row_c`), the certificate's argument unchanged.

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

**Nonsmooth hinges (gamma = 0): a continuation about proximal centres.**  Stage j smooths
the conjugate about a centre ``V`` in the dual (loss units)::

    L_{gamma,v}(s) = max_u <u, s> - L*(u) - gamma/2 ||P (u - v)||^2
                   = L_gamma(s + gamma P v) - gamma/2 ||P v||^2,

P the coordinates the loss's own smoothing regularizes (the off-label ones for the
multiclass hinges, TPAMI Prop. 2; all for SVM^ML and SVM^OVA, Props. 6 and 10, and for
Kato's weighted top-k hinge: :meth:`~topkbench.losses.curvature.LossDerivatives.
smoothing_centre`): the stage's gradient, Hessian and loss are those of ``L_gamma`` at the
shifted scores.  The first centre is the starting dual; gamma starts at 1 (or a warm
start's last) and decreases as in the accelerated solver
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

**Hand-overs.** When the line search fails (F no longer decreases: the rounding floor), a
step cannot be factored, the gap stalls or a continuation would pass :data:`MAX_CURVATURE`,
the solver hands the run back with its dual, which the next phase continues from
(:mod:`topkbench.solvers.plan`).
"""

from __future__ import annotations

import math
import time

import numpy as np

from topkbench.losses.dispatch import loss_derivatives
from topkbench.solvers import newton_steps as steps
from topkbench.solvers import plan
from topkbench.solvers.accelerated import first_stage_gamma, next_stage_gamma
from topkbench.solvers.line_search import line_search
from topkbench.solvers.problem import Run, SDCAProblem, features_t_dot, relative_gap

# a continuation's smoothing decreases down to this and then stays, each further stage moving
# its centre instead (the proximal point method on the dual): smaller would make each stage's
# piecewise-quadratic problem take more damped Newton steps than it saves stages ...
PROX_MIN_GAMMA = 0.1
# ... as long as each stage ends with the gamma = 0 gap below this fraction of the last
# stage's; where the proximal steps make less progress than that, gamma decreases further
PROX_MIN_DECREASE = 0.5
# the largest curvature C R^2 / gamma of a continuation stage: beyond it the Hessian's
# condition number leaves float64 (and the stage's share of the gap is below any useful eps)
MAX_CURVATURE = 1e12
# a run whose full Newton steps leave its gap (a continuation stage's own) above STALL_FACTOR
# times its best for STALL_ITERATIONS iterations is handed on: iterates on the kinks of a
# piecewise-quadratic loss, where a difference Hessian mixes two pieces, or at the rounding
# floor (damped steps, far from the optimum, are progress on F and do not count)
STALL_ITERATIONS = 50
STALL_FACTOR = 0.9


def derivatives_of(prob: SDCAProblem):
    """The derivatives of ``prob``'s loss (:func:`topkbench.losses.dispatch.loss_derivatives`)."""
    return loss_derivatives(prob.loss_id, prob.y, prob.m, prob.k, prob.rho)


class _NewtonPhase:
    """The state of one Newton phase: the primal point ``W`` and its scores ``S``, the
    continuation's smoothing and centre, and the stall counter."""

    def __init__(self, prob: SDCAProblem, run: Run, A, C: float, gamma: float, W_start,
                 gamma_start: float | None):  # fmt: skip
        n, m = prob.n, prob.m
        self.prob, self.run, self.C, self.gamma = prob, run, C, gamma
        self.lam = 1.0 / (C * n)
        self.deriv = derivatives_of(prob)
        self.gram = steps.GramRows(prob.X)
        self.route = plan.route_of(prob)
        self.woodbury_tries = plan.woodbury_applies(prob.kind, prob.n, prob.loss_id)
        self.refused_at = None  # the continuation stage in which a Woodbury attempt was refused
        self.refused = False  # the phase was refused before its first step
        stage_gamma = first_stage_gamma(prob.loss_id, gamma)
        if gamma_start is not None and gamma <= gamma_start < stage_gamma:
            # a warm start's last smoothing, but not below the proximal floor: the smaller ones
            # were the previous C's answer to proximal steps that stopped paying there, and the
            # centre starts afresh here
            stage_gamma = max(gamma_start, min(stage_gamma, PROX_MIN_GAMMA))
        self.stage_gamma = stage_gamma
        self.info = {"newton_from_epoch": run.epochs, "newton_iterations": 0,
                     "gamma_stages": [stage_gamma]}  # fmt: skip
        no_dual = np.zeros((n, m))
        W = prob.rep_of(A)
        S = prob.scores(W)
        if W_start is not None:
            # a primal point near the optimum (the previous C of a path): start from it when
            # its objective is lower than that of the point the dual defines
            S_start = prob.scores(W_start)
            sq_start, sq = float(np.vdot(W_start, W_start)), float(np.vdot(W, W))
            if (prob.values(S_start, no_dual, sq_start, C, stage_gamma)[0]
                    < prob.values(S, no_dual, sq, C, stage_gamma)[0]):  # fmt: skip
                W, S = np.array(W_start, dtype=np.float64), S_start
        self.W, self.S = W, S
        self.best_gap, self.since_best, self.full_step = math.inf, 0, False
        # a continuation smooths the loss about a centre in the dual: first the starting dual's
        self.centre, self.stage_end_gap = None, math.inf
        if stage_gamma != gamma:
            Cs = prob.example_c(C)[:, None]
            self.centre = self.deriv.smoothing_centre(
                np.divide(-np.asarray(A), Cs, out=np.zeros((n, m)), where=Cs > 0.0)
            )

    def stage_scores(self, S):
        """The scores at which the stage's loss takes the smoothed loss's values."""
        return S if self.centre is None else S + self.stage_gamma * self.centre

    def gradient(self):
        return self.deriv.gradient(self.stage_scores(self.S), self.stage_gamma)

    def certify(self, G):
        """The certificate of ``(W, A)``, ``A = -C G``: P from W's scores, D from A with
        ``||X^T A||^2``; records it in the run and returns ``(A, W_A, primal, dual, gap)``."""
        prob = self.prob
        A = np.ascontiguousarray(-prob.row_c(self.C) * G)
        W_A = features_t_dot(prob.X, A)
        sq_w, sq_a = float(np.vdot(self.W, self.W)), float(np.vdot(W_A, W_A))
        primal, dual = prob.values(self.S, A, sq_w, self.C, self.gamma)
        dual += 0.5 * self.lam * (sq_w - sq_a)
        return A, W_A, primal, dual, self.run.record(primal, dual, A, self.W)

    def continuation(self, G, W_A, primal: float, gap: float):
        """A continuation's stage rule at a certificate: ``(progress, G, W_A)``, the stage's
        own gap (None when a new stage starts here, with its gradient and ``W_A``), or
        ``(None, None, None)`` when the next stage would pass :data:`MAX_CURVATURE`."""
        W, lam = self.W, self.lam
        # the stage's own gap is lambda/2 ||grad F||^2 (module docstring)
        progress = relative_gap(primal, primal - 0.5 * lam * float(np.vdot(W - W_A, W - W_A)))
        smaller = next_stage_gamma(self.stage_gamma, gap, progress, self.run.eps)
        if smaller is None:
            return progress, G, W_A
        if gap < PROX_MIN_DECREASE * self.stage_end_gap:  # the proximal steps are paying
            smaller = max(smaller, min(self.stage_gamma, PROX_MIN_GAMMA))
        self.stage_end_gap = gap
        if self.C * self.prob.r2 / smaller > MAX_CURVATURE:
            return None, None, None
        self.best_gap, self.since_best = math.inf, 0  # a new stage starts
        self.centre = self.deriv.smoothing_centre(G)
        self.stage_gamma = smaller
        self.info["gamma_stages"].append(smaller)
        G = self.gradient()
        return None, G, features_t_dot(self.prob.X, -self.prob.row_c(self.C) * G)

    def stalled(self, progress: float | None) -> bool:
        """Whether the full steps have left the gap above :data:`STALL_FACTOR` times its best
        for :data:`STALL_ITERATIONS` iterations."""
        if progress is not None and progress < STALL_FACTOR * self.best_gap:
            self.best_gap, self.since_best = progress, 0
        elif progress is not None and self.full_step:
            self.since_best += 1
            return self.since_best >= STALL_ITERATIONS
        return False

    def direction(self, grad):
        """The Newton direction for the gradient ``grad`` of F on the phase's route
        (:func:`topkbench.solvers.plan.newton_route`), or None (a step that cannot be
        factored, or a Woodbury system past its limit; :attr:`refused` when that happens
        before the first step)."""
        prob, deriv, C, m = self.prob, self.deriv, self.C, self.prob.m
        D = None
        stage = len(self.info["gamma_stages"])
        if self.route == "dense" and self.woodbury_tries and self.refused_at != stage:
            # within the dense limit a hinge's Woodbury system may still be the smaller one;
            # once refused, not again within the stage (the refused attempt's root-finding
            # failures are the dense Hessian's again: counted once)
            failures = deriv.failures
            smaller = int(plan.WOODBURY_DENSE_SHARE * prob.X.shape[1] * m)
            D = steps.woodbury_direction(prob, deriv, C, grad, self.gram, max_rank=smaller)
            if D is None:
                self.refused_at, deriv.failures = stage, failures
        if self.route == "dense" and D is None:
            flat = grad.T.reshape(-1)
            step = steps.newton_step(steps.hessian(prob.X, deriv, C, m, prob.weights), flat)
            return None if step is None else np.ascontiguousarray(step.reshape(m, -1).T)
        if self.route in ("woodbury", "separable"):
            solve = {"woodbury": steps.woodbury_direction, "separable": steps.separable_direction}
            D = solve[self.route](prob, deriv, C, grad, self.gram)
            self.refused = D is None and self.info["newton_iterations"] == 0
            return D
        if self.route != "dense":
            D = steps.cg_direction(prob, deriv, C, grad)
        return D

    def step(self, D, grad, G, t_iter: float):
        """Move along ``D`` by the line search; returns ``(moved, G_next)``, the gradient at
        the new point where the search left one the family can adopt (else None)."""
        prob, deriv = self.prob, self.deriv
        SD = prob.scores(D)
        S_stage = self.stage_scores(self.S)
        t, G_next = line_search(prob, deriv, self.W, S_stage, D, SD, self.C, self.stage_gamma,
                                float(np.vdot(grad, D)), G)  # fmt: skip
        if t is None:
            return False, None
        # what curvature() reads: the scores and smoothing of the gradient it differences
        if G_next is not None and not deriv.adopt_gradient(S_stage + t * SD, self.stage_gamma,
                                                           G_next):  # fmt: skip
            G_next = None
        # a class-separable loss steps per class; those without descent stay (t_c = 0)
        moved = np.atleast_1d(t) > 0.0
        self.full_step = bool(np.all(np.atleast_1d(t)[moved] == 1.0))
        self.W = self.W + t * D
        self.S = prob.scores(self.W)  # the certificate needs P of W itself, not summed scores
        self.info["newton_iterations"] += 1
        run = self.run
        run.failures += deriv.failures
        deriv.failures = 0
        run.epochs += 1
        run.epoch_seconds = time.perf_counter() - t_iter
        return True, G_next


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
    ``W = X^T A`` (or at ``W_start`` where its objective is lower), until the relative gap (of
    the loss smoothed by ``gamma``) is at most ``run.eps`` or a budget is spent.  Each Newton
    iteration counts as one epoch of ``run`` (a pass over the data, plus the Hessian).

    Returns ``(status, A, W, primal, dual, gap, info)`` as
    :func:`topkbench.solvers.accelerated.solve_accelerated` does; status ``"running"`` hands
    the run on from the last gradient dual (line search or Cholesky failure, a stalled gap,
    or a continuation that would pass :data:`MAX_CURVATURE`), or from the dual given when
    the first step was refused (``info["newton_refused"]``).
    """
    phase = _NewtonPhase(prob, run, A, C, gamma, W_start, gamma_start)
    A_given, info = A, phase.info
    G_next = None
    while True:
        G = phase.gradient() if G_next is None else G_next
        A, W_A, primal, dual, gap = phase.certify(G)
        status = run.stop_status(gap)
        if status is not None:
            return status, A, phase.W, primal, dual, gap, info
        t_iter = time.perf_counter()
        progress = gap  # the gap this stage's Newton steps reduce: its own
        if phase.centre is not None:
            progress, G, W_A = phase.continuation(G, W_A, primal, gap)
            if G is None:
                return "running", A, phase.W, primal, dual, gap, info
        if phase.stalled(progress):
            return "running", A, phase.W, primal, dual, gap, info
        grad = phase.W - W_A
        D = phase.direction(grad)
        if D is None:
            if phase.refused:  # no step taken: hand on the dual given
                info["newton_refused"] = True
                return "running", A_given, phase.W, primal, dual, gap, info
            return "running", A, phase.W, primal, dual, gap, info
        moved, G_next = phase.step(D, grad, G, t_iter)
        if not moved:
            return "running", A, phase.W, primal, dual, gap, info


__all__ = ["PROX_MIN_GAMMA", "derivatives_of", "solve_newton"]
