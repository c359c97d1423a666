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


def max_pool(scores: np.ndarray, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first row of each image, image scores)``: per image, the max over its rows, images in
    order of first appearance."""
    _, first, inverse = np.unique(image_ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    pooled = np.full((order.size, scores.shape[1]), -np.inf)
    np.maximum.at(pooled, rank[inverse.ravel()], scores)
    return first[order], pooled


def image_level(ds, split: str, scores: np.ndarray):
    """Scores and targets of ``split`` at the evaluation unit (see :func:`pool_images`)."""
    _, Y = ds.splits[split]
    source = ds.provenance.get("files", {}).get(split, ds.name)
    return pool_images(scores, Y, ds.image_ids.get(split), source)


def pool_images(scores: np.ndarray, Y, ids: np.ndarray | None, source: str = ""):
    """Images as the evaluation unit: max-pooled scores and each image's label set (checked
    to be the same on all its rows); rows themselves when there are no image ids."""
    if ids is None:
        return scores, Y
    first, pooled = max_pool(scores, ids)
    # the labels are replicated from the image to its regions: verify, do not assume
    _, first_sorted, inverse = np.unique(ids, return_index=True, return_inverse=True)
    ref = Y[first_sorted[inverse.ravel()]]
    if sp.issparse(Y):
        differs = np.diff((Y - ref).tocsr().indptr) > 0
    else:
        differs = (np.asarray(Y) != np.asarray(ref)).reshape(len(ids), -1).any(axis=1)
    if differs.any():
        row = int(np.flatnonzero(differs)[0])
        raise DataFormatError(
            str(source), f"rows of image {ids[row]!r} carry different label sets (row {row})"
        )
    return pooled, Y[first]


def multilabel_record(prefix: str, scores: np.ndarray, Y, deltas, cardinality=None) -> dict:
    """Record columns of one evaluated split: ranking metrics as ``<prefix>_<metric>``, the AP
    of every class as the list ``<prefix>_ap_classes`` (Table 10), and the partition metrics on
    the threshold grid as lists ``<prefix>_<metric>_grid``; with the training label
    ``cardinality``, also the partition metrics at the cardinality-matched threshold
    (``<prefix>_<metric>_card``, ``<prefix>_delta_card``)."""
    from topkbench.metrics.multilabel import (
        cardinality_threshold,
        class_aps,
        partition_metrics,
        partition_metrics_grid,
        ranking_metrics,
    )

    out = {f"{prefix}_{k}": v for k, v in ranking_metrics(scores, Y).items()}
    out[f"{prefix}_ap_classes"] = [float(x) for x in class_aps(scores, Y)]
    for k, v in partition_metrics_grid(scores, Y, deltas).items():
        out[f"{prefix}_{k}_grid"] = [float(x) for x in v]
    if cardinality is not None:
        dc = cardinality_threshold(scores, cardinality)
        out[f"{prefix}_delta_card"] = dc
        for k, v in partition_metrics(scores, Y, dc).items():
            out[f"{prefix}_{k}_card"] = v
    return out


def evaluate_multilabel(ds, split: str, scores: np.ndarray, *, delta=0.0) -> dict[str, float]:
    """All multilabel metrics of ``split`` (pooled per image when it has image ids)."""
    from topkbench.metrics.multilabel import multilabel_metrics

    S, Y = image_level(ds, split, scores)
    return multilabel_metrics(S, Y, delta=delta)
