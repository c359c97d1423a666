"""``topkbench bench sdca`` (measured, not asserted): epoch speed and time to a certified gap.

The SDCA benchmark builds a seeded synthetic problem (Gaussian class means plus unit noise),
compiles the kernels on a tiny problem first (as benchopt does), then times single epochs of the
numba kernel (no duality-gap evaluation inside the timing) and reports seconds per epoch and
GFLOP/s against the ~4 n d m flops an epoch must do (scores W^T x_i and the rank-1 update of W,
2 n d m multiply-adds each).  The machine's peak is measured, not looked up: single-thread BLAS
dgemm (:func:`measure_peak_gflops`); each loss's epoch is reported as a multiple of the time
4 n d m flops take at that peak.  On a shared (virtual) machine
the attainable speed drifts by tens of percent within a minute, so the peak is measured again
right before each loss's epochs; the bound uses the highest of these measurements (the
conservative choice: the machine did reach it), and each row also keeps the peak measured next
to it (``peak_gflops_here``), so that a slow phase of the machine can be told apart from a slow
kernel.

Its second part (:func:`bench_sdca_convergence`, TPAMI 002 Fig. 3b) runs the full solver
(epochs, W resynchronization and the gap certificate every epoch) to a relative gap eps on a
problem with overlapping classes and records, per epoch, the relative gap and the top-1
accuracy on a held-out set against wall time (validation scoring excluded from the clock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from topkbench.bench.common import (
    check_sdca_methods,
    check_sdca_problem,
    make_delicious_problem,
    make_gaussian_problem,
    measure_peak_gflops,
    method_label,
    saved_figure,
)
from topkbench.errors import ConfigError
from topkbench.losses.registry import get_method

# (method, gamma, k): the losses whose epoch cost the issues set targets for, and the top-k ones
DEFAULT_SDCA_METHODS: tuple[tuple[str, float, int], ...] = (
    ("svm_multi", 0.0, 1),
    ("svm_multi", 1.0, 1),
    ("lr_multi", 0.0, 1),
    ("svm_ova", 0.0, 1),
    ("lr_ova", 0.0, 1),
    ("topk_svm_alpha_pseudo", 0.0, 5),
    ("topk_svm_alpha", 0.0, 5),
    ("topk_svm_alpha", 1.0, 5),
    ("topk_svm_beta", 0.0, 5),
    ("topk_ent", 0.0, 5),
)


@dataclass(frozen=True)
class BenchShape:
    """A problem shape of ``bench sdca``: its generator, default size and losses."""

    n: int
    d: int
    m: int
    methods: tuple[tuple[str, float, int], ...]
    about: str
    multilabel: bool = False  # label sets (make_delicious_problem) rather than one class


SDCA_SHAPES: dict[str, BenchShape] = {
    "gaussian": BenchShape(
        20_000, 128, 100, DEFAULT_SDCA_METHODS, "dense Gaussian class means plus unit noise"
    ),  # fmt: skip
    # TPAMI Table 5's ALOI: 108,000 x 128, m = 1,000 (the epoch cost does not depend on n
    # beyond proportion, so the default n keeps the run short)
    "aloi": BenchShape(
        20_000,
        128,
        1000,
        (
            ("topk_svm_alpha_pseudo", 0.0, 5),
            ("topk_svm_alpha", 0.0, 5),
            ("svm_multi", 0.0, 1),
            ("lr_multi", 0.0, 1),
        ),
        "ALOI-shaped: dense Gaussian, d = 128, m = 1,000",
    ),  # fmt: skip
    # TPAMI Table 7's delicious: 12,920 x 500 binary sparse, m = 983
    "delicious": BenchShape(
        11_628,
        500,
        983,
        (("svm_ml", 1.0, 1), ("svm_ml", 0.0, 1), ("lr_ml", 0.0, 1)),
        "delicious-shaped: binary CSR multilabel",
        multilabel=True,
    ),  # fmt: skip
}


def _real_problem(cfg, seed: int):
    """The training split of the registered dataset ``cfg``, and the shape whose default
    methods it takes (the delicious shape's for a multilabel set, else the ALOI shape's),
    sized as the data."""
    from dataclasses import replace

    from topkbench.data.cache import load_dataset_cached
    from topkbench.training_data import ranking_rows

    ds = load_dataset_cached(cfg, seed)
    X, y = ds.splits["train"]
    if ds.multilabel:
        y = sp.csr_matrix(y)
        keep = np.flatnonzero(ranking_rows(y, ds.n_classes))
        X, y = X[keep], y[keep]  # the examples fit trains on
    base = SDCA_SHAPES["delicious" if ds.multilabel else "aloi"]
    about = f"{ds.name}: the real training split"
    return X, y, replace(base, n=X.shape[0], d=X.shape[1], m=ds.n_classes, about=about)


def shape_size(shape: str, n: int | None, d: int | None, m: int | None) -> tuple[int, int, int]:
    """``(n, d, m)`` of a ``bench sdca`` shape, each None replaced by the shape's default;
    an unknown shape is refused with the known ones."""
    if shape not in SDCA_SHAPES:
        known = ", ".join(SDCA_SHAPES)
        raise ConfigError(f"bench sdca: shape must be one of {known}; got {shape!r}")
    spec = SDCA_SHAPES[shape]
    return (spec.n if n is None else n), (spec.d if d is None else d), (spec.m if m is None else m)


@dataclass
class SDCABenchRow:
    method: str
    gamma: float
    k: int
    n: int
    d: int
    m: int
    C: float
    epochs_timed: int
    sec_per_epoch: float
    sec_per_epoch_min: float
    gflops: float
    gap_after: float
    peak_gflops: float  # single-core dgemm peak: the highest measurement of the run
    times_bound: float  # sec_per_epoch / (4 nnz m flops at peak_gflops)
    peak_gflops_here: float  # the peak measured right before this loss's epochs
    shape: str = "gaussian"
    nnz: int = 0  # stored feature entries (n d when dense)
    # median duality-gap certificate after an epoch, W = X^T A's resynchronization included
    sec_per_certificate: float = math.nan
    precision: str = "float64"  # of the epochs' passes over W: float64, float32 or mixed


def _precision(single_epochs: int, epochs: int) -> str:
    """How the timed epochs ran: all in float32, none, or some of each."""
    return "float32" if single_epochs == epochs else "float64" if not single_epochs else "mixed"


def bench_sdca(
    n: int | None = None,
    d: int | None = None,
    m: int | None = None,
    methods: tuple[tuple[str, float, int], ...] | None = None,
    epochs: int = 5,
    C: float = 1.0,
    seed: int = 0,
    peak_gflops: float | None = None,
    shape: str = "gaussian",
    float32: bool = False,
    dataset=None,
) -> list[SDCABenchRow]:
    """Seconds per epoch of each loss in ``methods`` on the problem ``shape`` (a key of
    :data:`SDCA_SHAPES`; ``n``, ``d``, ``m`` override its size), against ``4 nnz m`` flops
    at the measured peak (``nnz = n d`` for dense features): the scores ``W^T x_i`` and the
    update of W each take ``nnz_i m`` multiply-adds an example.  Each row also has the median
    seconds of the duality-gap certificate that follows an epoch.  ``float32``: the features
    are stored as float32 (a dataset's ``float32: true``), and the epochs' passes over W run
    in float32 (each row's ``precision`` says whether all timed epochs did); the bound stays
    the float64 one.  ``dataset`` (a :class:`~topkbench.config.DatasetConfig`) times the
    training split of a real dataset instead (``shape`` is then its name; default methods:
    the delicious shape's for a multilabel set, the ALOI shape's otherwise)."""
    from topkbench.solvers.sdca import solve_sdca

    if dataset is not None:
        X, y, spec = _real_problem(dataset, seed)
        n, d, m = X.shape[0], X.shape[1], spec.m
    else:
        n, d, m = shape_size(shape, n, d, m)
        spec = SDCA_SHAPES[shape]
    check_sdca_problem(n, d, m, C)
    if epochs < 1:
        raise ConfigError(f"bench sdca: epochs must be >= 1; got {epochs}")
    if methods is None:
        methods = spec.methods
    check_sdca_methods(methods, m, "bench sdca")
    multilabel = spec.multilabel
    for name, gamma, k in methods:
        if (get_method(name).task == "multilabel") != multilabel:
            raise ConfigError(
                f"bench sdca: {method_label(name, gamma, k)} is a "
                f"{get_method(name).task} loss; the {shape} shape is "
                f"{'multilabel' if multilabel else 'multiclass'}"
            )
    if dataset is not None:  # compiled on its own first rows: the same dtypes and format
        Xs, ys, ms = X[:40], y[:40], m
    elif multilabel:
        X, y = make_delicious_problem(n, d, m, seed)
        Xs, ys, ms = *make_delicious_problem(20, 5, 4, seed), 4
    else:
        X, y = make_gaussian_problem(n, d, m, seed)
        Xs, ys, ms = *make_gaussian_problem(20, 3, 4, seed), 4
    nnz = int(X.nnz) if sp.issparse(X) else n * d
    if float32:
        X, Xs = X.astype(np.float32), Xs.astype(np.float32)

    def run(Xr, yr, mr, name, gamma, k, n_epochs, on_batch=None):
        # full epochs (no shrinking), one certificate after each, timed without it
        return solve_sdca(Xr, yr, n_classes=mr, loss_id=get_method(name).loss_id, C=C,
                          gamma=gamma, k=k, eps=1e-300, max_epochs=n_epochs, eval_every=1,
                          seed=seed, shrink=False, warn=False, accelerate="never",
                          on_batch=on_batch)  # fmt: skip

    # compile on a tiny problem of the same dtypes
    for name, gamma, _ in methods:
        run(Xs, ys, ms, name, gamma, 2, 1)
    rows = []
    flops = 4.0 * nnz * m
    for name, gamma, k in methods:
        times: list[float] = []
        here = measure_peak_gflops() if peak_gflops is None else peak_gflops
        res = run(X, y, m, name, gamma, k, epochs, lambda _, sec, out=times: out.append(sec))
        med = float(np.median(times))
        # the trace's clock runs over epochs and certificates (one at epoch 0, at time 0);
        # from the second epoch on, consecutive points differ by one epoch and one
        # certificate (with the resynchronization of W = X^T A)
        clock = [p.seconds for p in res.trace]
        certs = [clock[e] - clock[e - 1] - times[e - 1] for e in range(2, len(clock))]
        rows.append(
            SDCABenchRow(
                name,
                gamma,
                k,
                n,
                d,
                m,
                C,
                epochs,
                med,
                float(min(times)),
                flops / med / 1e9,
                res.relative_gap,
                here,
                math.nan,
                here,
                shape,
                nnz,
                float(np.median(certs)) if certs else math.nan,
                _precision(res.info.get("float32_epochs", 0), epochs),
            )  # fmt: skip
        )
    peak = max(r.peak_gflops_here for r in rows)
    for r in rows:
        r.peak_gflops = peak
        r.times_bound = r.sec_per_epoch / (flops / (peak * 1e9))
    return rows


@dataclass
class SDCAConvergenceRow:
    method: str
    gamma: float
    k: int
    n: int
    d: int
    m: int
    C: float
    eps: float
    status: str  # "converged", "max_epochs" or "time_limit"
    epochs: int
    seconds: float  # solver wall time (epochs + certificates) until it stopped
    relative_gap: float
    val_top1: float


@dataclass
class SDCACurvePoint:
    label: str
    epoch: int
    seconds: float
    relative_gap: float
    val_top1: float


def bench_sdca_convergence(
    n: int = 20_000,
    d: int = 128,
    m: int = 100,
    methods: tuple[tuple[str, float, int], ...] | None = None,
    C: float = 0.1,
    eps: float = 1e-3,
    max_epochs: int = 200,
    time_limit: float = 120.0,
    separation: float = 0.5,
    n_val: int = 5_000,
    seed: int = 0,
    progress=None,
) -> tuple[list[SDCAConvergenceRow], list[SDCACurvePoint]]:
    """TPAMI 002 Fig. 3b/3c: run each SDCA method to relative gap ``eps`` (or the budget:
    ``max_epochs``, ``time_limit`` seconds) on ``make_gaussian_problem(n + n_val, ...,
    separation)`` split into train and validation; returns the time to ``eps`` and the curves
    (relative gap and validation top-1 against seconds, one point per certificate).  The solver
    runs as ``fit`` does by default: certificates on the ``eval_every="auto"`` schedule, with
    shrinking."""
    import warnings

    from threadpoolctl import threadpool_limits

    from topkbench.errors import ConvergenceWarning
    from topkbench.metrics.topk import topk_accuracy
    from topkbench.solvers.sdca import solve_sdca

    check_sdca_problem(n, d, m, C, eps)
    if methods is None:
        methods = DEFAULT_SDCA_METHODS
    check_sdca_methods(methods, m, "bench sdca")
    Xall, yall = make_gaussian_problem(n + n_val, d, m, seed, separation)
    X, y, Xv, yv = Xall[:n], yall[:n], Xall[n:], yall[n:]
    rows, points = [], []
    for name, gamma, k in methods:
        spec = get_method(name)
        label = method_label(name, gamma, k)
        common = dict(loss_id=spec.loss_id, C=C, gamma=gamma, k=k, seed=seed, warn=False)
        # compile (or load from numba's cache) outside the clock, on a problem where k is
        # valid (k < classes; the kernels do not check it)
        mw = max(4, k + 1)
        solve_sdca(X[:20], y[:20] % mw, n_classes=mw, max_epochs=1, **common)

        accs: list[float] = []

        def score(epoch, A, W, label=label, accs=accs):
            accs.append(topk_accuracy(Xv @ W, yv, (1,))[1] if n_val else np.nan)
            if progress is not None:
                progress(f"{label}: epoch {epoch}")

        # one core, as the epoch timings and the peers (the certificates' BLAS products would
        # otherwise take both cores of the development machine)
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore", ConvergenceWarning)
            res = solve_sdca(
                X, y, n_classes=m, eps=eps, max_epochs=max_epochs, time_limit=time_limit,
                on_eval=score, eval_every="auto", accelerate="auto", **common,
            )  # fmt: skip
        for tp, acc in zip(res.trace, accs, strict=True):
            points.append(SDCACurvePoint(label, tp.epoch, tp.seconds, tp.relative_gap, acc))
        row = (name, gamma, k, n, d, m, C, eps, res.status, res.epochs, res.seconds)
        rows.append(SDCAConvergenceRow(*row, res.relative_gap, accs[-1]))
    return rows, points


def plot_sdca_convergence(points: list[SDCACurvePoint], eps: float, path, title: str) -> None:
    """TPAMI 002 Fig. 3b (relative gap vs time) and 3c (validation top-1 vs time)."""
    with saved_figure(path, 1, 2, figsize=(12, 4.5)) as (fig, (ax_gap, ax_acc)):
        labels = list(dict.fromkeys(p.label for p in points))
        for label in labels:
            pts = [p for p in points if p.label == label]
            t = [p.seconds for p in pts]
            ax_gap.semilogy(t, [max(p.relative_gap, 1e-17) for p in pts], label=label)
            ax_acc.plot(t, [100.0 * p.val_top1 for p in pts], label=label)
        ax_gap.axhline(eps, color="grey", lw=0.8, ls="--")
        ax_gap.set(xlabel="wall time (s)", ylabel="relative duality gap", title="(b) " + title)
        ax_acc.set(xlabel="wall time (s)", ylabel="validation top-1 (%)", title="(c) " + title)
        ax_gap.legend(fontsize=7)
