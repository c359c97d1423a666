"""One path's data and fits: the training split of a fold, the evaluated splits, one fit at a
C and the record it becomes (what a worker computes)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topkbench.config import DatasetConfig, ExperimentConfig, SweepRow
from topkbench.errors import ConfigError
from topkbench.experiments.plan import ACCELERATE, HALF, REFIT, PathJob
from topkbench.experiments.store import spec_key
from topkbench.losses.registry import get_method

log = logging.getLogger(__name__)

_DATA_CACHE: dict[str, Any] = {}


def cached_dataset(ds: DatasetConfig, seed: int):
    """Load a dataset once per process (paths of one worker share it; parsed files are also
    cached on disk, see :func:`~topkbench.data.cache.load_dataset_cached`)."""
    from topkbench.data.cache import load_dataset_cached

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
    primary label for a multiclass method: ``evaluation.training_targets``) on the rows it can
    use (``evaluation.trainable_rows``); the evaluated splits always carry the label sets.
    Folds of multilabel data are seeded random partitions, grouped by image id when the data
    has several regions per image.
    """
    from topkbench.experiments.evaluation import ImageGroups, trainable_rows, training_targets

    Xtr, ytr = dataset.splits["train"]
    ttr = training_targets(dataset, "train", method)
    ids = dataset.image_ids.get("train")
    if fold.startswith("cv") or fold == HALF:
        if fold == HALF:
            i, n_folds = 1, 2
        else:
            i = int(fold[2:].split("of")[0])
        if dataset.multilabel:
            from topkbench.experiments.selection_multilabel import group_folds

            folds = group_folds(Xtr.shape[0], n_folds, seed, ids)
        else:
            from topkbench.data.preprocess import stratified_folds

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


@dataclass
class _Context:
    """What the fits of one path share: its data, the dataset and the Ent_tr start."""

    data: PathData
    dataset: Any
    deltas: Any
    train_cardinality: float | None
    ks_max: int
    empty_label: str = "zero"
    init_model: Any = None


def path_context(exp: ExperimentConfig, job: PathJob, data_seed: int):
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
        exp.empty_label,
    )  # fmt: skip
    if job.init_C is not None:  # TPAMI §6.2: Ent_tr starts from the selected LR^Multi
        ctx.init_model = _init_model(exp, data, job.init_C, data_seed, dataset)
    return ctx, None


def dataset_options(dataset, method: str) -> dict:
    """The ``fit`` keywords a dataset's spec sets: ``class_weight`` when it asks for class
    weights (multilabel methods have no classes to weigh, and are refused one), and
    ``float32="never"`` when it says ``float32: false``."""
    options = {} if dataset.float32 == "auto" else {"float32": dataset.float32}
    if dataset.class_weight is None:
        return options
    if get_method(method).task == "multilabel":
        raise ConfigError(
            f"dataset {dataset.name}: class_weight applies to multiclass methods, not {method}"
        )
    return {**options, "class_weight": dataset.class_weight}


def fit_point(exp, job: PathJob, ctx: _Context, C: float, seed: int, warm, **budget):
    """One fit of a path at ``C`` (``budget`` overrides the experiment's stopping rule)."""
    from topkbench.api import fit

    data, row = ctx.data, job.row
    stop = {**exp.stop_rule(), **budget}
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
            **dataset_options(ctx.dataset, row.method),
        )


def make_record(
    spec, ds, row: SweepRow, ctx: _Context, model, warm_started: bool
) -> dict[str, Any]:
    """The stored record of one fit: its spec, certificate and held-out metrics."""
    from topkbench.experiments.evaluation import multilabel_record
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
        **phase_counts(model),
        "n_train": int(data.X.shape[0]),
        "n_features": int(data.X.shape[1]),
        "n_classes": dataset.n_classes,
    }
    for split, (_, ys, groups) in data.evals.items():
        scores = data.scores(model, split)
        if dataset.multilabel:
            S = scores if groups is None else groups.pool(scores)
            record.update(
                multilabel_record(split, S, ys, ctx.deltas, ctx.train_cardinality, ctx.empty_label)
            )
        else:
            ks = [k for k in range(1, dataset.n_classes) if k <= ctx.ks_max]
            for k, v in topk_accuracy(scores, ys, ks).items():
                record[f"{split}_top{k}"] = v
    return record


def phase_counts(model) -> dict[str, int]:
    """The fit's epochs by solver phase (:func:`topkbench.solvers.sdca.phase_counts`); all
    of a Frank-Wolfe or Ent_tr run counts as plain."""
    from topkbench.solvers.sdca import phase_counts as counts

    return counts(model.info, model.epochs)


def certifiable(row: SweepRow, model) -> bool:
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


def _init_model(exp: ExperimentConfig, data, C: float, seed: int, dataset):
    """LR^Multi trained at ``C`` on a path's training data: the start of its Ent_tr fits."""
    from topkbench.api import fit

    Xtr, ytr = data.X, data.y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit(Xtr, ytr, "lr_multi", C=C, **exp.stop_rule(), seed=seed,
                   n_classes=dataset.n_classes, warn=False,
                   **dataset_options(dataset, "lr_multi"))  # fmt: skip


def warm_up(methods: set[str], rbf_methods: set[str] = frozenset()) -> None:
    """Compile the kernels once in the parent so that workers load them from the cache."""
    from topkbench.api import fit

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = np.arange(12) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in methods:
            fit(X, y, method, C=1.0, max_epochs=2, warn=False)
            if method in rbf_methods:
                fit(X, y, method, C=1.0, max_epochs=2, warn=False, kernel="rbf", theta=1.0)
