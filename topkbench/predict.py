"""Predictions of a saved model on a data file: each example's top-k labels and scores, and
top-k accuracy (multiclass) or precision@k (multilabel) when the file carries labels."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topkbench.errors import ConfigError, DataFormatError


@dataclass
class Prediction:
    frame: object  # pandas DataFrame: row, label_1..k, score_1..k[, true]
    metric: tuple[str, float] | None  # (name, value) when the file has labels
    notes: list[str] = field(default_factory=list)
    top_rule: str | None = None  # how k was chosen when the caller gave none


def _read(path: Path, n_features: int | None, zero_based: bool, multilabel: bool):
    """Features and raw label tuples (None for a .npy matrix) of ``path``."""
    if path.suffix.lower() == ".npy":
        try:
            X = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise DataFormatError(str(path), f"not a .npy feature matrix ({exc})") from None
        if X.ndim != 2:
            raise DataFormatError(str(path), f"features must be 2-D; got shape {X.shape}")
        return X, None
    from topkbench.data.libsvm import read_libsvm

    data = read_libsvm(path, multilabel=multilabel, n_features=n_features, zero_based=zero_based)
    return data.X, data.labels


def predict_file(model_path, data_path, *, top: int | None = None,
                 zero_based: bool | None = None) -> Prediction:  # fmt: skip
    """Top-``top`` labels and scores of the model saved at ``model_path`` for every example of
    ``data_path`` (LibSVM text or ``.npy``).  ``top`` defaults to the model's k when it was
    trained with k > 1, else to ``min(5, m - 1)`` (at least 1); ``Prediction.top_rule`` says
    which.  ``zero_based`` (LibSVM feature indices from 0) defaults to the training data's
    setting when the model records it, else False."""
    import pandas as pd

    from topkbench.model import Model
    from topkbench.persist import class_label_key
    from topkbench.validation import check_int

    if top is not None:
        top = check_int("--top", top, 1)
    model = Model.load(model_path)
    if model.kernel == "precomputed":
        raise ConfigError(
            "this model was trained on a precomputed kernel: it needs the test x train kernel, "
            "not features (use Model.decision_function(K=...) from Python)"
        )
    m = model.n_classes
    top_rule = None
    if top is None:
        k = int(model.params.get("k", 1) or 1)
        if 1 < k <= m:
            top, top_rule = k, f"k = {k}, the model's k (--top sets it)"
        else:
            top = max(1, min(5, m - 1))
            top_rule = f"k = {top} = min(5, m - 1) for this {m}-class model (--top sets it)"
    if top > m:
        raise ConfigError(f"--top must be in [1, {m}] (the model has {m} classes); got {top}")
    from topkbench.losses.registry import get_method

    multilabel = get_method(model.method).task == "multilabel"
    if zero_based is None:
        spec = (model.info.get("training_data") or {}).get("spec") or {}
        zero_based = bool(spec.get("zero_based", False))
    X, labels = _read(Path(data_path), model.n_features, zero_based, multilabel)
    S = model.decision_function(X)
    order = np.argsort(-S, axis=1, kind="stable")[:, :top]
    classes = np.arange(m) if model.classes is None else np.asarray(model.classes)
    cols = {"row": np.arange(1, S.shape[0] + 1)}
    for j in range(top):
        cols[f"label_{j + 1}"] = classes[order[:, j]]
    for j in range(top):
        cols[f"score_{j + 1}"] = S[np.arange(S.shape[0]), order[:, j]]
    notes: list[str] = []
    metric = None
    if labels is not None:
        # the file's labels are integers; the model's may be floats or strings
        raw = range(m) if model.classes is None else list(model.classes)
        index = {class_label_key(c): j for j, c in enumerate(raw)}
        unseen = sorted({lab for labs in labels for lab in labs
                         if class_label_key(lab) not in index})  # fmt: skip
        if unseen:
            notes.append(
                f"{len(unseen)} label value(s) of {Path(data_path).name} are not classes of the "
                f"model (first: {unseen[:5]}); their examples count as misses"
            )
        true = [[index[key] for key in map(class_label_key, labs) if key in index]
                for labs in labels]  # fmt: skip
        hits = np.array([len(set(t) & set(o.tolist())) for t, o in zip(true, order, strict=True)])
        if multilabel:
            metric = (f"precision@{top}", float(np.mean(hits / top)))
        else:
            if any(len(labs) != 1 for labs in labels):
                raise DataFormatError(
                    str(data_path), "a multiclass model needs exactly one label per example"
                )
            metric = (f"top-{top} accuracy", float(np.mean(hits > 0)))
        cols["true"] = [" ".join(str(lab) for lab in labs) for labs in labels]
    return Prediction(pd.DataFrame(cols), metric, notes, top_rule)
