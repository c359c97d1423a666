"""``dataset.scale``: per-feature scaling fitted on the training split only."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import topkbench
from topkbench.config import DatasetConfig
from topkbench.data.dataset import load_dataset
from topkbench.data.synthetic import make_ill_conditioned
from topkbench.errors import ConfigError


def write_libsvm(path, X, y):
    with open(path, "w") as fh:
        for xi, yi in zip(X, y, strict=True):
            feats = " ".join(f"{j + 1}:{v:.17g}" for j, v in enumerate(xi) if v != 0.0)
            fh.write(f"{yi} {feats}\n")
    return str(path)


@pytest.fixture
def files(tmp_path):
    X, y = make_ill_conditioned(150, 6, 3, seed=1)
    X[:, 2] = 7.0  # a constant column
    X[100:, 4] = 0.0
    X[:100, 4] = np.where(np.arange(100) % 2, X[:100, 4], 0.0)
    return X, {
        "train": write_libsvm(tmp_path / "tr.txt", X[:100], y[:100]),
        "test": write_libsvm(tmp_path / "te.txt", X[100:], y[100:]),
    }


def load(files, **options):
    cfg = DatasetConfig.from_dict({"name": "s", "kind": "libsvm", **files, **options})
    return load_dataset(cfg, 0)


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def test_standard_uses_train_statistics_only(files):
    X, paths = files
    raw = load(paths)
    ds = load(paths, scale="standard", bias=1.0)
    Xtr, Xte = dense(ds.splits["train"][0]), dense(ds.splits["test"][0])
    Rtr, Rte = dense(raw.splits["train"][0]), dense(raw.splits["test"][0])
    mu, sd = Rtr.mean(0), Rtr.std(0)
    sd[sd == 0] = 1.0
    np.testing.assert_allclose(Xtr[:, :-1], (Rtr - mu) / sd, atol=1e-12)
    np.testing.assert_allclose(Xte[:, :-1], (Rte - mu) / sd, atol=1e-12)  # not the test's own
    assert np.all(Xtr[:, -1] == 1.0) and np.all(Xte[:, -1] == 1.0)  # the bias column is kept
    np.testing.assert_allclose(Xtr[:, [0, 1, 3, 5]].std(0), 1.0)
    assert np.all(Xtr[:, 2] == 0.0)  # constant on train: centred, unit divisor
    assert "standard" in ds.provenance["scale"]


def test_maxabs_keeps_sparsity(files):
    _, paths = files
    raw = load(paths)
    ds = load(paths, scale="maxabs")
    Xtr = ds.splits["train"][0]
    if sp.issparse(raw.splits["train"][0]):
        assert sp.issparse(Xtr) and Xtr.nnz == raw.splits["train"][0].nnz
    Rtr = dense(raw.splits["train"][0])
    div = np.abs(Rtr).max(0)
    div[div == 0] = 1.0
    np.testing.assert_allclose(dense(Xtr), Rtr / div, atol=1e-15)
    np.testing.assert_allclose(np.abs(dense(Xtr)).max(0)[div != 1.0], 1.0)


def test_unknown_values_and_huge_sparse_standard_are_refused(files, tmp_path, monkeypatch):
    _, paths = files
    with pytest.raises(ConfigError, match="dataset.scale.*none, standard, maxabs"):
        load(paths, scale="minmax")
    X, y = make_ill_conditioned(80, 6, 3, seed=2)
    X[np.random.default_rng(2).random(X.shape) < 0.7] = 0.0
    paths = {"train": write_libsvm(tmp_path / "sp_tr.txt", X[:60], y[:60]),
             "test": write_libsvm(tmp_path / "sp_te.txt", X[60:], y[60:])}  # fmt: skip
    assert sp.issparse(load(paths).splits["train"][0])  # sparse LibSVM data is read sparse
    monkeypatch.setattr("topkbench.data.preprocess.MAX_DENSE_GB", 1e-6)
    with pytest.raises(ConfigError, match="sparse data dense"):
        load(paths, scale="standard")
    load(paths, scale="maxabs")


def test_scaling_makes_raw_features_well_conditioned(files):
    _, paths = files
    raw, ds = load(paths), load(paths, scale="standard")
    r2 = lambda d: float((dense(d.splits["train"][0]) ** 2).sum(1).max())  # noqa: E731
    assert r2(raw) > 1e3 and r2(ds) < 50
    X, y = ds.splits["train"]
    model = topkbench.fit(X, y, "svm_multi", C=16.0, gamma=1.0, eps=1e-3, max_epochs=1000)
    assert model.status == "converged"
