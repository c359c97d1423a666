"""Which targets a method trains on, and how a split is evaluated (shared by ``train`` and the
sweep engine).

* Multiclass data: top-k accuracy (:mod:`topkbench.metrics.topk`).
* Multilabel data (TPAMI §6.3): multilabel methods train on the label sets; multiclass and
  top-k methods train on one label per example, the "primary label" the dataset supplies
  (``Dataset.primary``; Tables 10-12).  Evaluation uses the multilabel metrics of
  :mod:`topkbench.metrics.multilabel`.  When the split has an image id per row (several region
  features per image), rows of one image share its labels at training time, and at test time
  the image's score for each class is the max over its regions (TPAMI §6.3, "max pooling").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConfigError, DataFormatError
from topkbench.losses.registry import get_method


def training_targets(ds, split: str, method: str):
    """Targets of ``split`` for ``method``: class indices or the multilabel indicator."""
    _, Y = ds.splits[split]
    task = get_method(method).task
    if not ds.multilabel or task == "multilabel":
        return Y
    if split not in ds.primary:
        raise ConfigError(
            f"{method} is a multiclass method and {ds.name} is multilabel: it trains on one "
            "label per example, which the dataset must supply (a 'primary' label column, see "
            "topkbench.data.features); multilabel methods are svm_ml and lr_ml"
        )
    return ds.primary[split]


def trainable_rows(Y, method: str) -> np.ndarray | None:
    """Rows of multilabel targets ``Y`` (CSR indicator) that ``method`` trains on, or None
    for all: a multilabel loss needs ``0 < |Y_i| < m`` (a ranking constraint); a multiclass
    method trains on the primary label, which is meaningless for an empty label set."""
    if not sp.issparse(Y):
        return None
    sizes = np.diff(Y.indptr)
    if get_method(method).task == "multilabel":
        keep = (sizes > 0) & (sizes < Y.shape[1])
    else:
        keep = sizes > 0
    return None if keep.all() else np.flatnonzero(keep)


@dataclass(frozen=True)
class ImageGroups:
    """Rows grouped by image id, computed once per split: ``order`` lists the rows image by
    image (images in ascending id order), ``starts`` the offset of each image in ``order``,
    ``first`` one row of each image."""

    order: np.ndarray
    starts: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, image_ids: np.ndarray) -> ImageGroups:
        _, inverse = np.unique(image_ids, return_inverse=True)
        inverse = inverse.ravel()
        order = np.argsort(inverse, kind="stable")
        srt = inverse[order]
        starts = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]])
        return cls(order, starts, order[starts])

    def pool(self, scores: np.ndarray) -> np.ndarray:
        """Per image, the max over its rows (TPAMI §6.3)."""
        return np.maximum.reduceat(np.asarray(scores)[self.order], self.starts, axis=0)

    def labels(self, Y, image_ids, source: str = ""):
        """Each image's label set, after checking that all its rows carry the same one."""
        counts = np.diff(np.r_[self.starts, len(self.order)])
        ref = Y[np.repeat(self.first, counts)]
        rows = Y[self.order]
        if sp.issparse(Y):
            differs = np.diff((rows - ref).tocsr().indptr) > 0
        else:
            differs = (np.asarray(rows) != np.asarray(ref)).reshape(len(rows), -1).any(axis=1)
        if differs.any():
            row = int(self.order[np.flatnonzero(differs)[0]])
            raise DataFormatError(
                str(source),
                f"rows of image {image_ids[row]!r} carry different label sets (row {row})",
            )
        return Y[self.first]


def max_pool(scores: np.ndarray, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first row of each image, image scores)``: per image, the max over its rows, images in
    order of first appearance."""
    g = ImageGroups.of(image_ids)
    by_appearance = np.argsort(g.first, kind="stable")
    return g.first[by_appearance], g.pool(scores)[by_appearance]


def image_level(ds, split: str, scores: np.ndarray):
    """Scores and targets of ``split`` at the evaluation unit (see :func:`pool_images`)."""
    _, Y = ds.splits[split]
    source = ds.provenance.get("files", {}).get(split, ds.name)
    return pool_images(scores, Y, ds.image_ids.get(split), source)


def pool_images(scores: np.ndarray, Y, ids: np.ndarray | None, source: str = ""):
    """Images as the evaluation unit: max-pooled scores and each image's label set (checked
    to be the same on all its rows), images in order of first appearance; rows themselves
    when there are no image ids."""
    if ids is None:
        return scores, Y
    g = ImageGroups.of(ids)
    Yi = g.labels(Y, ids, source)
    by_appearance = np.argsort(g.first, kind="stable")
    return g.pool(scores)[by_appearance], Yi[by_appearance]


def multilabel_record(
    prefix: str, scores: np.ndarray, Y, deltas, cardinality=None, empty: str = "zero"
) -> dict:
    """Record columns of one evaluated split: ranking metrics as ``<prefix>_<metric>``, the AP
    of every class as the list ``<prefix>_ap_classes`` (Table 10), and the partition metrics on
    the threshold grid as lists ``<prefix>_<metric>_grid``; with the training label
    ``cardinality``, also the partition metrics at the cardinality-matched threshold
    (``<prefix>_<metric>_card``, ``<prefix>_delta_card``).  ``empty`` is the 0/0 convention of
    the partition metrics (:mod:`topkbench.metrics.multilabel`)."""
    from topkbench.metrics.multilabel import (
        MAX_AT,
        cardinality_threshold,
        class_aps,
        partition_metrics,
        partition_metrics_grid,
        ranking_metrics,
    )

    scores = np.asarray(scores, dtype=np.float64)
    T = (Y.toarray() if sp.issparse(Y) else np.asarray(Y)) != 0
    ks = tuple(range(1, MAX_AT + 1))
    aps = class_aps(scores, T)
    ranking = ranking_metrics(scores, T, p_at=ks, r_at=ks, aps=aps)
    out = {f"{prefix}_{k}": v for k, v in ranking.items()}
    out[f"{prefix}_ap_classes"] = [float(x) for x in aps]
    for k, v in partition_metrics_grid(scores, T, deltas, empty).items():
        out[f"{prefix}_{k}_grid"] = [float(x) for x in v]
    if cardinality is not None:
        dc = cardinality_threshold(scores, cardinality)
        out[f"{prefix}_delta_card"] = dc
        for k, v in partition_metrics(scores, T, dc, empty).items():
            out[f"{prefix}_{k}_card"] = v
    return out


def evaluate_multilabel(
    ds, split: str, scores: np.ndarray, *, delta=0.0, empty: str = "zero"
) -> dict[str, float]:
    """All multilabel metrics of ``split`` (pooled per image when it has image ids)."""
    from topkbench.metrics.multilabel import multilabel_metrics

    S, Y = image_level(ds, split, scores)
    return multilabel_metrics(S, Y, delta=delta, empty=empty)
