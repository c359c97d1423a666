"""SDCA driver (DESIGN §5): epochs in numba, stopping rule and certificate in Python.

The numba kernels (``topkbench.losses.dispatch``) work in the scale ``P / lambda``; this module
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

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from topkbench.errors import ConvergenceWarning, SolverError
from topkbench.losses import ids
from topkbench.solvers.accelerated import solve_accelerated
from topkbench.solvers.active_set import solve_active_set
from topkbench.solvers.newton import solve_newton
from topkbench.solvers.plan import (
    ACCELERATE_MODES,
    ACTIVE_SET,
    NEWTON_RETRY_EPOCHS,
    can_hand_over,
    hand_over,
    second_order_of,
    takes_newton,
)
from topkbench.solvers.problem import (
    Run,
    SDCAProblem,
    TracePoint,
    _active_set,
    auto_batch,
    blas_threads,
    check_certificate,
    features_t_dot,
    keeps_single,
    warn_budget_stop,
)
from topkbench.validation import check_k


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
    info: dict = field(default_factory=dict)  # the accelerated phase's parameters, if any


def phase_counts(info: dict, epochs: int) -> dict[str, int]:
    """How a fit's ``epochs`` split over its solver phases (plain SDCA, then possibly Newton,
    then accelerated SDCA, then plain SDCA again; ``info`` as :func:`solve_sdca` returns it):
    plain epochs, Newton iterations and accelerated epochs.  The rounds of the active-set
    finish (:mod:`topkbench.solvers.active_set`) count as second-order iterations, the plain
    SDCA epochs between them as plain epochs."""
    newton = int(info.get("newton_iterations", 0)) + int(info.get("active_set_rounds", 0))
    accelerated = 0
    if "accelerated_from_epoch" in info:
        start = int(info["accelerated_from_epoch"])
        accelerated = int(info.get("plain_from_epoch", epochs)) - start
    return {"plain_epochs": int(epochs) - newton - accelerated, "newton_iterations": newton,
            "accelerated_epochs": accelerated}  # fmt: skip


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
    on_batch=None,
    shrink: bool = True,
    accelerate: str = "never",
    sample_weight: np.ndarray | None = None,
    rho: np.ndarray | None = None,
    W_start: np.ndarray | None = None,
    gamma_start: float | None = None,
    take_A0: bool = False,
) -> SDCAResult:
    """Minimize P(W) by SDCA; inputs are assumed validated (see :func:`topkbench.fit`).

    ``sample_weight`` (positive, length n) weights the examples' losses,
    ``P(W) = lambda/2 ||W||^2 + 1/n sum_i w_i L(y_i, W^T x_i)``: example i's dual block lives
    in its conjugate's domain scaled by ``C w_i``, and its update is the unweighted one with
    ``C w_i`` for C (:class:`~topkbench.solvers.problem.SDCAProblem`), so every phase, the
    certificate and the shrinking rule carry over unchanged.  ``rho``: the rank weights of
    the weighted top-k hinge (``loss_id = LOSS_WTOPK_SVM``; non-increasing, non-negative).

    With ``gram=True``, ``X`` is a symmetric PSD Gram matrix (n x n) and the problem is the
    kernel one (scores ``K A``; no W is formed; ``result.W`` is None).
    ``A0`` (n x m) warm-starts the dual; ``W`` is recomputed as ``X^T A0`` so that the pair
    is consistent.  ``A0`` is copied unless ``take_A0`` hands it over (a C-contiguous float64
    temporary of the caller, such as :func:`topkbench.fit`'s rescaled warm dual, then updated
    in place: at large n m the copy's page faults cost a sizeable share of a warm fit).
    ``on_eval(epoch, A, W)``, if given, is called after every trace point
    (benchmarks use it to score a validation set); its time is excluded from the trace and
    from the time limit.  ``on_batch(epochs, seconds)``, if given, is called after every batch
    of plain SDCA epochs with their count and the wall time of the epoch kernel alone (no W
    resynchronization, no certificate): the benchmarks' per-epoch timings.

    ``eval_every="auto"``: the epochs between certificates are chosen by :func:`auto_batch`
    (from the trace, the active-set size and whether a later certificate can still hand the
    run over, :func:`~topkbench.solvers.plan.can_hand_over`; no timings, so the run stays
    reproducible).

    Shrinking (``shrink=True``): every certificate evaluation also yields each example's
    Fenchel-Young gap ``g_i`` (:func:`topkbench.losses.dispatch.objective_terms`; ``sum_i g_i``
    is the duality gap).  ``g_i = 0`` means block i is already the maximizer of its update;
    the epochs until the next evaluation skip the examples with ``a_i = 0`` and ``g_i = 0``,
    i.e. zero loss (each epoch's permutation is still drawn in full and filtered, so the random
    stream is the same).  For the hinge losses these are the non-support vectors (most examples
    near the optimum of bench sdca's SVM^Multi problem); the smooth losses have no
    zero loss and are unaffected.  A skipped example whose block stops being optimal as W
    moves is visited again after the next evaluation; the stopping rule is the full duality
    gap, so shrinking never certifies a point that is not eps-optimal (cf. liblinear's
    shrinking, which it re-checks at the end).

    Float32 features (dense, or CSR with float32 values): plain SDCA runs the passes of its
    epochs over W in float32 while :func:`~topkbench.solvers.problem.keeps_single` allows it
    (from the start, not after a hand-back), its updates and certificates in float64;
    ``info["float32_epochs"]`` counts those epochs.

    Acceleration (``accelerate``: ``"auto"``, ``"catalyst"``, ``"newton"`` or ``"never"``):
    the phases a run may go through and the rules that hand it from one to the next are
    :mod:`topkbench.solvers.plan`'s (plain SDCA, Newton or Newton-CG in the primal,
    accelerated SDCA, plain SDCA again); ``"never"`` is plain SDCA throughout.  Every phase
    certifies the same problem with the same gap.  ``W_start`` and ``gamma_start`` (a warm
    model's primal point and last continuation smoothing) are where a Newton phase may start.
    """
    sample_weight = _checked_sample_weight(sample_weight, X.shape[0])
    rho = _checked_rank_weights(rho, loss_id, n_classes)
    prob = SDCAProblem(X, y, gram=gram, n_classes=n_classes, loss_id=loss_id, k=k,
                       weights=sample_weight, rho=rho)  # fmt: skip
    # the one check kept here: the kernels index the scores by k without bounds checks, so an
    # unvalidated k >= m would read past them (intermittent NaNs, not an error)
    check_k(k, prob.m)
    if accelerate not in ACCELERATE_MODES:
        raise SolverError(f"accelerate must be one of {', '.join(ACCELERATE_MODES)}")
    it = _start(prob, A0, take_A0, shrink)
    run = Run(prob.n, eps=eps, max_epochs=max_epochs, time_limit=time_limit, seed=seed,
              on_eval=on_eval)  # fmt: skip
    _certify(it, prob, run, C, gamma)
    run.single = prob.single and keeps_single(run.trace)  # a warm start may be close
    _run_phases(it, prob, run, C, gamma, eval_every=eval_every, accelerate=accelerate,
                on_batch=on_batch, W_start=W_start, gamma_start=gamma_start)  # fmt: skip
    return _finish(it, prob, run, warn)


def _checked_sample_weight(sample_weight, n: int) -> np.ndarray | None:
    """``sample_weight`` as float64, one finite positive weight per example (a weight of 0 would
    give a block an empty box: callers leave such examples out instead)."""
    if sample_weight is None:
        return None
    sample_weight = np.asarray(sample_weight, dtype=np.float64)
    if (
        sample_weight.shape != (n,)
        or not np.all(sample_weight > 0.0)
        or not (np.all(np.isfinite(sample_weight)))
    ):
        raise SolverError("sample_weight must hold one finite positive weight per example")
    return sample_weight


def _checked_rank_weights(rho, loss_id: int, m: int) -> np.ndarray | None:
    """``rho`` as a flat float64 array: 1..m non-negative, non-increasing rank weights, not all
    0 (the weighted top-k hinge is convex only then, Kato §4); given exactly when ``loss_id``
    is the weighted top-k hinge."""
    if (rho is not None) != (loss_id == ids.LOSS_WTOPK_SVM):
        raise SolverError("rank weights rho go with the weighted top-k hinge, and only with it")
    if rho is None:
        return None
    rho = np.asarray(rho, dtype=np.float64).ravel()
    if not (0 < rho.size <= m and np.all(np.isfinite(rho)) and np.all(rho >= 0.0)
            and np.all(np.diff(rho) <= 0.0) and rho.sum() > 0.0):  # fmt: skip
        raise SolverError(
            f"rho must be 1..{m} non-negative, non-increasing rank weights, not all 0"
        )
    return rho


@dataclass
class _Iterate:
    """Where a run stands between its batches and phases.

    ``A`` is the dual (n x m) and ``W`` the primal point it defines, ``X^T A`` (in kernel mode
    ``A`` itself: the scores ``K A`` come from it); ``primal``, ``dual`` and ``gap`` their last
    certificate.  ``gaps`` (None without shrinking) receives each example's Fenchel-Young gap
    at every evaluation, and ``active`` the examples the next plain epochs visit (None: all).
    """

    A: np.ndarray
    W: np.ndarray
    gaps: np.ndarray | None
    primal: float = np.nan
    dual: float = np.nan
    gap: float = np.inf
    active: np.ndarray | None = None
    status: str = "running"
    info: dict = field(default_factory=dict)


def _start(prob: SDCAProblem, A0, take_A0: bool, shrink: bool) -> _Iterate:
    """The starting point: ``A = 0`` (then ``W = 0``) or the warm dual ``A0`` (copied unless
    ``take_A0``) with ``W = X^T A0``, so that the pair is consistent."""
    n, m = prob.n, prob.m
    if A0 is None:
        A = np.zeros((n, m), dtype=np.float64)
    else:
        A = (np.asarray(A0, dtype=np.float64, order="C") if take_A0
             else np.array(A0, dtype=np.float64, order="C"))  # fmt: skip
        if A.shape != (n, m):
            raise SolverError(f"warm start A has shape {A.shape}, expected {(n, m)}")
    gaps = np.empty(n) if shrink else None
    if prob.kind == "gram":
        W = A  # the kernel's scores come from A itself (no offset)
    else:
        W = prob.rep_of(A) if A0 is not None else np.zeros((prob.X.shape[1], m))
    return _Iterate(A, W, gaps)


def _evaluate(it: _Iterate, prob: SDCAProblem, C: float, gamma: float) -> None:
    """P and D of the pair (A, W), and the examples the next plain epochs visit: shrinking
    skips those with ``a_i = 0`` and a zero Fenchel-Young gap (zero loss)."""
    it.primal, it.dual = prob.objective(it.A, it.W, C, gamma, it.gaps)
    it.active = _active_set(it.gaps, it.A)


def _certify(it: _Iterate, prob: SDCAProblem, run: Run, C: float, gamma: float) -> None:
    """Evaluate (A, W), record the certificate as a trace point (``on_eval`` sees the point)
    and mark the run converged at a relative gap within eps."""
    _evaluate(it, prob, C, gamma)
    it.gap = run.record(it.primal, it.dual, it.A, _public_rep(prob, it.W))
    if it.gap <= run.eps:
        it.status = "converged"


def _resume_plain(it: _Iterate, prob: SDCAProblem, C: float, gamma: float) -> None:
    """Plain SDCA goes on from the dual another phase left: ``W`` recomputed from ``A`` (the
    phase's primal point is not the one A defines) and evaluated, without a trace point (the
    phase recorded this certificate)."""
    it.W = it.A if prob.kind == "gram" else prob.rep_of(it.A)
    _evaluate(it, prob, C, gamma)


def _run_phases(it: _Iterate, prob: SDCAProblem, run: Run, C: float, gamma: float, *,
                eval_every: int | str, accelerate: str, on_batch, W_start,
                gamma_start: float | None) -> None:  # fmt: skip
    """Plain SDCA batches, and at most one hand-over to a faster phase, until the run converges
    or spends a budget (``it.status``).

    At every certificate :func:`~topkbench.solvers.plan.hand_over` decides whether plain SDCA
    stops for a faster phase.  A Newton phase refused before its first step (the Woodbury
    system too large: at a cold start every example is at the margin) lets plain SDCA go on
    from the same dual and offers the hand-over again after ``NEWTON_RETRY_EPOCHS`` more
    epochs, once; any other hand-over is the last.
    """
    retry_from = 0  # plain SDCA's epochs before the next hand-over may be offered
    while it.status == "running":
        budget = run.budget_status()
        if budget is not None:
            it.status = budget
            break
        if (accelerate != "never" and run.epochs >= retry_from
                and hand_over(run, prob, accelerate, C, gamma, _density(it, prob))):  # fmt: skip
            if _faster_phases(it, prob, run, C, gamma, accelerate, retry_from == 0, W_start,
                              gamma_start):  # fmt: skip
                retry_from = run.epochs + NEWTON_RETRY_EPOCHS
            else:
                accelerate = "never"
            continue
        _plain_batch(it, prob, run, C, gamma, eval_every, accelerate, on_batch)


def _density(it: _Iterate, prob: SDCAProblem) -> float:
    """The dual's share of nonzeros, which prices the active-set finish
    (:func:`~topkbench.solvers.plan.newton_cost_epochs`); 1 where that phase does not apply
    (no pass over A)."""
    if second_order_of(prob) != ACTIVE_SET:
        return 1.0
    return np.count_nonzero(it.A) / max(it.A.size, 1)


def _faster_phases(it: _Iterate, prob: SDCAProblem, run: Run, C: float, gamma: float,
                   accelerate: str, first_offer: bool, W_start,
                   gamma_start: float | None) -> bool:  # fmt: skip
    """The faster phases from the current dual: Newton in the primal
    (:func:`~topkbench.solvers.plan.takes_newton`), then accelerated SDCA if Newton stalls or
    fails (from Newton's gradient dual, their infos merged), or accelerated SDCA alone; a run
    they hand back unconverged resumes plain SDCA in float64 (it is near the optimum).

    Returns True when Newton refused at the ``first_offer`` (``it.info`` then says at which
    epoch), so that plain SDCA goes on and the hand-over is offered again later.
    """
    if takes_newton(prob, accelerate) and second_order_of(prob) == ACTIVE_SET:
        it.status, it.A, it.W, it.primal, it.dual, it.gap, it.info = solve_active_set(
            prob, run, it.A, C, gamma
        )
        return False
    newton = takes_newton(prob, accelerate)
    if newton:
        with blas_threads(1):
            it.status, it.A, it.W, it.primal, it.dual, it.gap, it.info = solve_newton(
                prob, run, it.A, C, gamma, W_start, gamma_start
            )
    if newton and it.info.pop("newton_refused", False) and first_offer:
        it.info = {"newton_refused_at_epoch": run.epochs}
        _resume_plain(it, prob, C, gamma)
        return True
    if not newton or it.status == "running":
        newton_info = it.info if newton else {}
        it.status, it.A, it.W, it.primal, it.dual, it.gap, info = solve_accelerated(
            prob, run, it.A, C, gamma
        )
        it.info = {**newton_info, **info}
    if it.status == "running":
        it.info["plain_from_epoch"] = run.epochs
        run.single = False  # handed back near the optimum: float64 from here
        _resume_plain(it, prob, C, gamma)
    return False


def _plain_batch(it: _Iterate, prob: SDCAProblem, run: Run, C: float, gamma: float,
                 eval_every: int | str, accelerate: str, on_batch) -> None:  # fmt: skip
    """One batch of plain SDCA epochs, then the certificate.

    The batch is ``eval_every`` epochs, or :func:`auto_batch`'s choice (grown while no later
    certificate can hand the run over), cut to the budgets; its permutations are drawn in full
    and filtered by the active set.  ``on_batch`` gets the epochs and the kernel's wall time.
    """
    if eval_every == "auto":
        n_active = prob.n if it.active is None else int(it.active.sum())
        grow = not can_hand_over(prob, accelerate, C, gamma, run.eps)
        batch = run.clip_batch(auto_batch(run.trace, run.eps, prob.n, n_active, grow=grow))
    else:
        batch = run.clip_batch(int(eval_every))
    perms = run.permutations(batch, it.active)
    single = run.single
    t_batch = time.perf_counter()
    run.failures += prob.run_epochs(it.A, it.W, perms, C, gamma, run.troots, single)
    run.epochs += batch
    run.single_epochs += batch if single else 0
    seconds = time.perf_counter() - t_batch
    run.epoch_seconds = seconds / batch
    if on_batch is not None:
        on_batch(batch, seconds)
    # resynchronize W = X^T A: D(A) is a certified lower bound only for the W that A
    # defines, and rank-1 updates accumulate rounding (A ~ C while W may be O(1))
    if prob.kind != "gram":
        it.W[...] = features_t_dot(prob.X, it.A)
    _certify(it, prob, run, C, gamma)
    if single:
        run.single = keeps_single(run.trace)


def _finish(it: _Iterate, prob: SDCAProblem, run: Run, warn: bool) -> SDCAResult:
    """The result of a finished run, after checking weak duality; warns (at the caller of
    :func:`solve_sdca`) about block updates whose root finding hit its limit and, if ``warn``,
    about a run stopped by a budget."""
    seconds = run.elapsed()
    check_certificate(it.primal, it.dual)
    if run.single_epochs:
        it.info["float32_epochs"] = run.single_epochs
    if run.failures:
        warnings.warn(
            f"{run.failures} block updates hit the inner root-finding iteration limit",
            ConvergenceWarning,
            stacklevel=3,
        )
    if it.status != "converged" and warn:
        warn_budget_stop("SDCA", it.status, f"{run.epochs} epochs", it.gap, run.eps,
                         stacklevel=3)  # fmt: skip
    return SDCAResult(it.A, _public_rep(prob, it.W), it.primal, it.dual, it.gap, it.status,
                      run.epochs, seconds, run.trace, it.info)  # fmt: skip


def _public_rep(prob: SDCAProblem, W):
    """What callers see as ``W``: the weights, or None in kernel mode (scores are ``K A``)."""
    return None if prob.kind == "gram" else W
