"""``topkbench bench sdca | conditioning | scale | peers | torch``: the solver's speed, on its
own and against its peers, and the PyTorch losses' against cross-entropy."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import typer

from topkbench.cli.app import (
    BENCH_D_OPT,
    BENCH_M_OPT,
    METHOD_SPEC_HELP,
    OUT_OPT,
    SEED_OPT,
    bench_app,
    check_data_files,
    compose,
    handle_errors,
    log,
    setup_logging,
)


@bench_app.command(
    "sdca",
    help="Seconds per SDCA epoch, GFLOP/s and the multiple of the 4 nnz m flop bound at the "
    "measured single-core peak (dgemm), and seconds per duality-gap certificate; then (TPAMI "
    "Fig. 3b/3c, gaussian shape) every method run to relative gap --eps: epochs and wall "
    "time, relative gap and validation top-1 against time (PNG).  --shape aloi (dense, "
    "d = 128, m = 1,000) and --shape delicious (binary CSR multilabel, 11,628 x 500, "
    "m = 983) time the large label spaces of TPAMI Tables 5 and 7.",
)
@handle_errors
def bench_sdca_cmd(
    shape: str = typer.Option(
        "gaussian",
        help="problem: gaussian (n 20,000, d 128, m 100), aloi (20,000 x 128, m 1,000; top-k "
        "and multiclass losses) or delicious (11,628 x 500 CSR, m 983; multilabel losses)",
    ),
    dataset: str = typer.Option(
        None,
        help="time a registered dataset's real training split instead of a shape (e.g. "
        "delicious, letter, caltech101_silhouettes; files found as by `topkbench data list`)",
        show_default=False,
    ),
    n: int = typer.Option(None, help="examples (default: the shape's)", show_default=False),
    d: int = typer.Option(None, help="features (default: the shape's)", show_default=False),
    m: int = typer.Option(None, help="classes (default: the shape's)", show_default=False),
    epochs: int = typer.Option(5, help="epochs timed per method (median reported)"),
    C: float = typer.Option(1.0, help="C = 1/(lambda n) of the epoch timing"),
    seed: int = SEED_OPT,
    method: list[str] = typer.Option(
        None,
        "--method",
        help=f"{METHOD_SPEC_HELP} (default: the shape's; for gaussian every multiclass SDCA "
        "loss, top-k ones at k = 5)",
    ),
    float32: bool = typer.Option(
        False,
        "--float32",
        help="store the timing problem's features as float32 (a dataset's float32: true): the "
        "epochs' passes over W then run in float32, the certificates stay float64",
    ),
    converge: bool = typer.Option(
        None,
        "--converge/--no-converge",
        help="also run the time-to-eps study (Fig. 3b/3c; the gaussian shape only, where it "
        "is the default)",
        show_default=False,
    ),
    eps: float = typer.Option(1e-3, help="relative duality gap of the time-to-eps study"),
    conv_C: float = typer.Option(0.1, "--conv-C", help="C of the time-to-eps study"),
    separation: float = typer.Option(
        0.5, help="class-mean scale of the study's problem (1 = the timing problem)"
    ),
    max_epochs: int = typer.Option(200, help="epoch budget per method of the study"),
    time_limit: float = typer.Option(120.0, help="seconds budget per method of the study"),
    out: Path = typer.Option(
        Path("results/bench/sdca.csv"),
        help="CSV output; the study writes sdca_convergence.csv, sdca_curves.csv and "
        "sdca_convergence.png beside it",
    ),
) -> None:
    import pandas as pd
    from rich.console import Console

    from topkbench.bench.common import check_sdca_problem, parse_method_spec
    from topkbench.bench.sdca import (
        bench_sdca,
        bench_sdca_convergence,
        plot_sdca_convergence,
        shape_size,
    )
    from topkbench.errors import ConfigError

    real = None
    if dataset is not None:
        from topkbench.config import DatasetConfig

        if n is not None or d is not None or m is not None:
            raise ConfigError("bench sdca: --dataset times the dataset's own n, d and m; drop "
                              "--n, --d and --m")  # fmt: skip
        real = DatasetConfig.from_dict(compose([f"dataset={dataset}"])["dataset"])
        check_data_files(real)
        shape = dataset
        converge = bool(converge)
    else:
        n, d, m = shape_size(shape, n, d, m)
    if converge is None:
        converge = shape == "gaussian"
    elif converge and shape != "gaussian":
        raise ConfigError(
            f"bench sdca: the time-to-eps study (--converge) runs on the gaussian shape only; "
            f"drop --converge for --shape {shape}"
        )
    if converge:  # refuse the study's parameters before the (long) timing part
        check_sdca_problem(n, d, m, conv_C, eps)
    methods = tuple(parse_method_spec(x) for x in method) if method else None
    rows = bench_sdca(n=n, d=d, m=m, epochs=epochs, C=C, seed=seed, methods=methods, shape=shape,
                      float32=float32, dataset=real)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([r.__dict__ for r in rows]).to_csv(out, index=False)
    console = Console()
    console.print(_sdca_epochs_table(rows, shape, C, float32))
    written = [out]
    if converge:
        conv, curves = bench_sdca_convergence(
            n=n, d=d, m=m, methods=methods, C=conv_C, eps=eps, max_epochs=max_epochs,
            time_limit=time_limit, separation=separation, seed=seed,
            progress=lambda msg: sys.stderr.write(f"\r{msg}    "),
        )  # fmt: skip
        sys.stderr.write("\n")
        paths = [out.with_name(f"sdca_{x}") for x in ("convergence.csv", "curves.csv")]
        pd.DataFrame([r.__dict__ for r in conv]).to_csv(paths[0], index=False)
        pd.DataFrame([p.__dict__ for p in curves]).to_csv(paths[1], index=False)
        png = out.with_name("sdca_convergence.png")
        title = f"n={n}, d={d}, m={m}, C={conv_C:g}, separation {separation:g}"
        plot_sdca_convergence(curves, eps, png, title)
        written += [*paths, png]
        console.print(_sdca_convergence_table(conv, eps, conv_C, separation))
    sys.stderr.write("written: " + ", ".join(str(x) for x in written) + "\n")


def _method_table(title: str, columns: tuple[str, ...], rows, cells):
    """A rich table with a line per timed method: its label, then ``cells(row)``."""
    from rich.table import Table

    from topkbench.bench.common import method_label

    t = Table("method", *columns, title=title)
    for r in rows:
        t.add_row(method_label(r.method, r.gamma, r.k), *cells(r))
    return t


def _sdca_epochs_table(rows, shape: str, C: float, float32: bool):
    """The epoch timings of ``bench sdca``."""
    title = (
        f"SDCA epochs ({shape}, {rows[0].nnz / rows[0].n:.1f} nonzeros a row"
        f"{', float32 features' if float32 else ''}), C = {C:g}; "
        f"s/epoch the median (the CSV has the minimum too); bound = 4 nnz m flops at the "
        f"measured peak "
        f"{rows[0].peak_gflops:.1f} GFLOP/s (1-thread dgemm; the highest of one measurement "
        f"before each loss, which ranged {min(r.peak_gflops_here for r in rows):.1f}-"
        f"{max(r.peak_gflops_here for r in rows):.1f}); s/cert. the duality-gap certificate "
        f"after an epoch (with W = X^T A's resynchronization)"
    )
    columns = ("n x d x m", "s/epoch", "GFLOP/s", "x bound", "s/cert.", "gap after", "passes")
    return _method_table(title, columns, rows, lambda r: (
        f"{r.n}x{r.d}x{r.m}", f"{r.sec_per_epoch:.4f}", f"{r.gflops:.2f}",
        f"{r.times_bound:.1f}", f"{r.sec_per_certificate:.4f}", f"{r.gap_after:.3g}",
        r.precision))  # fmt: skip


def _sdca_convergence_table(conv, eps: float, C: float, separation: float):
    """The time-to-eps study of ``bench sdca``."""
    title = f"time to relative gap {eps:g} (C = {C:g}, separation {separation:g})"
    columns = ("status", "epochs", "seconds", "rel. gap", "val top-1 %")
    return _method_table(title, columns, conv, lambda r: (
        r.status, str(r.epochs), f"{r.seconds:.2f}", f"{r.relative_gap:.2g}",
        f"{100 * r.val_top1:.1f}"))  # fmt: skip


@bench_app.command(
    "conditioning",
    help="Ill-conditioned features (column scales 1e-2..1e2, ||x||^2 up to ~1e5; small and "
    "large n, multiclass and multilabel): for each SDCA loss and C, seconds and epochs to "
    "relative gap --eps from a cold start, plain SDCA against accelerate=auto (the phases of "
    "topkbench/solvers/plan.py: Newton in the primal at small d*m, Newton-CG for the logistic "
    "losses and Woodbury steps for the hinges above it, accelerated SDCA otherwise). "
    "Writes a CSV, a per-method speed-up summary CSV and a PNG of time against C.",
)
@handle_errors
def bench_conditioning_cmd(
    problem: list[str] = typer.Option(
        None, "--problem", help="multiclass-400 | multilabel-400 | multiclass-10k (default: all)"
    ),
    method: list[str] = typer.Option(
        None, "--method", help=f"{METHOD_SPEC_HELP} (default: every SDCA loss of the task)"
    ),
    log2_C: list[int] = typer.Option(
        None, "--log2-C", help="exponents e of C = 2^e (default: -8 -4 0 4 8)"
    ),
    eps: float = typer.Option(1e-3, help="relative duality gap to reach"),
    time_limit: float = typer.Option(30.0, help="seconds budget per fit"),
    seed: int = SEED_OPT,
    out: Path = typer.Option(
        Path("results/bench/conditioning.csv"),
        help="CSV output; conditioning_summary.csv and conditioning.png go beside it",
    ),
) -> None:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.common import method_label, parse_method_spec
    from topkbench.bench.conditioning import (
        LOG2_C,
        PROBLEMS,
        bench_conditioning,
        plot_conditioning,
        speedup_summary,
    )
    from topkbench.errors import ConfigError

    for name in problem or ():
        if name not in PROBLEMS:
            raise ConfigError(f"unknown problem {name!r}; available: {', '.join(PROBLEMS)}")
    if not 0.0 < eps < 1.0 or time_limit <= 0.0:
        raise ConfigError("--eps must be in (0, 1) and --time-limit > 0")
    methods = tuple(parse_method_spec(x) for x in method) if method else None
    rows = bench_conditioning(
        tuple(problem) if problem else tuple(PROBLEMS), methods,
        tuple(log2_C) if log2_C else LOG2_C, eps=eps, time_limit=time_limit, seed=seed,
        progress=lambda msg: sys.stderr.write(f"\r{msg:<70}"),
    )  # fmt: skip
    sys.stderr.write("\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([r.__dict__ for r in rows]).to_csv(out, index=False)
    summary = speedup_summary(rows)
    summary_path = out.with_name(out.stem + "_summary.csv")
    pd.DataFrame(summary).to_csv(summary_path, index=False)
    png = out.with_suffix(".png")
    plot_conditioning(rows, png, eps, time_limit)
    console = Console()
    t = Table("problem", "method", "C", "plain: epochs / s", "accelerated: epochs / s",
              title=f"cold fits to relative gap {eps:g} (* = stopped on the {time_limit:g} s "
              "limit)")  # fmt: skip
    pairs: dict = {}
    for r in rows:
        pairs.setdefault((r.problem, r.method, r.gamma, r.k, r.C), {})[r.mode] = r
    for (prob, mth, g, k, C), pair in pairs.items():
        cells = [
            f"{x.epochs} / {x.seconds:.2f}{'' if x.status == 'converged' else '*'}"
            + ("" if x.mode == "plain" or x.phase == "plain" else f" ({x.phase})")
            for x in (pair["plain"], pair["accelerated"])
        ]
        t.add_row(prob, method_label(mth, g, k), f"2^{round(math.log2(C))}", *cells)
    console.print(t)
    t = Table("problem", "method", "C where plain needs > 1000 epochs", "median speed-up",
              "unconverged plain / accelerated",
              title="speed-up (plain seconds / accelerated seconds; a lower bound where plain "
              "hit the limit)")  # fmt: skip
    for s in summary:
        t.add_row(s["problem"], method_label(s["method"], s["gamma"], s["k"]), str(s["hard_C"]),
                  f"{s['median_speedup']:.1f}x" if s["hard_C"] else "-",
                  f"{s['plain_unconverged']} / {s['accelerated_unconverged']}")  # fmt: skip
    console.print(t)
    sys.stderr.write(f"written: {out}, {summary_path}, {png}\n")


@bench_app.command(
    "scale",
    help="Memory at scale: write an n x d float32 problem to disk (.npy or "
    "contiguous HDF5), train each method in a fresh process on the memory-mapped file, report "
    "epoch time and the training process's peak resident memory.",
)
@handle_errors
def bench_scale_cmd(
    n: int = typer.Option(1_000_000, help="examples"),
    d: int = BENCH_D_OPT,
    m: int = BENCH_M_OPT,
    epochs: int = typer.Option(3, help="SDCA epochs (each followed by the gap certificate)"),
    C: float = typer.Option(1.0, help="C = 1/(lambda n)"),
    fmt: str = typer.Option("npy", "--format", help="npy or h5 (contiguous HDF5 dataset)"),
    seed: int = SEED_OPT,
    method: list[str] = typer.Option(
        None, "--method", help=f"{METHOD_SPEC_HELP} (default: svm_multi)"
    ),
    data_dir: Path = typer.Option(
        None, help="where to write the features (default: a temporary directory, removed)"
    ),
    out: Path = typer.Option(Path("results/bench/scale.csv"), help="CSV output"),
) -> None:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.common import method_label, parse_method_spec
    from topkbench.bench.scale import bench_scale

    methods = tuple(parse_method_spec(x) for x in method) if method else (("svm_multi", 0.0, 1),)
    rows = bench_scale(
        n, d, m, methods=methods, C=C, epochs=epochs, fmt=fmt, seed=seed, directory=data_dir,
        progress=lambda msg: sys.stderr.write(msg + "\n"),
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([r.__dict__ for r in rows]).to_csv(out, index=False)
    t = Table(
        "method", "n x d x m", "input", "file GB", "s/epoch", "s/epoch + gap", "peak RSS GB",
        "rel. gap",
        title=f"SDCA on memory-mapped float32 features, {epochs} epochs, C = {C:g}",
    )  # fmt: skip
    for r in rows:
        t.add_row(
            method_label(r.method, r.gamma, r.k),
            f"{r.n}x{r.d}x{r.m}",
            f"{r.format} {r.dtype}{' (mmap)' if r.memory_mapped else ''}",
            f"{r.file_gb:.2f}",
            f"{r.kernel_sec_per_epoch:.2f}",
            f"{r.sec_per_epoch:.2f}",
            f"{r.peak_rss_gb:.2f}",
            f"{r.relative_gap:.3g}",
        )
    Console().print(t)
    sys.stderr.write(f"written: {out}\n")


@bench_app.command(
    "peers",
    help=(
        "Wall time (one core) to a primal within --tol relative of the certified optimum, our "
        "SDCA vs scikit-learn on the same problem and C (scikit-learn's C = ours): lr_multi vs "
        "LogisticRegression lbfgs and saga, svm_multi vs LinearSVC crammer_singer (liblinear "
        "-s 4), svm_ova vs LinearSVC hinge (-s 3), lr_ova vs LogisticRegression liblinear dual "
        "(-s 7); scikit-learn refitted at growing budgets. CSV + PNG. Needs scikit-learn."
    ),
)
@handle_errors
def bench_peers_cmd(
    n: int = typer.Option(20_000, help="examples"),
    d: int = typer.Option(128, help="features"),
    m: int = typer.Option(100, help="classes (>= 3)"),
    C: float = typer.Option(0.1, help="C = 1/(lambda n); scikit-learn gets the same C"),
    separation: float = typer.Option(
        0.5, help="class-mean scale (0.5: partly overlapping classes, as in bench sdca's study)"
    ),
    seed: int = SEED_OPT,
    tol: float = typer.Option(1e-3, help="relative suboptimality (P - P*)/|P*| to reach"),
    method: list[str] = typer.Option(
        None, "--method", help="our method, repeatable (default lr_multi svm_multi svm_ova lr_ova)"
    ),
    cert_eps: float = typer.Option(1e-7, help="relative duality gap our reference run aims at"),
    cert_seconds: float = typer.Option(300.0, help="time budget of our reference run"),
    peer_seconds: float = typer.Option(
        300.0, help="a scikit-learn fit is not started after one that took over half of this"
    ),
    out: Path = typer.Option(
        Path("results/bench/peers.csv"), help="CSV output (PNG and trace CSV beside it)"
    ),
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.peers import bench_peers, plot_peers

    rows, points = bench_peers(
        n=n, d=d, m=m, C=C, seed=seed, tol=tol, methods=tuple(method) if method else None,
        separation=separation, cert_eps=cert_eps, cert_seconds=cert_seconds,
        peer_seconds=peer_seconds, progress=log.info,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    trace_csv = out.with_name(out.stem + "_trace.csv")
    png = out.with_suffix(".png")
    pd.DataFrame([asdict(r) for r in rows]).to_csv(out, index=False)
    pd.DataFrame([asdict(p) for p in points]).to_csv(trace_csv, index=False)
    title = f"gaussian n={n} d={d} m={m}, separation {separation:g}, C={C:g}"
    plot_peers(points, png, tol, title + ", one core")
    t = Table(
        "method", "solver", f"s to {tol:g}", "rel. subopt", "ratio to ours", "iterations / budget",
        "fits",
        title=f"{title}: wall time to (P - P*)/|P*| <= {tol:g}",
    )  # fmt: skip
    for r in rows:
        if r.budget_kind == "epochs":
            budget = f"{r.iterations} / {int(r.budget)} epochs"
        elif r.budget_kind == "max_iter":
            budget = f"{r.iterations} / max_iter {int(r.budget)}"
        else:
            budget = f"{r.iterations} / tol {r.budget:.1e}"
        t.add_row(
            r.method, r.solver, f"{r.seconds:.3f}" if r.reached else "not reached",
            f"{r.rel_subopt:.2e}", "-" if math.isnan(r.ratio_to_ours) else f"{r.ratio_to_ours:.2f}",
            budget, str(r.fits),
        )  # fmt: skip
    Console(width=max(120, Console().width)).print(t)
    for r in rows:
        if r.budget_kind != "epochs":
            continue
        typer.echo(
            f"{r.method}: P* = {r.P_ref:.10g}, certified relative gap {r.cert_gap:.1e}; ours "
            f"certifies gap <= {tol:g} after "
            + ("(never)" if math.isnan(r.certified_seconds) else f"{r.certified_seconds:.3f} s")
        )
        if not r.cert_gap <= tol / 10:
            log.warning(
                "%s: P* is certified only to %.1e (> tol/10); raise --cert-seconds",
                r.method, r.cert_gap,
            )  # fmt: skip
    sys.stderr.write(f"written: {out}, {trace_csv}, {png}\n")


@bench_app.command(
    "torch",
    help="Milliseconds of one forward + backward of each PyTorch loss (topkbench.torch, the "
    "torch extra) on a batch of N(0,1) scores, beside "
    "torch.nn.functional.cross_entropy's on the same scores, and their ratio (target: the "
    "top-k hinges and top-k Ent_tr within 3x on the CPU); CSV + Markdown.",
)
@handle_errors
def bench_torch_cmd(
    batch: int = typer.Option(256, help="rows per batch"),
    m: list[int] = typer.Option(None, "--m", help="classes (repeatable; default 100 and 1000)"),
    reps: int = typer.Option(30, help="timed repetitions per case (median reported)"),
    dtype: str = typer.Option("float32", help="the scores' dtype: float32 or float64"),
    device: str = typer.Option("cpu", help="cpu, or cuda where a GPU exists"),
    threads: int = typer.Option(1, help="torch's CPU threads (1: one core, as the other benches)"),
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
) -> None:
    setup_logging(False)
    from dataclasses import asdict

    import pandas as pd

    from topkbench.errors import ConfigError

    try:
        import torch
    except ImportError as exc:
        raise ConfigError("bench torch needs PyTorch: pip install 'topkbench[torch]'") from exc
    from topkbench.bench.torch_losses import bench_torch

    if dtype not in ("float32", "float64"):
        raise ConfigError(f"--dtype must be float32 or float64, got {dtype!r}")
    if batch < 1 or reps < 1 or threads < 1:
        raise ConfigError("--batch, --reps and --threads must be at least 1")
    ms = tuple(m or (100, 1000))
    if min(ms) < 11:
        raise ConfigError(f"--m must be at least 11 (the top-k cases use k = 5), got {min(ms)}")
    if device != "cpu" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: no CUDA device is available here")
    torch.set_num_threads(threads)

    def progress(r):
        log.info("m = %d %s k=%d gamma=%g: %.3f ms (%.1fx cross-entropy)", r.m, r.method, r.k,
                 r.gamma, r.ms, r.ratio)  # fmt: skip

    rows = bench_torch(batch, ms, reps=reps, seed=seed, dtype=dtype, device=device,
                       progress=progress)  # fmt: skip
    df = pd.DataFrame([asdict(r) for r in rows])
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "torch_losses.csv", index=False)
    lines = [f"# PyTorch losses, forward + backward, batch {batch}, {dtype}, {device}, "
             f"{threads} thread(s)", "",
             "| m | method | k | gamma | ms | cross-entropy ms | ratio |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r.m} | {r.method} | {r.k} | {r.gamma:g} | {r.ms:.3f} | "
                     f"{r.cross_entropy_ms:.3f} | {r.ratio:.1f}x |")  # fmt: skip
    (out / "torch_losses.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out / 'torch_losses.csv'}, {out / 'torch_losses.md'}")
