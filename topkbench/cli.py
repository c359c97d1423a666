"""Command-line interface (the only module that imports Typer and Hydra).

Hydra configs in ``conf/`` are composed with the Compose API (``version_base="1.3"``) and
converted to frozen dataclasses (``topkbench.config``) before anything else sees them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import warnings
from functools import wraps
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "topkbench: train and benchmark the top-k / multiclass losses of Lapin, Hein & Schiele "
        "(TPAMI 2017) with certified SDCA solvers, and reproduce the papers' tables.\n\n"
        "Configuration is composed from conf/ with Hydra overrides, e.g.\n\n"
        "  topkbench train method=lr_multi C=0.5 --json\n\n"
        "  topkbench sweep experiment=table3 n_jobs=2 && topkbench report experiment=table3"
    ),
)
bench_app = typer.Typer(help="Benchmarks (print a table and write CSV under results/bench/).")
# the output directory of every benchmark (typer reads the default; it is never mutated)
_OUT_OPT = typer.Option(Path("results/bench"), help="output directory")
# the issue 7 problem shape shared by bench sdca / scale / peers (d x m; n differs)
_BENCH_D_OPT = typer.Option(128, help="features")
_BENCH_M_OPT = typer.Option(100, help="classes")
_METHOD_SPEC_HELP = "name[:gamma[:k]], repeatable"
app.add_typer(bench_app, name="bench")
data_app = typer.Typer(
    no_args_is_help=True,
    help=(
        "Datasets of the registry (conf/dataset/*.yaml). Files live in datasets/<name>/ or "
        "$TOPKBENCH_DATA/<name>/."
    ),
)
app.add_typer(data_app, name="data")

log = logging.getLogger("topkbench")


def _conf_dir() -> Path:
    env = os.environ.get("TOPKBENCH_CONF")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parent.parent / "conf"
    return here


def _setup_logging(verbose: bool = False) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], format="%(message)s"
    )


def _err(message: str, hint: str | None = None, code: int = 2) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    if hint:
        console.print(f"[dim]try:[/] {hint}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _handle_errors(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        from topkbench.errors import TopkbenchError

        try:
            return fn(*args, **kwargs)
        except TopkbenchError as exc:
            _err(str(exc), getattr(exc, "hint", None), exc.exit_code)
        except KeyboardInterrupt:
            _err("interrupted; finished records are kept, re-run the command to resume", code=130)

    return wrapper


def compose(overrides: list[str] | None, command: str | None = None) -> dict[str, Any]:
    """Compose ``conf/config.yaml`` with Hydra overrides into a plain dict.

    Every override either takes effect or is refused: keys that ``command`` would ignore
    (:func:`~topkbench.config.check_override_keys`), unknown keys at any level, and run options
    of the wrong type or range are errors."""
    from topkbench.config import (
        check_config_keys,
        check_dataset_overrides,
        check_override_keys,
        check_run_options,
    )

    if command is not None:
        check_override_keys(command, overrides)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from topkbench.errors import ConfigError

    conf = _conf_dir()
    if not (conf / "config.yaml").exists():
        raise ConfigError(f"config directory {conf} has no config.yaml (set TOPKBENCH_CONF)")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=_upserts(overrides))
        out = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # Hydra/OmegaConf raise many types; all are config errors
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "overrides look like key=value, e.g. C=0.5; see --help"
        if "Could not override" in msg:
            hint = "the configuration does not set that key: add it with +key=value"
        raise ConfigError(f"bad configuration override: {msg}", hint=hint) from None
    exp = out.get("experiment")  # type: ignore[union-attr]
    if isinstance(exp, dict) and exp.get("datasets"):
        exp["datasets"] = [_resolve_dataset(conf, d) for d in exp["datasets"]]
    check_config_keys(out)
    check_dataset_overrides(overrides, out)
    check_run_options(out)
    return out  # type: ignore[return-value]


def _upserts(overrides: list[str] | None) -> list[str]:
    """``experiment.KEY=V`` and ``dataset.KEY=V`` set the key whether or not the chosen YAML
    file mentions it (Hydra's ``++``); unknown keys are then refused by name, with the valid
    ones, by :func:`~topkbench.config.check_config_keys`."""
    out = []
    for item in overrides or ():
        key = item.split("=", 1)[0]
        parts = key.split(".")
        if "=" in item and len(parts) == 2 and parts[0] in ("experiment", "dataset"):
            item = "++" + item
        out.append(item)
    return out


def _resolve_dataset(conf: Path, entry: Any) -> dict[str, Any]:
    """An experiment's dataset entry: a registry name, or ``{base: NAME, <overrides>}``."""
    from topkbench.data.registry import registry_entry

    if isinstance(entry, str):
        return registry_entry(conf, entry).as_dict()
    if isinstance(entry, dict) and entry.get("base"):
        base = registry_entry(conf, str(entry["base"])).as_dict()
        base.update({k: v for k, v in entry.items() if k != "base"})
        return base
    return entry


def _methods_help() -> str:
    from topkbench.losses.registry import METHODS

    return "; ".join(f"{s.name} ({', '.join(('C',) + s.params)})" for s in METHODS.values())


OVERRIDES_HELP = (
    "Hydra overrides key=value: method, C, k, gamma, eps, max_epochs, time_limit, seed, "
    "dataset=circle, dataset.n_train=..."
)


@app.command(help="Train and evaluate one model. Methods: " + _methods_help())
@_handle_errors
def train(
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    _setup_logging(verbose)
    from topkbench.config import TrainConfig
    from topkbench.data.dataset import load_dataset
    from topkbench.errors import ConvergenceWarning
    from topkbench.experiments.evaluation import evaluate_multilabel, training_targets
    from topkbench.losses.registry import get_method
    from topkbench.metrics.topk import topk_accuracy
    from topkbench.model import fit

    cfg = TrainConfig.from_dict(compose(overrides, "train"))
    _check_files(cfg.dataset)
    ds = load_dataset(cfg.dataset, cfg.seed)
    Xtr, ytr = ds.splits["train"]
    ytr = training_targets(ds, "train", cfg.method)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = fit(
            Xtr,
            ytr,
            cfg.method,
            C=cfg.C,
            k=cfg.k,
            gamma=cfg.gamma,
            eps=cfg.eps,
            max_epochs=cfg.max_epochs,
            time_limit=cfg.time_limit,
            eval_every=cfg.eval_every,
            seed=cfg.seed,
            n_classes=ds.n_classes,
            kernel=None if cfg.kernel == "linear" else cfg.kernel,
            theta=cfg.theta,
            **(
                {"weights": cfg.weights, "fw": cfg.fw}
                if get_method(cfg.method).solver == "frank_wolfe"
                else {}
            ),
        )
    for w in caught:
        log.warning("%s", w.message)
    ks = [k for k in cfg.topk if k < ds.n_classes] or [1]
    metrics = {}
    for split, (Xs, ys) in ds.splits.items():
        scores = model.decision_function(Xs)
        if ds.multilabel:
            metrics[split] = evaluate_multilabel(ds, split, scores, delta=cfg.delta)
        else:
            acc = topk_accuracy(scores, ys, ks)
            metrics[split] = {f"top{k}": v for k, v in acc.items()}
    out = {
        "dataset": ds.name,
        "method": model.method,
        "params": {**model.params, "kernel": cfg.kernel, "theta": cfg.theta},
        "n": int(Xtr.shape[0]),
        "d": int(Xtr.shape[1]),
        "m": int(ds.n_classes),
        "primal": model.primal,
        "dual": model.dual,
        "relative_gap": model.relative_gap,
        "status": model.status,
        "epochs": model.epochs,
        "train_seconds": model.train_seconds,
        "metrics": metrics,
    }
    if model.info:
        out["info"] = model.info
    if as_json:
        # nonconvex methods have no dual: NaN is written as null (valid JSON)
        sys.stdout.write(json.dumps(_json_safe(out), allow_nan=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{model.method}[/] on {ds.name} (n={out['n']}, d={out['d']}, m={out['m']}), "
        f"C={cfg.C:g} gamma={cfg.gamma:g} k={cfg.k}"
    )
    if math.isnan(model.dual):
        certificate = (
            f"P = {model.primal:.8g} (nonconvex: no duality gap), "
            f"|grad P| = {model.info.get('grad_norm', float('nan')):.3g}"
        )
    else:
        certificate = (
            f"P = {model.primal:.8g}, D = {model.dual:.8g}, relative gap = {model.relative_gap:.3g}"
        )
    console.print(
        f"status {model.status} after {model.epochs} epochs, {model.train_seconds:.2f} s: "
        + certificate
    )
    if ds.multilabel:
        t = Table("metric", *metrics)
        for name in next(iter(metrics.values())):
            t.add_row(name, *[f"{vals[name]:.4g}" for vals in metrics.values()])
        console.print(t)
        console.print(f"partition metrics at delta = {cfg.delta:g}")
        return
    t = Table("split", *[f"top-{k} %" for k in ks])
    for split, vals in metrics.items():
        t.add_row(split, *[f"{100 * vals[f'top{k}']:.2f}" for k in ks])
    console.print(t)


def _json_safe(obj):
    """Replace non-finite floats by None, recursively."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


@app.command(help="List the training methods (generated from the registry).")
def methods() -> None:
    from topkbench.losses.registry import METHODS

    for s in METHODS.values():
        aliases = f"  (aliases: {', '.join(s.aliases)})" if s.aliases else ""
        typer.echo(f"{s.name}{aliases}")
        typer.echo(f"    {s.paper_name}")
        typer.echo(
            f"    params: {', '.join(('C',) + s.params)}   task: {s.task}   solver: {s.solver}"
        )
        typer.echo(f"    loss: {s.objective}")
        typer.echo(f"    reference: {s.reference}")


@app.command(
    help="Run an experiment's sweep (resumable). Example: sweep experiment=table3 n_jobs=2"
)
@_handle_errors
def sweep(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    skip_missing: bool = typer.Option(
        False, "--skip-missing", help="run the datasets whose files are present, skip the rest"
    ),
) -> None:
    _setup_logging(verbose)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from topkbench.config import ExperimentConfig
    from topkbench.experiments.sweep import run_sweep

    exp = _available_datasets(ExperimentConfig.from_dict(compose(overrides, "sweep")), skip_missing)
    counts = {"done": 0, "cached": 0, "failed": 0, "skipped": 0, "not_converged": 0}
    log.info(
        "%s: %d rows x %d dataset(s) x %d draw(s) x %d C values (+ folds, extensions, refits), "
        "%s, records in %s/%s",
        exp.name,
        len(exp.rows),
        len(exp.datasets),
        exp.draws,
        len(exp.C_values),
        f"dask scheduler {exp.scheduler}" if exp.scheduler else f"n_jobs={exp.n_jobs}",
        exp.results_dir,
        exp.name,
    )
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        transient=False,
        console=None,
    ) as progress:
        task = progress.add_task(exp.name, total=0, stats="")

        def on_stage(name: str, n_fits: int) -> None:
            total = progress.tasks[0].total or 0
            progress.update(task, total=total + n_fits, description=f"{exp.name} [{name}]")

        def on_done(s):
            for key in counts:
                counts[key] += getattr(s, key)
            for e in s.errors:
                log.error("%s %s draw %d %s: %s", s.dataset, s.row, s.draw, s.fold, e)
            progress.update(
                task,
                advance=s.done + s.cached + s.failed + s.skipped,
                stats=f"done {counts['done']} cached {counts['cached']} failed {counts['failed']}",
            )

        run_sweep(exp, on_done, on_stage)
    log.info(
        "finished: %d new, %d cached, %d failed, %d skipped (k >= m); "
        "%d new fits stopped on the budget",
        counts["done"],
        counts["cached"],
        counts["failed"],
        counts["skipped"],
        counts["not_converged"],
    )
    if counts["failed"]:
        raise typer.Exit(1)


def _check_files(cfg) -> None:
    """Refuse data files that fail their checksum; say which have none to check against."""
    from topkbench.data.dataset import missing_files
    from topkbench.data.registry import check_before_use

    if cfg.kind not in ("libsvm", "mat", "mulan", "features") or missing_files(cfg):
        return  # generated data; missing files get their own error from the loader
    unchecked = check_before_use(cfg)
    if unchecked:
        log.info("%s: no checksum on record for %s: not verified", cfg.name, ", ".join(unchecked))


def _available_datasets(exp, skip_missing: bool):
    """Refuse an experiment whose data files are missing (listing them all), or drop those
    datasets with a warning when ``skip_missing``."""
    from dataclasses import replace

    from topkbench.data.dataset import missing_files
    from topkbench.errors import DatasetNotFoundError

    missing = {d.name: missing_files(d) for d in exp.datasets}
    missing = {k: v for k, v in missing.items() if v}
    if not missing:
        for d in exp.datasets:
            _check_files(d)
        return exp
    listing = "; ".join(f"{k}: {', '.join(str(p) for p in v)}" for k, v in missing.items())
    names = " ".join(missing)
    if not skip_missing or len(missing) == len(exp.datasets):
        none_left = " (--skip-missing: no dataset of the experiment has its files)"
        raise DatasetNotFoundError(
            ", ".join(missing) + (none_left if skip_missing else ""),
            [listing],
            hint=f"fetch with `topkbench data fetch NAME` ({names}), or see `topkbench data info "
            "NAME` for files you must supply"
            + ("" if skip_missing else "; or run the others with --skip-missing"),
        )
    log.warning("skipping datasets without their files: %s", listing)
    exp = replace(exp, datasets=tuple(d for d in exp.datasets if d.name not in missing))
    for d in exp.datasets:
        _check_files(d)
    return exp


@app.command(
    help="Print an experiment's table beside the paper's numbers. Example: report experiment=table3"
)
@_handle_errors
def report(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
) -> None:
    from topkbench.config import ExperimentConfig
    from topkbench.experiments.render import write_report
    from topkbench.experiments.report import build_report

    exp = ExperimentConfig.from_dict(compose(overrides, "report"))
    rep = build_report(exp)
    paths = write_report(exp, rep)
    sys.stdout.write(rep.markdown)
    if rep.incomplete:
        log.warning("the sweep of this configuration is incomplete: see the report's first line")
    sys.stderr.write("written: " + ", ".join(str(p) for p in paths) + "\n")


@app.command(
    help="Write an experiment's records (every configuration in its results directory) to a "
    "Parquet or CSV file. Example: export experiment=table3 --out results/table3.parquet"
)
@_handle_errors
def export(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
    out: Path = typer.Option(..., "--out", help="file to write: .parquet or .csv"),
) -> None:
    from topkbench.config import ExperimentConfig
    from topkbench.experiments.store import RecordStore

    exp = ExperimentConfig.from_dict(compose(overrides, "export"))
    store = RecordStore(exp.results_dir, exp.name)
    path = store.export(out)
    sys.stderr.write(f"written: {path}\n")


@bench_app.command(
    "sdca",
    help="Seconds per SDCA epoch, GFLOP/s and the multiple of the 4 n d m flop bound at the "
    "measured single-core peak (dgemm); then (TPAMI Fig. 3b/3c) every method run to relative "
    "gap --eps: epochs and wall time, relative gap and validation top-1 against time (PNG).",
)
@_handle_errors
def bench_sdca_cmd(
    n: int = typer.Option(20_000, help="examples"),
    d: int = _BENCH_D_OPT,
    m: int = _BENCH_M_OPT,
    epochs: int = typer.Option(5, help="epochs timed per method (median reported)"),
    C: float = typer.Option(1.0, help="C = 1/(lambda n) of the epoch timing"),
    seed: int = typer.Option(0),
    method: list[str] = typer.Option(
        None,
        "--method",
        help=f"{_METHOD_SPEC_HELP} (default: every SDCA loss, top-k ones at k = 5)",
    ),
    converge: bool = typer.Option(True, help="also run the time-to-eps study (Fig. 3b/3c)"),
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
    from rich.table import Table

    from topkbench.bench.common import check_sdca_problem, method_label, parse_method_spec
    from topkbench.bench.sdca import bench_sdca, bench_sdca_convergence, plot_sdca_convergence

    if converge:  # refuse the study's parameters before the (long) timing part
        check_sdca_problem(n, d, m, conv_C, eps)
    methods = tuple(parse_method_spec(x) for x in method) if method else None
    rows = bench_sdca(n=n, d=d, m=m, epochs=epochs, C=C, seed=seed, methods=methods)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([r.__dict__ for r in rows]).to_csv(out, index=False)
    console = Console()
    t = Table(
        "method",
        "n x d x m",
        "s/epoch (median)",
        "s/epoch (min)",
        "GFLOP/s",
        "x bound",
        "gap after",
        title=f"SDCA epochs, C = {C:g}; bound = 4 n d m flops at the measured peak "
        f"{rows[0].peak_gflops:.1f} GFLOP/s (1-thread dgemm; the highest of one measurement "
        f"before each loss, which ranged {min(r.peak_gflops_here for r in rows):.1f}-"
        f"{max(r.peak_gflops_here for r in rows):.1f})",
    )
    for r in rows:
        t.add_row(
            method_label(r.method, r.gamma, r.k),
            f"{r.n}x{r.d}x{r.m}",
            f"{r.sec_per_epoch:.4f}",
            f"{r.sec_per_epoch_min:.4f}",
            f"{r.gflops:.2f}",
            f"{r.times_bound:.1f}",
            f"{r.gap_after:.3g}",
        )
    console.print(t)
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
        t = Table(
            "method",
            "status",
            "epochs",
            "seconds",
            "rel. gap",
            "val top-1 %",
            title=f"time to relative gap {eps:g} (C = {conv_C:g}, separation {separation:g})",
        )
        for r in conv:
            t.add_row(
                method_label(r.method, r.gamma, r.k),
                r.status,
                str(r.epochs),
                f"{r.seconds:.2f}",
                f"{r.relative_gap:.2g}",
                f"{100 * r.val_top1:.1f}",
            )
        console.print(t)
    sys.stderr.write("written: " + ", ".join(str(x) for x in written) + "\n")


@bench_app.command(
    "conditioning",
    help="Ill-conditioned features (column scales 1e-2..1e2, ||x||^2 up to ~1e5; small and "
    "large n, multiclass and multilabel): for each SDCA loss and C, seconds and epochs to "
    "relative gap --eps from a cold start, plain SDCA against accelerated (accelerate=auto). "
    "Writes a CSV, a per-method speed-up summary CSV and a PNG of time against C.",
)
@_handle_errors
def bench_conditioning_cmd(
    problem: list[str] = typer.Option(
        None, "--problem", help="multiclass-400 | multilabel-400 | multiclass-10k (default: all)"
    ),
    method: list[str] = typer.Option(
        None, "--method", help=f"{_METHOD_SPEC_HELP} (default: every SDCA loss of the task)"
    ),
    log2_C: list[int] = typer.Option(
        None, "--log2-C", help="exponents e of C = 2^e (default: -8 -4 0 4 8)"
    ),
    eps: float = typer.Option(1e-3, help="relative duality gap to reach"),
    time_limit: float = typer.Option(30.0, help="seconds budget per fit"),
    seed: int = typer.Option(0, help="drives the data and the permutations"),
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
    help="Memory at scale (issue 7): write an n x d float32 problem to disk (.npy or "
    "contiguous HDF5), train each method in a fresh process on the memory-mapped file, report "
    "epoch time and the training process's peak resident memory.",
)
@_handle_errors
def bench_scale_cmd(
    n: int = typer.Option(1_000_000, help="examples"),
    d: int = _BENCH_D_OPT,
    m: int = _BENCH_M_OPT,
    epochs: int = typer.Option(3, help="SDCA epochs (each followed by the gap certificate)"),
    C: float = typer.Option(1.0, help="C = 1/(lambda n)"),
    fmt: str = typer.Option("npy", "--format", help="npy or h5 (contiguous HDF5 dataset)"),
    seed: int = typer.Option(0),
    method: list[str] = typer.Option(
        None, "--method", help=f"{_METHOD_SPEC_HELP} (default: svm_multi)"
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
    "projections",
    help=(
        "TPAMI Fig. 3a: seconds per 1,000 projections of N(0,1) vectors onto the simplex "
        "(Kiwiel's variable fixing), the top-k simplex Delta_k^alpha (k = 1, 5, 10), "
        "Delta_k^beta, D_k (printed alpha) and the top-k entropic prox, d = 10 ... 10^6; the "
        "fitted scaling exponent over 10^3 <= d <= 10^6 (1 = linear); CSV + PNG."
    ),
)
@_handle_errors
def bench_projections_cmd(
    dims: list[int] = typer.Option(
        None, "--dim", help="dimension d (repeatable; default 10, 10^2, ..., 10^6)"
    ),
    problems: int = typer.Option(1000, help="projections per dimension and set"),
    methods: list[str] = typer.Option(
        None, "--method", help="set to time (repeatable; default all, see the CSV's names)"
    ),
    seed: int = typer.Option(0),
    out: Path = _OUT_OPT,
) -> None:
    _setup_logging(False)
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
@_handle_errors
def bench_bipartite_cmd(
    dims: list[int] = typer.Option(
        None, "--dim", help="dimension d (repeatable; default 10^3, 10^4, 10^5, 10^6)"
    ),
    problems: int = typer.Option(1000, help="projections per dimension"),
    rho: float = typer.Option(10.0, help="radius of B(rho)"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("results/bench/bipartite.csv"), help="CSV output"),
) -> None:
    _setup_logging(False)
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
        "CPU time for the pseudo-alpha SDCA (the authors' code), our printed-alpha SDCA and "
        "Frank-Wolfe (standard / away / pairwise) at k = 3, lambda = 1/n; CSV + PNG."
    ),
)
@_handle_errors
def bench_kato_fig2_cmd(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides selecting a dataset (its train split), e.g. dataset=letter"
    ),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = typer.Option(3),
    C: float = _C_OPT,
    iters: int = typer.Option(300, help="SDCA epochs / Frank-Wolfe iterations per solver"),
    budget: float = typer.Option(2.0, help="CPU seconds at which the summary reads each gap"),
    seed: int = typer.Option(0),
    out: Path = _OUT_OPT,
) -> None:
    _setup_logging(False)
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
    t = Table("solver", f"best gap within {budget:g} s CPU", "final gap", "iterations", "CPU s")
    for solver in dict.fromkeys(p.solver for p in points):
        pts = [p for p in points if p.solver == solver]
        best = min(p.gap for p in pts if p.seconds <= budget)
        t.add_row(
            solver, f"{best:.3e}", f"{pts[-1].gap:.3e}", str(pts[-1].iteration),
            f"{pts[-1].seconds:.2f}",
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
        "standard, away-step and pairwise Frank-Wolfe; k = 3, lambda = 1/n; CSV + PNG."
    ),
)
@_handle_errors
def bench_kato_fig3_cmd(
    overrides: list[str] = typer.Argument(None, help=_STUDY_OVERRIDES_HELP),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = typer.Option(3),
    C: float = _C_OPT,
    gammas: list[float] = typer.Option(
        None, "--gamma", help="smoothing gamma (repeatable; default 0, 1e-3, 1e-2, 1e-1)"
    ),
    iters: int = _FW_ITERS_OPT,
    target: float = _TARGET_OPT,
    seed: int = typer.Option(0),
    out: Path = _OUT_OPT,
) -> None:
    _setup_logging(False)
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
        "flat, linear and exp weights (Kato eq. (8), §7.3) by one Frank-Wolfe variant; "
        "k = 3, lambda = 1/n; CSV + PNG."
    ),
)
@_handle_errors
def bench_kato_fig4_cmd(
    overrides: list[str] = typer.Argument(None, help=_STUDY_OVERRIDES_HELP),
    n: int = _N_OPT,
    d: int = _D_OPT,
    m: int = _M_OPT,
    k: int = typer.Option(3),
    C: float = _C_OPT,
    fw: str = typer.Option("standard", help="Frank-Wolfe variant: standard, away or pairwise"),
    iters: int = _FW_ITERS_OPT,
    target: float = _TARGET_OPT,
    seed: int = typer.Option(0),
    out: Path = _OUT_OPT,
) -> None:
    _setup_logging(False)
    from topkbench.bench.kato import FW_PANELS, kato_fig4
    from topkbench.errors import ConfigError
    from topkbench.validation import check_positive

    if fw not in FW_PANELS:
        raise ConfigError(f"--fw must be one of {', '.join(FW_PANELS)}; got {fw!r}")
    check_positive("C", C)
    X, y, name = _study_problem(overrides, n, d, m, seed)
    points = kato_fig4(X, y, k=k, C=C, iters=iters, variant=fw)
    _fw_study_output(points, out, "kato_fig4", f"{name}, k = {k}, C = {C:g}", target)


@bench_app.command(
    "table5",
    help=(
        "Wall time of the full Table 5 protocol (17 rows, C grid with extension, selection on "
        "val) on the Letter-shaped synthetic set, with and without warm starts along C."
    ),
)
@_handle_errors
def bench_table5_cmd(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides applied on top (e.g. dataset sizes: see conf/dataset)"
    ),
    n_jobs: int = typer.Option(2, help="worker processes"),
    out: Path = typer.Option(Path("results/bench"), help="output directory"),
) -> None:
    _setup_logging(False)
    from dataclasses import asdict

    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from topkbench.bench.table5 import bench_table5
    from topkbench.config import ExperimentConfig

    base = ["experiment=table5", "experiment.datasets=[letter_synth]", f"n_jobs={n_jobs}"]
    exp = ExperimentConfig.from_dict(compose(base + list(overrides or []), "sweep"))
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
    "peers",
    help=(
        "Wall time (one core) to a primal within --tol relative of the certified optimum, our "
        "SDCA vs scikit-learn on the same problem and C (scikit-learn's C = ours): lr_multi vs "
        "LogisticRegression lbfgs and saga, svm_multi vs LinearSVC crammer_singer (liblinear "
        "-s 4), svm_ova vs LinearSVC hinge (-s 3), lr_ova vs LogisticRegression liblinear dual "
        "(-s 7); scikit-learn refitted at growing budgets. CSV + PNG. Needs scikit-learn."
    ),
)
@_handle_errors
def bench_peers_cmd(
    n: int = typer.Option(20_000, help="examples"),
    d: int = typer.Option(128, help="features"),
    m: int = typer.Option(100, help="classes (>= 3)"),
    C: float = typer.Option(0.1, help="C = 1/(lambda n); scikit-learn gets the same C"),
    separation: float = typer.Option(
        0.5, help="class-mean scale (0.5: partly overlapping classes, as in bench sdca's study)"
    ),
    seed: int = typer.Option(0),
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
    _setup_logging(False)
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


def _status_table(cfg, statuses) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("file", "state", "sha256 check", "path", title=f"{cfg.name}")
    for st in statuses:
        check = {"registry": "registry", "recorded": "recorded on first fetch"}.get(
            st.source, "none published"
        )
        t.add_row(st.file, st.state, check, str(st.path))
    Console().print(t)


@data_app.command("list", help="List the registered datasets and whether their files are here.")
@_handle_errors
def data_list() -> None:
    from rich.console import Console
    from rich.table import Table

    from topkbench.data.dataset import data_dir, missing_files
    from topkbench.data.registry import registry_entry, registry_names

    t = Table("name", "kind", "paper m / n / d", "files", "title", title=f"data dir: {data_dir()}")
    for name in registry_names(_conf_dir()):
        cfg = registry_entry(_conf_dir(), name)
        paper = cfg.get("paper") or {}
        shape = " / ".join(str(paper.get(k, "?")) for k in ("m", "n", "d")) if paper else ""
        if cfg.kind in ("circle", "gaussian"):
            state = "generated"
        else:
            state = "missing" if missing_files(cfg) else "present"
        t.add_row(name, cfg.kind, shape, state, str(cfg.get("title", "")))
    Console().print(t)


@data_app.command("info", help="Show a dataset's files, sources, preprocessing and state.")
@_handle_errors
def data_info(name: str = typer.Argument(..., help="registered dataset name")) -> None:
    from topkbench.data.dataset import data_dir
    from topkbench.data.registry import registry_entry, verify

    cfg = registry_entry(_conf_dir(), name)
    typer.echo(f"{cfg.name}: {cfg.get('title', '')}")
    typer.echo(f"  kind: {cfg.kind}")
    for key, value in cfg.options:
        if key not in ("files", "title"):
            typer.echo(f"  {key}: {value}")
    if cfg.kind in ("circle", "gaussian"):
        typer.echo("  generated on the fly; nothing to download")
        return
    typer.echo(f"  directory: {data_dir() / cfg.name}")
    if cfg.kind == "features":
        from topkbench.data import features

        typer.echo("  expected layout (you supply the files):")
        typer.echo("    " + features.__doc__.split("Layout", 1)[1].strip().replace("\n", "\n    "))
    _status_table(cfg, verify(cfg))


@data_app.command("fetch", help="Download a dataset's files (checksums verified, resumable).")
@_handle_errors
def data_fetch(
    name: str = typer.Argument(..., help="registered dataset name"),
    progress: bool = typer.Option(True, help="show a download progress bar"),
    deadline: float = typer.Option(
        3600.0, min=0.001, help="seconds a file's download may take in total"
    ),
) -> None:
    from topkbench.data.registry import fetch, registry_entry

    cfg = registry_entry(_conf_dir(), name)
    if cfg.kind in ("circle", "gaussian"):
        typer.echo(f"{name} is generated on the fly; nothing to fetch")
        return
    _status_table(cfg, fetch(cfg, progressbar=progress, deadline=deadline))


@data_app.command("verify", help="Check a dataset's files against their sha256 (exit 1 if bad).")
@_handle_errors
def data_verify(name: str = typer.Argument(..., help="registered dataset name")) -> None:
    from topkbench.data.registry import registry_entry, verify

    cfg = registry_entry(_conf_dir(), name)
    statuses = verify(cfg)
    _status_table(cfg, statuses)
    if any(st.state in ("missing", "mismatch") for st in statuses):
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
