"""Selection in the multilabel protocol (TPAMI §6.3, DESIGN §7), shared by the sweep and the report.

Every metric selects its own hyper-parameters: ``C`` (and ``theta`` for RBF rows) for the
ranking metrics, ``(C, theta, delta)`` for the partition metrics, where the threshold ``delta``
is chosen on a fixed grid from the validation scores stored with each fit (no retraining).
A hyper-parameter point counts only when every selection fold has a record for it; the value is
the mean over folds (summed in fold order).  The choice is the first point within ``TIE_TOL`` of
the best, in the order smallest C, then smallest theta, then smallest k (rows with a k grid,
Tables 10-12), then smallest delta (the first on the grid) -- the rule of the top-k protocol.

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

from topkbench.errors import ConfigError
from topkbench.metrics.multilabel import LOWER_IS_BETTER, PARTITION_METRICS, TIE_TOL

# ties: the same tolerance as the metric module (and the top-k protocol)


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


def as_theta(t) -> float | None:
    """A record's theta as a float, or None for linear rows (stored as NaN in the frame)."""
    return None if t is None or (isinstance(t, float) and np.isnan(t)) else float(t)


def matching(records: pd.DataFrame, C: float, theta: float | None, k: int) -> pd.DataFrame:
    """The records at exactly this (C, theta, k) point (C values are copies of the grid's
    floats; the relative tolerance only absorbs a round trip through parquet)."""
    at = np.isclose(records["C"].to_numpy(float), C, rtol=1e-12, atol=0.0)
    if "k" in records:
        at &= records["k"].to_numpy() == k
    th = records["theta"] if "theta" in records else pd.Series(np.nan, index=records.index)
    if theta is None:
        at &= th.isna().to_numpy()
    else:
        at &= np.isclose(th.to_numpy(float), theta, rtol=1e-12, atol=0.0)
    return records[at]


class FoldMeans:
    """Mean over the selection folds of every metric column, at every hyper-parameter point
    ``(C, theta, k)`` that has a record in each fold; points in ascending (C, theta, k) order.

    Built once per (dataset, draw, row) so that each metric's choice is an argmax over arrays.
    """

    def __init__(self, records: pd.DataFrame, folds: Iterable[str]) -> None:
        folds = list(folds)
        sel = records[records["fold"].isin(folds)] if len(records) else records
        self.columns = set(sel.columns)
        self.points: list[tuple[float, float | None, int]] = []
        self._means: dict[str, np.ndarray] = {}
        if sel.empty:
            return
        theta = sel["theta"] if "theta" in sel else pd.Series(np.nan, index=sel.index)
        k = sel["k"] if "k" in sel else pd.Series(1, index=sel.index)
        sel = sel.assign(_theta=theta.map(_theta_key), _k=k, _fold=sel["fold"].map(folds.index))
        sel = sel.drop_duplicates(["C", "_theta", "_k", "_fold"])
        sel = sel.sort_values(["C", "_theta", "_k", "_fold"], kind="stable")
        size = sel.groupby(["C", "_theta", "_k"], sort=False)["_fold"].transform("size")
        self._sel = sel[size.to_numpy() == len(folds)]
        self._nf = len(folds)
        head = self._sel.iloc[:: self._nf]
        self.points = [
            (float(c), None if t == -np.inf else float(t), int(kk))
            for c, t, kk in zip(head["C"], head["_theta"], head["_k"], strict=True)
        ]

    def mean(self, col: str) -> np.ndarray | None:
        """(points,) for a scalar column, (points, grid) for a list column; fold order fixed."""
        if col not in self._means:
            if col not in self.columns or not self.points:
                return None
            v = self._sel[col].to_numpy()
            if v.dtype == object:
                v = np.stack([np.asarray(x, dtype=float) for x in v])
                v = v.reshape(len(self.points), self._nf, -1)
            else:
                v = v.astype(float).reshape(len(self.points), self._nf)
            self._means[col] = v.mean(axis=1)
        return self._means[col]


def select(
    records: pd.DataFrame | FoldMeans,
    folds: Iterable[str],
    metric: str,
    deltas: np.ndarray,
    rule: str = "grid",
) -> Choice | None:
    """The best (C, theta, k[, delta]) for ``metric`` over the records of one dataset/draw/row:
    the first point, in ascending (C, theta, k[, delta]) order, whose fold mean is within
    ``TIE_TOL`` of the best.  ``rule="cardinality"`` uses the cardinality-matched threshold
    instead of the grid.  ``records`` may be a prebuilt :class:`FoldMeans`."""
    fm = records if isinstance(records, FoldMeans) else FoldMeans(records, folds)
    grid = uses_grid(metric, rule)
    vals = fm.mean(metric_column("val", metric, rule))
    if vals is None:
        return None
    vals = vals.reshape(len(fm.points), -1)
    if grid and vals.shape[1] != len(deltas):
        raise ConfigError(
            f"records hold {metric} on {vals.shape[1]} thresholds, the experiment's grid has "
            f"{len(deltas)}: they come from another delta_grid (use a fresh results_dir)"
        )
    score = -vals if metric in LOWER_IS_BETTER else vals
    if not np.isfinite(score).any():
        return None
    flat = np.flatnonzero(score.ravel() >= np.nanmax(score) - TIE_TOL)[0]
    i, q = divmod(int(flat), vals.shape[1])
    C, theta, k = fm.points[i]
    if grid:
        return Choice(C, theta, float(deltas[q]), float(vals[i, q]), q, k)
    return Choice(C, theta, None, float(vals[i, 0]), None, k)


def refit_points(
    records: pd.DataFrame,
    folds: Iterable[str],
    metrics: Iterable[str],
    deltas: np.ndarray,
    rule: str = "grid",
) -> dict[tuple[float | None, int], set[float]]:
    """(theta, k) -> the C values that some metric selected (the refits on all of train)."""
    fm = FoldMeans(records, folds)
    out: dict[tuple[float | None, int], set[float]] = {}
    for metric in metrics:
        ch = select(fm, folds, metric, deltas, rule)
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
