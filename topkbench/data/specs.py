"""Typed specs of the generated dataset kinds: each kind's parameters with their defaults in
one place, read from a :class:`~topkbench.config.DatasetConfig` (the file kinds name their
files and options in the registry and are read by their loaders).

A leaf module (dataclasses only), so that the config layer can ask a generated dataset
whether it has a validation split without importing the generators.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CircleSpec:
    """The synthetic circle of TPAMI §6.1 (Table 3)."""

    n_train: int = 200
    n_val: int = 200
    n_test: int = 200_000


@dataclass(frozen=True)
class GaussianSpec:
    """Gaussian classes: a Letter-shaped stand-in for benchmarks and smoke tests."""

    n_classes: int = 26
    n_train: int = 10_500
    n_val: int = 4_500
    n_test: int = 5_000
    n_features: int = 16
    separation: float = 1.0


@dataclass(frozen=True)
class MultilabelSynthSpec:
    """Linear-threshold multilabel data; ``regions`` rows per image share its labels."""

    n_labels: int = 10
    n_train: int = 300
    n_val: int = 0
    n_test: int = 300
    n_features: int = 10
    cardinality: float = 2.0
    noise: float = 1.0
    nonlinear: bool = False
    regions: int = 1


GENERATED_KINDS = {
    "circle": CircleSpec,
    "gaussian": GaussianSpec,
    "multilabel_synth": MultilabelSynthSpec,
}


def generated_spec(kind: str, options: dict[str, Any]):
    """The spec of a generated ``kind`` from a dataset's options (other keys, such as
    ``bias``, ``scale`` or ``title``, belong to every kind and are ignored here), each value
    cast to its field's type."""
    cls = GENERATED_KINDS[kind]
    casts = {"int": int, "float": float, "bool": bool}
    return cls(**{f.name: casts[f.type](options[f.name]) for f in fields(cls) if f.name in options})
