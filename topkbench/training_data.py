"""The training data of :func:`topkbench.fit`, checked: features or a Gram matrix, targets,
example weights and the rows to train on (DESIGN §9)."""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from topkbench.errors import ConfigError, InputError
from topkbench.gram import check_gram, rbf_kernel
from topkbench.losses.registry import MethodSpec
from topkbench.validation import (
    check_features,
    check_multilabel,
    check_positive,
    class_indices,
    example_weights,
)

logger = logging.getLogger(__name__)


class TrainingData(NamedTuple):
    """What a solver trains on: the features ``X`` (None with a precomputed kernel) or the
    Gram matrix ``gram`` (precomputed or RBF, None for a linear model) with ``kernel`` and
    ``theta``, the targets ``y`` (class indices, or the label sets as a CSR indicator) of
    ``m`` classes with their labels ``classes`` (None: 0..m-1), the rows to train on
    ``keep`` (None: all) and the examples' weights ``weights`` (None: all 1)."""

    X: Any
    gram: np.ndarray | None
    kernel: str | None
    theta: float | None
    y: Any
    m: int
    classes: np.ndarray | None
    keep: np.ndarray | None
    weights: np.ndarray | None

    @property
    def features(self):
        """What the solver reads: the Gram matrix where there is one, else the features."""
        return self.gram if self.gram is not None else self.X

    @property
    def n_rows(self) -> int:
        return self.features.shape[0]


def training_data(spec: MethodSpec, X, Y, *, K, kernel, theta, n_classes, fw, check_kernel: bool,
                  warn: bool, sample_weight, class_weight) -> TrainingData:  # fmt: skip
    """The inputs of :func:`topkbench.fit` for ``spec``, checked (:class:`TrainingData`);
    refuses a problem whose model would not fit in memory."""
    X, gram, kernel, theta = _fit_inputs(spec, X, K, kernel, theta, fw, check_kernel)
    n_rows = gram.shape[0] if gram is not None else X.shape[0]
    y, m, classes, keep = _fit_targets(spec, Y, n_rows, n_classes, warn)
    ex_w, keep = _fit_weights(spec, sample_weight, class_weight, y, m, classes, keep, fw)
    _check_memory(X if gram is None else None, n_rows, m)
    return TrainingData(X, gram, kernel, theta, y, m, classes, keep, ex_w)


def _fit_inputs(spec, X, K, kernel, theta, fw, check_kernel):
    """The training inputs of :func:`fit`, checked: ``(X, gram, kernel, theta)`` with ``gram``
    the precomputed or RBF Gram matrix (None for a linear model) and ``kernel`` None,
    ``"precomputed"`` or ``"rbf"``."""
    if "fw" not in spec.params and fw is not None:
        raise ConfigError(f"fw= is an option of wtopk_svm, not of {spec.name}")
    if (K is not None or kernel == "rbf") and spec.solver != "sdca":
        raise ConfigError(f"method {spec.name} ({spec.solver}) has no kernel mode")
    if K is not None:
        if X is not None or kernel not in (None, "precomputed"):
            raise ConfigError("pass either X (with an optional kernel=) or K=, not both")
        gram = check_gram(K) if check_kernel else np.ascontiguousarray(K, dtype=np.float64)
        return None, gram, "precomputed", theta
    if X is None:
        raise InputError("fit needs features X or a Gram matrix K=")
    X = check_features(X)
    if X.dtype == np.float32 and (spec.solver != "sdca" or kernel == "rbf" or fw):
        X = X.astype(np.float64)  # float32 is an SDCA (linear) option
    if kernel not in (None, "linear", "rbf"):
        raise ConfigError(f"kernel must be 'linear' or 'rbf'; got {kernel!r}")
    if kernel != "rbf":
        if theta is not None:
            raise ConfigError(
                f"theta= is the RBF kernel's width; it does not apply to kernel={kernel!r} "
                "(give kernel='rbf' with it, or leave it out)"
            )
        return X, None, None, None
    if theta is None:
        raise ConfigError("kernel='rbf' needs theta > 0 (K = exp(-theta |x-z|^2))")
    theta = check_positive("theta", theta)
    return X, rbf_kernel(X, theta=theta), "rbf", theta


def ranking_rows(Y, m: int) -> np.ndarray:
    """The examples of a CSR label indicator whose label set is neither empty nor complete:
    the only ones a multilabel ranking loss constrains (TPAMI §3.3)."""
    sizes = np.diff(Y.indptr)
    return (sizes > 0) & (sizes < m)


def _fit_targets(spec, Y, n_rows: int, n_classes, warn: bool):
    """The targets of :func:`fit`, checked: ``(y, m, classes, keep)``, ``y`` the class indices
    (multiclass, with ``classes`` their labels) or the label sets as a CSR indicator
    (multilabel), and ``keep`` the rows to train on (None: all; multilabel examples whose
    label set is empty or complete carry no ranking constraint, TPAMI §3.3)."""
    if spec.task != "multilabel":
        if sp.issparse(Y) or np.ndim(Y) == 2:
            raise InputError(
                f"method {spec.name} is multiclass and needs 1-D labels (one class index per "
                "example); for multilabel targets use svm_ml or lr_ml (or a primary-label column)"
            )
        y, m, classes = class_indices(Y, n_rows, n_classes)
        return y, m, classes, None
    y, m = check_multilabel(Y, n_rows, n_classes)
    keep = ranking_rows(y, m)
    excluded = int(n_rows - keep.sum())
    if excluded == n_rows:
        raise InputError(
            f"every one of the {n_rows} training examples has an empty or complete label "
            "set; a multilabel ranking loss needs at least one with 0 < |Y| < m"
        )
    if not excluded:
        return y, m, None, None
    logger.log(
        logging.INFO if warn else logging.DEBUG,
        "%s: %d of %d training examples have an empty or complete label set and are "
        "left out of training (no ranking constraint)",
        spec.name, excluded, n_rows,
    )  # fmt: skip
    return y, m, None, keep


def _fit_weights(spec, sample_weight, class_weight, y, m: int, classes, keep, fw):
    """The examples' weights ``w_i`` (None: all 1) and the rows to train on, those of weight
    0 left out as well."""
    n_rows = y.shape[0]
    codes = None if spec.task == "multilabel" else y
    ex_w = example_weights(sample_weight, class_weight, codes, m, classes, n_rows)
    if ex_w is None or np.all(ex_w == 1.0):
        return None, keep  # the unweighted problem, on the unweighted code path
    if fw is not None:
        raise ConfigError(
            f"sample_weight and class_weight are not available with fw={fw}: the "
            "Frank-Wolfe solver has no weighted form (the default SDCA solver has)"
        )
    if np.any(ex_w == 0.0):
        keep = (ex_w > 0.0) if keep is None else keep & (ex_w > 0.0)
        if not keep.any():
            raise InputError("every example with a label set to rank has weight 0")
    return ex_w, keep


def _available_memory() -> float | None:
    """Bytes the kernel can give without swapping (``MemAvailable``: free memory plus the
    reclaimable page cache, which memory-mapped features fill), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(X, n: int, m: int) -> None:
    """Refuse a problem whose W (d x m) and dual (n x m) would not fit in memory, with the
    figure: a stray label of 2^40 or a feature index of 1e11 would otherwise end in a
    MemoryError (or in swap) deep inside the solver."""
    d = 0 if X is None else X.shape[1]
    need = 8.0 * (d * m + 2 * n * m)
    avail = _available_memory()
    if avail is None:
        return
    if need > avail:
        raise InputError(
            f"the model needs {need / 2**30:.1f} GB (W: {d:,} features x {m:,} classes, "
            f"dual: {n:,} x {m:,}), more than the {avail / 2**30:.1f} GB of available memory; "
            "check the feature indices and labels of the data"
        )
