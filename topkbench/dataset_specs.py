"""Typed dataset specs: each kind's own parameters, and the preprocessing every kind shares,
with their defaults in one place, read from a :class:`~topkbench.config.DatasetConfig`.

The file kinds' ``files``, ``holdout`` and ``xml`` entries are structured (split -> file
entry) and are read by :mod:`topkbench.data.files` and :mod:`topkbench.data.preprocess`.

A leaf module (dataclasses only), so that the config layer can ask a generated dataset
whether it has a validation split without importing the generators.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from topkbench.errors import ConfigError


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


@dataclass(frozen=True)
class LibsvmSpec:
    """LibSVM/SVMlight text files, one per split."""

    zero_based: bool = False  # feature indices start at 0 (the format's default is 1)


@dataclass(frozen=True)
class MatSpec:
    """One MATLAB file holding ``<split>_data`` / ``<split>_labels``."""

    names_var: str = "classnames"  # the variable with the class names


@dataclass(frozen=True)
class FeaturesSpec:
    """Precomputed features (HDF5, ``.npz``, ``.npy``; layout in :mod:`topkbench.data.features`)."""


@dataclass(frozen=True)
class MulanSpec:
    """Multilabel ARFF files; without a label XML, ``n_labels`` = N takes the first N
    attributes as labels and -N the last N."""

    n_labels: int | None = None


@dataclass(frozen=True)
class PreprocessSpec:
    """What every kind applies after loading, in this order: PCA fitted on train (file kinds;
    an integer or ``nonsingular``), a constant feature of value ``bias`` (0 = none, DESIGN
    §2), per-feature ``scale`` fitted on train (``none`` keeps the papers' raw features), and
    float32 storage of the features (``float32: true``; ``false`` keeps SDCA's passes in
    float64 even where the features are exact in float32; absent: features exact in float32
    get float32 passes, :func:`topkbench.fit`'s ``float32="auto"``); and how training weighs
    the classes: ``class_weight: balanced`` gives each example of class c the weight ``n /
    (m n_c)`` (multiclass methods; None weighs every example 1, as the papers do)."""

    pca: int | str | None = None
    bias: float = 0.0
    scale: str = "none"
    float32: bool | None = None
    class_weight: str | None = None


GENERATED_KINDS = {
    "circle": CircleSpec,
    "gaussian": GaussianSpec,
    "multilabel_synth": MultilabelSynthSpec,
}


FILE_KINDS = {
    "libsvm": LibsvmSpec,
    "mat": MatSpec,
    "features": FeaturesSpec,
    "mulan": MulanSpec,
}

ALL_KINDS = {**GENERATED_KINDS, **FILE_KINDS}

# each field type's cast, and what it takes, for the error a value that does not cast gets
_CASTS = {
    "int": (int, "an integer"),
    "float": (float, "a number"),
    "bool": (bool, "true or false"),
    "str": (str, "a string"),
    "int | None": (int, "an integer"),
    "str | None": (str, "a string"),
    "bool | None": (bool, "true, false or null"),
    "int | str | None": (lambda v: v if isinstance(v, str) else int(v), "an integer or a name"),
}


def _read(cls, options: dict[str, Any]):
    """The spec ``cls`` from ``options``, each value cast to its field's type; a value that
    does not cast is a ConfigError naming the key and what it takes."""
    values = {}
    for f in fields(cls):
        if f.name not in options:
            continue
        value = options[f.name]
        try:
            values[f.name] = None if value is None else _CASTS[f.type][0](value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"dataset.{f.name} must be {_CASTS[f.type][1]}; got {value!r}"
            ) from None
    return cls(**values)


def kind_spec(kind: str, options: dict[str, Any]):
    """The spec of dataset ``kind`` from a dataset's options (keys of other kinds or of every
    kind, such as ``bias`` or ``title``, are ignored here), each value cast to its type."""
    return _read(ALL_KINDS[kind], options)


def preprocess_spec(options: dict[str, Any]) -> PreprocessSpec:
    """The preprocessing options of a dataset (:class:`PreprocessSpec`)."""
    return _read(PreprocessSpec, options)
