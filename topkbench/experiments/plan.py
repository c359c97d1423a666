"""What a sweep trains (DESIGN §7-8): paths, folds, the base grid, and the record key.

A sweep is a set of independent *paths*.  A path is one (dataset, draw, table row, fold) walking a
list of C values in ascending order, warm-starting each fit from the previous dual (rescaled by
C_new / C_old, which keeps it feasible).  The fold says which data the path trains on:

* ``val``      — train on the train split, evaluate the val and test splits (selection on val);
* ``cv<i>of<K>`` — train on the other K-1 stratified folds of train, evaluate the held-out fold;
* ``half``     — train on one random half of train, validate on the other (Tables 10-12);
* ``refit``    — train on the whole train split at the C values selected by cross-validation,
  evaluate the test split (DESIGN §7: "refit on the selection split's train part").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from topkbench.config import DatasetConfig, ExperimentConfig, SweepRow

log = logging.getLogger(__name__)

REFIT = "refit"


VAL = "val"


HALF = "half"  # train on one random half of train, validate on the other (Tables 10-12)


ACCELERATE = "auto"  # fit's SDCA acceleration rule for every sweep fit


def cv_fold_name(i: int, n_folds: int) -> str:
    return f"cv{i}of{n_folds}"


@dataclass(frozen=True)
class PathJob:
    """One path: a dataset, draw, row and fold, and the C values to walk (ascending)."""

    dataset: int  # index into exp.datasets
    draw: int
    row: SweepRow
    fold: str
    C_values: tuple[float, ...]
    init_C: float | None = None  # topk_ent_tr: start from LR^Multi trained at this C
    theta: float | None = None  # RBF rows: the kernel width of this path


@dataclass
class PathSummary:
    row: str
    draw: int
    dataset: str = ""
    fold: str = VAL
    done: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    not_converged: int = 0
    seconds: float = 0.0
    errors: tuple[str, ...] = field(default_factory=tuple)


def record_spec(
    exp: ExperimentConfig,
    ds: DatasetConfig,
    row: SweepRow,
    draw: int,
    fold: str,
    C: float | None,
    init_C: float | None = None,
    theta: float | None = None,
    digests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The canonical spec of one record; its hash is the record key (DESIGN §8).

    It covers everything that changes the record's numbers: the dataset's options and the
    SHA-256 of every file it reads (``digests``, default: hashed now), the draw, fold and
    protocol, the method with every solver setting, the seed and the code version.  The sweep
    and the report use this one function, so a report reads exactly the records of the
    configuration it names.
    """
    import topkbench
    from topkbench.data.files import file_digests

    spec = {
        "experiment": exp.name,
        "dataset": ds.spec_dict(),
        "data_sha256": file_digests(ds) if digests is None else digests,
        "draw": draw,
        "data_seed": exp.seed + draw,
        "fold": fold,
        "method": row.method,
        "gamma": float(row.gamma),
        "k": int(row.k),
        "C": None if C is None else float(C),
        "eps": exp.eps,
        "max_epochs": exp.max_epochs,
        "time_limit": exp.time_limit,
        "eval_every": exp.eval_every,
        "accelerate": ACCELERATE,
        "version": topkbench.__version__,
    }
    if init_C is not None:
        spec["init_C"] = float(init_C)
    for key, value in row.fit_options().items():  # only rows with such options change keys
        # a string either way, so that records of both kinds share one column type
        spec[key] = ",".join(f"{v:.17g}" for v in value) if isinstance(value, tuple) else value
    if theta is not None:
        spec["kernel"] = "rbf"
        spec["theta"] = float(theta)
    if exp.multilabel:  # records hold the partition metrics on this grid, with this 0/0
        spec["delta_grid"] = exp.delta_grid
        spec["empty_label"] = exp.empty_label
    return spec


def selection_folds(exp: ExperimentConfig, ds_index: int) -> tuple[str, ...]:
    """The folds whose held-out accuracy selects C for a dataset (val split or K CV folds)."""
    mode = exp.selection_for(ds_index)
    if mode == "cv":
        return tuple(cv_fold_name(i, exp.folds) for i in range(exp.folds))
    if mode == HALF:
        return (HALF,)
    return (VAL,)


def base_jobs(
    exp: ExperimentConfig,
    rows: tuple[SweepRow, ...] | None = None,
    init: dict[tuple, float] | None = None,
) -> list[PathJob]:
    init = init or {}
    return [
        PathJob(di, draw, variant, fold, exp.C_values, init.get((di, draw, row.row)), theta)
        for di in range(len(exp.datasets))
        for draw in range(exp.draws)
        for row in (exp.rows if rows is None else rows)
        for variant in row.variants()
        for theta in (exp.theta_values if row.kernel == "rbf" else (None,))
        for fold in selection_folds(exp, di)
    ]


def init_row(exp: ExperimentConfig) -> SweepRow | None:
    """The LR^Multi row whose selected model starts the Ent_tr rows (``ent_tr_init:
    selected``), or None (then Ent_tr starts from LR^Multi at its own C)."""
    if exp.ent_tr_init != "selected":
        return None
    return next(
        (r for r in exp.rows if r.method == "lr_multi" and not r.block and r.gamma == 0.0), None
    )


def grid_step(exp: ExperimentConfig) -> float:
    return float(exp.C_base) ** float(exp.C_step)
