"""Validation of user inputs: one-line messages that state the valid range (STYLE.md)."""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConfigError, InputError


def _first_nonfinite(values, rows: int = 16_384):
    """Index of the first NaN/Inf of a dense 1-D or 2-D array (None if none), checked by row
    blocks so that a large (memory-mapped) matrix needs no n x d temporary."""
    for a in range(0, values.shape[0], rows):
        bad = ~np.isfinite(values[a : a + rows])
        if bad.any():
            pos = np.argwhere(bad)[0]
            pos[0] += a
            return tuple(int(v) for v in pos)
    return None


def check_features(X, name: str = "X"):
    """Return X as a float64 ndarray or CSR, as is when it is a dense float32 array (a
    memory-mapped float32 matrix is not copied; SDCA trains on it directly), or as a float32
    CSR when its values are float32; refuse NaN/Inf, wrong rank, empty input."""
    if sp.issparse(X):
        if X.dtype.kind == "c":
            raise InputError(f"{name} is complex; features must be real numbers")
        X = sp.csr_matrix(X, dtype=np.float32 if X.dtype == np.float32 else np.float64)
        values = X.data
    else:
        kind = (np.asarray(X) if not isinstance(X, np.ndarray) else X).dtype.kind
        if kind == "c":
            raise InputError(f"{name} is complex; features must be real numbers")
        if kind in "OUSV":
            raise InputError(
                f"{name} has dtype {np.asarray(X).dtype}; features must be a numeric (real) array"
            )
        keep32 = isinstance(X, np.ndarray) and X.dtype == np.float32
        try:
            X = X if keep32 else np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{name} must be a numeric array: {exc}") from None
        values = X
    if X.ndim != 2:
        raise InputError(f"{name} must be 2-D (n_samples x n_features), got {X.ndim}-D")
    if X.shape[0] == 0:
        raise InputError(f"{name} has no rows")
    first = _first_nonfinite(values)
    if first is not None:
        if sp.issparse(X):
            pos = first[0]
            row = int(np.searchsorted(X.indptr, pos, side="right") - 1)
            col = int(X.indices[pos])
            bad = values[pos]
        else:
            row, col = first
            bad = values[row, col]
        raise InputError(
            f"{name} contains {bad} at row {row}, column {col}; "
            "features must be finite real numbers (no NaN or Inf)"
        )
    return X


def _integer_labels(y, n: int) -> np.ndarray:
    """``y`` as int64, one per row; refuse other shapes, non-integers and values beyond int64."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise InputError(f"labels must be 1-D with one entry per row, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"got {arr.shape[0]} labels for {n} rows of X")
    if arr.dtype.kind in "ib":
        return arr.astype(np.int64)
    if arr.dtype.kind == "u":
        if arr.size and int(arr.max()) >= 2**63:
            i = int(np.argmax(arr))
            raise InputError(f"label {arr[i]} at row {i} is outside the int64 range")
        return arr.astype(np.int64)
    try:
        f = arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        bad = next((v for v in arr if not _is_int_like(v)), arr[0])
        raise InputError(f"labels must be integers; got {bad!r}") from None
    bad_mask = ~np.isfinite(f) | (f != np.round(f))
    if bad_mask.any():
        i = int(np.flatnonzero(bad_mask)[0])
        raise InputError(f"labels must be integers; got {arr[i]!r} at row {i}")
    big = np.abs(f) >= 2.0**63
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise InputError(f"label {arr[i]!r} at row {i} is outside the int64 range")
    if arr.dtype.kind == "O":  # exact Python integers (floats above 2^53 are rounded)
        return np.array([int(v) for v in arr], dtype=np.int64)
    return f.astype(np.int64)


def check_labels(y, n: int, n_classes: int | None = None) -> tuple[np.ndarray, int]:
    """Return (0-based int64 labels, m) for labels that are class indices in ``[0, m)``."""
    labels = _integer_labels(y, n)
    if labels.min() < 0:
        i = int(np.argmin(labels))
        raise InputError(f"labels must be integers in [0, m) (0-based); got {labels[i]} at row {i}")
    m = int(labels.max()) + 1 if n_classes is None else int(n_classes)
    if n_classes is not None and labels.max() >= m:
        raise InputError(f"label {labels.max()} is outside [0, {m}) for n_classes = {m}")
    if m < 2:
        raise InputError(f"need at least 2 classes, got m = {m}")
    return labels, m


def class_indices(y, n: int, n_classes: int | None = None):
    """``(codes, m, classes)``: labels as 0-based class indices.

    With ``n_classes`` the labels must already be indices in ``[0, n_classes)`` (a training
    fold may lack a class) and ``classes`` is None.  Without it the distinct labels, sorted,
    become the classes: ``y = [5, 7, 9]`` is a 3-class problem (not 10 classes of which 7 are
    empty), ``classes = [5, 7, 9]`` names the score columns, and ``classes`` is None when the
    labels already are ``0..m-1``.  Fewer than two distinct labels is refused.
    """
    if n_classes is not None:
        codes, m = check_labels(y, n, n_classes)
        return codes, m, None
    classes, codes = np.unique(_integer_labels(y, n), return_inverse=True)
    if len(classes) < 2:
        raise InputError(f"need at least 2 classes; every label is {classes[0]}")
    codes = codes.astype(np.int64).ravel()
    if classes[0] == 0 and classes[-1] == len(classes) - 1:
        return codes, len(classes), None
    return codes, len(classes), classes


def check_multilabel(Y, n: int, n_classes: int | None = None) -> tuple[sp.csr_matrix, int]:
    """Return (CSR 0/1 indicator with sorted indices, m) for multilabel targets.

    Accepts a dense 0/1 (or boolean) array, a sparse indicator, or 1-D class indices (each
    example then has the singleton label set ``{y_i}``).  Refuses other values, wrong shapes
    and fewer than 2 classes.
    """
    if not sp.issparse(Y):
        arr = np.asarray(Y)
        if arr.ndim == 1:
            y, m = check_labels(arr, n, n_classes)
            ind = sp.csr_matrix((np.ones(n, dtype=np.int8), y, np.arange(n + 1)), shape=(n, m))
            return ind, m
        if arr.ndim != 2:
            raise InputError(
                f"multilabel targets must be an n x m 0/1 indicator, got shape {arr.shape}"
            )
        Y = arr
    if Y.shape[0] != n:
        raise InputError(f"got {Y.shape[0]} label rows for {n} rows of X")
    m = Y.shape[1] if n_classes is None else int(n_classes)
    if Y.shape[1] != m:
        raise InputError(f"the indicator has {Y.shape[1]} columns; n_classes = {m}")
    ind = sp.csr_matrix(Y)
    ind.sum_duplicates()
    ind.eliminate_zeros()
    bad = (ind.data != 1) & (ind.data != True)  # noqa: E712 (bool indicators)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        row = int(np.searchsorted(ind.indptr, pos, side="right") - 1)
        raise InputError(
            f"multilabel indicator must be 0/1; got {ind.data[pos]!r} at row {row}, "
            f"column {int(ind.indices[pos])}"
        )
    if m < 2:
        raise InputError(f"need at least 2 classes, got m = {m}")
    ind = sp.csr_matrix((np.ones(ind.nnz, dtype=np.int8), ind.indices, ind.indptr), shape=(n, m))
    ind.sort_indices()
    return ind, m


def _is_int_like(v) -> bool:
    return isinstance(v, numbers.Integral) or (
        isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer()
    )


def check_positive(name: str, value, *, allow_zero: bool = False, upper: float | None = None):
    lo = "[0" if allow_zero else "(0"
    hi = f"{upper:g})" if upper is not None else "inf)"
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number in {lo}, {hi}; got {value!r}") from None
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if upper is not None:
        ok = ok and v < upper
    if not ok:
        raise ConfigError(f"{name} must be in {lo}, {hi}; got {value!r}")
    return v


def check_k(k, m: int) -> int:
    if isinstance(k, bool) or not _is_int_like(k):
        raise ConfigError(f"k must be an integer in [1, {m - 1}] (m = {m}); got {k!r}")
    k = int(k)
    if not 1 <= k <= m - 1:
        raise ConfigError(f"k must be in [1, {m - 1}] (m = {m} classes); got k = {k}")
    return k


def check_method_params(spec, gamma, k, m: int) -> tuple[float, int]:
    """``gamma`` and ``k`` of the registered method ``spec`` (a ``MethodSpec``) on ``m``
    classes: gamma >= 0 and only where the method is smoothed, k in [1, m - 1] and only for
    top-k methods.  The kernels do not check k against m (numba has no bounds checks: a k >= m
    reads past the score vector), so every entry point that reaches them checks k first: this
    (``fit``, the SDCA benches) or :func:`check_k` (``solve_sdca``, ``bench.kato_fig2``)."""
    gamma = check_positive("gamma", gamma, allow_zero=True)
    k = check_k(k, m)
    if "gamma" not in spec.params and gamma != 0.0:
        raise ConfigError(f"method {spec.name} has no smoothing parameter; use gamma=0")
    if "k" not in spec.params and k != 1:
        raise ConfigError(f"method {spec.name} is a top-1 loss and takes no k; use k=1")
    return gamma, k


def check_eval_every(value) -> int | str:
    """``eval_every``: a positive number of epochs between certificates, or ``"auto"``."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not _is_int_like(value) or int(value) < 1:
        raise ConfigError(
            f"eval_every must be 'auto' or an integer >= 1 (epochs between duality-gap "
            f"evaluations); got {value!r}"
        )
    return int(value)


def check_int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not _is_int_like(value) or int(value) < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}; got {value!r}")
    return int(value)


def check_bool(name: str, value) -> bool:
    """A true/false option (YAML and Hydra give booleans; a string such as ``abc`` is
    refused, not read as true)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false; got {value!r}")
    return value


def check_number(name: str, value) -> float:
    """A finite real number (booleans and strings refused: a config gives numbers typed)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(float(value))
    if not ok:
        raise ConfigError(f"{name} must be a finite number; got {value!r}")
    return float(value)


def check_int_list(name: str, values, lo: int) -> tuple[int, ...]:
    """A list of integers ``>= lo`` (a scalar, or an entry such as 1.5 or ``abc``, refused)."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{name} must be a list of integers >= {lo}; got {values!r}")
    return tuple(check_int(f"{name}[{i}]", v, lo) for i, v in enumerate(values))


def check_n_jobs(value) -> int:
    """Worker processes, with joblib's meaning of the negative values: -1 all cores, -2 all
    but one, ... (``cpu_count + 1 + n_jobs``); 0, and negatives beyond the core count, are
    refused."""
    import os

    cores = os.cpu_count() or 1
    if isinstance(value, bool) or not _is_int_like(value) or int(value) == 0:
        raise ConfigError(
            f"n_jobs must be a positive integer, or -1 for all {cores} cores (-2 all but one, "
            f"...); got {value!r}"
        )
    n = int(value)
    if n < 0:
        n = cores + 1 + n
        if n < 1:
            raise ConfigError(f"n_jobs = {value} leaves no worker on {cores} cores; use -1 .. "
                              f"-{cores} or a positive integer")  # fmt: skip
    return n


def check_choice(name: str, value, allowed: tuple[str, ...]) -> str:
    """One of the strings ``allowed``, else a ConfigError listing them."""
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


ENT_TR_SOLVERS = ("lbfgs", "gd")


def check_solver(spec, solver: str | None) -> str | None:
    """The solver of method ``spec`` (``None``: its default).  Only top-k Ent_tr offers a
    choice: ``"lbfgs"`` (the default, the better optimizer of the loss) or ``"gd"`` (the
    authors' gradient descent, what TPAMI's Ent_tr numbers come from)."""
    if spec.solver == "lbfgs":
        return check_choice("solver", "lbfgs" if solver is None else solver, ENT_TR_SOLVERS)
    if solver is not None and solver != spec.solver:
        raise ConfigError(f"method {spec.name} is solved by {spec.solver}; got solver={solver!r}")
    return None


def example_weights(sample_weight, class_weight, codes, m: int, classes, n: int):
    """Per-example loss weights ``w_i = sample_weight_i * class_weight[y_i]``, or None when
    neither is given.

    ``sample_weight``: n finite non-negative numbers.  ``class_weight``: ``"balanced"``
    (``n / (m' n_c)`` with m' the classes present in ``codes``, scikit-learn's rule) or a mapping
    from class label (as in the training labels; class indices when ``classes`` is None) to a
    non-negative weight, classes not listed weighing 1.  ``codes`` are the class indices
    (multiclass), or None for multilabel targets, which take no class weights."""
    if sample_weight is None and class_weight is None:
        return None
    w = np.ones(n)
    if sample_weight is not None:
        sw = np.asarray(sample_weight)
        if sw.dtype.kind not in "biuf" or sw.shape != (n,):
            raise InputError(
                f"sample_weight must be {n} numbers (one per example); got shape {sw.shape}"
            )
        sw = sw.astype(np.float64)
        if not np.all(np.isfinite(sw)) or np.any(sw < 0.0):
            i = int(np.flatnonzero(~np.isfinite(sw) | (sw < 0.0))[0])
            raise InputError(
                f"sample_weight must be finite and >= 0; got {float(sw[i])} at example {i}"
            )
        w *= sw
    if class_weight is not None:
        if codes is None:
            raise ConfigError("class_weight applies to multiclass methods (one label each)")
        if isinstance(class_weight, str):
            check_choice("class_weight", class_weight, ("balanced",))
            counts = np.bincount(codes, minlength=m).astype(np.float64)
            present = int(np.count_nonzero(counts))  # classes of these labels, as scikit-learn
            per_class = np.where(counts > 0, n / (present * np.maximum(counts, 1.0)), 0.0)
        elif isinstance(class_weight, dict):
            labels = list(range(m)) if classes is None else list(np.asarray(classes).tolist())
            per_class = np.ones(m)
            for label, value in class_weight.items():
                key = label.item() if isinstance(label, np.generic) else label
                if key not in labels:
                    raise ConfigError(
                        f"class_weight names class {label!r}, which is not a training class "
                        f"(classes: {', '.join(map(str, labels[:10]))}"
                        f"{' ...' if len(labels) > 10 else ''})"
                    )
                per_class[labels.index(key)] = check_positive(
                    f"class_weight[{label!r}]", value, allow_zero=True
                )
        else:
            raise ConfigError(
                f"class_weight must be 'balanced' or a dict class -> weight; got {class_weight!r}"
            )
        w *= per_class[codes]
    if not np.any(w > 0.0):
        raise InputError("every example has weight zero: nothing to train on")
    return w
