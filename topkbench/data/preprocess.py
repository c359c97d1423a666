"""Preprocessing that the papers' protocols and the user options apply to a loaded dataset:
a seeded stratified holdout, stratified folds, an appended bias feature and per-feature
scaling fitted on the training split."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from topkbench.config import DatasetConfig
from topkbench.errors import ConfigError, DataFormatError

if TYPE_CHECKING:
    from topkbench.data.dataset import Dataset

logger = logging.getLogger(__name__)


def stratified_holdout(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (keep, held out): ``round(fraction * n_c)`` of each class held out."""
    rng = np.random.default_rng(seed)
    keep, out = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        h = int(round(fraction * len(idx)))
        out.append(idx[:h])
        keep.append(idx[h:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(out))


def stratified_folds(y: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Fold id (0..n_folds-1) of every example; each class is spread evenly over the folds."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=np.int64)
    offset = 0
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        fold[idx] = (np.arange(len(idx)) + offset) % n_folds
        offset += len(idx)  # continue the round robin so small classes do not all start at 0
    return fold


def apply_holdout(cfg: DatasetConfig, raw, provenance, *extras) -> None:
    """Split ``raw[source]`` into train/test in place (``holdout:`` option), carrying the
    per-row ``extras`` (image ids, primary labels) along.

    Class labels: a stratified ``test_fraction`` per class (ALOI, TPAMI §6.2).  Label sets
    (no single class to stratify on): a seeded random ``test_count`` or ``test_fraction``
    (bookmarks).  The holdout seed is fixed by the config, independent of the run seed.
    """
    holdout = cfg.get("holdout")
    if not holdout:
        return
    source = str(holdout.get("source", "all"))
    if source not in raw:
        raise ConfigError(f"dataset {cfg.name}: holdout source split {source!r} is not in files")
    X, y, src = raw.pop(source)
    hseed = int(holdout.get("seed", 0))
    if sp.issparse(y):
        n = X.shape[0]
        if holdout.get("test_count") is not None:
            n_out = int(holdout["test_count"])
        else:
            n_out = int(round(float(holdout.get("test_fraction", 0.5)) * n))
        if not 0 < n_out < n:
            raise DataFormatError(src, f"holdout of {n_out} test examples from {n} is impossible")
        perm = np.random.default_rng(hseed).permutation(n)
        out, keep = np.sort(perm[:n_out]), np.sort(perm[n_out:])
        provenance["holdout"] = f"random {n_out} of {source} to test, seed {hseed}"
    else:
        frac = float(holdout.get("test_fraction", 0.5))
        keep, out = stratified_holdout(y, frac, hseed)
        provenance["holdout"] = f"stratified {frac:g} of {source} to test, seed {hseed}"
    raw["train"] = (X[keep], y[keep], src)
    raw["test"] = (X[out], y[out], src)
    for extra in extras:
        if source in extra:
            v = extra.pop(source)
            extra["train"], extra["test"] = v[keep], v[out]


SCALINGS = ("none", "standard", "maxabs")


MAX_DENSE_GB = 4.0


def scale_features(ds: Dataset, how: str, has_bias: bool = False):
    """Scale every split's features in place by statistics of the training split.

    ``standard``: ``(x_j - mean_j) / std_j``; centring fills a sparse matrix, so sparse
    splits become dense (refused above MAX_DENSE_GB); ``maxabs``: ``x_j / max_i |x_ij|`` (keeps
    sparsity).  Columns that are constant (std 0) or zero on train keep a unit divisor; an
    appended bias column is left as it is.  Scaling changes the problem, and with it C's
    meaning: R^2 = max ||x||^2 falls from up to ~1e5 on raw real features to about d, which is
    what makes SDCA fast there.  Returns the ``(shift, div)`` applied to the first columns.
    """
    X = ds.splits["train"][0]
    d = X.shape[1] - (1 if has_bias else 0)
    if how == "standard":
        gb = sum(8.0 * Xs.shape[0] * Xs.shape[1] for Xs, _ in ds.splits.values()) / 2**30
        if any(sp.issparse(Xs) for Xs, _ in ds.splits.values()):
            if gb > MAX_DENSE_GB:
                raise ConfigError(
                    f"dataset {ds.name}: scale=standard centres the features, which makes this "
                    f"sparse data dense ({gb:.1f} GB > {MAX_DENSE_GB:g} GB)",
                    hint="use dataset.scale=maxabs for sparse features",
                )
            for split, (Xs, y) in ds.splits.items():
                ds.splits[split] = (Xs.toarray() if sp.issparse(Xs) else Xs, y)
            X = ds.splits["train"][0]
        Xd = np.asarray(X[:, :d], dtype=np.float64)
        shift = Xd.mean(axis=0)
        div = Xd.std(axis=0)
    else:
        shift = np.zeros(d)
        div = np.asarray(abs(X[:, :d]).max(axis=0).todense() if sp.issparse(X)
                         else np.abs(X[:, :d]).max(axis=0), dtype=np.float64).ravel()  # fmt: skip
    div[div == 0.0] = 1.0
    for split, (Xs, y) in ds.splits.items():
        if sp.issparse(Xs):
            cols = np.concatenate([1.0 / div, np.ones(Xs.shape[1] - d)])
            Xs = sp.csr_matrix(Xs @ sp.diags(cols))
        else:
            Xs = np.array(Xs, dtype=np.float64)
            Xs[:, :d] = (Xs[:, :d] - shift) / div
        ds.splits[split] = (Xs, y)
    ds.provenance["scale"] = f"{how}, fitted on train"
    return shift, div
