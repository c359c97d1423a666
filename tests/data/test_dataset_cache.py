"""The on-disk dataset cache (``load_dataset_cached``): dense matrices are stored as ``.npy``
beside the pickle and come back memory-mapped, so the worker processes of a sweep share one
copy (issue 7); sparse ones stay in the pickle; a missing matrix is a cache miss."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from topkbench.config import DatasetConfig
from topkbench.data.cache import _cache_path, load_dataset_cached
from topkbench.data.dataset import load_dataset


@pytest.fixture
def libsvm_cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKBENCH_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("test", 12)):
        lines = []
        for i in range(n):
            # features 1, 3 and 5 of 8: the file is sparse (3/8 of the entries stored)
            feats = " ".join(f"{j + 1}:{rng.normal():.6f}" for j in range(0, 5, 2))
            lines.append(f"{1 + i % 3} {feats} 8:0.5")
        (tmp_path / f"toy.{split}").write_text("\n".join(lines) + "\n")

    def make(**extra):
        files = {s: {"file": str(tmp_path / f"toy.{s}")} for s in ("train", "test")}
        return DatasetConfig.from_dict({"name": "toy", "kind": "libsvm", "files": files, **extra})

    return make


def test_dense_data_in_a_sparse_file_is_stored_dense(tmp_path, monkeypatch):
    """A LibSVM file that stores (almost) every entry, as Letter's does, gives dense splits
    of the same values (no larger than CSR, and faster to train on); a sparse one stays CSR."""
    monkeypatch.setenv("TOPKBENCH_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(1)
    values = rng.normal(size=(2, 12, 6))
    values[0, 3, 2] = 0.0  # one entry left out: 71 of 72 stored
    for s, block in zip(("train", "test"), values, strict=True):
        text = "\n".join(
            f"{1 + i % 2} "
            + " ".join(f"{j + 1}:{float(v)!r}" for j, v in enumerate(row) if v != 0.0)
            for i, row in enumerate(block)
        )
        (tmp_path / f"full.{s}").write_text(text + "\n")
    files = {s: {"file": str(tmp_path / f"full.{s}")} for s in ("train", "test")}
    cfg = DatasetConfig.from_dict({"name": "full", "kind": "libsvm", "files": files})
    for load in (load_dataset, load_dataset_cached, load_dataset_cached):
        for s, block in zip(("train", "test"), values, strict=True):
            X = load(cfg, 0).splits[s][0]
            assert not sp.issparse(X)
            np.testing.assert_array_equal(X, block)


def test_dense_splits_come_back_memory_mapped(libsvm_cfg):
    cfg = libsvm_cfg(pca="nonsingular")
    first = load_dataset_cached(cfg, 0)
    path = _cache_path(cfg)
    assert path.exists()
    assert sorted(p.name for p in path.parent.glob("*.npy")) == [
        f"{path.stem}.test.npy",
        f"{path.stem}.train.npy",
    ]
    again = load_dataset_cached(cfg, 0)
    fresh = load_dataset(cfg, 0)
    for split in ("train", "test"):
        X, y = again.splits[split]
        assert isinstance(X, np.memmap) and not X.flags.writeable
        np.testing.assert_array_equal(X, first.splits[split][0])
        np.testing.assert_array_equal(X, fresh.splits[split][0])
        np.testing.assert_array_equal(y, fresh.splits[split][1])
    assert again.label_names == fresh.label_names


def test_sparse_splits_stay_in_the_pickle(libsvm_cfg):
    cfg = libsvm_cfg()
    load_dataset_cached(cfg, 0)
    assert not list(_cache_path(cfg).parent.glob("*.npy"))
    X, _ = load_dataset_cached(cfg, 0).splits["train"]
    assert sp.issparse(X)


def test_a_missing_matrix_is_a_cache_miss(libsvm_cfg):
    cfg = libsvm_cfg(pca="nonsingular")
    load_dataset_cached(cfg, 0)
    path = _cache_path(cfg)
    (path.parent / f"{path.stem}.train.npy").unlink()
    ds = load_dataset_cached(cfg, 0)  # rebuilt, not an error
    np.testing.assert_array_equal(ds.splits["train"][0], load_dataset(cfg, 0).splits["train"][0])
    assert (path.parent / f"{path.stem}.train.npy").exists()


def test_float32_option_halves_the_features(libsvm_cfg):
    cfg = libsvm_cfg(pca="nonsingular", float32=True)
    ds = load_dataset_cached(cfg, 0)
    ref = load_dataset(libsvm_cfg(pca="nonsingular"), 0)
    for split in ("train", "test"):
        X = load_dataset_cached(cfg, 0).splits[split][0]
        assert X.dtype == np.float32 and isinstance(X, np.memmap)
        np.testing.assert_array_equal(ds.splits[split][0], ref.splits[split][0].astype(np.float32))
    ref = load_dataset(libsvm_cfg(), 0).splits["train"][0]
    for load in (load_dataset, load_dataset_cached):
        sparse = load(libsvm_cfg(float32=True), 0).splits["train"][0]
        assert sp.issparse(sparse) and sparse.dtype == np.float32
        np.testing.assert_array_equal(sparse.toarray(), ref.toarray().astype(np.float32))


def test_an_unwritable_data_directory_only_skips_the_cache(libsvm_cfg, monkeypatch):
    """A read-only data directory (shipped data, an archive) or a full disk: the data loads
    as without a cache, and nothing is left behind."""
    import errno

    import topkbench.data.cache as cache

    def refuse(path, write):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(cache, "_atomic_write", refuse)
    cfg = libsvm_cfg()
    ds = load_dataset_cached(cfg, 0)
    ref = load_dataset(cfg, 0)
    for split, (X, y) in ref.splits.items():
        np.testing.assert_array_equal(np.asarray(ds.splits[split][0].todense()
                                                 if sp.issparse(X) else ds.splits[split][0]),
                                      np.asarray(X.todense() if sp.issparse(X) else X))  # fmt: skip
        np.testing.assert_array_equal(ds.splits[split][1], y)
    assert not _cache_path(cfg).exists()


def test_float32_option_is_true_false_or_auto(libsvm_cfg):
    """Absent, the passes follow fit's float32="auto"; false keeps them in float64 (the
    sweep passes float32="never"); anything else is refused."""
    from topkbench.errors import ConfigError
    from topkbench.experiments.fits import dataset_options

    assert load_dataset(libsvm_cfg(), 0).float32 == "auto"
    off = load_dataset(libsvm_cfg(float32=False), 0)
    assert off.float32 == "never"
    assert dataset_options(off, "svm_multi") == {"float32": "never"}
    assert dataset_options(load_dataset(libsvm_cfg(), 0), "svm_multi") == {}
    with pytest.raises(ConfigError, match="dataset.float32 must be true, false or null"):
        libsvm_cfg(float32="abc")
