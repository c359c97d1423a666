"""Selection in the multilabel protocol (TPAMI §6.3, DESIGN §7), shared by the sweep and the report.

Every metric selects its own hyper-parameters: ``C`` (and ``theta`` for RBF rows) for the
ranking metrics, ``(C, theta, delta)`` for the partition metrics, where the threshold ``delta``
is chosen on a fixed grid from the validation scores stored with each fit (no retraining).
A hyper-parameter point counts only when every selection fold has a record for it; the value is
the mean over folds (summed in fold order).  Ties within ``TIE_TOL`` go to the smallest C, then
the smallest theta, then the smallest k (rows with a k grid, Tables 10-12), then the smallest
delta (the first on the grid).

Records carry ranking metrics as scalars ``<split>_<metric>``, partition metrics on the
threshold grid as lists ``<split>_<metric>_grid`` (:func:`metric_column`), and partition metrics
at the "match label cardinality" threshold as scalars ``<split>_<metric>_card`` (the option
``threshold_rule: cardinality``: delta is set on each evaluated split so that its mean number of
predicted labels matches the training label cardinality, TPAMI ref. [97], as Madjarov et al. did;
it is then not selected, and C is selected with it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topkbench.metrics.multilabel import LOWER_IS_BETTER, PARTITION_METRICS

TIE_TOL = 1e-9


def is_partition(metric: str) -> bool:
    return metric in PARTITION_METRICS


def metric_column(split: str, metric: str, rule: str = "grid") -> str:
    if not is_partition(metric):
        return f"{split}_{metric}"
    return f"{split}_{metric}_card" if rule == "cardinality" else f"{split}_{metric}_grid"


def uses_grid(metric: str, rule: str) -> bool:
    return is_partition(metric) and rule != "cardinality"


@dataclass(frozen=True)
class Choice:
    """A selected point: hyper-parameters, threshold (partition metrics) and its mean value."""

    C: float
    theta: float | None
    delta: float | None
    value: float
    delta_index: int | None = None
    k: int = 1


def _theta_key(t) -> float:
    return -np.inf if t is None or (isinstance(t, float) and np.isnan(t)) else float(t)


def select(
    records: pd.DataFrame,
    folds: Iterable[str],
    metric: str,
    deltas: np.ndarray,
    rule: str = "grid",
) -> Choice | None:
    """The best (C, theta, k[, delta]) for ``metric`` over the records of one dataset/draw/row;
    ``rule="cardinality"`` uses the cardinality-matched threshold instead of the grid."""
    folds = list(folds)
    col = metric_column("val", metric, rule)
    grid = uses_grid(metric, rule)
    if records.empty or col not in records:
        return None
    sel = records[records["fold"].isin(folds)]
    if sel.empty:
        return None
    theta = sel["theta"] if "theta" in sel else pd.Series(np.nan, index=sel.index)
    sel = sel.assign(_theta=theta.map(_theta_key)).sort_values(["C", "_theta", "k", "fold"])
    lower = metric in LOWER_IS_BETTER
    best: Choice | None = None
    for (C, tk, k), grp in sel.groupby(["C", "_theta", "k"], sort=True):
        if grp["fold"].nunique() != len(folds):
            continue
        grp = grp.drop_duplicates("fold").set_index("fold").loc[folds]
        if grid:
            vals = np.mean(np.stack([np.asarray(v, dtype=float) for v in grp[col]]), axis=0)
        else:
            vals = np.array([float(np.mean(grp[col].to_numpy(dtype=float)))])
        score = -vals if lower else vals
        if not np.isfinite(score).any():
            continue
        q = int(np.flatnonzero(score >= np.nanmax(score) - TIE_TOL)[0])
        value = float(vals[q])
        better = best is None or ((best.value - value if lower else value - best.value) > TIE_TOL)
        if better:
            th = None if tk == -np.inf else float(tk)
            if grid:
                best = Choice(float(C), th, float(deltas[q]), value, q, int(k))
            else:
                best = Choice(float(C), th, None, value, None, int(k))
    return best


def refit_points(
    records: pd.DataFrame,
    folds: Iterable[str],
    metrics: Iterable[str],
    deltas: np.ndarray,
    rule: str = "grid",
) -> dict[tuple[float | None, int], set[float]]:
    """(theta, k) -> the C values that some metric selected (the refits on all of train)."""
    out: dict[tuple[float | None, int], set[float]] = {}
    for metric in metrics:
        ch = select(records, folds, metric, deltas, rule)
        if ch is not None:
            out.setdefault((ch.theta, ch.k), set()).add(ch.C)
    return out


def group_folds(n: int, n_folds: int, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """Fold id of every row: a seeded random partition of the rows, or of the groups (image
    ids) when given so that all regions of an image fall in one fold.  Multilabel targets are
    not stratified (label sets have no single class); folds differ in size by at most one
    group."""
    rng = np.random.default_rng(seed)
    if groups is None:
        fold = np.empty(n, dtype=np.int64)
        fold[rng.permutation(n)] = np.arange(n) % n_folds
        return fold
    uniq, inverse = np.unique(groups, return_inverse=True)
    gfold = np.empty(uniq.size, dtype=np.int64)
    gfold[rng.permutation(uniq.size)] = np.arange(uniq.size) % n_folds
    return gfold[inverse.ravel()]
