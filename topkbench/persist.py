"""Saved models: one ``.npz`` file, read back without pickle.

The archive holds the model's arrays -- ``W`` (linear models) or the dual ``A`` (kernel
models, whose scores are ``K A``), the training features ``X_train`` of an RBF model, the
scaling ``shift``/``div`` of its :class:`~topkbench.feature_map.FeatureMap` -- and ``metadata``, a
JSON document: the method and its parameters, the class labels, the certificate (primal, dual,
relative gap, status, epochs), the solver's extras, a description of the training data
(hashes of its files, or of its arrays), and the versions that wrote it.

A linear model keeps no dual (n x m, often far larger than W), so a loaded linear model
cannot warm-start a fit; its per-epoch trace is not kept either.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from topkbench.errors import DataFormatError, InputError

FORMAT = "topkbench-model"
FORMAT_VERSION = 1


def _jsonable(obj):
    """Plain JSON values: numpy scalars and arrays as numbers and lists, NaN/Inf as null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in (obj.tolist() if isinstance(obj, np.ndarray) else obj)]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise InputError(f"cannot save {type(obj).__name__} value {obj!r} in the model metadata")


def save_model(model, path, *, training_data: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to ``path`` (``.npz``), atomically (a partial file never replaces an
    existing one).  ``training_data`` describes the data it was trained on (e.g. dataset
    name and file hashes); the estimators record a hash of their arrays there."""
    import topkbench

    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"{path} is a directory; a model is saved to a file (e.g. {path / 'model.npz'})"
        )
    arrays: dict[str, np.ndarray] = {}
    if model.kernel is None:
        arrays["W"] = np.asarray(model.W, dtype=np.float64)
    else:
        arrays["A"] = np.asarray(model.A, dtype=np.float64)
        if model.sample_weight is not None:  # the dual's scale, for warm starts
            arrays["sample_weight"] = np.asarray(model.sample_weight, dtype=np.float64)
        if model.kernel == "rbf":
            X = model.X_train
            arrays["X_train"] = np.asarray(X.toarray() if hasattr(X, "toarray") else X,
                                           dtype=np.float64)  # fmt: skip
    fmap = model.feature_map
    if fmap is not None and fmap.div is not None:
        arrays["shift"], arrays["div"] = fmap.shift, fmap.div
    classes = None
    if model.classes is not None:
        classes = _jsonable(np.asarray(model.classes))
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "method": model.method,
        "params": _jsonable(model.params),
        "kernel": model.kernel,
        "theta": model.theta,
        "n_classes": model.n_classes,
        "classes": classes,
        "feature_map": None
        if fmap is None
        else {"n_features": fmap.n_features, "bias": fmap.bias},  # fmt: skip
        "certificate": _jsonable(model.certificate()),
        "info": _jsonable(model.info),
        "training_data": _jsonable(training_data or model.info.get("training_data")),
        "versions": {
            "topkbench": topkbench.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },  # fmt: skip
    }
    arrays["metadata"] = np.array(json.dumps(meta, allow_nan=False, sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the model from others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_metadata(path) -> dict[str, Any]:
    """The JSON metadata of a saved model (without loading its arrays)."""
    with _open(path) as npz:
        return _metadata(npz, path)


def _open(path):
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DataFormatError(str(path), f"not a saved topkbench model ({exc})") from None


def _metadata(npz, path) -> dict[str, Any]:
    if "metadata" not in npz.files:
        raise DataFormatError(str(path), "not a saved topkbench model (no metadata entry)")
    meta = json.loads(str(npz["metadata"]))
    if meta.get("format") != FORMAT:
        raise DataFormatError(str(path), f"not a saved topkbench model ({meta.get('format')!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataFormatError(
            str(path),
            f"model format version {meta.get('format_version')}; this topkbench reads "
            f"version {FORMAT_VERSION}",
        )
    return meta


def read_model(path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of the model saved at ``path`` by :func:`save_model`
    (:meth:`topkbench.model.Model.load` builds the model from them)."""
    with _open(path) as npz:
        meta = _metadata(npz, path)
        arrays = {name: npz[name] for name in npz.files if name != "metadata"}
    return arrays, meta
