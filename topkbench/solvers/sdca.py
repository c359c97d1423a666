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
from topkbench.solvers.newton import solve_newton
from topkbench.solvers.plan import (
    ACCELERATE_MODES,
    NEWTON_RETRY_EPOCHS,
    can_hand_over,
    hand_over,
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
    plain epochs, Newton iterations and accelerated epochs."""
    newton = int(info.get("newton_iterations", 0))
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
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        if (
            sample_weight.shape != (X.shape[0],)
            or not np.all(sample_weight > 0.0)
            or not (np.all(np.isfinite(sample_weight)))
        ):
            raise SolverError("sample_weight must hold one finite positive weight per example")
    if (rho is not None) != (loss_id == ids.LOSS_WTOPK_SVM):
        raise SolverError("rank weights rho go with the weighted top-k hinge, and only with it")
    if rho is not None:
        rho = np.asarray(rho, dtype=np.float64).ravel()
        if not (0 < rho.size <= n_classes and np.all(np.isfinite(rho)) and np.all(rho >= 0.0)
                and np.all(np.diff(rho) <= 0.0) and rho.sum() > 0.0):  # fmt: skip
            raise SolverError(
                f"rho must be 1..{n_classes} non-negative, non-increasing rank weights, not all 0"
            )
    prob = SDCAProblem(X, y, gram=gram, n_classes=n_classes, loss_id=loss_id, k=k,
                       weights=sample_weight, rho=rho)  # fmt: skip
    n, m = prob.n, prob.m
    # the one check kept here: the kernels index the scores by k without bounds checks, so an
    # unvalidated k >= m would read past them (intermittent NaNs, not an error)
    check_k(k, m)
    if accelerate not in ACCELERATE_MODES:
        raise SolverError(f"accelerate must be one of {', '.join(ACCELERATE_MODES)}")
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
    run = Run(n, eps=eps, max_epochs=max_epochs, time_limit=time_limit, seed=seed,
              on_eval=on_eval)  # fmt: skip
    primal, dual = prob.objective(A, W, C, gamma, gaps)
    active = _active_set(gaps, A)
    gap = run.record(primal, dual, A, _public_rep(prob, W))
    run.single = prob.single and keeps_single(run.trace)  # a warm start may be close
    status = "converged" if gap <= eps else "running"
    info: dict = {}
    retry_from = 0  # plain SDCA's epochs before the next hand-over may be offered
    while status == "running":
        budget = run.budget_status()
        if budget is not None:
            status = budget
            break
        if (accelerate != "never" and run.epochs >= retry_from
                and hand_over(run, prob, accelerate, C, gamma)):  # fmt: skip
            newton = takes_newton(prob, accelerate)
            if newton:
                with blas_threads(1):
                    status, A, W, primal, dual, gap, info = solve_newton(
                        prob, run, A, C, gamma, W_start, gamma_start
                    )
            if newton and info.pop("newton_refused", False) and retry_from == 0:
                # the Woodbury system was too large before any step (at a cold start every
                # example is at the margin): plain SDCA goes on from the same dual and
                # offers the hand-over again after NEWTON_RETRY_EPOCHS more epochs, once
                info = {"newton_refused_at_epoch": run.epochs}
                retry_from = run.epochs + NEWTON_RETRY_EPOCHS
                W = A if prob.kind == "gram" else prob.rep_of(A)
                primal, dual = prob.objective(A, W, C, gamma, gaps)
                active = _active_set(gaps, A)
                continue
            if not newton or status == "running":
                # Newton stalled or failed: accelerated SDCA goes on from its gradient dual
                newton_info = info if newton else {}
                status, A, W, primal, dual, gap, info = solve_accelerated(prob, run, A, C, gamma)
                info = {**newton_info, **info}
            accelerate = "never"
            if status != "running":
                break
            info["plain_from_epoch"] = run.epochs
            run.single = False  # handed back near the optimum: float64 from here
            W = A if prob.kind == "gram" else prob.rep_of(A)
            primal, dual = prob.objective(A, W, C, gamma, gaps)
            active = _active_set(gaps, A)
            continue
        if eval_every == "auto":
            n_active = n if active is None else int(active.sum())
            grow = not can_hand_over(prob, accelerate, C, gamma, eps)
            batch = run.clip_batch(auto_batch(run.trace, eps, n, n_active, grow=grow))
        else:
            batch = run.clip_batch(int(eval_every))
        perms = run.permutations(batch, active)
        single = run.single
        t_batch = time.perf_counter()
        run.failures += prob.run_epochs(A, W, perms, C, gamma, run.troots, single)
        run.epochs += batch
        run.single_epochs += batch if single else 0
        seconds = time.perf_counter() - t_batch
        run.epoch_seconds = seconds / batch
        if on_batch is not None:
            on_batch(batch, seconds)
        # resynchronize W = X^T A: D(A) is a certified lower bound only for the W that A
        # defines, and rank-1 updates accumulate rounding (A ~ C while W may be O(1))
        if prob.kind != "gram":
            W[...] = features_t_dot(prob.X, A)
        primal, dual = prob.objective(A, W, C, gamma, gaps)
        active = _active_set(gaps, A)
        gap = run.record(primal, dual, A, _public_rep(prob, W))
        if single:
            run.single = keeps_single(run.trace)
        if gap <= eps:
            status = "converged"
    seconds = run.elapsed()
    check_certificate(primal, dual)
    if run.single_epochs:
        info["float32_epochs"] = run.single_epochs
    if run.failures:
        warnings.warn(
            f"{run.failures} block updates hit the inner root-finding iteration limit",
            ConvergenceWarning,
            stacklevel=2,
        )
    if status != "converged" and warn:
        warnings.warn(
            f"SDCA stopped on {status} after {run.epochs} epochs with relative gap {gap:.3g} "
            f"> eps = {eps:g}",
            ConvergenceWarning,
            stacklevel=2,
        )
    return SDCAResult(A, _public_rep(prob, W), primal, dual, gap, status, run.epochs, seconds,
                      run.trace, info)  # fmt: skip


def _public_rep(prob: SDCAProblem, W):
    """What callers see as ``W``: the weights, or None in kernel mode (scores are ``K A``)."""
    return None if prob.kind == "gram" else W
