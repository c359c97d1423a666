"""``topkbench bench peers``: wall time to a relative primal tolerance, ours vs scikit-learn.

The same problem (``bench.make_gaussian_problem``) and the same regularization are solved by
our SDCA and by scikit-learn's solvers of the same objective; for every solver we report the
wall time to reach a primal objective within ``tol`` (default 1e-3) relative of the optimum,
and its ratio to ours.

Objective and C mapping
-----------------------
DESIGN §2: ``P(W) = lambda/2 ||W||_F^2 + 1/n sum_i L(y_i, W^T x_i)`` with ``C = 1/(lambda n)``
and no bias, so ``P(W)/lambda = 1/2 ||W||_F^2 + C sum_i L(y_i, W^T x_i)``.  scikit-learn (and
liblinear) minimize ``1/2 ||w||^2 + C_sk sum_i loss_i`` (per binary problem for one-vs-rest):

* ``lr_multi`` (``log sum_j exp(f_j) - f_y``) -> ``LogisticRegression(solver="lbfgs" | "saga",
  fit_intercept=False)``: multinomial for m > 2, penalty ``1/2 ||W||_F^2`` over all m rows, so
  its objective is exactly ``P/lambda`` with ``C_sk = C``.
* ``svm_multi`` at gamma = 0 (``max_j {1[j != y] + f_j - f_y}``, Crammer-Singer) ->
  ``LinearSVC(multi_class="crammer_singer", fit_intercept=False)`` = liblinear ``-s 4``, whose
  primal is ``1/2 sum_m ||w_m||^2 + C sum_i max_m (e_i^m + w_m x_i - w_{y_i} x_i)``: ``C_sk = C``.
* ``svm_ova`` at gamma = 0 (``sum_c max{0, 1 - yt_c f_c}``, ``yt_c = +1`` iff ``c = y``) ->
  ``LinearSVC(loss="hinge", dual=True, fit_intercept=False)`` = liblinear ``-s 3``, one-vs-rest:
  class c solves ``1/2 ||w_c||^2 + C_sk sum_i max{0, 1 - yt_ic w_c x_i}``; summed over c this
  is ``1/2 ||W||^2 + C_sk sum_i L_i``: ``C_sk = C``.
* ``lr_ova`` (``sum_c log(1 + exp(-yt_c f_c))``) -> ``LogisticRegression(solver="liblinear",
  dual=True, fit_intercept=False)`` = liblinear ``-s 7`` on each class vs the rest, summed as
  above: ``C_sk = C``.  scikit-learn >= 1.8 refuses multiclass targets for liblinear, so the
  m binary fits run in an explicit loop (what liblinear's own one-vs-rest does; the extra cost
  is scikit-learn's per-fit input conversion, O(n d) per class) and their times are summed.

So ``C_sk = C`` for every pair; ``tests/test_bench_peers.py`` checks it twice: sklearn's
objective written out at a random W equals ``P(W)/lambda``, and sklearn's solution at a tight
tolerance has our primal within 1e-4 of our certified optimum.  Every primal in this module
is OUR ``P(W)`` (``solvers.sdca.evaluate_objective``) on the peer's ``coef_.T`` (d x m).

Reference optimum
-----------------
Our SDCA runs to a relative duality gap ``cert_eps`` (default 1e-7, ``tol`` / 10^4) or its budget
(``cert_epochs`` / ``cert_seconds``).  ``P_star_ours`` = our best primal on that trace; the
reference ``P_ref`` is the smallest primal seen from any solver (normally ``P_star_ours``;
a peer can only improve it), and ``cert_gap = (P_ref - D_best)/|P_ref|`` with ``D_best`` our
best dual certifies it: the optimum lies in ``[D_best, P_ref]``.  Relative suboptimality is
``(P - P_ref)/|P_ref|``; it is meaningful at ``tol`` only if ``cert_gap`` is well below ``tol``
(rows carry ``cert_gap`` and the CLI warns otherwise).

Timing protocol
---------------
Ours is timed on the trace of a plain ``fit(..., eps=tol)`` (certificates included); every
scikit-learn solver is refitted from scratch at growing iteration budgets (it reports no
iterates) and the smallest budget within ``tol`` is reported (:func:`_escalate`); all on one
core.  The full protocol is in ``docs/performance.md`` (Peers).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from topkbench.bench.common import saved_figure
from topkbench.errors import ConfigError

logger = logging.getLogger(__name__)

PEER_TOL = 1e-12  # solver tolerance when the budget is max_iter: only the budget stops it
CS_MAX_ITER = 100_000  # liblinear's fixed iteration cap of -s 4 in scikit-learn


@dataclass(frozen=True)
class PeerSpec:
    """One scikit-learn solver of the same objective as our ``method``."""

    key: str
    method: str  # our method (registry name)
    label: str  # display name
    budget_kind: str  # "max_iter" or "tol"
    max_level: float  # largest budget level (max_iter 2**level, tol 10**(-level/2))
    liblinear: str = ""  # liblinear solver, e.g. "-s 4"

    def budget(self, level: float) -> float:
        if self.budget_kind == "max_iter":
            return float(max(1, round(2.0**level)))
        return 10.0 ** (-level / 2.0)

    def budget_text(self, budget: float) -> str:
        return f"max_iter {int(budget)}" if self.budget_kind == "max_iter" else f"tol {budget:.0e}"


PEERS: dict[str, tuple[PeerSpec, ...]] = {
    "lr_multi": (
        PeerSpec("lbfgs", "lr_multi", "sklearn LogisticRegression lbfgs", "max_iter", 15),
        PeerSpec("saga", "lr_multi", "sklearn LogisticRegression saga", "max_iter", 15),
    ),
    "svm_multi": (
        PeerSpec(
            "crammer_singer", "svm_multi", "sklearn LinearSVC crammer_singer", "tol", 24, "-s 4"
        ),
    ),
    "svm_ova": (
        PeerSpec("linearsvc_hinge", "svm_ova", "sklearn LinearSVC hinge", "max_iter", 17, "-s 3"),
    ),
    "lr_ova": (
        PeerSpec(
            "liblinear_lr", "lr_ova", "sklearn LogisticRegression liblinear", "max_iter", 17, "-s 7"
        ),
    ),
}
OURS_LABEL = "topkbench SDCA"
CERT_LABEL = "topkbench SDCA (certification run)"


def sklearn_C(method: str, C: float) -> float:
    """scikit-learn's ``C`` for our ``C = 1/(lambda n)``: both objectives are ``P/lambda =
    1/2 ||W||^2 + C sum_i L_i`` (module docstring), so it is ``C`` for every pair."""
    if method not in PEERS:
        raise ConfigError(f"no scikit-learn peer for {method!r}; peers exist for {_names()}")
    return float(C)


def _names() -> str:
    return ", ".join(PEERS)


def require_sklearn():
    """Import scikit-learn and threadpoolctl (optional dependencies) or raise ConfigError."""
    try:
        import sklearn  # noqa: F401
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise ConfigError(
            "bench peers needs scikit-learn (an optional dependency), which is not installed",
            hint="pip install 'scikit-learn>=1.4'   (or: pip install -e '.[test]')",
        ) from None
    return threadpool_limits


@dataclass
class PeerBenchRow:
    method: str  # our loss (the objective both sides minimize)
    solver: str
    liblinear: str
    C: float  # ours, C = 1/(lambda n)
    C_sklearn: float
    budget_kind: str  # "epochs" (ours), "max_iter" or "tol"
    reached: bool  # a point within tol of P_ref was found
    seconds: float  # wall time of that point (or of the best point when not reached)
    rel_subopt: float  # (P - P_ref)/|P_ref| at that point
    iterations: int  # epochs (ours) or the solver's n_iter_ at that point
    budget: float  # epochs run (ours), max_iter or tol of the reported fit
    fits: int  # fits run (1 for ours)
    total_seconds: float  # all fits (or the whole certification run)
    ratio_to_ours: float  # seconds / ours' seconds; NaN unless both reached
    convergence_warnings: int
    certified_seconds: float  # ours: first relative duality gap <= tol (NaN for peers)
    P_star_ours: float
    P_ref: float
    D_best: float
    cert_gap: float  # (P_ref - D_best)/|P_ref|
    n: int
    d: int
    m: int
    tol: float


@dataclass
class PeerTracePoint:
    method: str
    solver: str
    budget: float  # epoch (ours), max_iter or tol
    seconds: float
    primal: float  # P(W) scale
    rel_subopt: float  # relative to P_ref (filled in at the end)
    iterations: int


def primal_value(
    X: NDArray[np.float64],
    y: NDArray[np.int64],
    W: NDArray[np.float64],
    method: str,
    C: float,
    A0: NDArray[np.float64] | None = None,
) -> float:
    """Our ``P(W)`` (DESIGN §2, gamma = 0, k = 1) of a d x m ``W``; ``A0`` an n x m zero
    buffer to reuse (the dual value computed alongside is discarded)."""
    from topkbench.losses.registry import get_method
    from topkbench.solvers.problem import evaluate_objective

    if A0 is None:
        A0 = np.zeros((X.shape[0], W.shape[1]))
    W = np.ascontiguousarray(W, dtype=np.float64)
    return float(evaluate_objective(X, y, A0, W, get_method(method).loss_id, C, 0.0, 1)[0])


def peer_fit(spec: PeerSpec, X, y, m: int, C: float, budget: float, seed: int = 0):
    """Fit ``spec`` from scratch at ``budget``; returns (W d x m, seconds, n_iter, warnings).

    Only the scikit-learn calls are timed.  ``n_iter`` is the solver's ``n_iter_`` (the
    maximum over the m binary fits for ``lr_ova``)."""
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    Csk = sklearn_C(spec.method, C)
    if spec.budget_kind == "max_iter":
        common = {"C": Csk, "fit_intercept": False, "tol": PEER_TOL, "max_iter": int(budget)}
    else:
        common = {"C": Csk, "fit_intercept": False, "tol": float(budget)}
    if spec.key in ("lbfgs", "saga"):
        extra = {"random_state": seed} if spec.key == "saga" else {}
        estimators = [LogisticRegression(solver=spec.key, **common, **extra)]
    elif spec.key == "crammer_singer":
        estimators = [LinearSVC(multi_class="crammer_singer", random_state=seed, **common)]
    elif spec.key == "linearsvc_hinge":
        estimators = [LinearSVC(loss="hinge", dual=True, random_state=seed, **common)]
    elif spec.key == "liblinear_lr":
        estimators = [
            LogisticRegression(solver="liblinear", dual=True, random_state=seed, **common)
            for _ in range(m)
        ]
    else:  # pragma: no cover - PEERS is closed
        raise ConfigError(f"unknown peer {spec.key!r}")
    targets = [y] if len(estimators) == 1 else [(y == c).astype(np.int64) for c in range(m)]
    seconds = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkConvergenceWarning)
        for est, target in zip(estimators, targets, strict=True):
            t0 = time.perf_counter()
            est.fit(X, target)
            seconds += time.perf_counter() - t0
    n_warn = sum(issubclass(w.category, SkConvergenceWarning) for w in caught)
    for w in caught:
        if not issubclass(w.category, SkConvergenceWarning):
            logger.debug("%s: %s", spec.label, w.message)
    # binary liblinear: coef_ (1 x d) is the weight of class 1 = "c vs rest"
    W = np.vstack([est.coef_ for est in estimators]).T
    if W.shape != (X.shape[1], m):
        raise ConfigError(f"{spec.label} returned coef_ of shape {W.T.shape}; expected {(m, -1)}")
    n_iter = int(max(np.max(np.atleast_1d(est.n_iter_)) for est in estimators))
    return W, seconds, n_iter, n_warn


def _escalate(spec, evaluate, target, peer_seconds, refine):
    """The budget protocol of the module docstring; ``evaluate(budget)`` fits and returns
    ``(seconds, primal, n_iter, n_warnings)``.  Returns (points, hit index or None)."""
    points: list[tuple[float, float, float, int, int]] = []  # budget, s, P, n_iter, warnings

    def run(level):
        b = spec.budget(level)
        points.append((b, *evaluate(b)))
        return points[-1]

    level, hit, miss_level = 0.0, None, None
    while level <= spec.max_level:
        b, s, P, it, _ = run(level)
        if P <= target:
            hit = len(points) - 1
            break
        miss_level = level
        own_stop = spec.budget_kind == "max_iter" and it < b
        capped = spec.budget_kind == "tol" and it >= CS_MAX_ITER
        if own_stop or capped or s > peer_seconds / 2:
            break
        level += 1.0
    if hit is not None and miss_level is not None:
        lo, hi = miss_level, level
        for _ in range(refine):
            mid = 0.5 * (lo + hi)
            if spec.budget(mid) in (spec.budget(lo), spec.budget(hi)):
                break
            b, s, P, it, _ = run(mid)
            if P <= target:
                hi, hit = mid, len(points) - 1
            else:
                lo = mid
    return points, hit


def _summary_point(
    pts: list[PeerTracePoint], tol: float, smallest_first: bool
) -> tuple[PeerTracePoint | None, PeerTracePoint]:
    """(first point within ``tol``, the point to report): the hit at the smallest budget
    (``smallest_first``; the largest budget for a tol budget), else the lowest primal."""
    hits = [p for p in pts if p.rel_subopt <= tol]
    hit = None
    if hits:
        hit = min(hits, key=lambda p: p.budget if smallest_first else -p.budget)
    return hit, hit or min(pts, key=lambda p: p.primal)


def bench_peers(
    n: int = 20_000,
    d: int = 128,
    m: int = 100,
    C: float = 0.1,
    seed: int = 0,
    tol: float = 1e-3,
    methods: tuple[str, ...] | None = None,
    separation: float = 0.5,
    cert_eps: float = 1e-7,
    cert_epochs: int = 10_000,
    cert_seconds: float = 300.0,
    peer_seconds: float = 300.0,
    refine: int = 3,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[PeerBenchRow], list[PeerTracePoint]]:
    """Time to a ``tol``-relative primal for our SDCA and its scikit-learn peers (module
    docstring) on ``make_gaussian_problem(n, d, m, seed, separation)`` at ``C = 1/(lambda n)``
    (the defaults are the problem of ``bench sdca``'s time-to-eps study: overlapping classes,
    C = 0.1).

    ``methods`` selects among ``PEERS`` (default all four); ``cert_*`` bound our certification
    run, ``peer_seconds`` and ``refine`` the peers' budget escalation.  Returns one summary
    row per solver and the (time, primal) points behind them (our trace, every sklearn fit).
    """
    from topkbench.api import fit
    from topkbench.bench.common import make_gaussian_problem
    from topkbench.losses.registry import get_method
    from topkbench.validation import check_int, check_positive

    threadpool_limits = require_sklearn()
    n, d, m = check_int("n", n, 1), check_int("d", d, 1), check_int("m", m, 3)
    C = check_positive("C", C)
    tol = check_positive("tol", tol, upper=1.0)
    cert_eps = check_positive("cert_eps", cert_eps, upper=1.0)
    cert_epochs = check_int("cert_epochs", cert_epochs, 1)
    cert_seconds = check_positive("cert_seconds", cert_seconds)
    peer_seconds = check_positive("peer_seconds", peer_seconds)
    refine = check_int("refine", refine, 0)
    limits = {"cert_eps": cert_eps, "cert_epochs": cert_epochs, "cert_seconds": cert_seconds,
              "peer_seconds": peer_seconds, "refine": refine}  # fmt: skip
    names = []
    for name in methods or tuple(PEERS):
        key = get_method(name).name
        if key not in PEERS:
            raise ConfigError(
                f"bench peers: {name!r} has no scikit-learn peer. Available methods are: "
                + _names()
            )
        names.append(key)
    say = progress or (lambda msg: None)
    X, y = make_gaussian_problem(n, d, m, seed, separation)
    if np.bincount(y, minlength=m).min() == 0:
        raise ConfigError(
            f"bench peers: some of the m = {m} classes have no example among n = {n}; "
            "scikit-learn would fit fewer classes (use n >> m)"
        )
    rows: list[PeerBenchRow] = []
    points: list[PeerTracePoint] = []
    with threadpool_limits(1):
        # compile (or load from numba's cache) the kernels used below; untimed
        Xs, ys = make_gaussian_problem(20, 3, 4, seed)
        for name in names:
            fit(Xs, ys, name, C=C, max_epochs=2, warn=False)
            primal_value(Xs, ys, np.zeros((3, 4)), name, C)
        A0 = np.zeros((n, m))
        for name in names:
            got_rows, got_points = _bench_method(name, X, y, C, seed, tol, limits, A0, say)
            rows += got_rows
            points += got_points
    return rows, points


def _bench_method(name, X, y, C, seed, tol, limits, A0, say):
    """One method of :func:`bench_peers`: our certification and timed runs, each peer's
    escalating fits, and their summary rows and trace points.  ``limits``: ``cert_eps``,
    ``cert_epochs``, ``cert_seconds``, ``peer_seconds`` and ``refine``."""
    from topkbench.api import fit

    cert_eps, cert_epochs, cert_seconds, peer_seconds, refine = (
        limits[k] for k in ("cert_eps", "cert_epochs", "cert_seconds", "peer_seconds", "refine")
    )
    n, d = X.shape
    m = A0.shape[1]
    rows: list[PeerBenchRow] = []
    points: list[PeerTracePoint] = []
    say(f"{name}: {OURS_LABEL} to relative gap {cert_eps:g}")
    model = fit(
        X,
        y,
        name,
        C=C,
        eps=cert_eps,
        max_epochs=cert_epochs,
        time_limit=cert_seconds,
        seed=seed,
        warn=False,
    )
    say(
        f"{name}: {model.status} after {model.epochs} epochs, {model.train_seconds:.2f}"
        f" s, relative gap {model.relative_gap:.2e}; timed run to eps = {tol:g}"
    )
    timed = fit(X, y, name, C=C, eps=tol, max_epochs=cert_epochs,
                time_limit=cert_seconds, seed=seed, warn=False)  # fmt: skip
    both = model.trace + timed.trace
    P_ours = min(tp.primal for tp in both)
    D_best = max(tp.dual for tp in both)
    target = P_ours + tol * abs(P_ours)
    peer_runs = []
    for spec in PEERS[name]:

        def evaluate(budget, spec=spec, name=name):
            W, s, it, nw = peer_fit(spec, X, y, m, C, budget, seed)
            P = primal_value(X, y, W, name, C, A0)
            logger.debug("%s %s: %.3f s, P = %.10g", spec.label, spec.budget_text(budget), s, P)
            return s, P, it, nw

        pts, hit = _escalate(spec, evaluate, target, peer_seconds, refine)
        say(
            f"{name}: {spec.label}: {len(pts)} fits, "
            + ("reached" if hit is not None else "did not reach")
            + f" P <= {target:.10g}"
        )
        peer_runs.append((spec, (pts, hit)))
    # the reference optimum: the best primal anyone reached (D_best certifies it)
    P_ref = min([P_ours] + [p[2] for _, (pts, _) in peer_runs for p in pts])
    if P_ref < D_best - 1e-9 * abs(D_best):
        logger.warning(
            "%s: a primal (%.12g) is below our certified dual (%.12g): the objectives "
            "differ (C mapping?)",
            name,
            P_ref,
            D_best,
        )
    scale = abs(P_ref) if P_ref != 0 else 1.0
    common = {
        "method": name,
        "C": C,
        "C_sklearn": sklearn_C(name, C),
        "P_star_ours": P_ours,
        "P_ref": P_ref,
        "D_best": D_best,
        "cert_gap": (P_ref - D_best) / scale,
        "n": n,
        "d": d,
        "m": m,
        "tol": tol,
    }
    mine = _our_points(name, OURS_LABEL, timed.trace, P_ref, scale)
    hit, best = _summary_point(mine, tol, smallest_first=True)
    ours = PeerBenchRow(
        solver=OURS_LABEL,
        liblinear="",
        budget_kind="epochs",
        reached=hit is not None,
        seconds=best.seconds,
        rel_subopt=best.rel_subopt,
        iterations=best.iterations,
        budget=float(timed.epochs),
        fits=1,
        total_seconds=timed.train_seconds,
        ratio_to_ours=1.0 if hit is not None else math.nan,
        convergence_warnings=0,
        certified_seconds=next(
            (tp.seconds for tp in timed.trace if tp.relative_gap <= tol), math.nan
        ),
        **common,
    )
    rows.append(ours)
    points += mine
    points += _our_points(name, CERT_LABEL, model.trace, P_ref, scale)
    peer_rows, peer_points = _peer_rows(name, peer_runs, ours, P_ref, scale, tol, common)
    return rows + peer_rows, points + peer_points


def _peer_rows(name, peer_runs, ours, P_ref, scale, tol, common):
    """The summary row and trace points of each peer of ``name`` (:func:`_bench_method`)."""
    rows: list[PeerBenchRow] = []
    points: list[PeerTracePoint] = []
    for spec, (pts, _) in peer_runs:
        ppts = [
            PeerTracePoint(name, spec.label, b, s, P, (P - P_ref) / scale, it)
            for b, s, P, it, _ in pts
        ]
        smallest_first = spec.budget_kind == "max_iter"
        hit, best = _summary_point(ppts, tol, smallest_first)
        rows.append(
            PeerBenchRow(
                solver=spec.label,
                liblinear=spec.liblinear,
                budget_kind=spec.budget_kind,
                reached=hit is not None,
                seconds=best.seconds,
                rel_subopt=best.rel_subopt,
                iterations=best.iterations,
                budget=best.budget,
                fits=len(ppts),
                total_seconds=sum(p.seconds for p in ppts),
                ratio_to_ours=(
                    best.seconds / ours.seconds
                    if hit and ours.reached and ours.seconds > 0
                    else math.nan  # W = 0 already within tol: no ratio
                ),
                convergence_warnings=sum(w for *_, w in pts),
                certified_seconds=math.nan,
                **common,
            )
        )
        points += ppts
    return rows, points


def _our_points(method: str, label: str, trace, P_ref: float, scale: float):
    """Our SDCA trace as PeerTracePoints (budget and iterations are the epoch)."""
    return [
        PeerTracePoint(
            method, label, tp.epoch, tp.seconds, tp.primal, (tp.primal - P_ref) / scale, tp.epoch
        )  # fmt: skip
        for tp in trace
    ]


def plot_peers(points: list[PeerTracePoint], path, tol: float, title: str) -> None:
    """One log-log panel per method: relative suboptimality (P - P_ref)/|P_ref| against wall
    seconds, a line per solver (our trace; one marker per scikit-learn fit, by iterations),
    the tolerance dashed.  Points at or below zero (the reference itself) are left out."""
    methods = list(dict.fromkeys(p.method for p in points))
    cols = min(2, len(methods))
    rows = (len(methods) + cols - 1) // cols
    size = (6.0 * cols, 4.3 * rows)
    with saved_figure(path, rows, cols, figsize=size, squeeze=False) as (fig, axes):
        for ax, method in zip(axes.flat, methods, strict=False):
            for solver in dict.fromkeys(p.solver for p in points if p.method == method):
                pts = [p for p in points if p.method == method and p.solver == solver]
                if solver not in (
                    OURS_LABEL,
                    CERT_LABEL,
                ):  # fits in budget order (refinement fits come last)
                    pts.sort(key=lambda p: p.iterations)
                pts = [p for p in pts if p.rel_subopt > 0 and p.seconds > 0]
                style = {OURS_LABEL: "-", CERT_LABEL: ":"}.get(solver, "o-")
                ax.loglog([p.seconds for p in pts], [p.rel_subopt for p in pts], style,
                          label=solver, markersize=3)  # fmt: skip
            ax.axhline(tol, color="gray", linestyle="--", linewidth=1, label=f"tol = {tol:g}")
            ax.set_title(method)
            ax.set_xlabel("wall seconds (one core)")
            ax.set_ylabel("(P - P_ref) / |P_ref|")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(methods) :]:
            ax.set_visible(False)
        fig.suptitle(title)


__all__ = [
    "PEERS",
    "PeerBenchRow",
    "PeerSpec",
    "PeerTracePoint",
    "bench_peers",
    "peer_fit",
    "plot_peers",
    "primal_value",
    "require_sklearn",
    "sklearn_C",
]
