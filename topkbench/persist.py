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
import platform
from pathlib import Path
from typing import Any

import numpy as np

from topkbench.atomic import write_outputs
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

    def fill(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return write_outputs([(path, fill)])[0]


def read_metadata(path) -> dict[str, Any]:
    """The JSON metadata of a saved model (without loading its arrays)."""
    with _open(path) as npz:
        return _metadata(npz, path)


def class_label_key(label) -> str:
    """What identifies a class label: its text, with an integral number written as an
    integer, so that equal numbers are one label (1 and 1.0: a model fitted on the float
    labels of ``sklearn.datasets.load_svmlight_file`` predicts a LibSVM file's integers)."""
    if isinstance(label, (bool, np.bool_)):
        return str(label)
    if isinstance(label, (int, np.integer)) or (
        isinstance(label, (float, np.floating)) and float(label).is_integer()
    ):
        return str(int(label))
    return str(label)


def _not_a_model(path, reason: str) -> DataFormatError:
    return DataFormatError(str(path), f"not a saved topkbench model ({reason})")


def _open(path):
    import zipfile

    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a model file")
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    try:
        npz = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        reason = "empty file" if path.stat().st_size == 0 else _reason(exc)
        raise _not_a_model(path, reason) from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise _not_a_model(path, "a single array, not an .npz archive")
    return npz


def _reason(exc: Exception) -> str:
    """numpy's message, without its advice to load pickles: a model file holds none."""
    text = str(exc)
    if "allow_pickle" in text or "pickle" in text.lower():
        return "it holds Python objects (a pickle), which are never read"
    return text.splitlines()[0] if text else type(exc).__name__


def _metadata(npz, path) -> dict[str, Any]:
    if "metadata" not in npz.files:
        raise _not_a_model(path, "no metadata entry")
    try:
        meta = json.loads(str(_array(npz, "metadata", path)))
    except json.JSONDecodeError as exc:
        raise _not_a_model(path, f"its metadata is not JSON: {exc.msg}") from None
    if not isinstance(meta, dict):
        raise _not_a_model(path, "its metadata is not a JSON object")
    if meta.get("format") != FORMAT:
        raise _not_a_model(path, repr(meta.get("format")))
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataFormatError(
            str(path),
            f"model format version {meta.get('format_version')}; this topkbench reads "
            f"version {FORMAT_VERSION}",
        )
    return meta


def _array(npz, name: str, path):
    """One entry of the archive; a damaged entry, one of Python objects, or one whose header
    declares more data than the entry holds (a 1 kB file cannot hold W of 4 x 10^11: it is
    refused before anything is allocated) is refused."""
    import zipfile

    try:
        _check_declared_size(npz, name, path)
        return npz[name]
    except DataFormatError:  # already says what is wrong with the entry
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise _not_a_model(path, f"entry {name!r}: {_reason(exc)}") from None


def _check_declared_size(npz, name: str, path) -> None:
    """Refuse an entry whose ``.npy`` header declares a shape of more bytes than the entry's
    uncompressed size."""
    fmt = np.lib.format
    member = f"{name}.npy"
    size = npz.zip.getinfo(member).file_size
    with npz.zip.open(member) as fh:
        version = fmt.read_magic(fh)
        read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
        if version not in read_header:
            return  # np.load reads or refuses it
        shape, _, dtype = read_header[version](fh)
    need = math.prod(shape) * dtype.itemsize
    if need > size:
        raise _not_a_model(path, f"entry {name!r} declares shape {shape} ({need:,} bytes) but "
                                 f"holds {size:,} bytes")  # fmt: skip


def read_model(path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of the model saved at ``path`` by :func:`save_model`,
    checked to make a consistent model (:func:`check_model`; :meth:`topkbench.model.Model.
    load` builds the model from them)."""
    with _open(path) as npz:
        meta = _metadata(npz, path)
        arrays = {name: _array(npz, name, path) for name in npz.files if name != "metadata"}
    check_model(arrays, meta, path)
    return arrays, meta


def _matrix(arrays, name: str, path, rows: int | None = None) -> np.ndarray:
    a = arrays.get(name)
    if a is None:
        raise _not_a_model(path, f"no {name} array")
    if a.dtype.kind not in "fiu" or a.ndim != 2:
        raise _not_a_model(path, f"{name} must be a 2-D numeric array; it is {a.ndim}-D "
                                 f"{a.dtype}")  # fmt: skip
    if not np.all(np.isfinite(a)):
        raise _not_a_model(path, f"{name} holds non-finite values")
    if rows is not None and a.shape[0] != rows:
        raise _not_a_model(path, f"{name} has {a.shape[0]} rows; expected {rows}")
    return a


_NONE = object()


def _check_params(params: dict[str, Any], path) -> None:
    """The method parameters a model records, where present: ``C > 0`` and ``eps > 0``
    numbers, ``gamma >= 0``, ``k`` an integer >= 1."""

    def number(v) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    for key, ok, what in (
        ("C", lambda v: number(v) and v > 0, "a positive number"),
        ("eps", lambda v: number(v) and v > 0, "a positive number"),
        ("gamma", lambda v: number(v) and v >= 0, "a number >= 0"),
        ("k", lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= 1,
         "an integer >= 1"),
    ):  # fmt: skip
        if key in params and not ok(params[key]):
            raise _not_a_model(path, f"params.{key} must be {what}; got {params[key]!r}")


def check_model(arrays: dict[str, np.ndarray], meta: dict[str, Any], path) -> None:
    """Refuse metadata and arrays that do not make one consistent model, naming the field:
    the method, parameters and certificate types; W (linear) or A (kernel) 2-D, numeric and
    finite, with one column per class of the class list; W's rows the feature map's width
    (plus the bias feature); the RBF kernel's positive theta and its stored training
    features, one row per dual row; the scaling vectors one entry per raw feature."""
    from topkbench.losses.registry import METHODS

    def field(name, types, what):
        value = meta.get(name)
        if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
            raise _not_a_model(path, f"metadata field {name!r} must be {what}; got {value!r}")
        return value

    method = field("method", (str,), "a method name")
    if method not in METHODS:
        raise _not_a_model(path, f"unknown method {method!r}")
    params = field("params", (dict,), "an object")
    _check_params(params, path)
    cert = field("certificate", (dict,), "an object")
    for key in ("primal", "dual", "relative_gap", "train_seconds", "epochs"):
        v = cert.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _not_a_model(path, f"certificate field {key!r} must be a number; got {v!r}")
    if not isinstance(cert.get("status"), str):
        raise _not_a_model(path, f"certificate field 'status' must be a string; got "
                                 f"{cert.get('status')!r}")  # fmt: skip
    if meta.get("info") is not None:
        field("info", (dict,), "an object")
    kernel = meta.get("kernel")
    if kernel not in (None, "precomputed", "rbf"):
        raise _not_a_model(path, f"metadata field 'kernel' must be null, 'precomputed' or "
                                 f"'rbf'; got {kernel!r}")  # fmt: skip
    for name, a in arrays.items():
        if a.dtype.kind not in "fiu":
            raise _not_a_model(path, f"array {name!r} is not numeric ({a.dtype})")
    fmap = meta.get("feature_map")
    width = None
    if fmap is not None:
        if not isinstance(fmap, dict):
            raise _not_a_model(path, f"metadata field 'feature_map' must be an object; got "
                                     f"{fmap!r}")  # fmt: skip
        d, bias = fmap.get("n_features"), fmap.get("bias", 0.0)
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise _not_a_model(path, f"feature_map.n_features must be a positive integer; got "
                                     f"{d!r}")  # fmt: skip
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise _not_a_model(path, f"feature_map.bias must be a finite number; got {bias!r}")
        width = d + (bias != 0.0)
        for name in ("shift", "div"):
            if name in arrays and arrays[name].shape != (d,):
                raise _not_a_model(path, f"{name} has shape {arrays[name].shape}; expected "
                                         f"({d},)")  # fmt: skip
        div = arrays.get("div")
        if div is not None and not np.all(np.isfinite(div) & (div > 0)):
            j = int(np.flatnonzero(~(np.isfinite(div) & (div > 0)))[0])
            raise _not_a_model(path, f"scaling divisor div[{j}] = {float(div[j])!r}; each "
                                     "must be a positive finite number")  # fmt: skip
        shift = arrays.get("shift")
        if shift is not None and not np.all(np.isfinite(shift)):
            raise _not_a_model(path, "the scaling shift holds non-finite values")
    if kernel is None:
        coef = _matrix(arrays, "W", path, width)
    else:
        coef = _matrix(arrays, "A", path)
        if kernel == "rbf":
            theta = meta.get("theta")
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
                raise _not_a_model(path, f"an RBF model needs theta > 0; got {theta!r}")
            X = _matrix(arrays, "X_train", path, coef.shape[0])
            if width is not None and X.shape[1] != width:
                raise _not_a_model(path, f"X_train has {X.shape[1]} columns; the feature map "
                                         f"gives {width}")  # fmt: skip
    classes = meta.get("classes")
    m = coef.shape[1]
    if m == 0:
        raise _not_a_model(path, "it has no class (0 score columns)")
    if classes is not None:
        if not isinstance(classes, list):
            raise _not_a_model(path, f"metadata field 'classes' must be a list; got {classes!r}")
        if len(classes) != m:
            raise _not_a_model(path, f"{len(classes)} classes listed for {m} score columns")
        bad = next((c for c in classes if isinstance(c, (list, dict)) or c is None), _NONE)
        if bad is not _NONE:
            raise _not_a_model(path, f"class label {bad!r}: each label must be a string or "
                                     "a number")  # fmt: skip
        keys = [class_label_key(c) for c in classes]
        if len(set(keys)) != m:
            i = next(i for i, key in enumerate(keys) if key in keys[:i])
            first = classes[keys.index(keys[i])]
            same = "" if repr(first) == repr(classes[i]) else f" (as {first!r})"
            raise _not_a_model(path, f"class label {classes[i]!r} is listed twice{same}")
    k = params.get("k")
    if isinstance(k, int) and not 1 <= k <= m - 1:  # its type is checked above
        raise _not_a_model(path, f"params.k must be in [1, {m - 1}] for a model of {m} "
                                 f"classes; got {k}")  # fmt: skip
    n_classes = meta.get("n_classes")
    if n_classes is not None and n_classes != m:
        raise _not_a_model(path, f"n_classes is {n_classes!r}; the model has {m} score columns")
