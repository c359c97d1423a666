"""The sweep (DESIGN §7-8): every stage of an experiment, in order.

Stages (:func:`run_sweep`): (1) every selection path on the base grid; (2) while a column's best
C sits on the grid's boundary, add one more grid point beyond it (at most ``extend`` per side,
DESIGN §7 / TPAMI §6.2); (3) certification: a selected fit that stopped on its budget is
continued from its stored dual until eps; (4) refit paths for cross-validated datasets,
walking the C grid with warm starts up to the selected values, and their certification.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from topkbench.config import ExperimentConfig, SweepRow
from topkbench.experiments.fits import warm_up
from topkbench.experiments.plan import (
    HALF,
    REFIT,
    PathJob,
    PathSummary,
    base_jobs,
    grid_step,
    init_row,
    record_spec,
    selection_folds,
)
from topkbench.experiments.run import CertifyTask, Driver, plan_path
from topkbench.experiments.selection import (
    best_C,
    current_records,
    ent_tr_init_Cs,
    mean_validation,
    selected_points,
)
from topkbench.experiments.store import RecordStore

log = logging.getLogger(__name__)


def _extension_jobs(
    exp: ExperimentConfig,
    records: pd.DataFrame,
    decided: dict[tuple, set[float]],
    rows: tuple[SweepRow, ...],
    init: dict[tuple, float],
) -> list[PathJob]:
    """One more C beyond each boundary that some column's best C still sits on.

    ``decided`` holds, per (dataset, draw, row), the extension points chosen in earlier rounds;
    each round looks only at the base grid plus those points, so a re-run replays exactly the
    decisions of the first run (and revisits their cached records).
    """
    if exp.extend <= 0 or records.empty or exp.multilabel:
        return []
    step = grid_step(exp)
    base = np.array(exp.C_values)
    lo0, hi0 = base.min(), base.max()
    jobs = []
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        recs_ds = records[records["dataset"] == ds.name]
        for draw in range(exp.draws):
            for row in rows:
                pts = decided.setdefault((di, draw, row.row), set())
                allowed = np.concatenate([base, sorted(pts)])
                recs = recs_ds[(recs_ds["draw"] == draw) & (recs_ds["row"] == row.row)]
                recs = recs[np.isclose(recs["C"].to_numpy()[:, None], allowed, rtol=1e-12).any(1)]
                curve = mean_validation(recs, folds, exp.ks)
                if curve.empty:
                    continue
                lo, hi = float(curve["C"].min()), float(curve["C"].max())
                new = set()
                for k in exp.ks:
                    b = best_C(curve, k)
                    if b is None:
                        continue
                    if b == hi and math.log(hi / hi0) / math.log(step) < exp.extend - 0.5:
                        new.add(hi * step)
                    if b == lo and math.log(lo0 / lo) / math.log(step) < exp.extend - 0.5:
                        new.add(lo / step)
                new -= pts
                if new:  # one job per path keeps its warm starts sequential (deterministic)
                    pts |= new
                    init_C = init.get((di, draw, row.row))
                    for variant in row.variants():
                        for fold in folds:
                            jobs.append(
                                PathJob(di, draw, variant, fold, tuple(sorted(new)), init_C)
                            )
    return jobs


def _refit_jobs(
    exp: ExperimentConfig, records: pd.DataFrame, init: dict[tuple, float]
) -> list[PathJob]:
    """Refits on all of train at the selected C values, for cross-validated datasets.

    A refit path walks the selection's C grid from its smallest value up to the largest
    selected C, warm-starting each fit from the previous one (a cold fit at a large C is what
    stops on the budget on ill-conditioned data).
    """
    jobs = []
    for sel in selected_points(exp, records):
        if exp.selection_for(sel.dataset) not in ("cv", HALF):
            continue
        top = max(sel.Cs)
        Cs = sorted({*(c for c in sel.grid if c <= top), *sel.Cs})
        init_C = init.get((sel.dataset, sel.draw, sel.row.row))
        if init_C is not None:  # Ent_tr fits start from LR^Multi: no path to walk
            Cs = list(sel.Cs)
        jobs.append(PathJob(sel.dataset, sel.draw, sel.row, REFIT, tuple(Cs), init_C, sel.theta))
    return jobs


MAX_CERTIFY_ROUNDS = 4


def certify_tasks(exp: ExperimentConfig, store: RecordStore, records: pd.DataFrame) -> list:
    """The selected fits (selection folds and refits) that stopped on the budget and were not
    yet continued with this budget: each becomes a :class:`CertifyTask`."""
    from topkbench.losses.registry import get_method

    tasks = []
    for sel in selected_points(exp, records):
        if get_method(sel.row.method).solver == "lbfgs":
            continue  # nonconvex: no certificate to reach
        ds = exp.datasets[sel.dataset]
        recs = records[
            (records["dataset"] == ds.name)
            & (records["draw"] == sel.draw)
            & (records["row"] == sel.row.row)
            & (records["k"] == sel.row.k)
            & (records["gamma"] == sel.row.gamma)
            & records["C"].isin(sel.Cs)
            & records["fold"].isin([*sel.folds, REFIT])
            & (records["status"] != "converged")
        ]
        if sel.theta is not None:
            recs = recs[np.isclose(recs["theta"].astype(float), sel.theta, rtol=1e-12)]
        if "certify_time_limit" in recs:  # continued before: again only with a larger budget
            tried = (recs["certify_time_limit"].astype(float) >= exp.certify_time_limit) & (
                recs["certify_max_epochs"].astype(float) >= exp.certify_max_epochs
            )
            recs = recs[~tried.fillna(False).to_numpy(dtype=bool)]
        for rec in recs.to_dict("records"):
            C = float(rec["C"])
            job = PathJob(sel.dataset, sel.draw, sel.row, rec["fold"], (C,), None, sel.theta)
            spec = record_spec(exp, ds, sel.row, sel.draw, rec["fold"], C, None, sel.theta)
            tasks.append(
                CertifyTask(
                    job,
                    rec["key"],
                    spec,
                    store.checkpoint_ref(rec["key"]),
                    int(rec["epochs"]),
                    float(rec["train_seconds"]),
                )  # fmt: skip
            )
    return tasks


def run_sweep(
    exp: ExperimentConfig,
    on_path_done: Callable[[PathSummary], None] | None = None,
    on_stage: Callable[[str, int], None] | None = None,
    on_fit: Callable[[], None] | None = None,
) -> list[PathSummary]:
    """Run every stage of ``exp``: selection paths, grid extensions, certification of the
    selected fits, refits (and their certification).

    ``on_stage(name, n_fits)`` announces each stage with the number of fits it holds (for
    progress bars); ``on_path_done`` receives each finished path's counts, and ``on_fit()``
    follows each record as it is stored (before its path's counts).  The sweep holds
    the results directory's writer lock throughout: a second sweep there is refused.
    """
    from topkbench.experiments.store import WriterLock

    store = RecordStore(exp.results_dir, exp.name)
    with WriterLock(store):
        warm_up({r.method for r in exp.rows}, {r.method for r in exp.rows if r.kernel == "rbf"})
        from topkbench.data.cache import load_dataset_cached

        for ds in exp.datasets:  # fail early on bad data, and fill the disk cache once
            if ds.kind in ("libsvm", "mat", "mulan"):
                load_dataset_cached(ds, exp.seed)
        driver = Driver(exp, store, on_path_done, on_fit)
        try:
            return _run_stages(exp, store, driver, on_stage)
        except BaseException:
            driver.close(kill=True)
            raise
        finally:
            driver.close()
            store.close()


def _run_stages(exp, store: RecordStore, driver: Driver, on_stage) -> list[PathSummary]:
    lr = init_row(exp)
    dependent = tuple(r for r in exp.rows if lr is not None and r.method == "topk_ent_tr")
    first = tuple(r for r in exp.rows if r not in dependent)
    decided: dict[tuple, set[float]] = {}

    def execute(jobs: list[PathJob], label: str, only_new: bool = False) -> list[PathSummary]:
        """Run ``jobs`` (``only_new``: not at all when every point is already stored)."""
        done = store.keys()
        tasks = [plan_path(exp, j, store, done) for j in jobs]
        if not tasks or (only_new and all(p[3] for t in tasks for p in t.points)):
            return []
        if on_stage:
            on_stage(label, sum(len(j.C_values) for j in jobs))
        return driver.run(tasks)

    def certify() -> list[PathSummary]:
        out: list[PathSummary] = []
        for _ in range(MAX_CERTIFY_ROUNDS):  # a continued fit can move the selection
            tasks = certify_tasks(exp, store, current_records(exp, store.load()))
            if not tasks:
                break
            if on_stage:
                on_stage("certify", len(tasks))
            out += driver.run(tasks)
        return out

    def stage(rows, init, label) -> list[PathSummary]:
        out = execute(base_jobs(exp, rows, init), label)
        for _ in range(exp.extend):
            ext = _extension_jobs(exp, current_records(exp, store.load()), decided, rows, init)
            if not ext:
                break
            out += execute(ext, "extend")
        return out

    results = stage(first, {}, "grid")
    results += certify()
    init: dict[tuple, float] = {}
    if dependent:
        # TPAMI §6.2: top-k Ent_tr starts from the selected (and certified) LR^Multi solution
        init = ent_tr_init_Cs(exp, current_records(exp, store.load()), lr, dependent)
        results += stage(dependent, init, "grid (Ent_tr from selected LR^Multi)")
    # refits at the selected C values, then their certification; a continued fit can move a
    # selection, so repeat until nothing is left to fit
    for round_ in range(MAX_CERTIFY_ROUNDS):
        recs = current_records(exp, store.load())
        refits = execute(_refit_jobs(exp, recs, init), "refit", only_new=round_ > 0)
        continued = certify()
        results += refits + continued
        if not sum(r.done for r in refits + continued):
            break
    return results
