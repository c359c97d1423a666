"""``topkbench bench protocol``: a whole model-selection protocol as a user runs it (every row,
the full C grid, the folds, the refits and the certify stage), timed end to end.

A protocol is thousands of small fits along warm-started C paths (DESIGN §5, "Cost model"), so
its wall time is decided by per-fit overheads, certificates and the iterations per C, which a
single-fit benchmark does not see.  The report gives wall and CPU time (the driver and its
worker processes), fits per second, the time and solver phases of each row (plain SDCA
epochs, second-order iterations: Newton's, or the active-set finish's rounds; accelerated
epochs), and how many selected models are certified.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


@dataclass
class RowTiming:
    """One (dataset, row) of a protocol run: its fits and what they cost."""

    dataset: str
    row: str
    fits: int
    fit_seconds: float  # sum of the fits' training times
    plain_epochs: int
    newton_iterations: int  # Newton iterations and active-set rounds
    accelerated_epochs: int
    budget_stops: int  # fits stopped on their budget (before the certify stage)
    max_fit_seconds: float
    plan: str = ""  # the solver phases a fit of this row may go through (solvers/plan.py)


@dataclass
class ProtocolTiming:
    experiment: str
    datasets: tuple[str, ...]
    n_jobs: int
    wall_seconds: float
    cpu_seconds: float  # user + system, the driver and its (finished) worker processes
    fits: int
    selected: int
    certified: int
    rows: list[RowTiming] = field(default_factory=list)

    @property
    def fits_per_second(self) -> float:
        return self.fits / self.wall_seconds if self.wall_seconds > 0 else float("nan")


def row_plan(record, eps: float) -> str:
    """The solver plan of a row's fits, from one of its records (method, gamma, shapes,
    kernel): :func:`topkbench.solvers.plan.plan` for the SDCA methods."""
    from topkbench.experiments.plan import ACCELERATE
    from topkbench.losses.registry import get_method
    from topkbench.solvers.plan import describe, plan

    spec = get_method(record["method"])
    if spec.solver != "sdca" or str(record.get("fw") or "nan") not in ("nan", "None"):
        return {"lbfgs": "L-BFGS or gradient descent from LR^Multi"}.get(spec.solver, spec.solver)
    kind = "gram" if str(record.get("kernel")) == "rbf" else "features"
    phases = plan(kind, int(record["n_features"]), int(record["n_classes"]), spec.loss_id,
                  float(record["gamma"]), ACCELERATE, eps, n=int(record["n_train"]))  # fmt: skip
    return describe(phases)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def bench_protocol(exp, out_dir, progress=None, on_stage=None,
                   on_fit=None) -> tuple[ProtocolTiming, str]:  # fmt: skip
    """Run the sweep of ``exp`` into a fresh results directory under ``out_dir`` and time it;
    returns the timings and the report (Markdown).  ``progress``, ``on_stage`` and ``on_fit``
    are the timed sweep's callbacks (:func:`topkbench.experiments.sweep.run_sweep`).

    An untimed spin-up sweep of the first C value first compiles the kernels into numba's
    disk cache (a user's first run pays that once); the timed run then starts its worker
    processes and loads the kernels as every later ``topkbench sweep`` does.
    """
    import shutil
    from dataclasses import replace
    from pathlib import Path

    from topkbench.experiments.report import build_report
    from topkbench.experiments.store import RecordStore
    from topkbench.experiments.sweep import run_sweep

    scratch = Path(out_dir) / f"{exp.name}-spinup"
    shutil.rmtree(scratch, ignore_errors=True)
    run_sweep(replace(exp, C_values=exp.C_values[:1], extend=0, results_dir=str(scratch)))
    shutil.rmtree(scratch, ignore_errors=True)
    results = Path(out_dir) / f"{exp.name}-protocol"
    shutil.rmtree(results, ignore_errors=True)
    timed = replace(exp, results_dir=str(results))
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    run_sweep(timed, progress, on_stage, on_fit)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    store = RecordStore(timed.results_dir, timed.name)
    try:
        recs = store.load()
    finally:
        store.close()
    report = build_report(timed)
    sel = report.selected
    timing = ProtocolTiming(
        experiment=exp.name, datasets=tuple(d.name for d in exp.datasets), n_jobs=exp.n_jobs,
        wall_seconds=wall, cpu_seconds=cpu, fits=len(recs), selected=len(sel),
        certified=int((sel["status"] == "converged").sum()) if len(sel) else 0,
    )  # fmt: skip
    for col in ("newton_iterations", "accelerated_epochs", "plain_epochs"):
        if col not in recs:
            recs[col] = 0
    groups = dict(list(recs.groupby(["dataset", "row"], sort=False)))
    order = [(d.name, r) for d in exp.datasets for r in dict.fromkeys(r.row for r in exp.rows)]
    order += [key for key in groups if key not in order]  # rows that expand to variants
    for ds, row in order:
        if (ds, row) not in groups:
            continue
        g = groups[(ds, row)]
        timing.rows.append(
            RowTiming(
                dataset=str(ds), row=str(row), fits=len(g),
                fit_seconds=float(g["train_seconds"].sum()),
                plain_epochs=int(g["plain_epochs"].fillna(0).sum()),
                newton_iterations=int(g["newton_iterations"].fillna(0).sum()),
                accelerated_epochs=int(g["accelerated_epochs"].fillna(0).sum()),
                budget_stops=int((g["status"] != "converged").sum()),
                max_fit_seconds=float(g["train_seconds"].max()),
                plan=row_plan(g.iloc[0], exp.eps),
            )
        )  # fmt: skip
    return timing, report.markdown
