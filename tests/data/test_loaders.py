"""Dataset kinds ``mat`` / ``features`` / ``libsvm`` through :func:`load_dataset` (DESIGN §6.2):
MATLAB v5 and v7.3 files, HDF5 / .npz / .npy features, LibSVM splits, the stratified holdout,
Gram-matrix PCA against an SVD reference, and one DataFormatError naming the file per defect.

Every fixture file is written here into ``tmp_path``; nothing is downloaded."""

from __future__ import annotations

import bz2
import gzip

import h5py
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from topkbench.config import DatasetConfig
from topkbench.data.dataset import load_dataset
from topkbench.data.features import read_features
from topkbench.data.files import missing_files
from topkbench.data.matlab import read_mat, read_split_mat
from topkbench.data.pca import gram_pca
from topkbench.data.preprocess import stratified_folds, stratified_holdout
from topkbench.errors import DataFormatError, DatasetNotFoundError

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def cfg_of(kind: str, files: dict, name: str = "toy", **opts) -> DatasetConfig:
    """A DatasetConfig whose files are absolute paths (or registry-style dicts)."""
    conv = {
        s: (str(e) if not isinstance(e, dict) else {k: str(v) for k, v in e.items()})
        for s, e in files.items()
    }
    return DatasetConfig.from_dict({"name": name, "kind": kind, "files": conv, **opts})


def silhouettes(seed: int = 0, m: int = 4, d: int = 6):
    """Caltech101-Silhouettes-shaped splits: 0/1 pixels, 1-based labels covering 1..m."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", 12), ("val", 8), ("test", 9)):
        X = (rng.random(size=(n, d)) < 0.4).astype(np.float64)
        y = np.concatenate([np.arange(1, m + 1), rng.integers(1, m + 1, size=n - m)])
        rng.shuffle(y)
        out[split] = (X, y.astype(np.float64))
    return out


CLASSNAMES = ["accordion", "airplanes", "anchor", "ant"]


def write_mat_v5(path, splits, classnames=CLASSNAMES, **extra):
    variables = {}
    for split, (X, y) in splits.items():
        variables[f"{split}_data"] = X
        variables[f"{split}_labels"] = y.reshape(-1, 1)  # n x 1, as in Marlin's file
    if classnames is not None:
        variables["classnames"] = np.array(classnames, dtype=object).reshape(1, -1)  # 1 x m cell
    variables.update(extra)
    scipy.io.savemat(path, variables)


def write_mat_v73(path, splits, classnames=None):
    """HDF5 in MATLAB's column-major layout: an n x d matrix is stored as d x n."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for split, (X, y) in splits.items():
            f[f"{split}_data"] = X.T
            f[f"{split}_data"].attrs["MATLAB_class"] = np.bytes_("double")
            f[f"{split}_labels"] = y.reshape(1, -1)  # MATLAB n x 1 -> HDF5 1 x n
            f[f"{split}_labels"].attrs["MATLAB_class"] = np.bytes_("double")
        if classnames is not None:  # a 1 x m cell of char arrays (object references)
            refs = f.create_group("#refs#")
            cell = np.empty((len(classnames), 1), dtype=h5py.ref_dtype)
            for j, name in enumerate(classnames):
                ds = refs.create_dataset(
                    f"c{j}", data=np.array([[ord(ch)] for ch in name], dtype=np.uint16)
                )
                ds.attrs["MATLAB_class"] = np.bytes_("char")
                cell[j, 0] = ds.ref
            f.create_dataset("classnames", data=cell, dtype=h5py.ref_dtype)
            f["classnames"].attrs["MATLAB_class"] = np.bytes_("cell")
    with open(path, "r+b") as fh:  # MATLAB's text header in the user block
        fh.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: topkbench test HDF5 schema")


def mat_cfg(path, splits=("train", "val", "test")):
    return cfg_of("mat", {s: {"file": path, "prefix": s} for s in splits})


def libsvm_text(X, y) -> str:
    lines = []
    for row, lab in zip(np.atleast_2d(X), y, strict=True):
        feats = " ".join(f"{j + 1}:{v:.17g}" for j, v in enumerate(row) if v != 0)
        lines.append(f"{lab} {feats}".rstrip())
    return "\n".join(lines) + "\n"


def write_text(path, text: str):
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)
    with opener(path, "wt") as fh:
        fh.write(text)
    return path


def align_signs(Z, Zref):
    s = np.sign(np.sum(Z * Zref, axis=0))
    s[s == 0] = 1.0
    return Z * s[None, :]


def svd_pca(Xtr, others):
    """Reference PCA: all components of the centred training matrix with nonzero singular value."""
    Xtr = Xtr.toarray() if sp.issparse(Xtr) else np.asarray(Xtr)
    mu = Xtr.mean(axis=0)
    Xc = Xtr - mu
    U, S, Vt = np.linalg.svd(Xc, full_matrices=False)
    r = np.linalg.matrix_rank(Xc)
    P = Vt[:r].T
    outs = [((Xo.toarray() if sp.issparse(Xo) else Xo) - mu) @ P for Xo in others]
    return Xc @ P, outs, r


# ---------------------------------------------------------------------------------------------
# MATLAB .mat, v5 and v7.3
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def mat_pair(tmp_path):
    splits = silhouettes()
    v5, v73 = tmp_path / "sil_v5.mat", tmp_path / "sil_v73.mat"
    write_mat_v5(v5, splits)
    write_mat_v73(v73, splits, classnames=CLASSNAMES)
    return splits, v5, v73


def test_mat_v5_and_v73_give_identical_arrays(mat_pair):
    splits, v5, v73 = mat_pair
    assert not h5py.is_hdf5(v5) and h5py.is_hdf5(v73)
    a, b = load_dataset(mat_cfg(v5), seed=0), load_dataset(mat_cfg(v73), seed=0)
    assert list(a.splits) == list(b.splits) == ["train", "val", "test"]
    for s, (X, y) in splits.items():
        for ds in (a, b):
            Xs, ys = ds.splits[s]
            assert Xs.dtype == np.float64 and Xs.shape == X.shape
            np.testing.assert_array_equal(Xs, X)
            np.testing.assert_array_equal(ys, y.astype(np.int64) - 1)  # 1..m -> 0..m-1
            assert ys.dtype.kind == "i"
    assert a.n_classes == b.n_classes == 4 and a.n_features == b.n_features == 6
    assert a.label_names == CLASSNAMES
    assert b.label_names == CLASSNAMES  # the v7.3 cell of char arrays decodes too
    assert a.provenance["file"] == str(v5)


def test_read_mat_orientation_and_classnames(mat_pair):
    splits, v5, v73 = mat_pair
    for path in (v5, v73):
        got = read_mat(path)
        assert got["train_data"].shape == splits["train"][0].shape  # MATLAB orientation
        assert got["classnames"] == CLASSNAMES
        assert not any(k.startswith("#") for k in got)  # '#refs#' is internal
    per_split, names = read_split_mat(v73, {"train": "train", "test": "test"})
    assert set(per_split) == {"train", "test"} and names == CLASSNAMES
    np.testing.assert_array_equal(per_split["test"][1], splits["test"][1].astype(int))


def test_mat_classnames_indexed_by_one_based_label_when_a_class_is_absent(tmp_path):
    splits = silhouettes(m=4)
    for s in splits:  # class 3 occurs nowhere; names still has 4 entries (labels 1..4)
        X, y = splits[s]
        keep = y != 3
        splits[s] = (X[keep], y[keep])
    path = tmp_path / "gap.mat"
    write_mat_v5(path, splits)
    ds = load_dataset(mat_cfg(path), seed=0)
    assert ds.n_classes == 3
    assert ds.label_names == ["accordion", "airplanes", "ant"]
    y_train = splits["train"][1]
    np.testing.assert_array_equal(ds.splits["train"][1], np.searchsorted([1, 2, 4], y_train))


def test_mat_without_classnames_uses_label_values(tmp_path):
    path = tmp_path / "nonames.mat"
    write_mat_v5(path, silhouettes(), classnames=None)
    ds = load_dataset(mat_cfg(path), seed=0)
    assert ds.label_names == ["1", "2", "3", "4"]


def test_mat_missing_variable_lists_the_variables_present(tmp_path):
    splits = silhouettes()
    del splits["val"]
    path = tmp_path / "noval.mat"
    write_mat_v5(path, splits)
    with pytest.raises(DataFormatError) as err:
        load_dataset(mat_cfg(path), seed=0)
    msg = str(err.value)
    assert str(path) in msg
    assert "val_data" in msg and "val_labels" in msg
    for present in ("classnames", "test_data", "test_labels", "train_data", "train_labels"):
        assert present in msg


def test_mat_rows_and_labels_length_mismatch(tmp_path):
    splits = silhouettes()
    X, y = splits["train"]
    splits["train"] = (X, y[:-1])
    path = tmp_path / "short.mat"
    write_mat_v5(path, splits)
    with pytest.raises(DataFormatError) as err:
        load_dataset(mat_cfg(path), seed=0)
    assert str(path) in str(err.value)
    assert "12 rows" in str(err.value) and "11 labels" in str(err.value)


@pytest.mark.parametrize("version", ["v5", "v73"])
def test_mat_nan_feature_names_file_and_position(tmp_path, version):
    splits = silhouettes()
    splits["val"][0][1, 2] = np.nan
    path = tmp_path / f"nan_{version}.mat"
    (write_mat_v5 if version == "v5" else write_mat_v73)(path, splits)
    with pytest.raises(DataFormatError) as err:
        load_dataset(mat_cfg(path), seed=0)
    msg = str(err.value)
    assert err.value.path == str(path) and str(path) in msg
    assert "example 2, feature 3" in msg and "finite" in msg


@pytest.mark.parametrize("version", ["v5", "v73"])
def test_mat_non_integer_label_names_file(tmp_path, version):
    splits = silhouettes()
    splits["train"][1][3] = 1.5
    path = tmp_path / f"frac_{version}.mat"
    (write_mat_v5 if version == "v5" else write_mat_v73)(path, splits)
    with pytest.raises(DataFormatError) as err:
        load_dataset(mat_cfg(path), seed=0)
    msg = str(err.value)
    assert str(path) in msg and "train_labels" in msg and "integers" in msg
    assert "1.5" in msg


def test_mat_non_integer_label_token_is_the_plain_value(tmp_path):
    splits = silhouettes()
    splits["train"][1][3] = 1.5
    path = tmp_path / "frac.mat"
    write_mat_v5(path, splits)
    with pytest.raises(DataFormatError) as err:
        read_split_mat(path, {"train": "train"})
    assert err.value.token == "1.5"
    assert "np.float64" not in str(err.value)


def test_mat_unreadable_file(tmp_path):
    path = tmp_path / "garbage.mat"
    path.write_bytes(b"this is not a MAT-file at all" * 10)
    with pytest.raises(DataFormatError) as err:
        load_dataset(mat_cfg(path), seed=0)
    assert str(path) in str(err.value)


# ---------------------------------------------------------------------------------------------
# precomputed features: HDF5, .npz, .npy
# ---------------------------------------------------------------------------------------------


def feature_problem(n=20, d=5, m=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.tile(np.array([10, 20, 30][:m]), n // m + 1)[:n]  # arbitrary integer labels
    return X, y


SPLIT_IDX = {
    "train": np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
    "val": np.array([12, 13, 14]),
    "test": np.array([15, 16, 17, 18, 19]),
}


@pytest.mark.parametrize("id_kind", ["int", "str"])
def test_hdf5_features_with_image_ids_and_split_indices(tmp_path, id_kind):
    X, y = feature_problem()
    n = len(y)
    if id_kind == "int":
        ids = np.arange(n) // 2 + 1000  # two regions per image
    else:
        ids = np.array([f"img_{i // 2:03d}.jpg" for i in range(n)])
    path = tmp_path / "feats.h5"
    with h5py.File(path, "w") as f:
        f["features"] = X.astype(np.float32)
        f["labels"] = y
        if id_kind == "int":
            f["image_ids"] = ids
        else:
            f.create_dataset("image_ids", data=ids.tolist(), dtype=h5py.string_dtype())
        f.create_dataset("label_names", data=["ten", "twenty", "thirty"], dtype=h5py.string_dtype())
        for s, idx in SPLIT_IDX.items():
            f[f"splits/{s}"] = idx
    ds = load_dataset(cfg_of("features", {s: path for s in SPLIT_IDX}), seed=0)
    assert list(ds.splits) == ["train", "val", "test"]
    for s, idx in SPLIT_IDX.items():
        Xs, ys = ds.splits[s]
        np.testing.assert_array_equal(Xs, X[idx].astype(np.float32))
        np.testing.assert_array_equal(ys, np.searchsorted([10, 20, 30], y[idx]))
        np.testing.assert_array_equal(ds.image_ids[s], ids[idx])
        if id_kind == "str":
            assert isinstance(ds.image_ids[s][0], str)
    assert ds.label_names == ["ten", "twenty", "thirty"]
    assert ds.n_classes == 3


def test_hdf5_split_index_missing_names_file(tmp_path):
    X, y = feature_problem()
    path = tmp_path / "feats.h5"
    with h5py.File(path, "w") as f:
        f["features"], f["labels"] = X, y
        f["splits/train"] = SPLIT_IDX["train"]
        f["splits/test"] = SPLIT_IDX["test"]
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": path, "val": path}), seed=0)
    assert str(path) in str(err.value) and "splits/val" in str(err.value)


def test_hdf5_one_file_per_split(tmp_path):
    X, y = feature_problem(n=21)
    files = {}
    for s, sl in (("train", slice(0, 12)), ("val", slice(12, 15)), ("test", slice(15, 21))):
        files[s] = tmp_path / f"{s}.hdf5"
        with h5py.File(files[s], "w") as f:
            f["features"], f["labels"] = X[sl], y[sl]
    ds = load_dataset(cfg_of("features", files), seed=0)
    np.testing.assert_array_equal(ds.splits["val"][0], X[12:15])
    np.testing.assert_array_equal(ds.splits["test"][1], np.searchsorted([10, 20, 30], y[15:21]))
    assert ds.label_names == ["10", "20", "30"]
    assert ds.provenance["files"] == {s: str(p) for s, p in files.items()}


def test_npz_features_with_split_keys(tmp_path):
    X, y = feature_problem()
    path = tmp_path / "feats.npz"
    np.savez(
        path,
        features=X,
        labels=y,
        image_ids=np.arange(len(y)),
        **{f"splits/{s}": idx for s, idx in SPLIT_IDX.items()},
    )
    ds = load_dataset(cfg_of("features", {s: path for s in SPLIT_IDX}), seed=0)
    for s, idx in SPLIT_IDX.items():
        np.testing.assert_array_equal(ds.splits[s][0], X[idx])
        np.testing.assert_array_equal(ds.image_ids[s], idx)


def test_npz_one_file_per_split_and_bias(tmp_path):
    X, y = feature_problem()
    tr, te = tmp_path / "tr.npz", tmp_path / "te.npz"
    np.savez(tr, features=X[:12], labels=y[:12])
    np.savez(te, features=X[12:], labels=y[12:])
    ds = load_dataset(cfg_of("features", {"train": tr, "test": te}, bias=1.0), seed=0)
    assert ds.n_features == X.shape[1] + 1
    np.testing.assert_array_equal(ds.splits["test"][0][:, :-1], X[12:])
    np.testing.assert_array_equal(ds.splits["test"][0][:, -1], 1.0)


def test_npy_features_are_memory_mapped(tmp_path):
    X, y = feature_problem()
    files = {}
    for s, sl in (("train", slice(0, 12)), ("test", slice(12, 20))):
        np.save(tmp_path / f"X_{s}.npy", X[sl])
        np.save(tmp_path / f"y_{s}.npy", y[sl])
        files[s] = {"file": tmp_path / f"X_{s}.npy", "labels": tmp_path / f"y_{s}.npy"}
    cfg = cfg_of("features", files)
    assert missing_files(cfg) == []
    ds = load_dataset(cfg, seed=0)
    Xtr = ds.splits["train"][0]
    assert isinstance(Xtr, np.memmap)  # not copied into every worker
    np.testing.assert_array_equal(Xtr, X[:12])
    np.testing.assert_array_equal(ds.splits["test"][0], X[12:])
    np.testing.assert_array_equal(ds.splits["test"][1], np.searchsorted([10, 20, 30], y[12:]))
    # a missing labels file is reported like a missing features file
    (tmp_path / "y_test.npy").unlink()
    assert missing_files(cfg) == [tmp_path / "y_test.npy"]
    with pytest.raises(DatasetNotFoundError):
        load_dataset(cfg, seed=0)


def test_npy_without_labels_file_is_an_error(tmp_path):
    np.save(tmp_path / "X.npy", np.ones((3, 2)))
    with pytest.raises(DataFormatError, match="labels file") as err:
        read_features(tmp_path / "X.npy")
    assert str(tmp_path / "X.npy") in str(err.value)


@pytest.mark.parametrize("fmt", ["npz", "h5", "npy"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_name_file_and_position(tmp_path, fmt, bad):
    X, y = feature_problem()
    X[7, 3] = bad
    if fmt == "npz":
        path = tmp_path / "f.npz"
        np.savez(path, features=X, labels=y)
        files = {"train": path}
    elif fmt == "h5":
        path = tmp_path / "f.h5"
        with h5py.File(path, "w") as f:
            f["features"], f["labels"] = X, y
        files = {"train": path}
    else:
        path = tmp_path / "f.npy"
        np.save(path, X)
        np.save(tmp_path / "y.npy", y)
        files = {"train": {"file": path, "labels": tmp_path / "y.npy"}}
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", files), seed=0)
    msg = str(err.value)
    assert err.value.path == str(path) and msg.startswith(str(path))
    assert "example 8, feature 4" in msg and str(bad) in msg


@pytest.mark.parametrize("fmt", ["npz", "h5"])
def test_non_integer_labels_in_feature_files(tmp_path, fmt):
    X, y = feature_problem()
    yf = y.astype(np.float64)
    yf[5] = 1.5
    path = tmp_path / f"f.{fmt}"
    if fmt == "npz":
        np.savez(path, features=X, labels=yf)
    else:
        with h5py.File(path, "w") as f:
            f["features"], f["labels"] = X, yf
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": path}), seed=0)
    assert err.value.path == str(path) and str(path) in str(err.value)
    assert err.value.token == "1.5" and "row 5" in str(err.value)


def test_integral_float_labels_are_accepted(tmp_path):
    X, y = feature_problem()
    path = tmp_path / "f.npz"
    np.savez(path, features=X, labels=y.astype(np.float64))
    ds = load_dataset(cfg_of("features", {"train": path}), seed=0)
    np.testing.assert_array_equal(ds.splits["train"][1], np.searchsorted([10, 20, 30], y))


@pytest.mark.parametrize("fmt", ["npz", "h5", "npy"])
def test_features_labels_length_mismatch(tmp_path, fmt):
    X, y = feature_problem()
    y = y[:-1]
    if fmt == "npz":
        path = tmp_path / "f.npz"
        np.savez(path, features=X, labels=y)
        files = {"train": path}
    elif fmt == "h5":
        path = tmp_path / "f.h5"
        with h5py.File(path, "w") as f:
            f["features"], f["labels"] = X, y
        files = {"train": path}
    else:
        path = tmp_path / "f.npy"
        np.save(path, X)
        np.save(tmp_path / "y.npy", y)
        files = {"train": {"file": path, "labels": tmp_path / "y.npy"}}
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", files), seed=0)
    assert str(path) in str(err.value)
    assert "20 rows" in str(err.value) and "19" in str(err.value)


def test_feature_file_missing_dataset_lists_contents(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["feats"] = np.ones((3, 2))
        f["labels"] = np.arange(3)
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": path}), seed=0)
    assert str(path) in str(err.value) and "features" in str(err.value)
    assert "feats" in str(err.value)


def test_dense_splits_with_different_feature_counts(tmp_path):
    X, y = feature_problem(d=5)
    tr, te = tmp_path / "tr.npz", tmp_path / "te.npz"
    np.savez(tr, features=X[:12], labels=y[:12])
    np.savez(te, features=X[12:, :4], labels=y[12:])
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": tr, "test": te}), seed=0)
    assert err.value.path == str(te) and str(te) in str(err.value)
    assert "4 features" in str(err.value) and "5" in str(err.value)


def test_training_split_missing_a_class(tmp_path):
    X, y = feature_problem()
    tr, te = tmp_path / "tr.npz", tmp_path / "te.npz"
    keep = y[:12] != 30
    np.savez(tr, features=X[:12][keep], labels=y[:12][keep])
    np.savez(te, features=X[12:], labels=y[12:])
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": tr, "test": te}), seed=0)
    assert err.value.path == str(tr)
    assert "training split" in str(err.value) and "30" in str(err.value)


def test_empty_split_is_an_error(tmp_path):
    tr, te = tmp_path / "tr.npz", tmp_path / "te.npz"
    np.savez(tr, features=np.ones((3, 2)), labels=np.array([0, 1, 1]))
    np.savez(te, features=np.ones((0, 2)), labels=np.array([], dtype=int))
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("features", {"train": tr, "test": te}), seed=0)
    assert str(te) in str(err.value) and "no examples" in str(err.value)


# ---------------------------------------------------------------------------------------------
# LibSVM kind
# ---------------------------------------------------------------------------------------------


def test_libsvm_splits_arbitrary_labels_and_widening(tmp_path):
    tr = write_text(tmp_path / "toy.tr", "-1 1:0.5 3:1\n5 2:2\n17 1:-1\n5 3:0.25\n")
    va = write_text(tmp_path / "toy.val", "17 2:1\n-1 1:1\n")
    te = write_text(tmp_path / "toy.t", "5 5:3\n-1 1:1 4:2\n17 2:7\n")  # wider than train
    ds = load_dataset(cfg_of("libsvm", {"train": tr, "val": va, "test": te}), seed=0)
    assert ds.label_names == ["-1", "5", "17"] and ds.n_classes == 3
    assert list(ds.splits) == ["train", "val", "test"]
    for X, _ in ds.splits.values():
        assert sp.issparse(X)
        assert X.shape[1] == 5
    np.testing.assert_array_equal(
        ds.splits["train"][0].toarray(),
        [[0.5, 0, 1, 0, 0], [0, 2, 0, 0, 0], [-1, 0, 0, 0, 0], [0, 0, 0.25, 0, 0]],
    )
    np.testing.assert_array_equal(ds.splits["test"][0].toarray()[0], [0, 0, 0, 0, 3])
    np.testing.assert_array_equal(ds.splits["train"][1], [0, 1, 2, 1])
    np.testing.assert_array_equal(ds.splits["val"][1], [2, 0])
    np.testing.assert_array_equal(ds.splits["test"][1], [1, 0, 2])
    assert ds.n_features == 5


def test_libsvm_compressed_files(tmp_path):
    rng = np.random.default_rng(2)
    X = np.round(rng.normal(size=(10, 4)) * (rng.random(size=(10, 4)) < 0.6), 3)
    y = np.array([3, 1, 2] * 3 + [3])
    tr = write_text(tmp_path / "d.tr.gz", libsvm_text(X[:6], y[:6]))
    te = write_text(tmp_path / "d.t.bz2", libsvm_text(X[6:], y[6:]))
    assert tr.read_bytes()[:2] == b"\x1f\x8b" and te.read_bytes()[:3] == b"BZh"
    ds = load_dataset(cfg_of("libsvm", {"train": tr, "test": te}), seed=0)
    d = ds.n_features
    np.testing.assert_array_equal(ds.splits["train"][0].toarray(), X[:6, :d])
    np.testing.assert_array_equal(ds.splits["test"][0].toarray(), X[6:, :d])
    np.testing.assert_array_equal(ds.splits["test"][1], y[6:] - 1)
    assert ds.label_names == ["1", "2", "3"]


def test_libsvm_zero_based_option(tmp_path):
    tr = write_text(tmp_path / "z.tr", "1 0:1 2:3\n2 1:4\n")
    ds = load_dataset(cfg_of("libsvm", {"train": tr}, zero_based=True), seed=0)
    np.testing.assert_array_equal(ds.splits["train"][0].toarray(), [[1, 0, 3], [0, 4, 0]])


def test_libsvm_string_label_names_file_line_and_token(tmp_path):
    tr = write_text(tmp_path / "toy.tr", "1 1:1\n2 1:2\ncat 2:1\n")
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("libsvm", {"train": tr}), seed=0)
    e = err.value
    assert (e.path, e.line, e.token) == (str(tr), 3, "cat")
    assert str(tr) in str(e) and "line 3" in str(e) and "'cat'" in str(e)


def test_libsvm_empty_file(tmp_path):
    tr = write_text(tmp_path / "toy.tr", "1 1:1\n2 1:2\n")
    te = write_text(tmp_path / "toy.t", "")
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("libsvm", {"train": tr, "test": te}), seed=0)
    assert err.value.path == str(te) and "empty" in str(err.value)


def test_libsvm_nan_feature_names_line(tmp_path):
    tr = write_text(tmp_path / "toy.tr", "1 1:1\n2 1:nan\n")
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("libsvm", {"train": tr}), seed=0)
    assert (err.value.path, err.value.line, err.value.token) == (str(tr), 2, "1:nan")


def test_libsvm_training_split_missing_a_test_class(tmp_path):
    tr = write_text(tmp_path / "toy.tr", "1 1:1\n2 1:2\n")
    te = write_text(tmp_path / "toy.t", "1 1:1\n3 1:2\n4 2:1\n")
    with pytest.raises(DataFormatError) as err:
        load_dataset(cfg_of("libsvm", {"train": tr, "test": te}), seed=0)
    msg = str(err.value)
    assert err.value.path == str(tr) and msg.startswith(str(tr))
    assert "2 class(es)" in msg and "3, 4" in msg


def test_missing_file_hint_mentions_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKBENCH_DATA", str(tmp_path / "data"))
    cfg = DatasetConfig.from_dict(
        {"name": "ghost", "kind": "libsvm", "files": {"train": "ghost.tr", "test": "ghost.t"}}
    )
    expected = [tmp_path / "data" / "ghost" / "ghost.tr", tmp_path / "data" / "ghost" / "ghost.t"]
    assert missing_files(cfg) == expected
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(cfg, seed=0)
    assert "ghost" in str(err.value)
    for p in expected:
        assert str(p) in str(err.value)
    assert "ghost has no download" in err.value.hint
    assert "topkbench data info ghost" in err.value.hint
    with_url = DatasetConfig.from_dict(
        {"name": "ghost", "kind": "libsvm", "files": {"train": {"file": "g", "url": "http://x/g"}}}
    )
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(with_url, seed=0)
    assert "topkbench data fetch ghost" in err.value.hint
    # once the files are there, relative names resolve under $TOPKBENCH_DATA/<name>/
    (tmp_path / "data" / "ghost").mkdir(parents=True)
    write_text(expected[0], "1 1:1\n2 2:1\n")
    write_text(expected[1], "2 1:1\n")
    assert missing_files(cfg) == []
    assert load_dataset(cfg, seed=0).splits["test"][1].tolist() == [1]


@pytest.mark.parametrize("kind", ["mat", "features"])
def test_missing_file_other_kinds(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("TOPKBENCH_DATA", str(tmp_path))
    cfg = DatasetConfig.from_dict({"name": "gone", "kind": kind, "files": {"train": "x.mat"}})
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(cfg, seed=0)
    assert str(tmp_path / "gone" / "x.mat") in str(err.value)
    assert "topkbench data info gone" in err.value.hint


# ---------------------------------------------------------------------------------------------
# stratified holdout and folds
# ---------------------------------------------------------------------------------------------

COUNTS = {-3: 10, 0: 6, 4: 4, 9: 8}


def holdout_file(tmp_path):
    """One LibSVM file; feature 1 is the row id so rows can be traced through the split."""
    rng = np.random.default_rng(5)
    y = np.concatenate([np.full(c, lab) for lab, c in COUNTS.items()])
    rng.shuffle(y)
    lines = [f"{lab} 1:{i + 1} 2:{rng.normal():.6f}" for i, lab in enumerate(y)]
    lines[0] += " 5:0.5"  # five columns, two fifths stored: read as CSR
    return write_text(tmp_path / "all.bz2", "\n".join(lines) + "\n"), y


def test_holdout_is_stratified_deterministic_and_independent_of_seed(tmp_path):
    path, y = holdout_file(tmp_path)
    opts = {"holdout": {"source": "all", "test_fraction": 0.5, "seed": 0}}
    cfg = cfg_of("libsvm", {"all": path}, **opts)
    a = load_dataset(cfg, seed=0)
    b = load_dataset(cfg, seed=12345)  # the run seed does not move the split
    assert list(a.splits) == ["train", "test"]
    classes = sorted(COUNTS)
    assert a.label_names == [str(c) for c in classes]
    for s in ("train", "test"):
        counts = np.bincount(a.splits[s][1], minlength=len(classes))
        assert counts.tolist() == [COUNTS[c] // 2 for c in classes]
        np.testing.assert_array_equal(a.splits[s][0].toarray(), b.splits[s][0].toarray())
        np.testing.assert_array_equal(a.splits[s][1], b.splits[s][1])
    rows_tr = a.splits["train"][0][:, 0].toarray().ravel().astype(int) - 1
    rows_te = a.splits["test"][0][:, 0].toarray().ravel().astype(int) - 1
    assert sorted(np.concatenate([rows_tr, rows_te]).tolist()) == list(range(len(y)))
    np.testing.assert_array_equal(np.asarray(classes)[a.splits["test"][1]], y[rows_te])
    assert "seed 0" in a.provenance["holdout"]
    # a different holdout seed gives another (still stratified) split
    c = load_dataset(cfg_of("libsvm", {"all": path}, holdout={**opts["holdout"], "seed": 1}), 0)
    rows_te_c = c.splits["test"][0][:, 0].toarray().ravel().astype(int) - 1
    assert set(rows_te_c.tolist()) != set(rows_te.tolist())
    assert np.bincount(c.splits["test"][1]).tolist() == [COUNTS[k] // 2 for k in classes]


def test_holdout_carries_image_ids(tmp_path):
    X, y = feature_problem(n=24)
    ids = np.array([f"im{i}" for i in range(24)])
    path = tmp_path / "all.npz"
    np.savez(path, features=X, labels=y, image_ids=ids)
    holdout = {"source": "all", "test_fraction": 0.25, "seed": 3}
    ds = load_dataset(cfg_of("features", {"all": path}, holdout=holdout), seed=0)
    assert np.bincount(ds.splits["test"][1]).tolist() == [2, 2, 2]  # round(0.25 * 8)
    for s in ("train", "test"):
        rows = [int(i[2:]) for i in ds.image_ids[s]]
        np.testing.assert_array_equal(ds.splits[s][0], X[rows])


def test_stratified_holdout_function():
    y = np.repeat([0, 1, 2], [10, 6, 4])
    keep, out = stratified_holdout(y, 0.5, seed=7)
    assert np.bincount(y[out]).tolist() == [5, 3, 2] and np.bincount(y[keep]).tolist() == [5, 3, 2]
    assert np.intersect1d(keep, out).size == 0 and len(keep) + len(out) == len(y)
    k2, o2 = stratified_holdout(y, 0.5, seed=7)
    np.testing.assert_array_equal(out, o2)
    np.testing.assert_array_equal(keep, k2)


@pytest.mark.parametrize("n_folds", [2, 3, 5])
def test_stratified_folds_balance_each_class(n_folds):
    y = np.repeat([0, 1, 2, 3], [13, 7, 3, 1])
    fold = stratified_folds(y, n_folds, seed=0)
    assert fold.min() >= 0 and fold.max() < n_folds
    for c in range(4):
        per_fold = np.bincount(fold[y == c], minlength=n_folds)
        assert per_fold.max() - per_fold.min() <= 1
    sizes = np.bincount(fold, minlength=n_folds)
    assert sizes.max() - sizes.min() <= 1  # the round robin continues across classes
    np.testing.assert_array_equal(fold, stratified_folds(y, n_folds, seed=0))


# ---------------------------------------------------------------------------------------------
# PCA (pca: nonsingular) against an SVD reference
# ---------------------------------------------------------------------------------------------


def check_against_svd(ds, Xtr, others):
    Zref, Zo_ref, r = svd_pca(Xtr, [X for X in others.values()])
    assert ds.n_features == r
    assert f"{r} components" in ds.provenance["pca"]
    Ztr = ds.splits["train"][0]
    assert isinstance(Ztr, np.ndarray) and Ztr.shape == (Xtr.shape[0], r)
    s = np.sign(np.sum(Ztr * Zref, axis=0))
    assert np.all(s != 0)
    np.testing.assert_allclose(Ztr * s, Zref, atol=1e-8)
    for (name, _), Zr in zip(others.items(), Zo_ref, strict=True):
        np.testing.assert_allclose(ds.splits[name][0] * s, Zr, atol=1e-8)


def test_pca_nonsingular_dense_rank_deficient(tmp_path):
    rng = np.random.default_rng(11)
    A = rng.normal(size=(18, 3)) @ rng.normal(size=(3, 7)) + 5.0  # centred rank 3
    X = np.vstack([A, rng.normal(size=(6, 7))])
    y = np.tile([1, 2, 3], 8)
    tr, te = tmp_path / "tr.npz", tmp_path / "te.npz"
    np.savez(tr, features=X[:18], labels=y[:18])
    np.savez(te, features=X[18:], labels=y[18:])
    ds = load_dataset(cfg_of("features", {"train": tr, "test": te}, pca="nonsingular"), 0)
    assert np.linalg.matrix_rank(X[:18] - X[:18].mean(0)) == 3
    check_against_svd(ds, X[:18], {"test": X[18:]})


def test_pca_nonsingular_sparse_wide(tmp_path):
    rng = np.random.default_rng(12)
    n, d = 10, 40
    X = np.round(rng.random(size=(n + 5, d)) * (rng.random(size=(n + 5, d)) < 0.15), 3)
    y = np.tile([1, 2], (n + 5) // 2 + 1)[: n + 5]
    tr = write_text(tmp_path / "s.tr", libsvm_text(X[:n], y[:n]))
    va = write_text(tmp_path / "s.val", libsvm_text(X[n:], y[n:]))
    ds = load_dataset(cfg_of("libsvm", {"train": tr, "val": va}, pca="nonsingular"), 0)
    d_eff = max(
        int(np.flatnonzero(X[:n].any(0)).max()) + 1, int(np.flatnonzero(X[n:].any(0)).max()) + 1
    )
    assert np.linalg.matrix_rank(X[:n] - X[:n].mean(0)) == n - 1
    check_against_svd(ds, sp.csr_matrix(X[:n, :d_eff]), {"val": sp.csr_matrix(X[n:, :d_eff])})


def test_pca_integer_components_and_gram_pca_directly():
    rng = np.random.default_rng(13)
    X, T = rng.normal(size=(12, 5)), rng.normal(size=(4, 5))
    Zref, (Tref,), r = svd_pca(X, [T])
    Z, (Zt,), ev = gram_pca(sp.csr_matrix(X), [T], n_components=2)
    assert Z.shape == (12, 2) and Zt.shape == (4, 2) and len(ev) == 2
    np.testing.assert_allclose(align_signs(Z, Zref[:, :2]), Zref[:, :2], atol=1e-10)
    s = np.sign(np.sum(Z * Zref[:, :2], axis=0))
    np.testing.assert_allclose(Zt * s, Tref[:, :2], atol=1e-10)
    np.testing.assert_allclose(ev, np.linalg.svd(X - X.mean(0), compute_uv=False)[:2] ** 2)


def test_pca_more_components_than_samples_is_an_error():
    rng = np.random.default_rng(14)
    X = rng.normal(size=(8, 20))  # centred rank 7
    with pytest.raises(ValueError, match="asked for 10 PCA components"):
        gram_pca(X, [], n_components=10)


def test_pca_more_components_than_rank_is_an_error():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(30, 3)) @ rng.normal(size=(3, 20))  # rank 3, 26 null eigenvalues
    with pytest.raises(ValueError, match="rank 3"):
        gram_pca(X, [], n_components=4)
