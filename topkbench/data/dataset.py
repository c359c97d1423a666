"""The dataset object every loader returns, and the dispatcher from a DatasetConfig."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topkbench.config import DatasetConfig
from topkbench.errors import ConfigError


@dataclass
class Dataset:
    """Features (dense or CSR) and 0-based labels per split, plus provenance."""

    name: str
    splits: dict[str, tuple[Any, np.ndarray]]
    n_classes: int
    label_names: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return next(iter(self.splits.values()))[0].shape[1]


DATASET_KINDS = ("circle",)


def append_bias(X, value: float):
    """Append a constant feature ``value`` (DESIGN §2: no bias term unless a config asks)."""
    if value == 0.0:
        return X
    import scipy.sparse as sp

    if sp.issparse(X):
        col = sp.csr_matrix(np.full((X.shape[0], 1), value))
        return sp.hstack([X, col], format="csr")
    return np.hstack([X, np.full((X.shape[0], 1), value)])


def load_dataset(cfg: DatasetConfig, seed: int) -> Dataset:
    """Build or load the dataset described by ``cfg``; ``seed`` drives any random choice."""
    if cfg.kind == "circle":
        from topkbench.data.synthetic import make_circle

        splits = make_circle(
            seed,
            n_train=int(cfg.get("n_train", 200)),
            n_val=int(cfg.get("n_val", 200)),
            n_test=int(cfg.get("n_test", 200_000)),
        )
        bias = float(cfg.get("bias", 0.0))
        return Dataset(
            name=cfg.name,
            splits={k: (append_bias(v.X, bias), v.y) for k, v in splits.items()},
            n_classes=3,
            label_names=["class 1", "class 2", "class 3"],
            provenance={"generator": "circle (DESIGN §6.1)", "seed": seed},
        )
    raise ConfigError(
        f"unknown dataset kind {cfg.kind!r}. Available kinds are: {', '.join(DATASET_KINDS)}"
    )
