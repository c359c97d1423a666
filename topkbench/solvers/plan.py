"""The solver phases of an SDCA fit and the rules that hand a run from one to the next: the
one place where they are decided (DESIGN §5, "Cost model").

A run starts in plain SDCA.  At a certificate it may hand over to a second-order phase
(Newton with the formed Hessian when ``d m`` is small; above that, Newton-CG for the logistic
losses and Woodbury steps for the hinges) or to accelerated SDCA (Catalyst); a Newton phase
that stalls hands its dual to accelerated SDCA, and an accelerated phase that reaches its
ratio limit hands it back to plain SDCA.  Every phase certifies the same problem with the
same duality gap, so a hand-over never changes what is certified, only how fast.

:func:`hand_over` is the rule, :func:`second_order` which second-order phase applies, and
:func:`plan` the phases a run of a given shape may go through, with their rules, as the
benchmarks print them.  The rules are deterministic: they read the problem's shape and
conditioning and the run's certificates, never the clock.

**The second-order routes** (:func:`newton_route`).  Newton's Hessian is ``d m x d m``,
formed in about ``n m^2 d^2`` flops, which for ``d m`` up to :data:`NEWTON_MAX_DIM` (Letter:
16 x 26, emotions: 72 x 6) costs some tens of epochs' worth of BLAS time, and a Cholesky
factorization.  Above that the logistic losses, whose curvature is bounded, take Newton-CG
steps, and the hinges, whose ``H_i`` vanish off the margin and have few directions on it,
solve a Woodbury system over their examples' curvature, which has far fewer than ``d m``
rows where ``d m`` is large (scene: 294 x 6).  A class-separable hinge (SVM^OVA) has a Hessian
that is block diagonal by class, so its steps solve one small system per class, on the
examples at that class's margin, whatever n, d and m (Caltech101 Silhouettes: 4,100 x 784,
m = 101), and each class takes its own step length.  The loss family says which applies
(:class:`~topkbench.losses.curvature.LossDerivatives`); the rules here never name a loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import scipy.sparse as sp

from topkbench.losses.dispatch import derivatives_family
from topkbench.solvers.accelerated import condition_number, loss_smoothness
from topkbench.solvers.active_set import ROUND_EPOCHS as ACTIVE_SET_ROUND_EPOCHS
from topkbench.solvers.active_set import ROUND_PRODUCTS as ACTIVE_SET_ROUND_PRODUCTS
from topkbench.solvers.problem import Run, SDCAProblem

# the Hessian is (d m)^2 doubles and costs about n m^2 d^2 flops per iteration
NEWTON_MAX_DIM = 1024
# above NEWTON_MAX_DIM the hinges' Newton steps solve the Woodbury system of their examples'
# curvature while it has at most this many rows (a factorization of about a tenth of a
# second), on problems of at most WOODBURY_MAX_ROWS examples: a continuation has about one
# row per example at the margin, so larger problems (corel5k's 4,050 x 374: some 40,000 rows)
# would only pay for the refusal
WOODBURY_MAX_RANK = 3000
WOODBURY_MAX_ROWS = 3000
# within the dense limit a hinge's step takes the Woodbury system while it has at most this
# share of d m rows (its factorization then costs about half the dense one's, which leaves the
# Gram block and the eigendecompositions their share)
WOODBURY_DENSE_SHARE = 0.8
# the cost model of a Newton phase (:func:`newton_cost_epochs`): the iterations a
# continuation for a nonsmooth hinge typically takes, those of a smooth loss (damped steps,
# then quadratic convergence), and how much faster per flop its dense products run than an
# epoch
NEWTON_ITERATIONS = 30
NEWTON_ITERATIONS_SMOOTH = 5
BLAS3_SPEEDUP = 4.0
# Newton-CG on CSR features: a Hessian-vector product costs about this many epochs (two sparse
# products with X and the curvature, as an epoch's passes; on dense features BLAS runs them
# BLAS3_SPEEDUP times faster), and CG takes about sqrt(C R^2 / mu) of them per Newton
# iteration: unlike the factored routes its cost grows with the conditioning
CG_PRODUCT_EPOCHS = 1.0

ACCELERATE_MODES = ("auto", "catalyst", "newton", "never")
# plain SDCA hands over to accelerated SDCA (accelerate="auto") after at least this many
# epochs, when the condition number C R^2 / mu is at least ACCEL_MIN_CONDITION and the last
# two certificates predict that plain SDCA needs ACCEL_PREDICTED_FACTOR times more epochs
# again than it has run
ACCEL_MIN_EPOCHS = 50
ACCEL_MIN_CONDITION = 1000.0
ACCEL_PREDICTED_FACTOR = 3.0
# plain SDCA runs at least this many epochs on a well-conditioned problem before its
# predicted remaining epochs are compared with Newton's cost ...
PREDICTED_MIN_EPOCHS = 20
# ... and only for eps at least this: where its proximal steps stop paying, a nonsmooth
# hinge's continuation goes down to smoothings of the order of eps, and below this its
# Hessians (curvature C R^2 / gamma) lose the digits the step needs, so the run would end in
# plain SDCA anyway, from a worse dual (a smooth loss converges linearly in plain SDCA, and
# the rule keeps one threshold for both)
PREDICTED_MIN_EPS = 1e-6
# a Newton phase refused before its first step (a Woodbury system past its limit: at a cold
# start every example is at the margin) leaves the run to plain SDCA, which offers the
# hand-over once more after this many epochs
NEWTON_RETRY_EPOCHS = 20


@dataclass(frozen=True)
class Phase:
    """One phase of a run: its solver and the rule that starts it."""

    name: str  # "plain", "newton", "newton-cg", "newton-woodbury", "accelerated"
    starts: str

    def __str__(self) -> str:
        return f"{self.name} ({self.starts})"


SECOND_ORDER = {
    "dense": "newton",
    "cg": "newton-cg",
    "woodbury": "newton-woodbury",
    "separable": "newton-separable",
}
# where no Newton route applies, SVM^ML_gamma's dual is finished on its faces
# (:mod:`topkbench.solvers.active_set`).  Its Hessian products touch only the face's entries,
# the dual's nonzeros: on a dual of density rho (nonzeros / (n m)) a product costs about
# ACTIVE_SET_PRODUCT_EPOCHS * rho epochs of plain SDCA (gathers, slower per entry than the
# epochs' passes: 0.15 epochs at rho = 0.05 on corel5k, 0.85 at rho = 0.17 on delicious), and
# a finish takes about ACTIVE_SET_ROUNDS rounds (corel5k's large-C fits: 4 to 11)
ACTIVE_SET = "active-set"
ACTIVE_SET_PRODUCT_EPOCHS = 3.0
ACTIVE_SET_ROUNDS = 5
# ... on faces of at most this density: past it the rounds grow with the face as well
# (delicious' nonsmooth SVM^ML at C = 2, 17 %: 10 and 11 rounds, three times as long as plain
# SDCA's whole 1,000-epoch budget), and the finish is not offered
ACTIVE_SET_MAX_DENSITY = 0.1


def newton_route(kind: str, n: int | None, d: int, m: int, loss_id: int) -> str | None:
    """How Newton's steps are solved on a problem of ``n`` examples (None: unknown) of this
    shape: ``"separable"`` (a class-separable hinge, SVM^OVA: one system per class, on the
    examples at its margin), ``"dense"`` (features with ``d m <= NEWTON_MAX_DIM``: the Hessian
    is formed and factored), ``"cg"`` (a loss of bounded curvature above that: Hessian-vector
    products), ``"woodbury"`` (a hinge above it, at most :data:`WOODBURY_MAX_ROWS` examples:
    the examples' curvature), or None (a Gram matrix, or none of these)."""
    if kind == "gram":
        return None
    family = derivatives_family(loss_id)
    if family.class_separable and family.support_curvature:
        return "separable"
    if d * m <= NEWTON_MAX_DIM:
        return "dense"
    if family.bounded_curvature:
        return "cg"
    return "woodbury" if woodbury_applies(kind, n, loss_id) else None


def woodbury_applies(kind: str, n: int | None, loss_id: int) -> bool:
    """Whether Woodbury steps may be tried (within the dense limit too): features, at most
    :data:`WOODBURY_MAX_ROWS` examples, and a loss whose H_i live on its gradient's support
    (the hinges: SVM^Multi, the top-k hinges, SVM^ML and SVM^OVA, whose H_i is diagonal)."""
    hinge = derivatives_family(loss_id).support_curvature
    return kind != "gram" and hinge and n is not None and n <= WOODBURY_MAX_ROWS


def route_of(prob: SDCAProblem) -> str | None:
    """:func:`newton_route` of a problem."""
    return newton_route(prob.kind, prob.n, prob.X.shape[1], prob.m, prob.loss_id)


def newton_cost_epochs(prob: SDCAProblem, smooth: bool = False, cond: float = 1.0,
                       density: float = 1.0) -> float:  # fmt: skip
    """What a Newton phase costs, in epochs of plain SDCA: :data:`NEWTON_ITERATIONS`
    iterations for a nonsmooth hinge's continuation (:data:`NEWTON_ITERATIONS_SMOOTH` for a
    smooth loss), each forming the Hessian (about ``n (d m)^2`` flops) and factoring it
    (``(d m)^3 / 3``), or on the Woodbury route the Gram matrix and the factorization of a
    system of ``r`` rows (``n nnz(X) + r^3 / 3``), ``r`` taken as ``n`` for a continuation
    (about one curvature direction per example at the margin) and ``2 n`` for a smooth hinge
    (most examples inside their quadratic pieces, several directions each; infinite when that
    passes :data:`WOODBURY_MAX_RANK`, which the route would refuse), or on the separable route
    m systems of ``r / m`` rows (or d, if fewer) and the products with X, against an
    epoch's ``4 nnz(X) m``; on the Newton-CG route :data:`NEWTON_ITERATIONS_SMOOTH` iterations
    of ``sqrt(cond)`` Hessian-vector products of :data:`CG_PRODUCT_EPOCHS` each (``cond`` the
    run's ``C R^2 / mu``); the active-set finish :data:`ACTIVE_SET_ROUNDS` rounds of its
    products and epochs (:data:`ACTIVE_SET_PRODUCT_EPOCHS`, ``density`` the dual's share of
    nonzeros; none past :data:`ACTIVE_SET_MAX_DENSITY`); the factor
    :data:`BLAS3_SPEEDUP` is how much faster per flop the dense products run than the epoch
    kernels on these small problems.  Deterministic: a function of the shapes only."""
    d = prob.X.shape[1]
    dm = float(d * prob.m)
    nnz = prob.X.nnz if sp.issparse(prob.X) else prob.n * d
    if nnz == 0:
        return math.inf  # no feature: plain SDCA's first epoch is the optimum (W = 0)
    if second_order_of(prob) == ACTIVE_SET:
        if density > ACTIVE_SET_MAX_DENSITY:
            return math.inf
        products = ACTIVE_SET_ROUND_PRODUCTS * ACTIVE_SET_PRODUCT_EPOCHS * density
        return ACTIVE_SET_ROUNDS * (products + ACTIVE_SET_ROUND_EPOCHS)
    route = route_of(prob)
    if route == "cg":
        product = CG_PRODUCT_EPOCHS / (1.0 if sp.issparse(prob.X) else BLAS3_SPEEDUP)
        return NEWTON_ITERATIONS_SMOOTH * product * math.sqrt(max(cond, 1.0))
    if route == "separable":
        r = float(prob.n) * (2.0 if smooth else 1.0) / prob.m  # per class
        if min(r, d) > WOODBURY_MAX_RANK:
            return math.inf  # systems the route would refuse: no hand-over to it
        solve = min(r * r * d + r**3 / 3.0, r * d * d + d**3 / 3.0)
        # the per-class solves are so small that the products with X (the step's scores and
        # the gradient) count too
        iteration = prob.m * solve + 4.0 * float(nnz) * prob.m
    elif route == "woodbury":
        r = float(prob.n) * (2.0 if smooth else 1.0)
        if r > WOODBURY_MAX_RANK:
            return math.inf  # a system the route would refuse: no hand-over to it
        iteration = prob.n * float(nnz) + r**3 / 3.0
    else:
        iteration = prob.n * dm * dm + dm**3 / 3.0
    iterations = NEWTON_ITERATIONS_SMOOTH if smooth else NEWTON_ITERATIONS
    return iterations * iteration / (BLAS3_SPEEDUP * 4.0 * nnz * prob.m)


def second_order(kind: str, d: int, m: int, loss_id: int, n: int | None = None) -> str | None:
    """The second-order phase a problem of ``n`` examples (None: unknown, then no Woodbury
    route) can take (:func:`newton_route`): ``"newton"`` (the
    Hessian formed and factored), ``"newton-cg"`` (Hessian-vector products),
    ``"newton-woodbury"`` (the examples' curvature), ``"newton-separable"``, or where none
    applies, ``"active-set"`` for a loss whose dual is a quadratic on bipartite simplices
    (:mod:`topkbench.solvers.active_set`), or None."""
    route = newton_route(kind, n, d, m, loss_id)
    if route is not None:
        return SECOND_ORDER[route]
    if kind != "gram" and derivatives_family(loss_id).bipartite_dual:
        return ACTIVE_SET
    return None


def second_order_of(prob: SDCAProblem) -> str | None:
    """:func:`second_order` of a problem."""
    return second_order(prob.kind, prob.X.shape[1], prob.m, prob.loss_id, prob.n)


def _predicted_rule(second: str | None, eps: float) -> bool:
    """Whether a well-conditioned run is watched for the predicted-epochs rule of
    :func:`hand_over`: dense Newton, Woodbury or separable steps, and eps within a
    continuation's reach
    (:data:`PREDICTED_MIN_EPS`).  The continuation's stages keep gamma at 0.1 or above while
    they pay (:data:`~topkbench.solvers.newton.PROX_MIN_GAMMA`), where even the differenced
    Hessians of Kato's weighted hinge (the one loss without written ones) are accurate."""
    return second in ("newton", "newton-woodbury", "newton-separable") and eps >= PREDICTED_MIN_EPS


def _priced(prob: SDCAProblem) -> bool:
    """Newton-CG on CSR features, whose Hessian-vector products cost about an epoch each, and
    the active-set finish, whose products cost with the dual's density: the predicted-epochs
    rule prices them at every condition number instead of handing over at once (on dense
    features BLAS makes Newton-CG's products cheap, and the hand-over stays as for the
    factored routes)."""
    second = second_order_of(prob)
    return second == ACTIVE_SET or (second == "newton-cg" and sp.issparse(prob.X))


def _smooth(loss_id: int, gamma: float) -> bool:
    return loss_smoothness(loss_id, gamma) > 0.0


def hand_over(run: Run, prob: SDCAProblem, accelerate: str, C: float, gamma: float,
              density: float = 1.0) -> bool:  # fmt: skip
    """Whether plain SDCA stops at this certificate and a faster phase takes over.

    ``"never"``: no.  ``"catalyst"`` / ``"newton"``: whenever the condition number ``C R^2 /
    mu`` (:func:`~topkbench.solvers.accelerated.condition_number`) exceeds 1.  ``"auto"``:

    * Newton-CG on CSR features, whose products cost about an epoch each and grow in number
      with the conditioning: at any condition number, once plain SDCA, after
      :data:`PREDICTED_MIN_EPOCHS` epochs, is predicted to need more epochs than the CG phase
      costs (a warm start often converges in a few epochs where one CG iteration costs dozens:
      LR^ML on delicious at C = 4, 3.6 s plain against 67 s); the active-set finish likewise,
      priced by the dual's ``density`` (delicious' duals, 15 % nonzero, make its products
      cost most of an epoch; corel5k's, 5 %, a sixth);
    * condition number at least :data:`ACCEL_MIN_CONDITION`: at once where another
      second-order phase applies (its cost does not grow with the conditioning), else once
      plain SDCA,
      after :data:`ACCEL_MIN_EPOCHS` epochs, is predicted by its last two certificates to
      need :data:`ACCEL_PREDICTED_FACTOR` times more epochs again than it has run;
    * below it, with dense Newton or Woodbury steps: once plain SDCA (sublinear on a
      nonsmooth loss however well conditioned), after :data:`PREDICTED_MIN_EPOCHS` epochs, is
      predicted to need more epochs than the Newton phase costs (:func:`newton_cost_epochs`:
      a continuation for a nonsmooth hinge, a few iterations for a smooth loss).

    Under the predicted-epochs rule a run also hands over, to a phase of finite cost, once
    plain SDCA is predicted not to reach eps within the epochs its budget has left.
    """
    if not can_hand_over(prob, accelerate, C, gamma, run.eps):
        return False
    if accelerate in ("catalyst", "newton"):
        return True
    cond = condition_number(prob, C, gamma)
    second = second_order_of(prob)
    if cond < ACCEL_MIN_CONDITION or _priced(prob):  # watched, priced finite
        if run.epochs < PREDICTED_MIN_EPOCHS:
            return False
        predicted = trend_epochs(run) if second == ACTIVE_SET else predicted_epochs(run)
        cost = newton_cost_epochs(prob, _smooth(prob.loss_id, gamma), cond, density)
        # a run that will not reach eps in its budget takes any phase that may
        return predicted > cost or (math.isfinite(cost) and predicted > run.epochs_left())
    if second is not None:
        return True
    if run.epochs < ACCEL_MIN_EPOCHS:
        return False
    return predicted_epochs(run) > ACCEL_PREDICTED_FACTOR * run.epochs


def can_hand_over(prob: SDCAProblem, accelerate: str, C: float, gamma: float, eps: float) -> bool:
    """Whether :func:`hand_over` can say yes at some certificate of this run, whatever its
    trace (its rules that depend on the problem alone; no: ``"never"``, or ``"auto"`` below
    :data:`ACCEL_MIN_CONDITION` where the predicted-epochs rule does not watch the run or
    prices the second-order phase as never paying, as for corel5k's SVM^ML, past the
    Woodbury route's size)."""
    if accelerate == "never" or prob.n == 0:
        return False
    cond = condition_number(prob, C, gamma)
    if accelerate in ("catalyst", "newton"):
        return cond > 1.0
    if _priced(prob):
        return True  # always watched: priced at every condition number
    if cond < ACCEL_MIN_CONDITION:
        return _predicted_rule(second_order_of(prob), eps) and math.isfinite(
            newton_cost_epochs(prob, _smooth(prob.loss_id, gamma))
        )
    return True


def takes_newton(prob: SDCAProblem, accelerate: str) -> bool:
    """At a hand-over: Newton (or Newton-CG) first, rather than accelerated SDCA."""
    return accelerate != "catalyst" and second_order_of(prob) is not None


def predicted_epochs(run: Run) -> float:
    """Epochs plain SDCA still needs to reach eps, extrapolating the decay per epoch of the
    last two certificates, or of the last three when the last one rose (SDCA's gap is not
    monotone, and one bump is not a stall); infinite if the gap did not decrease."""
    prev, last = run.trace[-2], run.trace[-1]
    if not (last.relative_gap < prev.relative_gap) and len(run.trace) >= 3:
        prev = run.trace[-3]
    if not (last.relative_gap < prev.relative_gap) or last.epoch <= prev.epoch:
        return math.inf
    rate = math.log(prev.relative_gap / last.relative_gap) / (last.epoch - prev.epoch)
    return math.log(last.relative_gap / run.eps) / rate


def trend_epochs(run: Run) -> float:
    """Epochs plain SDCA still needs to reach eps by its trend since half its epochs: the
    smallest gap so far against the gap at the certificate nearest half the epochs (the gap
    of float32 epochs rises and falls by tens of percent between certificates, which
    :func:`predicted_epochs`'s last two would read as a stall); infinite if the gap did not
    decrease since then."""
    last = run.trace[-1]
    half = min(run.trace, key=lambda t: abs(t.epoch - last.epoch / 2))
    best = min(t.relative_gap for t in run.trace if t.epoch >= half.epoch)
    if not best < half.relative_gap or last.epoch <= half.epoch:
        return math.inf
    rate = math.log(half.relative_gap / best) / (last.epoch - half.epoch)
    return math.log(best / run.eps) / rate


def plan(kind: str, d: int, m: int, loss_id: int, gamma: float, accelerate: str = "auto",
         eps: float = 1e-3, n: int | None = None,
         sparse: bool | None = None) -> tuple[Phase, ...]:  # fmt: skip
    """The phases a run of ``n`` examples (None: unknown, then no Woodbury route) of this
    shape (``sparse``: CSR features; None: either, both rules given where they differ) may go
    through under ``accelerate``, in order, each with the rule that starts it (the rules of
    :func:`hand_over`)."""
    phases = [Phase("plain", "from the start, or the warm dual")]
    if accelerate == "never":
        return tuple(phases)
    second = None if accelerate == "catalyst" else second_order(kind, d, m, loss_id, n)
    forced = accelerate in ("catalyst", "newton")
    smooth = _smooth(loss_id, gamma)
    if second is not None:
        rule = ("at the first certificate, C R^2 / mu > 1" if forced else
                f"at the first certificate once C R^2 / mu >= {ACCEL_MIN_CONDITION:g}")  # fmt: skip
        priced = (f"after {PREDICTED_MIN_EPOCHS} epochs, once plain SDCA's predicted epochs "
                  f"exceed the CG phase's cost ({NEWTON_ITERATIONS_SMOOTH:g} iterations of "
                  "sqrt(C R^2 / mu) products)")  # fmt: skip
        if second == ACTIVE_SET:
            if not forced:
                rule = (
                    f"after {PREDICTED_MIN_EPOCHS} epochs, once plain SDCA's predicted "
                    "epochs exceed the finish's cost (priced by the dual's nonzeros)"
                )
            rule += (
                f"; rounds of CG on the dual's face, each followed by "
                f"{ACTIVE_SET_ROUND_EPOCHS} plain epochs, to the gap or a budget"
            )
            phases.append(Phase(second, rule))
            return tuple(phases)
        if second == "newton-cg" and not forced and sparse:
            rule = priced
        elif second == "newton-cg" and not forced and sparse is None:
            rule = f"dense features: {rule}; CSR features: {priced}"
        elif not forced and _predicted_rule(second, eps):
            rule += ("; below it, once plain SDCA's predicted epochs exceed the Newton "
                     "phase's cost")  # fmt: skip
        if not smooth:
            rule += ("; smoothing continuation gamma = 1, then smaller down to 0.1, then "
                     "proximal centres")  # fmt: skip
        if second == "newton-woodbury":
            rule += (f"; a system past its limit before the first step: plain SDCA, offered "
                     f"once more after {NEWTON_RETRY_EPOCHS} epochs")  # fmt: skip
        phases.append(Phase(second, rule))
        phases.append(Phase("accelerated", f"if {second} stalls, from its gradient dual"))
    else:
        rule = ("at the first certificate, C R^2 / mu > 1" if forced else
                f"C R^2 / mu >= {ACCEL_MIN_CONDITION:g}, after {ACCEL_MIN_EPOCHS} epochs, when "
                f"plain SDCA is predicted to need {ACCEL_PREDICTED_FACTOR:g}x more")  # fmt: skip
        phases.append(Phase("accelerated", rule))
    phases.append(Phase("plain", "if the accelerated phase reaches its ratio limit"))
    return tuple(phases)


def describe(phases: tuple[Phase, ...]) -> str:
    """A plan on one line: ``plain -> newton (rule) -> ...``."""
    return " -> ".join(str(p) for p in phases)


__all__ = ["ACCELERATE_MODES", "NEWTON_MAX_DIM", "NEWTON_RETRY_EPOCHS", "Phase", "can_hand_over",
           "describe", "hand_over", "newton_cost_epochs", "newton_route", "plan",
           "predicted_epochs", "route_of", "second_order", "second_order_of", "takes_newton",
           "trend_epochs",
           "woodbury_applies"]  # fmt: skip
