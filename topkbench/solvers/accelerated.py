"""Accelerated SDCA for ill-conditioned problems: Catalyst's proximal outer loop around the
SDCA kernels, with smoothing continuation for the nonsmooth hinges (DESIGN §5).

**Why.** SDCA on ``P(W) = lambda/2 ||W||^2 + 1/n sum_i L_i(W^T x_i)`` with (1/mu)-smooth
losses needs O(n + R^2 / (lambda mu)) block updates per digit (Shalev-Shwartz & Zhang, JMLR
2013), i.e. about ``c = C R^2 / mu`` epochs with ``C = 1/(lambda n)`` and ``R^2 = max_i
||x_i||^2``.  Raw features (``R^2`` up to 1e5) at the large-C end of the papers' grids give
``c`` of 1e4 to 1e7.

**The proximal problems.** Catalyst (Lin, Mairal & Harchaoui, NIPS 2015) minimizes, for a
centre Z,

    G(W) = P(W) + kappa/2 ||W - Z||^2 = lambda'/2 ||W - W0||^2 + 1/n sum_i L_i(W^T x_i) + const,
    lambda' = lambda + kappa,   W0 = (kappa / lambda') Z.

Its dual has the same per-example conjugate domains and ``W(alpha) = W0 + 1/(lambda' n)
sum_i x_i alpha_i^T``.  In the kernels' scale (``A = C alpha``, ``topkbench.losses.dispatch``) that
is plain SDCA with ``C' = C / r``, ``r = lambda' / lambda``, on ``A' = A / r``, with W started at
``W0 + X^T A'``: the block updates only read the current scores, so the kernels run unchanged
(the Gram kernel takes the coefficients ``B = B0 + A'`` of W separately).

**The certificate stays the original problem's.** ``alpha`` is feasible for the original dual
at every step, so ``D(alpha)`` is a lower bound of P*.  Two primal points are at hand,
``W(alpha) = X^T (r A')`` and the prox iterate ``W_in``; the reported gap and the stopping rule
are ``P(W) - D(alpha)`` for the better of the two (``W(alpha)`` only in kernel mode, whose
model scores are ``K A``), and the returned ``W`` is that point.

**kappa and the momentum.** ``kappa = R^2 / (n mu) - lambda`` makes each proximal problem's
condition number 1 (``lambda' n mu = R^2``), so one epoch, warm-started from the previous
dual, solves it to a constant factor (Catalyst's practical fixed inner budget); the outer loop
then contracts by ``1 - sqrt(q)`` per step, ``q = lambda / lambda' = 1/c``, with the constant
extrapolation ``Z = W_k + beta (W_k - W_{k-1})``, ``beta = (1 - sqrt q)/(1 + sqrt q)`` of the
strongly convex case: O(sqrt(c)) epochs per digit instead of O(c).  When the objective at the
prox iterates rises between two certificates, the momentum restarts (``Z = W_k``; adaptive
restart, O'Donoghue & Candès 2015).

**Nonsmooth hinges (gamma = 0): smoothing continuation.** ``mu = 0`` for SVM^Multi, the top-k
hinges, SVM^OVA and SVM^ML.  TPAMI Prop. 2 (and Prop. 6, Prop. 10) smooth them by adding
``gamma/2 ||v||^2`` to the conjugate on the *same* domain, so every dual iterate of a smoothed
problem is feasible for the gamma = 0 dual, with

    D_0(alpha) - D_gamma(alpha) = gamma/(2n) sum_i ||v_i||^2 >= 0,
    0 <= P_0(W) - P_gamma(W) <= gamma/2 max ||v||^2,
    P_0(W) - D_0(alpha) <= [P_gamma(W) - D_gamma(alpha)] + [P_0(W) - P_gamma(W)].

The stages solve gamma_0 = 1 (the papers' smooth rows), then smaller gamma, each accelerated
with ``mu = gamma``, warm-started from the previous stage, and every certificate is the
gamma = 0 one.  A stage ends when its own relative gap is below a quarter of the smoothing's
share of the gamma = 0 gap (more accuracy at this gamma would not lower it); the next gamma
aims that share at eps/2 (share is proportional to gamma), within [gamma/10, gamma/3]
(:func:`next_stage_gamma`).
"""

from __future__ import annotations

import math
import time

from topkbench.losses.dispatch import derivatives_family
from topkbench.solvers.problem import Run, SDCAProblem, auto_batch, relative_gap

# smoothing of the first continuation stage for the nonsmooth hinges (TPAMI's "SVM_1" rows)
GAMMA_START = 1.0
# at most this many epochs between two certificates of the accelerated phase (a certificate
# costs three n x d x m products, about 1.5 epochs)
CERT_EVERY = 10
# epochs per proximal problem: 1, doubled at each restart up to this
MAX_INNER = 8
# largest r = lambda'/lambda: the dual is carried as A / r and the certificate multiplies it
# back, so rounding grows like r * 1e-16; kappa is capped there, and a continuation whose next
# gamma would need more hands the run back to plain SDCA on the gamma = 0 problem
MAX_RATIO = 1e9


def loss_smoothness(loss_id: int, gamma: float) -> float:
    """``mu`` such that the loss is (1/mu)-smooth in the scores (0: nonsmooth).

    The loss's family says it (:attr:`~topkbench.losses.curvature.LossDerivatives.
    smoothness`); the hinges smoothed by gamma (TPAMI Prop. 2) are (1/gamma)-smooth.  Only the
    choice of kappa depends on it, never the certificate.
    """
    mu = derivatives_family(loss_id).smoothness
    return float(gamma) if mu is None else mu


def first_stage_gamma(loss_id: int, gamma: float) -> float:
    """The smoothing a run starts from: ``gamma`` itself for a smooth loss, else
    :data:`GAMMA_START` (the first stage of the continuation)."""
    return gamma if loss_smoothness(loss_id, gamma) > 0.0 else GAMMA_START


def next_stage_gamma(stage_gamma: float, gap: float, stage_gap: float, eps: float):
    """The next smoothing of a continuation, or None to stay at ``stage_gamma``.

    ``gap`` is the relative gap of the gamma = 0 problem and ``stage_gap`` that of the stage's
    smoothed problem at the same pair; their difference is the smoothing's share.  The stage
    ends when its own gap is below a quarter of that share (or of eps); the next gamma aims the
    share, which is proportional to gamma, at eps/2, within [gamma/10, gamma/3].
    """
    share = gap - stage_gap
    if stage_gap > max(eps, share) / 4.0:
        return None
    return stage_gamma * min(max(0.5 * eps / max(share, 1e-300), 0.1), 1 / 3)


def condition_number(prob: SDCAProblem, C: float, gamma: float) -> float:
    """``C R^2 / mu``: plain SDCA's epochs per digit, up to a constant (``mu`` of the first
    continuation stage for a nonsmooth loss)."""
    mu = loss_smoothness(prob.loss_id, first_stage_gamma(prob.loss_id, gamma))
    return C * prob.r2 / mu


def solve_accelerated(prob: SDCAProblem, run: Run, A, C: float, gamma: float):
    """Continue ``run`` from the dual ``A`` (feasible, scaled for ``C``) by accelerated SDCA
    until the relative gap of the original problem (loss smoothed by ``gamma``) is at most
    ``run.eps`` or a budget is spent.

    Returns ``(status, A, W, primal, dual, gap, info)`` with ``W`` the certified primal point
    (None in kernel mode) and ``info`` the phase's parameters.  Status ``"running"`` hands the
    run back to plain SDCA from ``A`` (a continuation that reached :data:`MAX_RATIO`: on the
    gamma = 0 problem plain SDCA from a near-optimal dual converges linearly, its dual being
    a quadratic program).
    """
    n = prob.n
    lam = 1.0 / (C * n)
    mu = loss_smoothness(prob.loss_id, gamma)
    stage_gamma = first_stage_gamma(prob.loss_id, gamma)
    info = {"accelerated_from_epoch": run.epochs, "gamma_stages": [], "restarts": 0}
    start_point = prob.rep_of(A)
    while True:
        kappa = min(max(prob.r2 / (n * (mu or stage_gamma)) - lam, 0.0), (MAX_RATIO - 1) * lam)
        r = 1.0 + kappa / lam
        q = 1.0 / r
        beta = (1.0 - math.sqrt(q)) / (1.0 + math.sqrt(q))
        info["kappa"] = kappa
        info["gamma_stages"].append(stage_gamma)
        Ain = A / r
        W_prev = start_point
        W0 = (1.0 - q) * start_point
        W_in = W0 + prob.rep_of(Ain)
        p_last = math.inf
        inner = 1
        while True:
            batch = run.clip_batch(auto_batch(run.trace, run.eps, n, n, cap=CERT_EVERY))
            t_batch = time.perf_counter()
            for done in range(0, batch, inner):
                run.failures += prob.run_epochs(
                    Ain, W_in, run.permutations(min(inner, batch - done)), C * q, stage_gamma,
                    run.troots,
                )  # fmt: skip
                W_k = W_in.copy()
                W0_next = (1.0 - q) * (W_k + beta * (W_k - W_prev))
                W_prev = W_k
                W_in += W0_next - W0
                W0 = W0_next
            run.epochs += batch
            run.epoch_seconds = (time.perf_counter() - t_batch) / batch
            # certificate of the original problem at alpha = r A' (and W_in resynchronized)
            G = prob.rep_of(Ain)
            W_in = W0 + G
            A = r * Ain
            W_a = r * G
            S_a = prob.scores(W_a)
            sq_a = prob.sq_norm(W_a, S_a)
            primal, dual = prob.values(S_a, A, sq_a, C, gamma)
            S_in = prob.scores(W_in)
            sq_in = prob.sq_norm(W_in, S_in)
            p_in_orig = prob.values(S_in, A, sq_in, C, gamma)[0]
            W_best = W_a
            if prob.kind != "gram" and p_in_orig < primal:
                # the prox iterate is a primal point too, and usually the better one
                primal, W_best = p_in_orig, W_in.copy()
            public = None if prob.kind == "gram" else W_best
            gap = run.record(primal, dual, A, public)
            status = run.stop_status(gap)
            if status is not None:
                return status, A, public, primal, dual, gap, info
            p_in = p_in_orig
            if stage_gamma != gamma:
                p_in = prob.values(S_in, A, sq_in, C, stage_gamma)[0]
            if p_in > p_last:  # adaptive restart: drop the momentum, solve the next ones longer
                info["restarts"] += 1
                inner = min(2 * inner, MAX_INNER)
                W_prev = W_in.copy()
                W0_next = (1.0 - q) * W_in
                W_in += W0_next - W0
                W0 = W0_next
            p_last = p_in
            if mu == 0.0:
                stage_gap = relative_gap(*prob.values(S_a, A, sq_a, C, stage_gamma))
                smaller = next_stage_gamma(stage_gamma, gap, stage_gap, run.eps)
                if smaller is not None:
                    stage_gamma = smaller
                    if prob.r2 / (n * stage_gamma) > (MAX_RATIO - 1) * lam:
                        return "running", A, public, primal, dual, gap, info
                    start_point = W_in
                    break
