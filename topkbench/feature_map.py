"""The map from raw features to the features a model was trained on (leaf module: numpy and
scipy only, so that the data layer and the model share it without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from topkbench.errors import InputError


def append_bias(X, value: float):
    """Append a constant feature ``value`` (DESIGN §2: no bias term unless a config asks)."""
    if value == 0.0:
        return X
    if sp.issparse(X):
        col = sp.csr_matrix(np.full((X.shape[0], 1), value))
        return sp.hstack([X, col], format="csr")
    return np.hstack([X, np.full((X.shape[0], 1), value)])


@dataclass(frozen=True)
class FeatureMap:
    """``x -> [(x - shift) / div, bias]``: the preprocessing a dataset applied to raw features
    before training (per-feature scaling fitted on the training split, then a constant feature
    ``bias`` appended when nonzero; :mod:`topkbench.data.preprocess`).  A model that carries one
    takes raw features, so a saved model predicts on the files it was trained from."""

    n_features: int  # width of the raw features
    shift: NDArray[np.float64] | None = None
    div: NDArray[np.float64] | None = None
    bias: float = 0.0

    @property
    def identity(self) -> bool:
        return self.shift is None and self.div is None and self.bias == 0.0

    def apply(self, X):
        if X.shape[1] != self.n_features:
            raise InputError(
                f"X has {X.shape[1]} features, the model was trained on {self.n_features}"
            )
        if self.div is not None:
            if sp.issparse(X) and not np.any(self.shift):
                X = sp.csr_matrix(X @ sp.diags(1.0 / self.div))
            else:
                X = (np.asarray(X.todense() if sp.issparse(X) else X, dtype=np.float64)
                     - self.shift) / self.div  # fmt: skip
        return append_bias(X, self.bias)
