"""Sweep engine (DESIGN §7-8): C paths with warm starts, per-record persistence, resume.

A sweep is a set of independent *paths*: one per (draw, table row).  A path walks the C grid in
ascending order, warm-starting each fit from the previous dual (rescaled by C_new / C_old, which
keeps it feasible).  Every finished point is written atomically to the record store before the
next one starts, together with a warm-start checkpoint, so an interrupted sweep loses no finished
record and a re-run resumes exactly where it stopped.  Paths run in parallel through joblib
processes (``n_jobs``).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from topkbench.config import ExperimentConfig, SweepRow
from topkbench.errors import TopkbenchError
from topkbench.store import RecordStore, spec_key

log = logging.getLogger(__name__)


@dataclass
class PathSummary:
    row: str
    draw: int
    done: int = 0
    cached: int = 0
    failed: int = 0
    not_converged: int = 0
    seconds: float = 0.0
    errors: tuple[str, ...] = ()


def _record_spec(exp: ExperimentConfig, row: SweepRow, draw: int, C: float) -> dict[str, Any]:
    import topkbench

    return {
        "experiment": exp.name,
        "dataset": exp.dataset.as_dict(),
        "draw": draw,
        "data_seed": exp.seed + draw,
        "method": row.method,
        "gamma": float(row.gamma),
        "k": int(row.k),
        "C": float(C),
        "eps": exp.eps,
        "max_epochs": exp.max_epochs,
        "time_limit": exp.time_limit,
        "eval_every": exp.eval_every,
        "version": topkbench.__version__,
    }


def run_path(exp: ExperimentConfig, row: SweepRow, draw: int) -> PathSummary:
    """Run (or resume) the C path of one (row, draw); returns counts."""
    from topkbench.data.dataset import load_dataset
    from topkbench.metrics.topk import topk_accuracy
    from topkbench.model import fit

    start = time.perf_counter()
    store = RecordStore(exp.results_dir, exp.name)
    summary = PathSummary(row=row.row, draw=draw)
    data_seed = exp.seed + draw
    path_spec = _record_spec(exp, row, draw, 0.0)
    path_spec.pop("C")
    path_key = spec_key(path_spec)
    dataset = None
    prev_model = None
    last_finished_C = None
    errors: list[str] = []
    for C in exp.C_values:
        spec = _record_spec(exp, row, draw, C)
        key = spec_key(spec)
        if store.has(key):
            summary.cached += 1
            last_finished_C = C
            prev_model = None
            continue
        if dataset is None:
            dataset = load_dataset(exp.dataset, data_seed)
        Xtr, ytr = dataset.splits["train"]
        warm = prev_model
        if warm is None and last_finished_C is not None:
            ck = store.load_warm(path_key)
            if ck is not None and ck[0] == last_finished_C:
                warm = ck
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = fit(
                    Xtr,
                    ytr,
                    row.method,
                    C=C,
                    k=row.k,
                    gamma=row.gamma,
                    eps=exp.eps,
                    max_epochs=exp.max_epochs,
                    time_limit=exp.time_limit,
                    eval_every=exp.eval_every,
                    seed=data_seed,
                    n_classes=dataset.n_classes,
                    warm_start=warm,
                    warn=False,
                )
        except TopkbenchError as exc:
            summary.failed += 1
            errors.append(f"C={C:g}: {exc}")
            log.error("%s draw %d C=%g failed: %s", row.row, draw, C, exc)
            prev_model = None
            continue
        ks = [k for k in range(1, dataset.n_classes) if k <= max(exp.ks)]
        record: dict[str, Any] = {
            **{k: v for k, v in spec.items() if k != "dataset"},
            "dataset": exp.dataset.name,
            "row": row.row,
            "status": model.status,
            "primal": model.primal,
            "dual": model.dual,
            "relative_gap": model.relative_gap,
            "epochs": model.epochs,
            "train_seconds": model.train_seconds,
            "warm_started": warm is not None,
            "n_train": int(Xtr.shape[0]),
            "n_features": int(Xtr.shape[1]),
            "n_classes": dataset.n_classes,
        }
        for split, (Xs, ys) in dataset.splits.items():
            acc = topk_accuracy(model.decision_function(Xs), ys, ks)
            for k, v in acc.items():
                record[f"{split}_top{k}"] = v
        store.save_warm(path_key, C, model.A)
        store.write(key, record)
        summary.done += 1
        summary.not_converged += model.status != "converged"
        last_finished_C = C
        prev_model = model
    summary.seconds = time.perf_counter() - start
    summary.errors = tuple(errors)
    return summary


def _warm_up(methods: set[str]) -> None:
    """Compile the kernels once in the parent so that workers load them from the cache."""
    from topkbench.model import fit

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = np.arange(12) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in methods:
            fit(X, y, method, C=1.0, max_epochs=2, warn=False)


def run_sweep(
    exp: ExperimentConfig,
    on_path_done: Callable[[PathSummary], None] | None = None,
) -> list[PathSummary]:
    """Run every path of ``exp`` (in parallel when ``exp.n_jobs != 1``)."""
    jobs = [(row, draw) for draw in range(exp.draws) for row in exp.rows]
    _warm_up({row.method for row in exp.rows})
    results: list[PathSummary] = []
    if exp.n_jobs == 1:
        for row, draw in jobs:
            s = run_path(exp, row, draw)
            results.append(s)
            if on_path_done:
                on_path_done(s)
        return results
    from joblib import Parallel, delayed

    parallel = Parallel(n_jobs=exp.n_jobs, return_as="generator_unordered")
    for s in parallel(delayed(run_path)(exp, row, draw) for row, draw in jobs):
        results.append(s)
        if on_path_done:
            on_path_done(s)
    return results
