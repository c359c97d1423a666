"""MATLAB ``.mat`` files (DESIGN §6.2): v4–v7 through :func:`scipy.io.loadmat`, v7.3 through h5py.

v7.3 files are HDF5 containers in which MATLAB stores every matrix column-major, so h5py returns
the transpose of what MATLAB shows; :func:`read_mat` transposes 2-D numeric arrays back, and
decodes char arrays and cell arrays of strings (stored as object references to uint16 arrays).
The result is a dict ``name -> ndarray or list[str]`` in MATLAB's orientation for either version.

The Caltech101 Silhouettes file of Marlin et al. (``caltech101_silhouettes_28_split1.mat``)
holds ``train_data``/``val_data``/``test_data`` (n x 784, 0/1 pixels), the matching
``*_labels`` (n x 1, 1..101) and ``classnames`` (a 1 x 101 cell of strings);
:func:`read_split_mat` reads that layout (any prefix set) into per-split arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from topkbench.errors import DataFormatError, DatasetNotFoundError


def _decode_chars(arr: np.ndarray) -> str:
    return "".join(chr(int(c)) for c in np.asarray(arr).ravel(order="F") if int(c) != 0)


def _read_h5_item(f, obj) -> Any:
    import h5py

    if isinstance(obj, h5py.Group):
        return {k: _read_h5_item(f, obj[k]) for k in obj}
    data = obj[()]
    mclass = obj.attrs.get("MATLAB_class", b"")
    mclass = mclass.decode() if isinstance(mclass, bytes) else str(mclass)
    if data.dtype == h5py.ref_dtype or data.dtype.kind == "O":
        items = [_read_h5_item(f, f[ref]) for ref in np.asarray(data).ravel(order="F")]
        return items
    if mclass == "char":
        return _decode_chars(data)
    arr = np.asarray(data)
    return arr.T if arr.ndim >= 2 else arr


def read_mat(path: str | Path) -> dict[str, Any]:
    """All variables of a ``.mat`` file (any version), in MATLAB's orientation."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path.name, [str(path)])
    import h5py

    if h5py.is_hdf5(path):  # v7.3
        try:
            with h5py.File(path, "r") as f:
                return {k: _read_h5_item(f, f[k]) for k in f if not k.startswith("#")}
        except OSError as exc:
            raise DataFormatError(str(path), f"unreadable v7.3 (HDF5) .mat file: {exc}") from None
    import scipy.io

    try:
        raw = scipy.io.loadmat(path, squeeze_me=False)
    except (ValueError, TypeError, OSError, NotImplementedError) as exc:
        raise DataFormatError(str(path), f"unreadable .mat file: {exc}") from None
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k.startswith("__"):
            continue
        if isinstance(v, np.ndarray) and v.dtype == object:
            out[k] = [str(np.asarray(c).ravel()[0]) if np.size(c) else "" for c in v.ravel()]
        elif isinstance(v, np.ndarray) and v.dtype.kind == "U":
            out[k] = [str(s) for s in v.ravel()]
        else:
            out[k] = v
    return out


def _as_labels(v: Any, path: Path, name: str) -> np.ndarray:
    arr = np.asarray(v)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.ravel()
    if arr.ndim != 1:
        raise DataFormatError(
            str(path), f"variable {name!r} must be a vector, has shape {arr.shape}"
        )
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise DataFormatError(str(path), f"variable {name!r} contains NaN or Inf labels")
        bad = arr != np.round(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataFormatError(
                str(path), f"variable {name!r}: labels must be integers", token=repr(float(arr[i]))
            )
    elif arr.dtype.kind not in "iu":
        raise DataFormatError(
            str(path), f"variable {name!r}: labels must be integers, found dtype {arr.dtype}"
        )
    return arr.astype(np.int64)


def read_split_mat(
    path: str | Path,
    splits: dict[str, str],
    data_suffix: str = "_data",
    labels_suffix: str = "_labels",
    names_var: str | None = "classnames",
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str] | None]:
    """Per-split ``(X, raw integer labels)`` from ``<prefix>_data`` / ``<prefix>_labels``.

    ``splits`` maps our split name to the file's prefix (``{"train": "train", ...}``).  Returns
    the splits and the class names (``names_var``), if the file has them.
    """
    path = Path(path)
    vars_ = read_mat(path)
    out = {}
    for split, prefix in splits.items():
        dname, lname = prefix + data_suffix, prefix + labels_suffix
        missing = [v for v in (dname, lname) if v not in vars_]
        if missing:
            raise DataFormatError(
                str(path),
                f"missing variable(s) {', '.join(missing)}; the file has: "
                f"{', '.join(sorted(vars_)) or 'none'}",
            )
        X = np.asarray(vars_[dname])
        if X.ndim != 2 or X.dtype.kind not in "biuf":
            raise DataFormatError(
                str(path), f"variable {dname!r} must be a numeric matrix, has shape {X.shape}"
            )
        y = _as_labels(vars_[lname], path, lname)
        if len(y) != X.shape[0]:
            raise DataFormatError(
                str(path),
                f"{dname!r} has {X.shape[0]} rows but {lname!r} has {len(y)} labels",
            )
        out[split] = (np.ascontiguousarray(X, dtype=np.float64), y)
    names = vars_.get(names_var) if names_var else None
    if names is not None and not isinstance(names, list):
        names = None
    return out, names
