"""The dataset object every loader returns, and the dispatcher from a DatasetConfig.

Dataset kinds (``kind:`` in ``topkbench/conf/dataset/*.yaml``, DESIGN §6):

* ``circle``   — the synthetic circle of TPAMI §6.1 (Table 3).
* ``gaussian`` — Gaussian classes (a Letter-shaped stand-in for benchmarks and smoke tests).
* ``multilabel_synth`` — linear-threshold multilabel data (smoke runs of Tables 7/9 and 10-12;
  with ``regions: R`` every example becomes an image of R region rows sharing its labels).
* ``libsvm``   — LibSVM/SVMlight text files, one per split (``files: {train: ..., test: ...}``).
* ``mat``      — a MATLAB file with ``<split>_data`` / ``<split>_labels`` (Caltech101 Silhouettes).
* ``features`` — precomputed features (HDF5, ``.npz``, ``.npy``; layout in ``data.features``).
* ``mulan``    — multilabel ARFF files, one per split, with the label XML in ``xml:`` (or
  ``n_labels: N``); labels are an n x m CSR 0/1 indicator (:mod:`topkbench.data.arff`).

Options shared by the file kinds:

* ``files``: split name -> file name (resolved under the data directory,
  :mod:`topkbench.data.files`) or ``{file: ..., url: ..., sha256: ...}`` (the registry form,
  used by ``topkbench data``).
  ``.npy`` features take ``{file: X.npy, labels: y.npy}``.
* ``holdout: {source: all, test_fraction: 0.5, seed: 0}`` — split one file into stratified
  train/test parts with a fixed seed (ALOI, TPAMI §6.2), independent of the run seed.
* ``pca: nonsingular`` or an integer — PCA fitted on train (News20, :mod:`topkbench.data.pca`).
* ``bias``: value of an appended constant feature (0 = none, DESIGN §2).
* ``scale: none | standard | maxabs`` — per-feature scaling fitted on the training split
  (:mod:`topkbench.data.preprocess`); ``none`` (the default) keeps the papers' raw features.

Every check raises :class:`DataFormatError` naming the file: NaN/Inf features, splits with
different feature counts (LibSVM files are widened to the largest index instead, since the
format omits trailing zeros), empty files, labels that are not integers, and a training split
without some class that occurs in another split.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from topkbench.config import DatasetConfig
from topkbench.data.files import (
    SPLIT_ORDER,
    extra_file_entries,
    file_entries,
    missing_files,
    resolve_path,
)
from topkbench.data.preprocess import SCALINGS, apply_holdout, scale_features
from topkbench.dataset_specs import FILE_KINDS, GENERATED_KINDS
from topkbench.errors import ConfigError, DataFormatError, DatasetNotFoundError
from topkbench.feature_map import FeatureMap, append_bias
from topkbench.validation import check_choice

logger = logging.getLogger(__name__)


@dataclass
class Dataset:
    """Features (dense or CSR) and targets per split, plus provenance.

    Targets are 0-based class indices (multiclass) or an n x m CSR 0/1 indicator (multilabel,
    :attr:`multilabel`).
    """

    name: str
    splits: dict[str, tuple[Any, np.ndarray]]
    n_classes: int
    label_names: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)
    image_ids: dict[str, np.ndarray] = field(default_factory=dict)
    # multilabel data: one class per example for multiclass training (TPAMI §6.3, Tables 10-12)
    primary: dict[str, np.ndarray] = field(default_factory=dict)
    # raw features -> the training features (scaling, bias); None where it cannot be replayed
    feature_map: FeatureMap | None = None
    class_weight: str | None = None  # how training weighs the classes (PreprocessSpec)
    float32: str = "auto"  # SDCA's passes (fit's float32=): "never" when the spec says false

    @property
    def n_features(self) -> int:
        return next(iter(self.splits.values()))[0].shape[1]

    @property
    def multilabel(self) -> bool:
        return sp.issparse(next(iter(self.splits.values()))[1])


DATASET_KINDS = (*GENERATED_KINDS, *FILE_KINDS)


def _check_finite(X, source: str) -> None:
    vals = X.data if sp.issparse(X) else X
    bad = ~np.isfinite(vals)
    if bad.any():
        if sp.issparse(X):
            pos = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(X.indptr, pos, side="right") - 1)
            col, v = int(X.indices[pos]), vals[pos]
        else:
            row, col = (int(t) for t in np.argwhere(bad)[0])
            v = X[row, col]
        raise DataFormatError(
            source,
            f"feature value {v} at example {row + 1}, feature {col + 1}; "
            "features must be finite (no NaN or Inf)",
        )


# a CSR entry stores a value and a column index (12 bytes), a dense one the value (8): from this
# fraction of stored entries on, a dense array is no larger than the CSR matrix
DENSE_FRACTION = 2.0 / 3.0


def _dense_if_denser(raw) -> None:
    """Store the splits ``split -> (X, targets, file)`` dense when the training features are
    a CSR matrix with at least :data:`DENSE_FRACTION` of its entries stored (the other
    splits follow, so that every split has one form).  LibSVM files hold dense data as CSR
    (Letter's: every entry stored); dense, it takes no more memory, and the solvers' dense
    products and epoch kernels run faster on it."""
    X = raw["train"][0] if "train" in raw else None
    if X is None or not sp.issparse(X) or X.nnz < DENSE_FRACTION * X.shape[0] * X.shape[1]:
        return
    for s, (Xs, targets, src) in list(raw.items()):
        raw[s] = (Xs.toarray() if sp.issparse(Xs) else Xs, targets, src)


def assemble(
    cfg: DatasetConfig,
    raw: dict[str, tuple[Any, np.ndarray, str]],
    names: list[str] | None = None,
    provenance: dict[str, Any] | None = None,
    image_ids: dict[str, np.ndarray] | None = None,
) -> Dataset:
    """Checks, label encoding and preprocessing shared by the file kinds.

    ``raw`` maps a split to ``(X, raw integer labels, source file)``.
    """
    provenance = dict(provenance or {})
    image_ids = dict(image_ids or {})
    for split, (X, _, src) in raw.items():
        if X.shape[0] == 0:
            raise DataFormatError(src, f"split {split!r} has no examples")
        _check_finite(X, src)
    apply_holdout(cfg, raw, provenance, image_ids)
    if "train" not in raw:
        raise ConfigError(f"dataset {cfg.name}: no 'train' split (have {', '.join(raw)})")
    # common width: LibSVM omits trailing zero features, so widen sparse splits
    widths = {s: X.shape[1] for s, (X, _, _) in raw.items()}
    d = max(widths.values())
    for s, (X, y, src) in list(raw.items()):
        if X.shape[1] != d:
            if not sp.issparse(X):
                raise DataFormatError(
                    src, f"split {s!r} has {X.shape[1]} features but other splits have {d}"
                )
            raw[s] = (sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], d)), y, src)
    _dense_if_denser(raw)
    classes = np.unique(np.concatenate([y for _, y, _ in raw.values()]))
    codes = {s: np.searchsorted(classes, y) for s, (_, y, _) in raw.items()}
    missing = np.setdiff1d(np.arange(len(classes)), codes["train"])
    if len(missing):
        shown = ", ".join(str(classes[j]) for j in missing[:10])
        raise DataFormatError(
            raw["train"][2],
            f"the training split has no example of {len(missing)} class(es) that occur in "
            f"other splits: {shown}{' ...' if len(missing) > 10 else ''}",
        )
    if names is not None and len(names) == len(classes):
        label_names = [str(n) for n in names]
    elif names is not None and len(names) >= classes.max() and classes.min() >= 1:
        label_names = [str(names[int(c) - 1]) for c in classes]  # 1-based (MATLAB) labels
    else:
        label_names = [str(c) for c in classes]
    splits = {s: (raw[s][0], codes[s]) for s in SPLIT_ORDER if s in raw}
    splits.update({s: (raw[s][0], codes[s]) for s in raw if s not in splits})
    pca = cfg.preprocess.pca
    if pca:
        from topkbench.data.pca import gram_pca

        others = [s for s in splits if s != "train"]
        n_comp = None if str(pca) == "nonsingular" else int(pca)
        Ztr, Zo, ev = gram_pca(splits["train"][0], [splits[s][0] for s in others], n_comp)
        splits["train"] = (Ztr, splits["train"][1])
        for s, Z in zip(others, Zo, strict=True):
            splits[s] = (Z, splits[s][1])
        provenance["pca"] = f"{len(ev)} components fitted on train ({pca})"
    bias = cfg.preprocess.bias
    splits = {s: (append_bias(X, bias), y) for s, (X, y) in splits.items()}
    return Dataset(cfg.name, splits, len(classes), label_names, provenance, image_ids)


def _load_libsvm(cfg: DatasetConfig) -> Dataset:
    from topkbench.data.libsvm import read_libsvm

    raw = {}
    for split, entry in file_entries(cfg).items():
        path = resolve_path(cfg, entry["file"])
        data = read_libsvm(path, zero_based=cfg.spec.zero_based)
        if any(len(labs) != 1 for labs in data.labels):
            i = next(i for i, labs in enumerate(data.labels) if len(labs) != 1)
            raise DataFormatError(
                str(path),
                f"multiclass data expected, but example {i + 1} has {len(data.labels[i])} labels",
            )
        y = np.array([labs[0] for labs in data.labels], dtype=np.int64)
        raw[split] = (data.X, y, str(path))
    return assemble(cfg, raw, provenance={"files": {s: r[2] for s, r in raw.items()}})


def _load_mat(cfg: DatasetConfig) -> Dataset:
    from topkbench.data.matlab import read_split_mat

    entries = file_entries(cfg)
    if len({e["file"] for e in entries.values()}) != 1:
        raise ConfigError(f"dataset {cfg.name}: kind 'mat' reads all splits from one file")
    path = resolve_path(cfg, next(iter(entries.values()))["file"])
    prefixes = {s: str(e.get("prefix", s)) for s, e in entries.items()}
    splits, names = read_split_mat(path, prefixes, names_var=cfg.spec.names_var)
    raw = {s: (X, y, str(path)) for s, (X, y) in splits.items()}
    return assemble(cfg, raw, names, provenance={"file": str(path)})


def _load_features(cfg: DatasetConfig) -> Dataset:
    from topkbench.data.features import read_features

    raw, ids, names, prov, primary = {}, {}, None, {}, {}
    cache: dict[Path, Any] = {}
    kinds = set()
    for split, entry in file_entries(cfg).items():
        path = resolve_path(cfg, entry["file"])
        labels = resolve_path(cfg, entry["labels"]) if entry.get("labels") else None
        if path not in cache:
            cache[path] = read_features(path, labels)
        ff = cache[path]
        kinds.add(ff.multilabel)
        names = names or ff.label_names
        prov[split] = str(path)
        idx = slice(None)
        if ff.splits:
            if split not in ff.splits:
                raise DataFormatError(
                    str(path), f"no 'splits/{split}' index (the file has {', '.join(ff.splits)})"
                )
            idx = ff.splits[split]
        X = ff.X if isinstance(idx, slice) else np.asarray(ff.X[idx])
        raw[split] = (X, ff.labels[idx], str(path))
        if ff.image_ids is not None:
            ids[split] = ff.image_ids[idx]
        if ff.primary is not None:
            primary[split] = ff.primary[idx]
    if len(kinds) > 1:
        raise DataFormatError(
            ", ".join(prov.values()), "some files hold class labels and others an indicator"
        )
    if kinds == {True}:
        m = next(iter(raw.values()))[1].shape[1]
        if any(r[1].shape[1] != m for r in raw.values()):
            raise DataFormatError(", ".join(prov.values()), "indicator widths differ")
        label_names = names or [f"label {j + 1}" for j in range(m)]
        return assemble_multilabel(cfg, raw, label_names, {"files": prov}, ids, primary)
    return assemble(cfg, raw, names, provenance={"files": prov}, image_ids=ids)


def _make_multilabel_synth(cfg: DatasetConfig, seed: int) -> Dataset:
    from topkbench.data.synthetic import make_multilabel

    spec = cfg.spec
    m = spec.n_labels
    regions = spec.regions
    parts = make_multilabel(seed, **{k: v for k, v in asdict(spec).items() if k != "regions"})
    raw, ids, primary = {}, {}, {}
    rng = np.random.default_rng(seed + 1)
    for split, part in parts.items():
        if part.X.shape[0] == 0:
            continue
        X, Y, prim = part.X, part.Y, part.primary
        if regions > 1:  # R noisy region features per image, labels replicated (TPAMI §6.3)
            rep = np.repeat(np.arange(X.shape[0]), regions)
            X = X[rep] + 0.5 * rng.standard_normal((rep.size, X.shape[1]))
            Y, prim = Y[rep], prim[rep]
            ids[split] = np.array([f"{split}{i}" for i in rep])
        raw[split] = (X, Y, f"{cfg.name}:{split}")
        primary[split] = prim
    prov = {"generator": "multilabel_synth (data.synthetic.make_multilabel)", "seed": seed}
    names = [f"label {j + 1}" for j in range(m)]
    return assemble_multilabel(cfg, raw, names, prov, ids, primary)


def _load_mulan(cfg: DatasetConfig) -> Dataset:
    from topkbench.data.arff import read_label_xml, read_mulan

    extra = extra_file_entries(cfg)
    xml_path = resolve_path(cfg, extra[0]["file"]) if extra else None
    names = read_label_xml(xml_path) if xml_path is not None else None
    n_labels = cfg.spec.n_labels
    raw: dict[str, tuple[Any, Any, str]] = {}
    label_names = None
    for split, entry in file_entries(cfg).items():
        path = resolve_path(cfg, entry["file"])
        data = read_mulan(path, names, n_labels)
        if label_names is None:
            label_names = data.label_names
        elif data.label_names != label_names:
            raise DataFormatError(
                str(path),
                f"label attributes differ from the other split's ({len(data.label_names)} vs "
                f"{len(label_names)}; first: {data.label_names[:3]} vs {label_names[:3]})",
            )
        raw[split] = (data.X, data.Y, str(path))
    prov = {"files": {s: r[2] for s, r in raw.items()}}
    if xml_path is not None:
        prov["xml"] = str(xml_path)
    return assemble_multilabel(cfg, raw, label_names or [], prov)


def assemble_multilabel(
    cfg: DatasetConfig,
    raw: dict[str, tuple[Any, Any, str]],
    label_names: list[str],
    provenance: dict[str, Any],
    image_ids: dict[str, np.ndarray] | None = None,
    primary: dict[str, np.ndarray] | None = None,
) -> Dataset:
    """Checks and preprocessing of multilabel splits ``split -> (X, CSR indicator, file)``:
    non-empty, finite, equal widths (sparse splits widened), same label count; an optional
    seeded random holdout (``holdout: {source, test_count | test_fraction, seed}``, e.g.
    bookmarks); a logged warning when split sizes differ from ``splits_expected``; bias."""
    image_ids = dict(image_ids or {})
    primary = dict(primary or {})
    provenance = dict(provenance)
    apply_holdout(cfg, raw, provenance, image_ids, primary)
    expected = cfg.get("splits_expected") or {}
    for split, count in expected.items():
        if split in raw and raw[split][0].shape[0] != int(count):
            logger.warning(
                "%s: split %r has %d examples; the paper's protocol uses %d (%s)",
                cfg.name, split, raw[split][0].shape[0], int(count), raw[split][2],
            )  # fmt: skip
    if "train" not in raw:
        raise ConfigError(f"dataset {cfg.name}: no 'train' split (have {', '.join(raw)})")
    m = len(label_names)
    for split, (X, Y, src) in raw.items():
        if X.shape[0] == 0:
            raise DataFormatError(src, f"split {split!r} has no examples")
        if Y.shape != (X.shape[0], m):
            raise DataFormatError(
                src, f"label indicator has shape {Y.shape}; expected ({X.shape[0]}, {m})"
            )
        _check_finite(X, src)
    d = max(X.shape[1] for X, _, _ in raw.values())
    for s, (X, Y, src) in list(raw.items()):
        if X.shape[1] != d:
            if not sp.issparse(X):
                raise DataFormatError(
                    src, f"split {s!r} has {X.shape[1]} features but other splits have {d}"
                )
            raw[s] = (sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], d)), Y, src)
    _dense_if_denser(raw)
    bias = cfg.preprocess.bias
    order = [s for s in SPLIT_ORDER if s in raw] + [s for s in raw if s not in SPLIT_ORDER]
    splits = {s: (append_bias(raw[s][0], bias), sp.csr_matrix(raw[s][1])) for s in order}
    return Dataset(
        cfg.name, splits, m, list(label_names), dict(provenance), image_ids, primary
    )  # fmt: skip


def load_dataset(cfg: DatasetConfig, seed: int) -> Dataset:
    """Build or load the dataset described by ``cfg``; ``seed`` drives any random choice.

    With the option ``float32: true`` feature values are stored as float32: dense matrices
    take half the memory, and SDCA, which trains on them directly, runs the passes of its
    plain epochs in float32 while far from eps (its certificates stay float64;
    :func:`topkbench.solvers.problem.keeps_single`).  Sparse matrices keep their structure
    with float32 values (the binary features of the Mulan sets are exact).  Without the
    option, features exact in float32 get the same passes (:func:`topkbench.fit`'s
    ``float32="auto"``); ``float32: false`` keeps them in float64 (``ds.float32``)."""
    ds = _load_dataset(cfg, seed)
    pre = cfg.preprocess
    scale = check_choice("dataset.scale", pre.scale, SCALINGS)
    shift = div = None
    if scale != "none":
        shift, div = scale_features(ds, scale, has_bias=pre.bias != 0.0)
    ds.class_weight = pre.class_weight
    ds.float32 = "never" if pre.float32 is False else "auto"
    if not (pre.pca and cfg.kind in FILE_KINDS):  # a PCA projection is not replayed
        raw = ds.n_features - (pre.bias != 0.0)
        ds.feature_map = FeatureMap(raw, shift, div, pre.bias)
    if pre.float32:
        for split, (X, y) in ds.splits.items():
            if X.dtype != np.float32 and (isinstance(X, np.ndarray) or sp.issparse(X)):
                ds.splits[split] = (X.astype(np.float32), y)
    return ds


def _load_dataset(cfg: DatasetConfig, seed: int) -> Dataset:
    if cfg.kind == "circle":
        from topkbench.data.synthetic import make_circle

        spec = cfg.spec
        splits = make_circle(seed, **asdict(spec))
        bias = cfg.preprocess.bias
        return Dataset(
            name=cfg.name,
            splits={k: (append_bias(v.X, bias), v.y) for k, v in splits.items()},
            n_classes=3,
            label_names=["class 1", "class 2", "class 3"],
            provenance={"generator": "circle (DESIGN §6.1)", "seed": seed},
        )
    if cfg.kind == "gaussian":
        from topkbench.data.synthetic import make_gaussian

        spec = cfg.spec
        m = spec.n_classes
        splits = make_gaussian(seed, **asdict(spec))
        bias = cfg.preprocess.bias
        return Dataset(
            name=cfg.name,
            splits={k: (append_bias(v.X, bias), v.y) for k, v in splits.items() if len(v.y)},
            n_classes=m,
            label_names=[f"class {j + 1}" for j in range(m)],
            provenance={"generator": "gaussian classes (data.synthetic)", "seed": seed},
        )
    if cfg.kind == "multilabel_synth":
        return _make_multilabel_synth(cfg, seed)
    loaders = {
        "libsvm": _load_libsvm,
        "mat": _load_mat,
        "features": _load_features,
        "mulan": _load_mulan,
    }
    if cfg.kind in loaders:
        missing = missing_files(cfg)
        if missing:
            if any(e.get("url") for e in file_entries(cfg).values()):
                hint = f"topkbench data fetch {cfg.name}   (or: topkbench data info {cfg.name})"
            else:
                hint = (
                    f"{cfg.name} has no download: put the files at the paths above (relative "
                    f"names resolve under $TOPKBENCH_DATA/{cfg.name}/ or the working directory)"
                    f"; `topkbench data info {cfg.name}` shows the expected layout"
                )
            raise DatasetNotFoundError(cfg.name, [str(p) for p in missing], hint=hint)
        return loaders[cfg.kind](cfg)
    raise ConfigError(
        f"unknown dataset kind {cfg.kind!r}. Available kinds are: {', '.join(DATASET_KINDS)}"
    )
