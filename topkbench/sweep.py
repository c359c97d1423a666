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
DESIGN §7 / TPAMI §6.2); (3) certification: a selected fit that stopped on its budget is
continued from its stored dual until eps (:class:`CertifyTask`); (4) refit paths for
cross-validated datasets, walking the C grid with warm starts up to the selected values, and
their certification.  The driver process is the store's one writer (:class:`Driver`): each
finished point is committed with its warm-start checkpoint as it arrives, so an interrupted
sweep loses no finished record and a re-run resumes where it stopped.  Paths run in parallel on
local worker processes (``n_jobs``) or on a Dask cluster (``scheduler=ADDRESS``; workers need
the data files, not the results directory).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from topkbench.config import DatasetConfig, ExperimentConfig, SweepRow
from topkbench.errors import TopkbenchError
from topkbench.store import CheckpointRef, RecordStore, read_checkpoint, spec_key

log = logging.getLogger(__name__)

REFIT = "refit"
VAL = "val"
HALF = "half"  # train on one random half of train, validate on the other (Tables 10-12)
ACCELERATE = "auto"  # fit's SDCA acceleration rule for every sweep fit


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
    digests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The canonical spec of one record; its hash is the record key (DESIGN §8).

    It covers everything that changes the record's numbers: the dataset's options and the
    SHA-256 of every file it reads (``digests``, default: hashed now), the draw, fold and
    protocol, the method with every solver setting, the seed and the code version.  The sweep
    and the report use this one function, so a report reads exactly the records of the
    configuration it names.
    """
    import topkbench
    from topkbench.data.dataset import file_digests

    spec = {
        "experiment": exp.name,
        "dataset": ds.spec_dict(),
        "data_sha256": file_digests(ds) if digests is None else digests,
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
        "accelerate": ACCELERATE,
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


@dataclass(frozen=True)
class PathTask:
    """A path as the driver hands it to a worker: each C with its record key and spec and
    whether the store already holds it, and the path's warm-start checkpoint (its largest
    finished C).  Workers never read or write the store."""

    job: PathJob
    points: tuple[tuple[float, str, dict[str, Any], bool], ...]  # (C, key, spec, cached)
    path_key: str
    checkpoint: CheckpointRef | None = None

    def run(self, exp: ExperimentConfig, emit: Emit) -> PathSummary:
        return run_path(exp, self, emit)


Emit = Callable[[str, dict[str, Any], tuple], None]  # (key, record, checkpoints)


def plan_path(exp: ExperimentConfig, job: PathJob, store: RecordStore, done: set[str]) -> PathTask:
    """The task of ``job`` against the store's finished keys ``done`` (driver side)."""
    ds = exp.datasets[job.dataset]
    points = []
    for C in sorted(job.C_values):
        spec = record_spec(exp, ds, job.row, job.draw, job.fold, C, job.init_C, job.theta)
        key = spec_key(spec)
        points.append((C, key, spec, key in done))
    path_key = spec_key(
        record_spec(exp, ds, job.row, job.draw, job.fold, None, job.init_C, job.theta)
    )
    ck = None
    if exp.warm_start and job.init_C is None and not all(p[3] for p in points):
        ck = store.checkpoint_ref(path_key)
    return PathTask(job, tuple(points), path_key, ck)


def run_path(exp: ExperimentConfig, task: PathTask, emit: Emit) -> PathSummary:
    """Run (or resume) one path, handing each finished record to ``emit``; returns counts.

    Each record goes with its checkpoints: the path's (the dual at its largest finished C, the
    warm start of a resumed path) and, for a fit stopped on the budget, the point's own (from
    which :func:`certify_selected` continues it).
    """
    job = task.job
    start = time.perf_counter()
    ds = exp.datasets[job.dataset]
    row, draw, fold = job.row, job.draw, job.fold
    summary = PathSummary(row=row.row, draw=draw, dataset=ds.name, fold=fold)
    data_seed = exp.seed + draw
    init_C = job.init_C
    ctx = None
    ck = None
    prev_model = None
    errors: list[str] = []
    for C, key, spec, cached in task.points:
        if cached:
            summary.cached += 1
            prev_model = None
            continue
        if ctx is None:
            ctx, msg = _path_context(exp, job, data_seed)
            if msg is not None:
                n_left = len(task.points) - summary.cached
                if msg.startswith("skip:"):
                    summary.skipped = n_left
                    log.info("%s", msg[5:])
                else:
                    summary.failed = n_left
                    errors.append(msg)
                    log.error("%s %s %s: %s", ds.name, row.row, fold, msg)
                break
            ck = read_checkpoint(task.checkpoint) if task.checkpoint is not None else None
        data = ctx.data
        # warm start from the largest finished C <= C of this path: the previous point of
        # this job, or the checkpoint
        warm = prev_model if exp.warm_start and init_C is None else None
        if ck is not None and ck[0] <= C and ck[1].shape[0] == data.X.shape[0]:
            if warm is None or ck[0] > warm.params["C"]:
                warm = ck
        try:
            model = _fit_point(exp, job, ctx, C, data_seed, warm)
        except TopkbenchError as exc:
            summary.failed += 1
            errors.append(f"C={C:g}: {exc}")
            log.error("%s %s draw %d %s C=%g failed: %s", ds.name, row.row, draw, fold, C, exc)
            prev_model = None
            continue
        record = _record(spec, ds, row, ctx, model, warm is not None)
        checkpoints = []
        if exp.warm_start and init_C is None and (ck is None or C > ck[0]):
            checkpoints.append((task.path_key, C, model.A))
            ck = (C, model.A)
        if _certifiable(row, model):
            checkpoints.append((key, C, model.A))
        emit(key, record, tuple(checkpoints))
        summary.done += 1
        summary.not_converged += model.status != "converged"
        prev_model = model
    summary.seconds = time.perf_counter() - start
    summary.errors = tuple(errors)
    return summary


@dataclass
class _Context:
    """What the fits of one path share: its data, the dataset and the Ent_tr start."""

    data: PathData
    dataset: Any
    deltas: Any
    train_cardinality: float | None
    ks_max: int
    init_model: Any = None


def _path_context(exp: ExperimentConfig, job: PathJob, data_seed: int):
    """(context, None), or (None, message): ``"skip: ..."`` when the row does not apply."""
    from topkbench.metrics.multilabel import delta_grid

    ds = exp.datasets[job.dataset]
    dataset = cached_dataset(ds, data_seed)
    row = job.row
    if row.k >= dataset.n_classes:
        return None, f"skip:{row.row} on {ds.name}: k = {row.k} >= m = {dataset.n_classes}, skipped"
    if dataset.multilabel != exp.multilabel:
        return None, (
            f"{ds.name} is {'multi' if dataset.multilabel else 'single'}-label data but "
            f"experiment {exp.name} is a {'multilabel' if exp.multilabel else 'top-k'} protocol"
        )
    data = _path_data(dataset, job.fold, exp.folds, data_seed, row.method)
    if job.theta is not None:
        gb = _gram_gb(data)
        if gb > exp.max_gram_gb:
            return None, (
                f"RBF Gram matrices of {data.X.shape[0]} training examples need {gb:.1f} GB > "
                f"max_gram_gb = {exp.max_gram_gb:g} (experiment option)"
            )
        from topkbench.gram import rbf_kernel

        data.K_train = rbf_kernel(data.X, theta=job.theta)
        data.K_evals = {
            s: rbf_kernel(Xs, data.X, theta=job.theta) for s, (Xs, _, _) in data.evals.items()
        }
    ctx = _Context(
        data, dataset, delta_grid(exp.delta_grid),
        _train_cardinality(dataset) if dataset.multilabel else None, max(exp.ks, default=1),
    )  # fmt: skip
    if job.init_C is not None:  # TPAMI §6.2: Ent_tr starts from the selected LR^Multi
        ctx.init_model = _init_model(exp, data, job.init_C, data_seed, dataset.n_classes)
    return ctx, None


def _fit_point(exp, job: PathJob, ctx: _Context, C: float, seed: int, warm, **budget):
    """One fit of a path at ``C`` (``budget`` overrides the experiment's stopping rule)."""
    from topkbench.model import fit

    data, row = ctx.data, job.row
    stop = {"eps": exp.eps, "max_epochs": exp.max_epochs, "time_limit": exp.time_limit,
            "eval_every": exp.eval_every, **budget}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit(
            None if data.K_train is not None else data.X,
            data.y,
            row.method,
            K=data.K_train,
            check_kernel=False,  # built by rbf_kernel for this path
            **row.fit_options(),
            C=C,
            k=row.k,
            gamma=row.gamma,
            **stop,
            seed=seed,
            n_classes=ctx.dataset.n_classes,
            warm_start=warm,
            init=ctx.init_model,
            accelerate=ACCELERATE,
            warn=False,
        )


def _record(spec, ds, row: SweepRow, ctx: _Context, model, warm_started: bool) -> dict[str, Any]:
    """The stored record of one fit: its spec, certificate and held-out metrics."""
    from topkbench.evaluation import multilabel_record
    from topkbench.metrics.topk import topk_accuracy

    data, dataset = ctx.data, ctx.dataset
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
        "warm_started": warm_started,
        "n_train": int(data.X.shape[0]),
        "n_features": int(data.X.shape[1]),
        "n_classes": dataset.n_classes,
    }
    for split, (_, ys, groups) in data.evals.items():
        scores = data.scores(model, split)
        if dataset.multilabel:
            S = scores if groups is None else groups.pool(scores)
            record.update(multilabel_record(split, S, ys, ctx.deltas, ctx.train_cardinality))
        else:
            ks = [k for k in range(1, dataset.n_classes) if k <= ctx.ks_max]
            for k, v in topk_accuracy(scores, ys, ks).items():
                record[f"{split}_top{k}"] = v
    return record


def _certifiable(row: SweepRow, model) -> bool:
    """A convex fit stopped on its budget, which can be continued from its dual."""
    from topkbench.losses.registry import get_method

    return model.status != "converged" and get_method(row.method).solver != "lbfgs"


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


@dataclass(frozen=True)
class Selected:
    """The C values a protocol selected for one variant (k, gamma, theta) of a row."""

    dataset: int
    draw: int
    row: SweepRow  # the variant
    theta: float | None
    Cs: tuple[float, ...]
    folds: tuple[str, ...]  # the selection folds
    grid: tuple[float, ...]  # the C values the selection saw (the refit path walks them)


def selected_points(
    exp: ExperimentConfig, records: pd.DataFrame, init: dict[tuple, float] | None = None
) -> list[Selected]:
    """What the selection rule picks from ``records``: per (dataset, draw, row, variant) the
    selected C values (top-k: per column k; multilabel: per metric, DESIGN §7)."""
    out: list[Selected] = []
    if records.empty:
        return out
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        recs_ds = records[records["dataset"] == ds.name]
        for draw in range(exp.draws):
            for row in exp.rows:
                recs = recs_ds[(recs_ds["draw"] == draw) & (recs_ds["row"] == row.row)]
                if recs.empty:
                    continue
                recs = recs[recs["fold"].isin(folds)]
                if exp.multilabel:
                    from topkbench.metrics.multilabel import delta_grid
                    from topkbench.multilabel_selection import refit_points

                    points = refit_points(
                        recs, folds, exp.metrics, delta_grid(exp.delta_grid), exp.threshold_rule
                    )
                    for (theta, k), Cs in sorted(
                        points.items(), key=lambda t: (t[0][0] or 0.0, t[0][1])
                    ):
                        at = recs["k"] == k
                        if theta is not None:
                            at &= np.isclose(recs["theta"].astype(float), theta, rtol=1e-12)
                        grid = tuple(sorted(set(recs.loc[at, "C"].astype(float))))
                        variant = dataclasses.replace(row, k=k)
                        out.append(
                            Selected(di, draw, variant, theta, tuple(sorted(Cs)), folds, grid)
                        )
                    continue
                curve = mean_validation(recs, folds, exp.ks)
                by_variant: dict[tuple[int, float], set[float]] = {}
                for k in exp.ks:
                    p = best_point(curve, k)
                    if p is not None:
                        v = point_row(row, p)
                        by_variant.setdefault((v.k, v.gamma), set()).add(p["C"])
                for (kt, g), Cs in sorted(by_variant.items()):
                    at = np.ones(len(curve), dtype=bool)
                    for h, v in (("k", kt), ("gamma", g)):
                        if h in curve:
                            at &= curve[h].to_numpy() == v
                    grid = tuple(sorted(set(curve.loc[at, "C"].astype(float))))
                    variant = dataclasses.replace(row, k=kt, gamma=g)
                    out.append(Selected(di, draw, variant, None, tuple(sorted(Cs)), folds, grid))
    return out


def _refit_jobs(
    exp: ExperimentConfig, records: pd.DataFrame, init: dict[tuple, float]
) -> list[PathJob]:
    """Refits on all of train at the selected C values, for cross-validated datasets.

    A refit path walks the selection's C grid from its smallest value up to the largest
    selected C, warm-starting each fit from the previous one (a cold fit at a large C is what
    stops on the budget on ill-conditioned data).
    """
    jobs = []
    for sel in selected_points(exp, records):
        if exp.selection_for(sel.dataset) not in ("cv", HALF):
            continue
        top = max(sel.Cs)
        Cs = sorted({*(c for c in sel.grid if c <= top), *sel.Cs})
        init_C = init.get((sel.dataset, sel.draw, sel.row.row))
        if init_C is not None:  # Ent_tr fits start from LR^Multi: no path to walk
            Cs = list(sel.Cs)
        jobs.append(PathJob(sel.dataset, sel.draw, sel.row, REFIT, tuple(Cs), init_C, sel.theta))
    return jobs


MAX_CERTIFY_ROUNDS = 4


@dataclass(frozen=True)
class CertifyTask:
    """Continue one selected, budget-stopped fit from its stored dual until eps (within the
    experiment's certify budget), and replace its record by the certified one."""

    job: PathJob  # its one C
    key: str
    spec: dict[str, Any]
    checkpoint: CheckpointRef | None
    prior_epochs: int
    prior_seconds: float

    def run(self, exp: ExperimentConfig, emit: Emit) -> PathSummary:
        job = self.job
        ds = exp.datasets[job.dataset]
        summary = PathSummary(row=job.row.row, draw=job.draw, dataset=ds.name, fold=job.fold)
        start = time.perf_counter()
        seed = exp.seed + job.draw
        ctx, msg = _path_context(exp, job, seed)
        if ctx is None:
            summary.failed = 1
            summary.errors = (msg,)
            return summary
        (C,) = job.C_values
        warm = read_checkpoint(self.checkpoint) if self.checkpoint is not None else None
        try:
            model = _fit_point(exp, job, ctx, C, seed, warm,
                               max_epochs=exp.certify_max_epochs,
                               time_limit=exp.certify_time_limit)  # fmt: skip
        except TopkbenchError as exc:
            summary.failed = 1
            summary.errors = (f"C={C:g}: {exc}",)
            return summary
        record = _record(self.spec, ds, job.row, ctx, model, warm is not None)
        record.update(
            epochs=self.prior_epochs + model.epochs,
            train_seconds=self.prior_seconds + model.train_seconds,
            certify_epochs=model.epochs,
            certify_seconds=model.train_seconds,
            certify_time_limit=exp.certify_time_limit,
            certify_max_epochs=exp.certify_max_epochs,
        )
        emit(self.key, record, ((self.key, C, model.A),) if _certifiable(job.row, model) else ())
        summary.done = 1
        summary.not_converged = int(model.status != "converged")
        summary.seconds = time.perf_counter() - start
        return summary


def certify_tasks(exp: ExperimentConfig, store: RecordStore, records: pd.DataFrame) -> list:
    """The selected fits (selection folds and refits) that stopped on the budget and were not
    yet continued with this budget: each becomes a :class:`CertifyTask`."""
    from topkbench.losses.registry import get_method

    tasks = []
    for sel in selected_points(exp, records):
        if get_method(sel.row.method).solver == "lbfgs":
            continue  # nonconvex: no certificate to reach
        ds = exp.datasets[sel.dataset]
        recs = records[
            (records["dataset"] == ds.name)
            & (records["draw"] == sel.draw)
            & (records["row"] == sel.row.row)
            & (records["k"] == sel.row.k)
            & (records["gamma"] == sel.row.gamma)
            & records["C"].isin(sel.Cs)
            & records["fold"].isin([*sel.folds, REFIT])
            & (records["status"] != "converged")
        ]
        if sel.theta is not None:
            recs = recs[np.isclose(recs["theta"].astype(float), sel.theta, rtol=1e-12)]
        if "certify_time_limit" in recs:  # continued before: again only with a larger budget
            tried = (recs["certify_time_limit"].astype(float) >= exp.certify_time_limit) & (
                recs["certify_max_epochs"].astype(float) >= exp.certify_max_epochs
            )
            recs = recs[~tried.fillna(False).to_numpy(dtype=bool)]
        for rec in recs.to_dict("records"):
            C = float(rec["C"])
            job = PathJob(sel.dataset, sel.draw, sel.row, rec["fold"], (C,), None, sel.theta)
            spec = record_spec(exp, ds, sel.row, sel.draw, rec["fold"], C, None, sel.theta)
            tasks.append(
                CertifyTask(
                    job,
                    rec["key"],
                    spec,
                    store.checkpoint_ref(rec["key"]),
                    int(rec["epochs"]),
                    float(rec["train_seconds"]),
                )  # fmt: skip
            )
    return tasks


def current_records(exp: ExperimentConfig, records: pd.DataFrame) -> pd.DataFrame:
    """The records of ``exp``'s configuration (DESIGN §8).

    A record is kept when its stored key is the key :func:`record_spec` gives its coordinates
    under ``exp``, its (k, gamma) is one of its row's variants and its theta one of the grid's
    (so records of other solver settings, data file contents, row definitions or code versions
    are left out), and, for Ent_tr rows started from the selected LR^Multi, its init_C is the
    current selection.  Where a dataset's files are not on this machine (a report elsewhere),
    the digests the records carry stand in for them; ``records.attrs["unverified"]`` names
    those datasets.
    """
    from topkbench.data.dataset import missing_files

    if records.empty:
        return records
    rows = {r.row: r for r in exp.rows}
    datasets = {d.name: d for d in exp.datasets}
    absent = {d.name for d in exp.datasets if missing_files(d)}
    keep = np.zeros(len(records), dtype=bool)
    for i, rec in enumerate(records.to_dict("records")):
        row, ds = rows.get(rec.get("row")), datasets.get(rec.get("dataset"))
        if row is None or ds is None:
            continue
        variant = dataclasses.replace(row, k=int(rec["k"]), gamma=float(rec["gamma"]))
        if variant not in row.variants():
            continue
        init_C, theta = (_opt_float(rec.get(h)) for h in ("init_C", "theta"))
        if (theta is None) != (row.kernel != "rbf") or (
            theta is not None and not np.isclose(exp.theta_values, theta, rtol=1e-12).any()
        ):
            continue
        digests = rec.get("data_sha256") if ds.name in absent else None
        if ds.name in absent and not isinstance(digests, dict):
            continue
        spec = record_spec(exp, ds, variant, int(rec["draw"]), rec["fold"],
                           _opt_float(rec["C"]), init_C, theta, digests)  # fmt: skip
        keep[i] = spec_key(spec) == rec["key"]
    out = records[keep].reset_index(drop=True)
    lr = init_row(exp)
    dependent = tuple(r for r in exp.rows if lr is not None and r.method == "topk_ent_tr")
    if dependent and not out.empty:
        init = _init_Cs(exp, out, lr, dependent, quiet=True)
        ok = np.ones(len(out), dtype=bool)
        for i, rec in enumerate(out.to_dict("records")):
            if rec["row"] in {r.row for r in dependent}:
                di = next(j for j, d in enumerate(exp.datasets) if d.name == rec["dataset"])
                want = init.get((di, int(rec["draw"]), rec["row"]))
                ok[i] = _opt_float(rec.get("init_C")) == want
        out = out[ok].reset_index(drop=True)
    out.attrs["unverified"] = sorted(absent & set(out["dataset"])) if not out.empty else []
    return out


def _opt_float(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


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


def _init_Cs(exp, records: pd.DataFrame, lr: SweepRow, rows, quiet=False) -> dict[tuple, float]:
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
                    if quiet:
                        continue
                    log.error("%s draw %d: no LR^Multi selection for %s; it starts from "
                              "LR^Multi at its own C", ds.name, draw, row.row)  # fmt: skip
                    continue
                out[(di, draw, row.row)] = C
    return out


_QUEUE = None  # a pool worker's channel to the driver


def _worker_init(queue) -> None:
    """Pool workers: records go to the driver through ``queue``; Ctrl-C is the driver's to
    handle; and a worker dies with the driver (Linux ``PR_SET_PDEATHSIG``), so a killed sweep
    leaves no orphan computing."""
    import signal

    global _QUEUE
    _QUEUE = queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the driver died before prctl took effect
        os._exit(1)


def _run_queued(exp: ExperimentConfig, index: int, task) -> None:
    """Run a task in a pool worker: its records, then ("done", index, summary), go through the
    one queue, so the driver sees a task's records before its end (one process's messages
    arrive in order)."""
    summary = task.run(exp, lambda *msg: _QUEUE.put(("record", msg)))
    _QUEUE.put(("done", (index, summary)))


def _run_collected(exp: ExperimentConfig, task) -> tuple[PathSummary, list]:
    """Run a task on a Dask worker and return its records with its summary.  Each record of a
    path carries the path's checkpoint, which the next one supersedes: only the last is kept,
    so a returned path holds one n x m dual plus those of its budget-stopped fits."""
    out: list = []
    summary = task.run(exp, lambda *msg: out.append(msg))
    path_key = getattr(task, "path_key", None)
    last = max((i for i, (_, _, cks) in enumerate(out) if any(c[0] == path_key for c in cks)),
               default=None)  # fmt: skip
    for i, (key, record, cks) in enumerate(out):
        if i != last:
            out[i] = (key, record, tuple(c for c in cks if c[0] != path_key))
    return summary, out


class Driver:
    """The sweep's one writer (DESIGN §8): runs tasks in process, on a local process pool
    (``n_jobs``) or on a Dask cluster (``scheduler``), and commits every record the workers
    hand back in its own transaction.  Pool workers stream records as each fit finishes; Dask
    workers return a path's records with its summary (so they never touch a shared file)."""

    def __init__(self, exp: ExperimentConfig, store: RecordStore, on_path_done=None) -> None:
        self.exp, self.store, self.on_path_done = exp, store, on_path_done
        self._pool = None
        self._queue = None

    def commit(self, key: str, record: dict[str, Any], checkpoints: tuple) -> None:
        self.store.write(key, record, checkpoints)

    def run(self, tasks: list) -> list[PathSummary]:
        results: list[PathSummary] = []

        def done(s: PathSummary) -> None:
            results.append(s)
            if self.on_path_done:
                self.on_path_done(s)

        exp = self.exp
        if not tasks:
            return results
        if exp.scheduler:
            from distributed import Client, as_completed

            with Client(exp.scheduler) as client:
                futures = client.map(_run_collected, [exp] * len(tasks), tasks, pure=False)
                for fut in as_completed(futures):
                    summary, msgs = fut.result()
                    for msg in msgs:
                        self.commit(*msg)
                    done(summary)
            return results
        if exp.n_jobs == 1 or len(tasks) == 1:
            for task in tasks:
                done(task.run(exp, self.commit))
            return results
        self._run_pool(tasks, done)
        return results

    def _run_pool(self, tasks: list, done) -> None:
        import queue as queue_mod
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            self._queue = ctx.Queue()
            self._pool = ProcessPoolExecutor(
                self.exp.n_jobs, mp_context=ctx, initializer=_worker_init,
                initargs=(self._queue,),
            )  # fmt: skip
        futures = [self._pool.submit(_run_queued, self.exp, i, t) for i, t in enumerate(tasks)]
        finished = 0
        while finished < len(tasks):
            try:
                kind, payload = self._queue.get(timeout=0.1)
            except queue_mod.Empty:
                kind, payload = None, None
            if kind is None:
                # a failed task (or a dead worker: the pool is then broken) stops the sweep,
                # after the records that did arrive are committed
                failed = next((f for f in futures if f.done() and f.exception()), None)
                if failed is not None:
                    self._drain()
                    raise failed.exception()
                continue
            if kind == "record":
                self.commit(*payload)
            else:
                finished += 1
                done(payload[1])

    def _drain(self, seconds: float = 2.0) -> None:
        """Commit the records still queued (the workers' feeder threads may need a moment),
        until the queue has been quiet for 0.5 s or ``seconds`` have passed."""
        import queue as queue_mod

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                kind, payload = self._queue.get(timeout=0.5)
            except queue_mod.Empty:
                return
            if kind == "record":
                self.commit(*payload)

    def close(self, kill: bool = False) -> None:
        if self._pool is not None:
            if kill:  # interrupted: keep what finished, then stop the workers
                self._drain()
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    p.terminate()
                self._drain(0.5)
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def run_sweep(
    exp: ExperimentConfig,
    on_path_done: Callable[[PathSummary], None] | None = None,
    on_stage: Callable[[str, int], None] | None = None,
) -> list[PathSummary]:
    """Run every stage of ``exp``: selection paths, grid extensions, certification of the
    selected fits, refits (and their certification).

    ``on_stage(name, n_fits)`` announces each stage with the number of fits it holds (for
    progress bars); ``on_path_done`` receives each finished path's counts.  The sweep holds
    the results directory's writer lock throughout: a second sweep there is refused.
    """
    from topkbench.store import WriterLock

    store = RecordStore(exp.results_dir, exp.name)
    with WriterLock(store):
        _warm_up({r.method for r in exp.rows}, {r.method for r in exp.rows if r.kernel == "rbf"})
        from topkbench.data.dataset import load_dataset_cached

        for ds in exp.datasets:  # fail early on bad data, and fill the disk cache once
            if ds.kind in ("libsvm", "mat", "mulan"):
                load_dataset_cached(ds, exp.seed)
        driver = Driver(exp, store, on_path_done)
        try:
            return _run_stages(exp, store, driver, on_stage)
        except BaseException:
            driver.close(kill=True)
            raise
        finally:
            driver.close()
            store.close()


def _run_stages(exp, store: RecordStore, driver: Driver, on_stage) -> list[PathSummary]:
    lr = init_row(exp)
    dependent = tuple(r for r in exp.rows if lr is not None and r.method == "topk_ent_tr")
    first = tuple(r for r in exp.rows if r not in dependent)
    decided: dict[tuple, set[float]] = {}

    def execute(jobs: list[PathJob], label: str, only_new: bool = False) -> list[PathSummary]:
        """Run ``jobs`` (``only_new``: not at all when every point is already stored)."""
        done = store.keys()
        tasks = [plan_path(exp, j, store, done) for j in jobs]
        if not tasks or (only_new and all(p[3] for t in tasks for p in t.points)):
            return []
        if on_stage:
            on_stage(label, sum(len(j.C_values) for j in jobs))
        return driver.run(tasks)

    def certify() -> list[PathSummary]:
        out: list[PathSummary] = []
        for _ in range(MAX_CERTIFY_ROUNDS):  # a continued fit can move the selection
            tasks = certify_tasks(exp, store, current_records(exp, store.load()))
            if not tasks:
                break
            if on_stage:
                on_stage("certify", len(tasks))
            out += driver.run(tasks)
        return out

    def stage(rows, init, label) -> list[PathSummary]:
        out = execute(base_jobs(exp, rows, init), label)
        for _ in range(exp.extend):
            ext = _extension_jobs(exp, current_records(exp, store.load()), decided, rows, init)
            if not ext:
                break
            out += execute(ext, "extend")
        return out

    results = stage(first, {}, "grid")
    results += certify()
    init: dict[tuple, float] = {}
    if dependent:
        # TPAMI §6.2: top-k Ent_tr starts from the selected (and certified) LR^Multi solution
        init = _init_Cs(exp, current_records(exp, store.load()), lr, dependent)
        results += stage(dependent, init, "grid (Ent_tr from selected LR^Multi)")
    # refits at the selected C values, then their certification; a continued fit can move a
    # selection, so repeat until nothing is left to fit
    for round_ in range(MAX_CERTIFY_ROUNDS):
        recs = current_records(exp, store.load())
        refits = execute(_refit_jobs(exp, recs, init), "refit", only_new=round_ > 0)
        continued = certify()
        results += refits + continued
        if not sum(r.done for r in refits + continued):
            break
    return results
