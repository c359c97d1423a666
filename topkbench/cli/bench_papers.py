"""``topkbench bench projections | bipartite | kato-fig2 | kato-fig3 | kato-fig4 | table5``: the
papers' timing figures and tables, and the cost of a table's protocol."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from topkbench.cli.app import (
    OUT_OPT,
    SEED_OPT,
    TIMED_AFRESH,
    TOPK_OPT,
    bench_app,
    compose,
    handle_errors,
    log,
    setup_logging,
)


@bench_app.command(
    "projections",
    help=(
        "TPAMI Fig. 3a: seconds per 1,000 projections of N(0,1) vectors onto the simplex "
        "(Kiwiel's variable fixing), the top-k simplex Delta_k^alpha (k = 1, 5, 10), "
        "Delta_k^beta, D_k (printed alpha), the top-k entropic prox and the weighted top-k "
        "hinge's permutahedron projection (exp weights, k = 5), d = 10 ... 10^6; the fitted "
        "scaling exponent over 10^3 <= d <= 10^6 (1 = linear); CSV + PNG."
    ),
)
@handle_errors
def bench_projections_cmd(
    dims: list[int] = typer.Option(
        None, "--dim", help="dimension d (repeatable; default 10, 10^2, ..., 10^6)"
    ),
    problems: int = typer.Option(1000, help="projections per dimension and set"),
    methods: list[str] = typer.Option(
        None, "--method", help="set to time (repeatable; default all, see the CSV's names)"
    ),
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.projections import (
        PROJECTION_METHODS,
        bench_projections,
        plot_projections,
        scaling_exponent,
    )

    def progress(d, done, total):
        sys.stderr.write(f"\rd = {d}: {done}/{total} problems")
        if done == total:
            sys.stderr.write("\n")

    rows = bench_projections(
        dims=tuple(dims) if dims else (10, 100, 10**3, 10**4, 10**5, 10**6),
        problems=problems, methods=tuple(methods or PROJECTION_METHODS), seed=seed,
        progress=progress,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(r) for r in rows]).to_csv(out / "projections.csv", index=False)
    plot_projections(rows, out / "projections.png")
    ds = sorted({r.d for r in rows})
    expo = scaling_exponent(rows)
    t = Table("set", *[f"d={d:.0e}" for d in ds], "exponent 1e3..1e6",
              title=f"seconds per 1,000 projections ({problems} timed per cell)")  # fmt: skip
    for name in dict.fromkeys(r.method for r in rows):
        cells = {r.d: f"{r.seconds_per_1000:.3g}" for r in rows if r.method == name}
        t.add_row(name, *[cells.get(d, "-") for d in ds], f"{expo[name]:.2f}")
    Console(width=max(100, 22 + 11 * len(ds))).print(t)
    sys.stderr.write(f"written: {out / 'projections.csv'}, {out / 'projections.png'}\n")


@bench_app.command(
    "bipartite",
    help=(
        "TPAMI Table 2: seconds for 1,000 projections onto the bipartite simplex B(10) with "
        "m = n = d/2 and N(0,1) data, variable fixing (TPAMI §5.3) vs sorting, beside the "
        "paper's figures."
    ),
)
@handle_errors
def bench_bipartite_cmd(
    dims: list[int] = typer.Option(
        None, "--dim", help="dimension d (repeatable; default 10^3, 10^4, 10^5, 10^6)"
    ),
    problems: int = typer.Option(1000, help="projections per dimension"),
    rho: float = typer.Option(10.0, help="radius of B(rho)"),
    seed: int = SEED_OPT,
    out: Path = typer.Option(Path("results/bench/bipartite.csv"), help="CSV output"),
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.bipartite import bench_bipartite

    def progress(d, done, total) -> None:
        if done == total or done % 100 == 0:
            log.info("d = %d: %d / %d projections", d, done, total)

    rows = bench_bipartite(
        dims=tuple(dims) if dims else (10**3, 10**4, 10**5, 10**6),
        problems=problems, rho=rho, seed=seed, progress=progress,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(r) for r in rows]).to_csv(out, index=False)
    t = Table(
        "d", "sorting s", "var. fixing s", "factor", "paper sorting s", "paper v.f. s",
        "paper factor", "max |dt|",
    )  # fmt: skip
    for r in rows:
        t.add_row(
            f"{r.d:.0e}", f"{r.sorting_seconds:.3f}", f"{r.variable_fixing_seconds:.3f}",
            f"{r.improvement:.2f}", f"{r.paper_sorting_seconds:g}",
            f"{r.paper_variable_fixing_seconds:g}", f"{r.paper_improvement:.2f}",
            f"{r.max_threshold_difference:.1e}",
        )  # fmt: skip
    Console().print(t)
    sys.stderr.write(f"written: {out}\n")


_STUDY_OVERRIDES_HELP = "Hydra overrides selecting a dataset (its train split), e.g. dataset=news20"


# options shared by the Kato studies (typer reads these defaults; they are never mutated)
_N_OPT = typer.Option(1000, help="synthetic problem: examples (FMD-sized by default)")


_D_OPT = typer.Option(256, help="synthetic problem: features")


_M_OPT = typer.Option(10, help="synthetic problem: classes")


_C_OPT = typer.Option(1.0, help="C = 1/(lambda n); Kato uses lambda = 1/n, i.e. C = 1")


_FW_ITERS_OPT = typer.Option(300, help="Frank-Wolfe iterations per run (Kato: 1,000)")


_TARGET_OPT = typer.Option(1e-3, help="absolute gap the summary times (Kato: 1e-3)")


def _study_problem(overrides, n: int, d: int, m: int, seed: int):
    """The train split of the dataset the overrides select (dense), or the seeded Gaussian
    problem (``bench.make_gaussian_problem``); with its display name."""
    from topkbench.bench.common import make_gaussian_problem

    if overrides:
        from topkbench.config import TrainConfig
        from topkbench.data.dataset import load_dataset

        cfg = TrainConfig.from_dict(compose(list(overrides), "train"))
        ds = load_dataset(cfg.dataset, cfg.seed)
        X, y = ds.splits["train"]
        return (X.toarray() if hasattr(X, "toarray") else X), y, ds.name
    X, y = make_gaussian_problem(n, d, m, seed)
    return X, y, f"gaussian n={n} d={d} m={m}"


@bench_app.command(
    "kato-fig2",
    help=(
        "Kato & Hirohashi Fig. 2: duality gap measured with the printed top-k hinge primal vs "
        "CPU time for the pseudo-alpha SDCA (the authors' code), our printed-alpha SDCA, our "
        "weighted top-k SDCA (flat weights, the same loss) and Frank-Wolfe (standard / away / "
        "pairwise) at k = 3, lambda = 1/n; CSV + PNG."
    ),
)
@handle_errors
def bench_kato_fig2_cmd(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides selecting a dataset (its train split), e.g. dataset=letter"
    ),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = TOPK_OPT,
    C: float = _C_OPT,
    iters: int = typer.Option(300, help="SDCA epochs / Frank-Wolfe iterations per solver"),
    budget: float = typer.Option(2.0, help="CPU seconds at which the summary reads each gap"),
    target: float = typer.Option(
        1e-6, help="relative gap (P - D) / P the summary times each solver to"
    ),
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.kato import kato_fig2, plot_kato_fig2

    X, y, name = _study_problem(overrides, n, d, m, seed)
    points = kato_fig2(X, y, k=k, C=C, iters=iters, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(p) for p in points]).to_csv(out / "kato_fig2.csv", index=False)
    plot_kato_fig2(points, out / "kato_fig2.png", f"{name}, k = {k}, C = {C:g}")
    t = Table("solver", f"best gap within {budget:g} s CPU", f"CPU s to rel. gap {target:g}",
              "final gap", "final rel. gap", "iterations", "CPU s")  # fmt: skip
    for solver in dict.fromkeys(p.solver for p in points):
        pts = [p for p in points if p.solver == solver]
        best = min(p.gap for p in pts if p.seconds <= budget)
        hit = next((p for p in pts if p.gap <= target * abs(p.primal_printed)), None)
        t.add_row(
            solver, f"{best:.3e}", "not reached" if hit is None else f"{hit.seconds:.3f}",
            f"{pts[-1].gap:.3e}", f"{pts[-1].gap / abs(pts[-1].primal_printed):.3e}",
            str(pts[-1].iteration), f"{pts[-1].seconds:.2f}",
        )  # fmt: skip
    Console().print(t)
    sys.stderr.write(f"written: {out / 'kato_fig2.csv'}, {out / 'kato_fig2.png'}\n")


def _fw_study_output(points, out: Path, stem: str, title: str, target: float) -> None:
    """CSV + PNG of a Frank-Wolfe study and its summary table."""
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.kato import fw_study_summary, plot_fw_study

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(p) for p in points]).to_csv(out / f"{stem}.csv", index=False)
    plot_fw_study(points, out / f"{stem}.png", title)
    t = Table(
        "panel", "run", f"iters to {target:g}", "s to it", "final gap", "rel. gap", "iters", "s",
        title=f"first iterate with gap P - D <= {target:g}, and the last one",
    )  # fmt: skip
    for r in fw_study_summary(points, target):
        hit = r["iterations_to_target"] is not None
        t.add_row(
            r["panel"], r["label"], str(r["iterations_to_target"]) if hit else "not reached",
            f"{r['seconds_to_target']:.2f}" if hit else "", f"{r['final_gap']:.3e}",
            f"{r['final_relative_gap']:.3e}", str(r["iterations"]), f"{r['seconds']:.2f}",
        )  # fmt: skip
    Console().print(t)
    sys.stderr.write(f"written: {out / (stem + '.csv')}, {out / (stem + '.png')}\n")


@bench_app.command(
    "kato-fig3",
    help=(
        "Kato & Hirohashi Fig. 3: duality gap vs iterations of the smoothed top-k hinge (Kato "
        "eq. (25), flat weights) for each smoothing gamma (default 0, 1e-3, 1e-2, 1e-1), by "
        "standard, away-step and pairwise Frank-Wolfe and by our SDCA (panel d); k = 3, "
        "lambda = 1/n; CSV + PNG."
    ),
)
@handle_errors
def bench_kato_fig3_cmd(
    overrides: list[str] = typer.Argument(None, help=_STUDY_OVERRIDES_HELP),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = TOPK_OPT,
    C: float = _C_OPT,
    gammas: list[float] = typer.Option(
        None, "--gamma", help="smoothing gamma (repeatable; default 0, 1e-3, 1e-2, 1e-1)"
    ),
    iters: int = _FW_ITERS_OPT,
    target: float = _TARGET_OPT,
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from topkbench.bench.kato import KATO_FIG3_GAMMAS, kato_fig3
    from topkbench.validation import check_positive

    for g in gammas or ():
        check_positive("--gamma", g, allow_zero=True)
    check_positive("C", C)
    X, y, name = _study_problem(overrides, n, d, m, seed)
    points = kato_fig3(X, y, k=k, C=C, iters=iters, gammas=tuple(gammas or KATO_FIG3_GAMMAS))
    _fw_study_output(points, out, "kato_fig3", f"{name}, k = {k}, C = {C:g}", target)


@bench_app.command(
    "kato-fig4",
    help=(
        "Kato & Hirohashi Fig. 4: duality gap vs iterations of the weighted top-k hinge with "
        "flat, linear and exp weights (Kato eq. (8), §7.3) by one Frank-Wolfe variant and by "
        "our SDCA; k = 3, lambda = 1/n; CSV + PNG."
    ),
)
@handle_errors
def bench_kato_fig4_cmd(
    overrides: list[str] = typer.Argument(None, help=_STUDY_OVERRIDES_HELP),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = TOPK_OPT,
    C: float = _C_OPT,
    fw: str = typer.Option("standard", help="Frank-Wolfe variant: standard, away or pairwise"),
    iters: int = _FW_ITERS_OPT,
    target: float = _TARGET_OPT,
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from topkbench.bench.kato import FW_PANELS, kato_fig4
    from topkbench.errors import ConfigError
    from topkbench.validation import check_positive

    if fw not in FW_PANELS:
        raise ConfigError(f"--fw must be one of {', '.join(FW_PANELS)}; got {fw!r}")
    check_positive("C", C)
    X, y, name = _study_problem(overrides, n, d, m, seed)
    points = kato_fig4(X, y, k=k, C=C, iters=iters, variant=fw)
    _fw_study_output(points, out, "kato_fig4", f"{name}, k = {k}, C = {C:g}", target)


def _sweep_overrides(overrides: list[str] | None, n_jobs: int) -> list[str]:
    """The overrides of a protocol benchmark with the ``--n-jobs`` option's ``n_jobs=``; an
    ``n_jobs=`` among them is refused in favour of the option (one of the two would be
    dropped), and so is a ``results_dir=`` (a benchmark sweeps into fresh directories under
    its ``--out``)."""
    from topkbench.errors import ConfigError

    given = list(overrides or [])
    keys = {o.lstrip("+~").split("=", 1)[0] for o in given}
    if "n_jobs" in keys:
        raise ConfigError(
            "the worker processes of a benchmark are its --n-jobs option, not an n_jobs= "
            "override", hint="e.g. --n-jobs 2",
        )  # fmt: skip
    if "results_dir" in keys:
        raise ConfigError(
            "a benchmark sweeps into fresh directories under its --out option, not a "
            "results_dir= override", hint="e.g. --out results/bench",
        )  # fmt: skip
    return [*given, f"n_jobs={n_jobs}"]


@bench_app.command(
    "table5",
    help=(
        "Wall time of the full Table 5 protocol (17 rows, C grid with extension, selection on "
        "val) on the Letter-shaped synthetic set, with and without warm starts along C."
    ),
)
@handle_errors(interrupted=TIMED_AFRESH)
def bench_table5_cmd(
    overrides: list[str] = typer.Argument(
        None,
        help="Hydra overrides of the experiment (e.g. experiment.eps=0.01 "
        "experiment.C_grid.step=1.0); the dataset is letter_synth",
    ),
    n_jobs: int = typer.Option(2, help="worker processes"),
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.table5 import bench_table5
    from topkbench.config import ExperimentConfig

    base = ["experiment=table5", "experiment.datasets=[letter_synth]"]
    exp = ExperimentConfig.from_dict(compose(base + _sweep_overrides(overrides, n_jobs), "sweep"))
    done = {"n": 0}

    def on_done(s) -> None:
        done["n"] += s.done
        log.info("%s %s %s: %d fits in %.1f s", s.dataset, s.row, s.fold, s.done, s.seconds)

    rows, report = bench_table5(exp, out, on_done)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(r) for r in rows]).to_csv(out / "table5.csv", index=False)
    (out / "table5_letter_synth.md").write_text(report)
    t = Table("C path", "wall s", "sum of fit s", "fits", "epochs", "budget stops", "n_jobs")
    for r in rows:
        t.add_row(
            r.mode,
            f"{r.wall_seconds:.1f}",
            f"{r.fit_seconds:.1f}",
            str(r.fits),
            str(r.epochs),
            str(r.not_converged),
            str(r.n_jobs),
        )
    Console().print(t)
    warm, cold = rows
    typer.echo(
        f"warm starts save {100 * (1 - warm.wall_seconds / cold.wall_seconds):.0f}% wall time, "
        f"{100 * (1 - warm.epochs / max(cold.epochs, 1)):.0f}% of the epochs"
    )
    sys.stderr.write(f"written: {out / 'table5.csv'}, {out / 'table5_letter_synth.md'}\n")


@bench_app.command(
    "protocol",
    help=(
        "Time a whole model-selection protocol as `topkbench sweep` runs it (every row, the "
        "full C grid, folds, refits, certify stage) into a fresh results directory: wall and "
        "CPU time, fits per second, time and solver phases per row (plain SDCA epochs, Newton "
        "iterations, accelerated epochs), selected models certified. Example: bench protocol "
        "experiment=table7 'experiment.datasets=[emotions,scene]' --linear"
    ),
)
@handle_errors(interrupted=TIMED_AFRESH)
def bench_protocol_cmd(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides, as for `topkbench sweep`; experiment=NAME is required"
    ),
    linear: bool = typer.Option(
        False, "--linear", help="only the linear rows (drop the experiment's RBF rows)"
    ),
    row: list[str] = typer.Option(
        None, "--row", help="only these rows, by their table name (repeatable)"
    ),
    n_jobs: int = typer.Option(2, help="worker processes"),
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    import json
    from dataclasses import asdict, replace

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.atomic import write_outputs, write_text
    from topkbench.bench.protocol import bench_protocol
    from topkbench.cli.experiments import _available_datasets, sweep_progress
    from topkbench.config import ExperimentConfig
    from topkbench.errors import ConfigError

    exp = ExperimentConfig.from_dict(compose(_sweep_overrides(overrides, n_jobs), "sweep"))
    rows = tuple(r for r in exp.rows if not (linear and r.kernel == "rbf"))
    if row:
        unknown = sorted(set(row) - {r.row for r in rows})
        if unknown:
            raise ConfigError(
                f"unknown row(s) {', '.join(unknown)}; available: " + ", ".join(r.row for r in rows)
            )
        rows = tuple(r for r in rows if r.row in row)
    if not rows:
        raise ConfigError(f"experiment {exp.name} has no row left to run")
    exp = _available_datasets(replace(exp, rows=rows), skip_missing=False)
    counts = {"done": 0, "cached": 0, "failed": 0, "skipped": 0, "not_converged": 0}
    with sweep_progress(f"{exp.name} (timed)", counts) as (on_done, on_stage, on_fit):
        timing, report = bench_protocol(exp, out, on_done, on_stage, on_fit)
    stem = out / f"protocol_{exp.name}"
    summary = {k: v for k, v in asdict(timing).items() if k != "rows"}
    summary["fits_per_second"] = timing.fits_per_second
    frame = pd.DataFrame([asdict(r) for r in timing.rows])
    lost = f"the timings: {timing.wall_seconds:.1f} s wall, {timing.cpu_seconds:.1f} CPU-s"
    write_outputs([
        (Path(f"{stem}.csv"), lambda tmp: frame.to_csv(tmp, index=False)),
        (Path(f"{stem}.json"), write_text(json.dumps(summary, indent=2) + "\n")),
        (Path(f"{stem}.md"), write_text(report)),
    ], lost=lost)  # fmt: skip
    title = f"{exp.name} on {', '.join(timing.datasets)}, n_jobs = {timing.n_jobs}"
    t = Table("dataset", "row", "fits", "fit s", "max fit s", "plain epochs", "2nd-order its",
              "accel. epochs", "budget stops", title=title)  # fmt: skip
    for r in timing.rows:
        t.add_row(r.dataset, r.row, str(r.fits), f"{r.fit_seconds:.1f}",
                  f"{r.max_fit_seconds:.2f}", str(r.plain_epochs), str(r.newton_iterations),
                  str(r.accelerated_epochs), str(r.budget_stops))  # fmt: skip
    Console().print(t)
    for r in timing.rows:
        typer.echo(f"plan of {r.dataset} {r.row}: {r.plan}")
    typer.echo(
        f"wall {timing.wall_seconds:.1f} s, CPU {timing.cpu_seconds:.1f} s, {timing.fits} fits "
        f"({timing.fits_per_second:.1f} per second); selected models certified: "
        f"{timing.certified} of {timing.selected}"
    )
    sys.stderr.write(f"written: {stem}.csv, {stem}.json, {stem}.md\n")
