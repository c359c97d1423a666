"""``topkbench bench table5``: the Table 5 protocol with and without warm starts along the C
paths, on a Letter-shaped synthetic set (wall time, fits, epochs)."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Table5BenchRow:
    mode: str  # "warm" or "cold"
    wall_seconds: float
    fit_seconds: float  # sum of per-fit training times (all processes)
    fits: int
    epochs: int
    not_converged: int
    n_jobs: int


def bench_table5(exp_warm, out_dir, progress=None) -> tuple[list[Table5BenchRow], str]:
    """Run the Table 5 protocol of ``exp_warm`` twice, with and without warm starts along the
    C paths, each into a fresh results directory; returns timings and the warm run's report.

    The experiment comes from the caller (``topkbench bench table5`` composes table5 with the
    Letter-shaped synthetic dataset); the selection stages, grid extension and refits run as in
    ``topkbench sweep``.
    """
    import shutil
    from dataclasses import replace
    from pathlib import Path

    from topkbench.experiments.report import build_report
    from topkbench.experiments.store import read_records
    from topkbench.experiments.sweep import run_sweep

    # untimed: start the worker processes and load the compiled kernels in them
    scratch = Path(out_dir) / "table5-spinup"
    shutil.rmtree(scratch, ignore_errors=True)
    run_sweep(replace(exp_warm, C_values=exp_warm.C_values[:1], extend=0, results_dir=str(scratch)))
    shutil.rmtree(scratch, ignore_errors=True)
    rows, report = [], ""
    for mode in ("warm", "cold"):
        results = Path(out_dir) / f"table5-{mode}"
        shutil.rmtree(results, ignore_errors=True)
        exp = replace(exp_warm, results_dir=str(results), warm_start=mode == "warm")
        t0 = time.perf_counter()
        run_sweep(exp, progress)
        wall = time.perf_counter() - t0
        recs = read_records(exp.results_dir, exp.name)[0]
        rows.append(
            Table5BenchRow(
                mode=mode,
                wall_seconds=wall,
                fit_seconds=float(recs["train_seconds"].sum()),
                fits=len(recs),
                epochs=int(recs["epochs"].sum()),
                not_converged=int((recs["status"] != "converged").sum()),
                n_jobs=exp.n_jobs,
            )
        )
        if mode == "warm":
            report = build_report(exp).markdown
    return rows, report
