"""Sweep engine (DESIGN §7-8): C paths with warm starts, selection splits, grid extension, refits.

A sweep is a set of independent *paths*.  A path is one (dataset, draw, table row, fold) walking a
list of C values in ascending order, warm-starting each fit from the previous dual (rescaled by
C_new / C_old, which keeps it feasible).  The fold says which data the path trains on:

* ``val``      — train on the train split, evaluate the val and test splits (selection on val);
* ``cv<i>of<K>`` — train on the other K-1 stratified folds of train, evaluate the held-out fold;
* ``refit``    — train on the whole train split at the C values selected by cross-validation,
  evaluate the test split (DESIGN §7: "refit on the selection split's train part").

Stages (:func:`run_sweep`): (1) every selection path on the base grid; (2) while a column's best
C sits on the grid's boundary, add one more grid point beyond it (at most ``extend`` per side,
DESIGN §7 / TPAMI §6.2); (3) refit paths for cross-validated datasets.  Every finished point is
written atomically to the record store before the next starts, together with a warm-start
checkpoint, so an interrupted sweep loses no finished record and a re-run resumes where it
stopped.  Paths run in parallel through joblib processes (``n_jobs``) or on a Dask cluster
(``scheduler=ADDRESS``; the results directory must then be on a shared filesystem).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from topkbench.config import DatasetConfig, ExperimentConfig, SweepRow
from topkbench.errors import TopkbenchError
from topkbench.store import RecordStore, spec_key

log = logging.getLogger(__name__)

REFIT = "refit"
VAL = "val"
HALF = "half"  # train on one random half of train, validate on the other (Tables 10-12)


def cv_fold_name(i: int, n_folds: int) -> str:
    return f"cv{i}of{n_folds}"


@dataclass(frozen=True)
class PathJob:
    """One path: a dataset, draw, row and fold, and the C values to walk (ascending)."""

    dataset: int  # index into exp.datasets
    draw: int
    row: SweepRow
    fold: str
    C_values: tuple[float, ...]
    init_C: float | None = None  # topk_ent_tr: start from LR^Multi trained at this C
    theta: float | None = None  # RBF rows: the kernel width of this path


@dataclass
class PathSummary:
    row: str
    draw: int
    dataset: str = ""
    fold: str = VAL
    done: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    not_converged: int = 0
    seconds: float = 0.0
    errors: tuple[str, ...] = field(default_factory=tuple)


def record_spec(
    exp: ExperimentConfig,
    ds: DatasetConfig,
    row: SweepRow,
    draw: int,
    fold: str,
    C: float | None,
    init_C: float | None = None,
    theta: float | None = None,
) -> dict[str, Any]:
    """The canonical spec of one record (its hash is the record key)."""
    import topkbench

    spec = {
        "experiment": exp.name,
        "dataset": ds.spec_dict(),
        "draw": draw,
        "data_seed": exp.seed + draw,
        "fold": fold,
        "method": row.method,
        "gamma": float(row.gamma),
        "k": int(row.k),
        "C": None if C is None else float(C),
        "eps": exp.eps,
        "max_epochs": exp.max_epochs,
        "time_limit": exp.time_limit,
        "eval_every": exp.eval_every,
        "version": topkbench.__version__,
    }
    if init_C is not None:
        spec["init_C"] = float(init_C)
    for key, value in row.fit_options().items():  # only rows with such options change keys
        # a string either way, so that records of both kinds share one column type
        spec[key] = ",".join(f"{v:.17g}" for v in value) if isinstance(value, tuple) else value
    if theta is not None:
        spec["kernel"] = "rbf"
        spec["theta"] = float(theta)
    if exp.multilabel:  # records hold the partition metrics on this threshold grid
        spec["delta_grid"] = exp.delta_grid
    return spec


_DATA_CACHE: dict[str, Any] = {}


def cached_dataset(ds: DatasetConfig, seed: int):
    """Load a dataset once per process (paths of one worker share it; parsed files are also
    cached on disk, see :func:`~topkbench.data.dataset.load_dataset_cached`)."""
    from topkbench.data.dataset import load_dataset_cached

    key = spec_key({"d": ds.spec_dict(), "seed": seed})
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_dataset_cached(ds, seed)
    return _DATA_CACHE[key]


@dataclass
class PathData:
    """What a path trains on and evaluates, prepared once per path (not per C).

    ``evals`` maps a split to ``(X, targets, image groups)``; with image groups the targets are
    already the images' label sets (regions checked to agree) and scores are pooled per image.
    For RBF paths ``K_train`` / ``K_evals`` hold the Gram matrices of this theta.
    """

    X: Any
    y: Any
    evals: dict[str, tuple[Any, Any, Any]]
    K_train: np.ndarray | None = None
    K_evals: dict[str, np.ndarray] = field(default_factory=dict)

    def scores(self, model, split: str) -> np.ndarray:
        if self.K_train is not None:
            return model.decision_function(K=self.K_evals[split])
        return model.decision_function(self.evals[split][0])


def _path_data(dataset, fold: str, n_folds: int, seed: int, method: str) -> PathData:
    """The data of a path for a fold name (module docstring).

    Multilabel data: the training targets are what ``method`` trains on (label sets, or the
    primary label for a multiclass method, :func:`topkbench.evaluation.training_targets`) on
    the rows it can use (:func:`topkbench.evaluation.trainable_rows`); the evaluated splits
    always carry the label sets.  Folds of multilabel data are seeded random partitions,
    grouped by image id when the data has several regions per image.
    """
    from topkbench.evaluation import ImageGroups, trainable_rows, training_targets

    Xtr, ytr = dataset.splits["train"]
    ttr = training_targets(dataset, "train", method)
    ids = dataset.image_ids.get("train")
    if fold.startswith("cv") or fold == HALF:
        if fold == HALF:
            i, n_folds = 1, 2
        else:
            i = int(fold[2:].split("of")[0])
        if dataset.multilabel:
            from topkbench.multilabel_selection import group_folds

            folds = group_folds(Xtr.shape[0], n_folds, seed, ids)
        else:
            from topkbench.data.dataset import stratified_folds

            folds = stratified_folds(ytr, n_folds, seed)
        tr, te = np.flatnonzero(folds != i), np.flatnonzero(folds == i)
        evals = {"val": (Xtr[te], ytr[te], None if ids is None else ids[te])}
    else:
        tr = None
        evals = {
            s: (X, Y, dataset.image_ids.get(s))
            for s, (X, Y) in dataset.splits.items()
            if s != "train"
        }
        if fold == REFIT:
            evals = {"test": evals["test"]} if "test" in evals else evals
    if dataset.multilabel:
        labels = ytr if tr is None else ytr[tr]
        keep = trainable_rows(labels, method)
        if keep is not None:
            tr = keep if tr is None else tr[keep]
    X, y = (Xtr, ttr) if tr is None else (Xtr[tr], ttr[tr])
    prepared = {}
    for split, (Xs, Ys, sids) in evals.items():
        if sids is None:
            prepared[split] = (Xs, Ys, None)
        else:
            g = ImageGroups.of(sids)
            prepared[split] = (Xs, g.labels(Ys, sids, f"{dataset.name}:{split}"), g)
    return PathData(X, y, prepared)


def _gram_gb(data: PathData) -> float:
    n = data.X.shape[0]
    return 8.0 * n * (n + sum(X.shape[0] for X, _, _ in data.evals.values())) / 2**30


def run_path(exp: ExperimentConfig, job: PathJob) -> PathSummary:
    """Run (or resume) one path; returns counts."""
    from topkbench.evaluation import multilabel_record
    from topkbench.metrics.multilabel import delta_grid
    from topkbench.metrics.topk import topk_accuracy
    from topkbench.model import fit

    deltas = delta_grid(exp.delta_grid)
    start = time.perf_counter()
    ds = exp.datasets[job.dataset]
    row, draw, fold = job.row, job.draw, job.fold
    store = RecordStore(exp.results_dir, exp.name)
    summary = PathSummary(row=row.row, draw=draw, dataset=ds.name, fold=fold)
    data_seed = exp.seed + draw
    init_C = job.init_C
    theta = job.theta
    path_key = spec_key(record_spec(exp, ds, row, draw, fold, None, init_C, theta))
    data = None
    init_model = None
    ck: tuple[float, np.ndarray] | None = None
    prev_model = None
    errors: list[str] = []
    for C in sorted(job.C_values):
        spec = record_spec(exp, ds, row, draw, fold, C, init_C, theta)
        key = spec_key(spec)
        if store.has(key):
            summary.cached += 1
            prev_model = None
            continue
        if data is None:
            dataset = cached_dataset(ds, data_seed)
            if row.k >= dataset.n_classes:
                summary.skipped = len(job.C_values) - summary.cached
                log.info(
                    "%s on %s: k = %d >= m = %d, skipped",
                    row.row,
                    ds.name,
                    row.k,
                    dataset.n_classes,
                )
                break
            if dataset.multilabel != exp.multilabel:
                summary.failed = len(job.C_values) - summary.cached
                msg = (
                    f"{ds.name} is {'multi' if dataset.multilabel else 'single'}-label data but "
                    f"experiment {exp.name} is a "
                    f"{'multilabel' if exp.multilabel else 'top-k'} protocol"
                )
                errors.append(msg)
                log.error("%s", msg)
                break
            data = _path_data(dataset, fold, exp.folds, data_seed, row.method)
            train_cardinality = _train_cardinality(dataset) if dataset.multilabel else None
            if theta is not None:
                gb = _gram_gb(data)
                if gb > exp.max_gram_gb:
                    summary.failed = len(job.C_values) - summary.cached
                    msg = (
                        f"RBF Gram matrices of {data.X.shape[0]} training examples need "
                        f"{gb:.1f} GB > max_gram_gb = {exp.max_gram_gb:g} (experiment option)"
                    )
                    errors.append(msg)
                    log.error("%s %s %s: %s", ds.name, row.row, fold, msg)
                    break
                from topkbench.gram import rbf_kernel

                data.K_train = rbf_kernel(data.X, theta=theta)
                data.K_evals = {
                    s: rbf_kernel(Xs, data.X, theta=theta) for s, (Xs, _, _) in data.evals.items()
                }
            # the path's checkpoint (its largest finished C), read once per job
            ck = store.load_warm(path_key) if exp.warm_start and init_C is None else None
            if init_C is not None:  # TPAMI §6.2: Ent_tr starts from the selected LR^Multi
                init_model = _init_model(exp, data, init_C, data_seed, dataset.n_classes)
        Xtr, ytr = data.X, data.y
        # warm start from the largest finished C <= C of this path: the previous point of
        # this job, or the checkpoint
        warm = prev_model if exp.warm_start and init_C is None else None
        if ck is not None and ck[0] <= C and ck[1].shape[0] == Xtr.shape[0]:
            if warm is None or ck[0] > warm.params["C"]:
                warm = ck
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = fit(
                    None if data.K_train is not None else Xtr,
                    ytr,
                    row.method,
                    K=data.K_train,
                    check_kernel=False,  # built by rbf_kernel for this path
                    **row.fit_options(),
                    C=C,
                    k=row.k,
                    gamma=row.gamma,
                    eps=exp.eps,
                    max_epochs=exp.max_epochs,
                    time_limit=exp.time_limit,
                    eval_every=exp.eval_every,
                    seed=data_seed,
                    n_classes=dataset.n_classes,
                    warm_start=warm,
                    init=init_model,
                    warn=False,
                )
        except TopkbenchError as exc:
            summary.failed += 1
            errors.append(f"C={C:g}: {exc}")
            log.error("%s %s draw %d %s C=%g failed: %s", ds.name, row.row, draw, fold, C, exc)
            prev_model = None
            continue
        record: dict[str, Any] = {
            **{k: v for k, v in spec.items() if k != "dataset"},
            "dataset": ds.name,
            "row": row.row,
            "status": model.status,
            "primal": model.primal,
            "dual": model.dual,
            "relative_gap": model.relative_gap,
            "epochs": model.epochs,
            "train_seconds": model.train_seconds,
            "warm_started": warm is not None,
            "n_train": int(Xtr.shape[0]),
            "n_features": int(Xtr.shape[1]),
            "n_classes": dataset.n_classes,
        }
        for split, (_, ys, groups) in data.evals.items():
            scores = data.scores(model, split)
            if dataset.multilabel:
                S = scores if groups is None else groups.pool(scores)
                record.update(multilabel_record(split, S, ys, deltas, train_cardinality))
            else:
                ks = [k for k in range(1, dataset.n_classes) if k <= max(exp.ks)]
                for k, v in topk_accuracy(scores, ys, ks).items():
                    record[f"{split}_top{k}"] = v
        if exp.warm_start and init_C is None and (ck is None or C > ck[0]):
            store.save_warm(path_key, C, model.A)
            ck = (C, model.A)
        store.write(key, record)
        summary.done += 1
        summary.not_converged += model.status != "converged"
        prev_model = model
    summary.seconds = time.perf_counter() - start
    summary.errors = tuple(errors)
    return summary


def _train_cardinality(dataset) -> float:
    """Mean number of labels per training image (per row without image ids)."""
    from topkbench.metrics.multilabel import label_cardinality

    _, Y = dataset.splits["train"]
    ids = dataset.image_ids.get("train")
    if ids is not None:
        _, first = np.unique(ids, return_index=True)
        Y = Y[np.sort(first)]
    return label_cardinality(Y)


def _init_model(exp: ExperimentConfig, data, C: float, seed: int, m: int):
    """LR^Multi trained at ``C`` on a path's training data: the start of its Ent_tr fits."""
    from topkbench.model import fit

    Xtr, ytr = data.X, data.y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit(Xtr, ytr, "lr_multi", C=C, eps=exp.eps, max_epochs=exp.max_epochs,
                   time_limit=exp.time_limit, eval_every=exp.eval_every, seed=seed,
                   n_classes=m, warn=False)  # fmt: skip


def _warm_up(methods: set[str], rbf_methods: set[str] = frozenset()) -> None:
    """Compile the kernels once in the parent so that workers load them from the cache."""
    from topkbench.model import fit

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = np.arange(12) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in methods:
            fit(X, y, method, C=1.0, max_epochs=2, warn=False)
            if method in rbf_methods:
                fit(X, y, method, C=1.0, max_epochs=2, warn=False, kernel="rbf", theta=1.0)


# ---------------------------------------------------------------------------------------------
# selection (shared with the report)


def selection_folds(exp: ExperimentConfig, ds_index: int) -> tuple[str, ...]:
    """The folds whose held-out accuracy selects C for a dataset (val split or K CV folds)."""
    mode = exp.selection_for(ds_index)
    if mode == "cv":
        return tuple(cv_fold_name(i, exp.folds) for i in range(exp.folds))
    if mode == HALF:
        return (HALF,)
    return (VAL,)


def mean_validation(records: pd.DataFrame, folds: Iterable[str], ks) -> pd.DataFrame:
    """Per C: the mean over ``folds`` of held-out top-k accuracy (only C values with all folds).

    Records are summed in fold order, so the means do not depend on the order of the store.
    """
    folds = list(folds)
    sel = records[records["fold"].isin(folds)]
    cols = [f"val_top{k}" for k in ks if f"val_top{k}" in sel]
    if sel.empty or not cols:
        return pd.DataFrame(columns=["C", *cols])
    # rows with a k or gamma grid (Kato Table 1) select those too: one point per (C, k, gamma)
    keys = ["C"] + [h for h in ("k", "gamma") if h in sel and sel[h].nunique() > 1]
    sel = sel.sort_values([*keys, "fold"], kind="stable")
    g = sel.groupby(keys)
    agg = g[cols].mean()
    agg = agg[g["fold"].nunique() == len(folds)]
    return agg.reset_index().sort_values(keys, kind="stable")


TIE_TOL = 1e-9  # accuracies are multiples of 1/n: closer means are ties


def best_point(curve: pd.DataFrame, k: int) -> dict[str, float] | None:
    """The point (``C``, and ``k`` / ``gamma`` for rows with such grids) with the best mean
    validation top-k accuracy; ties (within TIE_TOL) go to the smallest C (the strongest
    regularization), then the smallest k, then the smallest gamma."""
    col = f"val_top{k}"
    if curve.empty or col not in curve:
        return None
    keys = [h for h in ("C", "k", "gamma") if h in curve]
    c = curve.sort_values(keys, kind="stable")
    vals = c[col].to_numpy(dtype=float)
    i = int(np.flatnonzero(vals >= np.nanmax(vals) - TIE_TOL)[0])
    return {h: float(c[h].iloc[i]) for h in keys}


def best_C(curve: pd.DataFrame, k: int) -> float | None:
    """The C of :func:`best_point`."""
    p = best_point(curve, k)
    return None if p is None else p["C"]


def point_row(row: SweepRow, point: dict[str, float]) -> SweepRow:
    """The row's variant at a selected point (its own k and gamma when they are fixed)."""
    return dataclasses.replace(
        row, k=int(point.get("k", row.k)), gamma=float(point.get("gamma", row.gamma))
    )


def _grid_step(exp: ExperimentConfig) -> float:
    return float(exp.C_base) ** float(exp.C_step)


def _extension_jobs(
    exp: ExperimentConfig,
    records: pd.DataFrame,
    decided: dict[tuple, set[float]],
    rows: tuple[SweepRow, ...],
    init: dict[tuple, float],
) -> list[PathJob]:
    """One more C beyond each boundary that some column's best C still sits on.

    ``decided`` holds, per (dataset, draw, row), the extension points chosen in earlier rounds;
    each round looks only at the base grid plus those points, so a re-run replays exactly the
    decisions of the first run (and revisits their cached records).
    """
    if exp.extend <= 0 or records.empty or exp.multilabel:
        return []
    step = _grid_step(exp)
    base = np.array(exp.C_values)
    lo0, hi0 = base.min(), base.max()
    jobs = []
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        recs_ds = records[records["dataset"] == ds.name]
        for draw in range(exp.draws):
            for row in rows:
                pts = decided.setdefault((di, draw, row.row), set())
                allowed = np.concatenate([base, sorted(pts)])
                recs = recs_ds[(recs_ds["draw"] == draw) & (recs_ds["row"] == row.row)]
                recs = recs[np.isclose(recs["C"].to_numpy()[:, None], allowed, rtol=1e-12).any(1)]
                curve = mean_validation(recs, folds, exp.ks)
                if curve.empty:
                    continue
                lo, hi = float(curve["C"].min()), float(curve["C"].max())
                new = set()
                for k in exp.ks:
                    b = best_C(curve, k)
                    if b is None:
                        continue
                    if b == hi and math.log(hi / hi0) / math.log(step) < exp.extend - 0.5:
                        new.add(hi * step)
                    if b == lo and math.log(lo0 / lo) / math.log(step) < exp.extend - 0.5:
                        new.add(lo / step)
                new -= pts
                if new:  # one job per path keeps its warm starts sequential (deterministic)
                    pts |= new
                    init_C = init.get((di, draw, row.row))
                    for variant in row.variants():
                        for fold in folds:
                            jobs.append(
                                PathJob(di, draw, variant, fold, tuple(sorted(new)), init_C)
                            )
    return jobs


def _refit_jobs(
    exp: ExperimentConfig, records: pd.DataFrame, init: dict[tuple, float]
) -> list[PathJob]:
    jobs = []
    for di, ds in enumerate(exp.datasets):
        if exp.selection_for(di) not in ("cv", HALF):
            continue
        folds = selection_folds(exp, di)
        recs_ds = records[records["dataset"] == ds.name] if not records.empty else records
        for draw in range(exp.draws):
            for row in exp.rows:
                if recs_ds.empty:
                    continue
                recs = recs_ds[(recs_ds["draw"] == draw) & (recs_ds["row"] == row.row)]
                if exp.multilabel:
                    from topkbench.metrics.multilabel import delta_grid
                    from topkbench.multilabel_selection import refit_points

                    points = refit_points(
                        recs, folds, exp.metrics, delta_grid(exp.delta_grid), exp.threshold_rule
                    )
                    for (theta, k), Cs in sorted(
                        points.items(), key=lambda t: (t[0][0] or 0.0, t[0][1])
                    ):
                        variant = dataclasses.replace(row, k=k)
                        jobs.append(
                            PathJob(di, draw, variant, REFIT, tuple(sorted(Cs)), None, theta)
                        )
                    continue
                curve = mean_validation(recs, folds, exp.ks)
                by_variant: dict[tuple[int, float], set[float]] = {}
                for k in exp.ks:
                    p = best_point(curve, k)
                    if p is not None:
                        v = point_row(row, p)
                        by_variant.setdefault((v.k, v.gamma), set()).add(p["C"])
                init_C = init.get((di, draw, row.row))
                for (kt, g), Cs in sorted(by_variant.items()):
                    variant = dataclasses.replace(row, k=kt, gamma=g)
                    jobs.append(PathJob(di, draw, variant, REFIT, tuple(sorted(Cs)), init_C))
    return jobs


def base_jobs(
    exp: ExperimentConfig,
    rows: tuple[SweepRow, ...] | None = None,
    init: dict[tuple, float] | None = None,
) -> list[PathJob]:
    init = init or {}
    return [
        PathJob(di, draw, variant, fold, exp.C_values, init.get((di, draw, row.row)), theta)
        for di in range(len(exp.datasets))
        for draw in range(exp.draws)
        for row in (exp.rows if rows is None else rows)
        for variant in row.variants()
        for theta in (exp.theta_values if row.kernel == "rbf" else (None,))
        for fold in selection_folds(exp, di)
    ]


def init_row(exp: ExperimentConfig) -> SweepRow | None:
    """The LR^Multi row whose selected model starts the Ent_tr rows (``ent_tr_init:
    selected``), or None (then Ent_tr starts from LR^Multi at its own C)."""
    if exp.ent_tr_init != "selected":
        return None
    return next(
        (r for r in exp.rows if r.method == "lr_multi" and not r.block and r.gamma == 0.0), None
    )


def _init_Cs(exp, records: pd.DataFrame, lr: SweepRow, rows) -> dict[tuple, float]:
    """Per (dataset, draw, Ent_tr row): the C selected for LR^Multi's top-k, k of the row."""
    out = {}
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        for draw in range(exp.draws):
            recs = records[
                (records["dataset"] == ds.name)
                & (records["draw"] == draw)
                & (records["row"] == lr.row)
            ] if not records.empty else records  # fmt: skip
            curve = mean_validation(recs, folds, sorted({*exp.ks, *(r.k for r in rows)}))
            for row in rows:
                C = best_C(curve, row.k)
                if C is None:
                    log.error("%s draw %d: no LR^Multi selection for %s; it starts from "
                              "LR^Multi at its own C", ds.name, draw, row.row)  # fmt: skip
                    continue
                out[(di, draw, row.row)] = C
    return out


def _execute(
    exp: ExperimentConfig,
    jobs: list[PathJob],
    on_path_done: Callable[[PathSummary], None] | None,
) -> list[PathSummary]:
    results: list[PathSummary] = []

    def done(s: PathSummary) -> None:
        results.append(s)
        if on_path_done:
            on_path_done(s)

    if not jobs:
        return results
    if exp.scheduler:
        from distributed import Client, as_completed

        with Client(exp.scheduler) as client:
            futures = client.map(run_path, [exp] * len(jobs), jobs, pure=False)
            for fut in as_completed(futures):
                done(fut.result())
        return results
    if exp.n_jobs == 1 or len(jobs) == 1:
        for job in jobs:
            done(run_path(exp, job))
        return results
    from joblib import Parallel, delayed

    parallel = Parallel(n_jobs=exp.n_jobs, return_as="generator_unordered")
    for s in parallel(delayed(run_path)(exp, job) for job in jobs):
        done(s)
    return results


def run_sweep(
    exp: ExperimentConfig,
    on_path_done: Callable[[PathSummary], None] | None = None,
    on_stage: Callable[[str, int], None] | None = None,
) -> list[PathSummary]:
    """Run every stage of ``exp``: selection paths, grid extensions, refits.

    ``on_stage(name, n_fits)`` announces each stage with the number of fits it holds (for
    progress bars); ``on_path_done`` receives each finished path's counts.
    """
    _warm_up({r.method for r in exp.rows}, {r.method for r in exp.rows if r.kernel == "rbf"})
    from topkbench.data.dataset import load_dataset_cached

    for ds in exp.datasets:  # fail early on bad data, and fill the disk cache once
        if ds.kind in ("libsvm", "mat", "mulan"):
            load_dataset_cached(ds, exp.seed)
    store = RecordStore(exp.results_dir, exp.name)
    lr = init_row(exp)
    dependent = tuple(r for r in exp.rows if lr is not None and r.method == "topk_ent_tr")
    first = tuple(r for r in exp.rows if r not in dependent)
    decided: dict[tuple, set[float]] = {}

    def stage(rows, init, label) -> list[PathSummary]:
        jobs = base_jobs(exp, rows, init)
        if on_stage:
            on_stage(label, sum(len(j.C_values) for j in jobs))
        out = _execute(exp, jobs, on_path_done)
        for _ in range(exp.extend):
            ext = _extension_jobs(exp, store.load(), decided, rows, init)
            if not ext:
                break
            if on_stage:
                on_stage("extend", sum(len(j.C_values) for j in ext))
            out += _execute(exp, ext, on_path_done)
        return out

    results = stage(first, {}, "grid")
    init: dict[tuple, float] = {}
    if dependent:
        # TPAMI §6.2: top-k Ent_tr starts from the selected LR^Multi solution
        init = _init_Cs(exp, store.load(), lr, dependent)
        results += stage(dependent, init, "grid (Ent_tr from selected LR^Multi)")
    refits = _refit_jobs(exp, store.load(), init)
    if refits and on_stage:
        on_stage("refit", sum(len(j.C_values) for j in refits))
    results += _execute(exp, refits, on_path_done)
    return results
