"""Targets and evaluation units of multilabel data (:mod:`topkbench.experiments.evaluation`).

What is tested: max pooling of region scores per image and the per-image label check (TPAMI,
/work/shared/papers/002_0e6cc4a42c89f487.txt §6.3, "max pooling"), the targets a method trains
on (the label indicator for multilabel methods, the primary label for multiclass ones; §6.3
"multiclass to multilabel"), ``evaluate_multilabel`` on ``multilabel_synth`` images against
manually pooled scores scored with the metrics of §3.1, and the record columns of
``multilabel_record`` (ranking metrics as scalars, partition metrics on the threshold grid of
DESIGN, /work/shared/DESIGN.md §7; datasets as in DESIGN §6.2).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import average_precision_score

from topkbench.config import DatasetConfig
from topkbench.data.dataset import load_dataset
from topkbench.errors import ConfigError, DataFormatError
from topkbench.experiments.evaluation import (
    evaluate_multilabel,
    max_pool,
    multilabel_record,
    pool_images,
    training_targets,
)
from topkbench.metrics.multilabel import (
    PARTITION_METRICS,
    delta_grid,
    multilabel_metrics,
    partition_metrics,
    ranking_metrics,
)

SYNTH = {
    "name": "s",
    "kind": "multilabel_synth",
    "n_train": 40,
    "n_test": 20,
    "n_features": 4,
    "n_labels": 5,
    "regions": 3,
}


@pytest.fixture(scope="module")
def synth():
    return load_dataset(DatasetConfig.from_dict(SYNTH), 0)


def manual_pool(scores, ids, Y):
    """Reference pooling with a dict: images in order of first appearance."""
    rows: dict = {}
    for i, key in enumerate(ids):
        rows.setdefault(key, []).append(i)
    S = np.array([scores[idx].max(axis=0) for idx in rows.values()])
    first = [idx[0] for idx in rows.values()]
    return S, Y[first], first


# ---------------------------------------------------------------------------------------------
# max pooling
# ---------------------------------------------------------------------------------------------


def test_max_pool_order_of_first_appearance():
    ids = np.array(["b", "a", "b", "c", "a", "img10", "img2", "img10"])
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(ids.size, 3))
    first, pooled = max_pool(scores, ids)
    ref, _, ref_first = manual_pool(scores, ids, np.zeros((ids.size, 1)))
    np.testing.assert_array_equal(first, ref_first)
    np.testing.assert_array_equal(first, [0, 1, 3, 5, 6])
    np.testing.assert_array_equal(pooled, ref)
    np.testing.assert_array_equal(pooled[0], np.maximum(scores[0], scores[2]))


def test_max_pool_integer_ids_and_singletons():
    ids = np.array([7, 3, 7, 7, 1])
    scores = np.array([[1.0, -5], [2, 2], [0, -1], [3, -9], [4, 4]])
    first, pooled = max_pool(scores, ids)
    np.testing.assert_array_equal(first, [0, 1, 4])
    np.testing.assert_array_equal(pooled, [[3, -1], [2, 2], [4, 4]])


def test_pool_images_returns_image_labels():
    ids = np.array(["x", "y", "x", "z", "y"])
    Y = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0], [0, 1, 0]]))
    scores = np.arange(15.0).reshape(5, 3)
    S, Yimg = pool_images(scores, Y, ids)
    np.testing.assert_array_equal(S, [[6, 7, 8], [12, 13, 14], [9, 10, 11]])
    assert sp.issparse(Yimg)
    np.testing.assert_array_equal(Yimg.toarray(), [[1, 0, 1], [0, 1, 0], [0, 0, 0]])


def test_pool_images_refuses_different_label_sets():
    ids = np.array(["x", "y", "x", "y"])
    Y = sp.csr_matrix(np.array([[1, 0], [0, 1], [1, 0], [1, 1]]))
    with pytest.raises(DataFormatError, match="different label sets") as exc:
        pool_images(np.zeros((4, 2)), Y, ids, "regions.h5")
    msg = str(exc.value)
    assert msg.startswith("regions.h5") and "'y'" in msg


def test_pool_images_refuses_different_dense_label_sets():
    ids = np.array(["x", "y", "x", "y"])
    Y = np.array([[1, 0], [0, 1], [1, 0], [1, 1]])
    with pytest.raises(DataFormatError, match="different label sets"):
        pool_images(np.zeros((4, 2)), Y, ids, "regions.h5")


def test_pool_images_without_ids_is_identity():
    scores = np.ones((3, 2))
    Y = sp.csr_matrix(np.eye(3, 2))
    S, Y2 = pool_images(scores, Y, None)
    assert S is scores and Y2 is Y


# ---------------------------------------------------------------------------------------------
# training targets
# ---------------------------------------------------------------------------------------------


def test_training_targets(synth):
    assert synth.multilabel
    _, Y = synth.splits["train"]
    Ytr = training_targets(synth, "train", "svm_ml")
    assert sp.isspmatrix_csr(Ytr) and Ytr.shape == (120, 5)
    assert (Ytr != Y).nnz == 0
    for method in ("svm_multi", "lr_multi", "topk_svm"):
        y = training_targets(synth, "train", method)
        assert y.ndim == 1 and y.shape == (120,) and np.issubdtype(y.dtype, np.integer)
        assert y.min() >= 0 and y.max() < synth.n_classes
        Yd = Y.toarray()
        for i, c in enumerate(y):
            if Yd[i].any():
                assert Yd[i, c] == 1, i


def test_multiclass_method_needs_primary_labels(synth):
    bare = dataclasses.replace(synth, primary={})
    assert training_targets(bare, "train", "lr_ml") is bare.splits["train"][1]
    with pytest.raises(ConfigError, match="multilabel methods are svm_ml and lr_ml"):
        training_targets(bare, "train", "svm_multi")


def test_multiclass_dataset_targets_are_labels():
    ds = load_dataset(
        DatasetConfig.from_dict(
            {"name": "g", "kind": "gaussian", "n_train": 30, "n_val": 0, "n_test": 10}
        ),
        0,
    )
    assert not ds.multilabel
    assert training_targets(ds, "train", "svm_multi") is ds.splits["train"][1]


# ---------------------------------------------------------------------------------------------
# multilabel_synth images and evaluate_multilabel
# ---------------------------------------------------------------------------------------------


def test_synth_regions_share_labels(synth):
    for split, n_img in (("train", 40), ("test", 20)):
        X, Y = synth.splits[split]
        ids = synth.image_ids[split]
        assert X.shape[0] == ids.size == 3 * n_img
        keys, counts = np.unique(ids, return_counts=True)
        assert keys.size == n_img and (counts == 3).all()
        Yd = Y.toarray()
        for key in keys:
            rows = np.flatnonzero(ids == key)
            assert (Yd[rows] == Yd[rows[0]]).all()
            assert (synth.primary[split][rows] == synth.primary[split][rows[0]]).all()


@pytest.mark.parametrize("delta", [0.0, 0.4])
def test_evaluate_multilabel_pools_per_image(synth, delta):
    X, Y = synth.splits["test"]
    rng = np.random.default_rng(1)
    scores = X @ rng.normal(size=(X.shape[1], synth.n_classes))
    S, Yimg, _ = manual_pool(scores, synth.image_ids["test"], Y.toarray())
    assert S.shape == (20, 5)
    out = evaluate_multilabel(synth, "test", scores, delta=delta)
    ref = multilabel_metrics(S, Yimg, delta=delta)
    assert out.keys() == ref.keys()
    for key, value in ref.items():
        assert out[key] == pytest.approx(value, abs=1e-15, nan_ok=True), key
    # region rows scored as they are give different numbers
    assert multilabel_metrics(scores, Y, delta=delta) != out


def test_evaluate_multilabel_per_threshold(synth):
    X, Y = synth.splits["test"]
    scores = np.random.default_rng(2).normal(size=(X.shape[0], 5))
    deltas = {name: d for name, d in zip(PARTITION_METRICS, np.linspace(-1, 1, 6), strict=True)}
    out = evaluate_multilabel(synth, "test", scores, delta=deltas)
    S, Yimg, _ = manual_pool(scores, synth.image_ids["test"], Y.toarray())
    for name, d in deltas.items():
        assert out[name] == pytest.approx(partition_metrics(S, Yimg, d)[name], abs=1e-15)


# ---------------------------------------------------------------------------------------------
# record columns
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", ["mulan", "voc"])
def test_multilabel_record(grid):
    rng = np.random.default_rng(3)
    S = rng.normal(size=(25, 6))
    Y = sp.csr_matrix((rng.random(size=(25, 6)) < 0.3).astype(np.int8))
    deltas = delta_grid(grid)
    rec = multilabel_record("val", S, Y, deltas)
    ks = tuple(range(1, 11))  # sweeps record P@K and R@K for K = 1..10 (k > m dropped)
    ranking = ranking_metrics(S, Y, p_at=ks, r_at=ks)
    for key, value in ranking.items():
        assert isinstance(rec[f"val_{key}"], float)
        assert rec[f"val_{key}"] == value
    for name in ("rloss", "map", "p@1", "r@1"):
        assert f"val_{name}" in rec
    for name in PARTITION_METRICS:
        assert f"val_{name}" not in rec
        values = rec[f"val_{name}_grid"]
        assert isinstance(values, list) and len(values) == len(deltas)
        assert all(isinstance(v, float) for v in values)
        q = len(deltas) // 2
        assert values[q] == pytest.approx(partition_metrics(S, Y, deltas[q])[name], abs=1e-15)
    # the AP of every class (Table 10), NaN for a class without positives
    aps = rec["val_ap_classes"]
    assert isinstance(aps, list) and len(aps) == 6
    Yd = Y.toarray()
    for j, value in enumerate(aps):
        if Yd[:, j].any():
            assert value == pytest.approx(average_precision_score(Yd[:, j], S[:, j]), abs=1e-12)
        else:
            assert np.isnan(value)
    assert np.nanmean(aps) == pytest.approx(rec["val_map"], abs=1e-15)
    assert set(rec) == {f"val_{k}" for k in ranking} | {"val_ap_classes"} | {
        f"val_{k}_grid" for k in PARTITION_METRICS
    }


def test_multilabel_record_class_without_positives():
    S = np.array([[0.3, 0.1], [0.2, 0.4], [0.9, -1.0]])
    Y = sp.csr_matrix(np.array([[1, 0], [0, 0], [1, 0]]))
    rec = multilabel_record("test", S, Y, [0.0])
    assert rec["test_ap_classes"][0] == 1.0  # 0.9 (+), 0.3 (+), 0.2
    assert np.isnan(rec["test_ap_classes"][1])
    assert rec["test_map"] == rec["test_ap_classes"][0]
    assert rec["test_hloss_grid"] == [pytest.approx(3 / 6)]  # FP: (0, 1), (1, 0), (1, 1)
