"""Precomputed features (DESIGN §6.2): HDF5, ``.npz`` and ``.npy``.

Layout (the same names in an HDF5 file and in an ``.npz`` archive)::

    features      n x d float array (required)
    labels        n integers (required; any integer values, mapped to 0..m-1 by the loader),
                  or an n x m 0/1 indicator for multilabel data (VOC 2007 / COCO, Tables 10-12)
    primary       multilabel data only (optional): n class indices 0..m-1, the single
                  "prominent" label each example's multiclass and top-k methods train on;
                  it must be one of the example's labels when its label set is not empty
    image_ids     n ids, integers or strings (optional: several region features per image,
                  TPAMI §6.3 — regions share their image's labels, and image scores are the
                  max over its regions)
    label_names   names of the label values in sorted order, or of the m indicator columns
                  (optional)
    splits/train  row indices of each split (optional; HDF5 group ``splits`` or npz keys
    splits/val    ``splits/train`` ...).  Without them, the file is one split and the
    splits/test   registry names one file per split.

A bare ``.npy`` holds only the feature matrix; its labels come from a second ``.npy`` (the
registry's ``labels:`` entry).  ``.npy`` features are memory-mapped (read-only), so a large
matrix is not copied into every worker process; so are HDF5 ``features`` stored contiguously
(h5py's default layout: no chunking, no compression) as floats, through their byte offset in
the file.  Chunked or compressed HDF5 features are read into memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topkbench.errors import DataFormatError, DatasetNotFoundError

FEATURE_SUFFIXES = (".h5", ".hdf5", ".npz", ".npy")


@dataclass
class FeatureFile:
    X: np.ndarray
    labels: np.ndarray  # class indices, or a CSR 0/1 indicator (multilabel)
    path: str
    image_ids: np.ndarray | None = None
    label_names: list[str] | None = None
    splits: dict[str, np.ndarray] = field(default_factory=dict)
    primary: np.ndarray | None = None  # multilabel: one class per example

    @property
    def multilabel(self) -> bool:
        import scipy.sparse as sp

        return sp.issparse(self.labels)


def _indicator(arr, path: str):
    """An n x m 0/1 indicator as CSR (int8); anything else than 0/1 names row and column."""
    import scipy.sparse as sp

    arr = np.asarray(arr)
    bad = (arr != 0) & (arr != 1)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise DataFormatError(
            path, f"'labels' indicator must be 0/1 (row {i}, column {j})", token=repr(arr[i, j])
        )
    return sp.csr_matrix(arr.astype(np.int8))


def _primary(arr, Y, path: str) -> np.ndarray:
    y = _labels(arr, path)
    n, m = Y.shape
    if len(y) != n:
        raise DataFormatError(path, f"'primary' has {len(y)} entries, expected {n}")
    if len(y) and (y.min() < 0 or y.max() >= m):
        i = int(np.flatnonzero((y < 0) | (y >= m))[0])
        raise DataFormatError(path, f"'primary' must be in 0..{m - 1} (row {i})", token=str(y[i]))
    nonempty = np.diff(Y.indptr) > 0
    inset = np.asarray(Y[np.arange(n), y]).ravel() != 0
    wrong = nonempty & ~inset
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise DataFormatError(
            path, f"'primary' label of row {i} is not one of its labels", token=str(y[i])
        )
    return y


def _labels(arr, path: str) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.ravel()
    if arr.ndim != 1:
        raise DataFormatError(path, f"'labels' must be a vector, has shape {arr.shape}")
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        bad = ~finite | (arr != np.round(np.where(finite, arr, 0.0)))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataFormatError(
                path, f"'labels' must be integers (row {i})", token=repr(float(arr[i]))
            )
    elif arr.dtype.kind not in "iub":
        raise DataFormatError(path, f"'labels' must be integers, found dtype {arr.dtype}")
    return arr.astype(np.int64)


def _strings(arr) -> list[str]:
    return [a.decode() if isinstance(a, bytes) else str(a) for a in np.asarray(arr).ravel()]


def _check_matrix(X, path: str) -> None:
    if X.ndim != 2:
        raise DataFormatError(path, f"'features' must be an n x d matrix, has shape {X.shape}")
    if X.dtype.kind not in "fiub":
        raise DataFormatError(path, f"'features' must be numeric, found dtype {X.dtype}")


def _finish(path: str, X, labels, image_ids, names, splits, primary=None) -> FeatureFile:
    _check_matrix(X, path)
    lab = np.asarray(labels)
    multilabel = lab.ndim == 2 and min(lab.shape) > 1
    y = _indicator(lab, path) if multilabel else _labels(lab, path)
    if y.shape[0] != X.shape[0]:
        raise DataFormatError(
            path, f"'features' has {X.shape[0]} rows but 'labels' has {y.shape[0]}"
        )
    prim = None
    if primary is not None:
        if not multilabel:
            raise DataFormatError(path, "'primary' is for multilabel data (an n x m 'labels')")
        prim = _primary(primary, y, path)
    ids = None
    if image_ids is not None:
        ids = np.asarray(image_ids)
        if ids.dtype.kind in "SO":
            ids = np.asarray(_strings(ids))
        ids = ids.ravel()
        if len(ids) != y.shape[0]:
            raise DataFormatError(
                path, f"'image_ids' has {len(ids)} entries, expected {y.shape[0]}"
            )
    out_splits = {}
    for name, idx in splits.items():
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise DataFormatError(path, f"'splits/{name}' must be a vector of row indices")
        if len(idx) and (idx.min() < 0 or idx.max() >= y.shape[0]):
            raise DataFormatError(
                path, f"'splits/{name}' has row indices outside 0..{y.shape[0] - 1}"
            )
        out_splits[name] = idx.astype(np.int64)
    names = _strings(names) if names is not None else None
    if multilabel and names is not None and len(names) != y.shape[1]:
        raise DataFormatError(
            path, f"'label_names' has {len(names)} entries for {y.shape[1]} indicator columns"
        )
    return FeatureFile(X, y, path, ids, names, out_splits, prim)


def _hdf5_matrix(path: Path, ds) -> np.ndarray:
    """An HDF5 dataset as a read-only memory map when its bytes lie contiguously in the file
    (module docstring), else read into memory."""
    offset = ds.id.get_offset() if ds.chunks is None and ds.compression is None else None
    if offset is not None and ds.dtype.kind == "f" and ds.dtype.isnative and ds.ndim == 2:
        return np.memmap(path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
    return np.asarray(ds[()])


def read_features(path: str | Path, labels: str | Path | None = None) -> FeatureFile:
    """Read a feature file in the layout of the module docstring."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path.name, [str(path)])
    suffix = path.suffix.lower()
    p = str(path)
    if suffix in (".h5", ".hdf5"):
        import h5py

        try:
            with h5py.File(path, "r") as f:
                missing = [k for k in ("features", "labels") if k not in f]
                if missing:
                    raise DataFormatError(
                        p,
                        f"missing dataset(s) {', '.join(missing)}; the file has: "
                        f"{', '.join(sorted(f)) or 'none'}",
                    )
                X = _hdf5_matrix(path, f["features"])
                y = f["labels"][()]
                ids = f["image_ids"][()] if "image_ids" in f else None
                names = f["label_names"][()] if "label_names" in f else None
                splits = {k: f["splits"][k][()] for k in f["splits"]} if "splits" in f else {}
                prim = f["primary"][()] if "primary" in f else None
        except OSError as exc:
            raise DataFormatError(p, f"not a readable HDF5 file: {exc}") from None
        return _finish(p, X, y, ids, names, splits, prim)
    if suffix == ".npz":
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataFormatError(p, f"not a readable .npz archive: {exc}") from None
        with z:
            missing = [k for k in ("features", "labels") if k not in z.files]
            if missing:
                raise DataFormatError(
                    p, f"missing array(s) {', '.join(missing)}; the archive has: {z.files}"
                )
            splits = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("splits/")}
            return _finish(
                p,
                z["features"],
                z["labels"],
                z["image_ids"] if "image_ids" in z.files else None,
                z["label_names"] if "label_names" in z.files else None,
                splits,
                z["primary"] if "primary" in z.files else None,
            )
    if suffix == ".npy":
        if labels is None:
            raise DataFormatError(p, "a .npy feature matrix needs a labels file (.npy)")
        lpath = Path(labels)
        if not lpath.exists():
            raise DatasetNotFoundError(lpath.name, [str(lpath)])
        try:
            X = np.load(path, mmap_mode="r", allow_pickle=False)
            y = np.load(lpath, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataFormatError(p, f"not a readable .npy file: {exc}") from None
        return _finish(p, X, y, None, None, {})
    raise DataFormatError(
        p, f"unknown feature file type {suffix!r}; expected one of {', '.join(FEATURE_SUFFIXES)}"
    )
