"""``topkbench sweep | report | export``: an experiment's records and its tables."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import typer

from topkbench.cli.app import (
    RESUMABLE,
    app,
    check_data_files,
    compose,
    handle_errors,
    log,
    setup_logging,
)


@app.command(
    help="Run an experiment's sweep (resumable). Example: sweep experiment=table3 n_jobs=2"
)
@handle_errors(interrupted=RESUMABLE)
def sweep(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
    skip_missing: bool = typer.Option(
        False, "--skip-missing", help="run the datasets whose files are present, skip the rest"
    ),
) -> None:
    setup_logging(verbose)
    from topkbench.config import ExperimentConfig
    from topkbench.deep.config import is_finetune
    from topkbench.experiments.sweep import run_sweep

    root = compose(overrides, "sweep")
    if is_finetune(root):
        _finetune_sweep(root)
        return
    exp = _available_datasets(ExperimentConfig.from_dict(root), skip_missing)
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
    with sweep_progress(exp.name, counts) as (on_done, on_stage, on_fit):
        run_sweep(exp, on_done, on_stage, on_fit)
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


def _finetune_sweep(root) -> None:
    """The fine-tuning protocol (``layout: finetune``, Table 6): networks, fine-tunings and
    the classifier rows' sweep, with one progress bar."""
    from topkbench.deep.config import FinetuneConfig
    from topkbench.deep.protocol import run_finetune

    cfg = FinetuneConfig.from_dict(root)
    _available_datasets(cfg, False)
    log.info(
        "%s: %d seed(s), a reference network each, %d fine-tuning row(s) x %d rate(s) x %d "
        "epoch(s), %d classifier row(s); %s on %s, records in %s/%s",
        cfg.name, cfg.seeds, len(cfg.rows), len(cfg.finetune_lrs), cfg.finetune_epochs,
        len(cfg.classifier.get("rows") or ()),
        f"n_jobs={cfg.n_jobs}", cfg.device, cfg.results_dir, cfg.name,
    )  # fmt: skip
    counts = {"done": 0, "cached": 0, "failed": 0, "skipped": 0, "not_converged": 0}
    with sweep_progress(cfg.name, counts) as (on_done, on_stage, on_fit):
        run_finetune(cfg, on_done, on_stage, on_fit)
    log.info("finished: %d new networks, fine-tunings and fits, %d cached, %d failed",
             counts["done"], counts["cached"], counts["failed"])  # fmt: skip
    if counts["failed"]:
        raise typer.Exit(1)


@contextmanager
def sweep_progress(name: str, counts: dict[str, int], console=None, log_every: float = 30.0):
    """A progress bar over a sweep's fits (stage by stage, with the counts of new, cached
    and failed fits, which ``counts`` accumulates): yields the sweep's ``(on_path_done,
    on_stage, on_fit)`` callbacks.  The bar moves with each stored fit and each finished
    path's cached, failed and skipped points; a path's errors are logged as it ends.  Where
    the console is not a terminal (a log file, a batch job) a bar would print only when the
    sweep ends, so the same figures are printed as lines instead: at each stage and at most
    every ``log_every`` seconds (on the console, whatever the logging configuration)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    # "stored": fits counted by on_fit whose path has not ended (a path's records are all
    # stored before its counts arrive, so its new fits are not counted twice)
    state = {"stage": name, "total": 0, "fits": 0, "stored": 0}
    say = _progress_bar if console.is_terminal else _progress_lines

    def on_stage(stage: str, n_fits: int) -> None:
        state["stage"] = f"{name} [{stage}]"
        state["total"] += n_fits
        show(final=True)

    def on_fit() -> None:
        state["fits"] += 1
        state["stored"] += 1
        show(final=False)

    def on_done(s) -> None:
        for key in counts:
            counts[key] += getattr(s, key)
        for e in s.errors:
            log.error("%s %s draw %d %s: %s", s.dataset, s.row, s.draw, s.fold, e)
        seen = min(s.done, state["stored"])
        state["stored"] -= seen
        state["fits"] += s.done - seen + s.cached + s.failed + s.skipped
        show(final=False)

    with say(console, state, counts, log_every) as show:
        yield on_done, on_stage, on_fit


def _stats(counts: dict[str, int], state: dict) -> str:
    """The counts shown: new fits as they are stored, the others as their paths end."""
    done = counts["done"] + state["stored"]
    return f"done {done} cached {counts['cached']} failed {counts['failed']}"


@contextmanager
def _progress_bar(console, state, counts, log_every):
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        transient=False,
        console=console,
    ) as progress:
        task = progress.add_task(state["stage"], total=0, stats="")

        def show(final: bool) -> None:
            # escaped: rich would read "[stage]" as a style tag and drop it
            progress.update(task, total=state["total"], completed=state["fits"],
                            description=escape(state["stage"]),
                            stats=_stats(counts, state))  # fmt: skip

        yield show


@contextmanager
def _progress_lines(console, state, counts, log_every):
    import time

    start = time.monotonic()
    last = [-float("inf")]

    def show(final: bool) -> None:
        now = time.monotonic()
        if final or now - last[0] >= log_every:
            last[0] = now
            minutes, seconds = divmod(int(now - start), 60)
            console.print(f"{state['stage']}: {state['fits']}/{state['total']} fits, "
                          f"{_stats(counts, state)}, {minutes} min {seconds:02d} s",
                          markup=False, highlight=False, soft_wrap=True)  # fmt: skip

    yield show
    show(final=True)


def _available_datasets(exp, skip_missing: bool):
    """Refuse an experiment whose data files are missing (listing them all), or drop those
    datasets with a warning when ``skip_missing``."""
    from dataclasses import replace

    from topkbench.data.files import missing_files
    from topkbench.errors import DatasetNotFoundError

    missing = {d.name: missing_files(d) for d in exp.datasets}
    missing = {k: v for k, v in missing.items() if v}
    if not missing:
        for d in exp.datasets:
            check_data_files(d)
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
        check_data_files(d)
    return exp


@app.command(
    help="Print an experiment's table beside the paper's numbers. Example: report experiment=table3"
)
@handle_errors
def report(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
    as_html: bool = typer.Option(
        False,
        "--html",
        help="also write report.html: one self-contained page (tables, plots, solver health, "
        "provenance) that opens offline",
    ),
    figures: Path = typer.Option(
        None, "--figures", help="also write every plot of the HTML page as PNG and PDF here"
    ),
) -> None:
    from topkbench.config import ExperimentConfig
    from topkbench.deep.config import FinetuneConfig, is_finetune
    from topkbench.experiments.render import write_report
    from topkbench.experiments.report import build_report

    root = compose(overrides, "report")
    records = None
    if is_finetune(root):
        from topkbench.deep.report import build_finetune_report

        exp = FinetuneConfig.from_dict(root)
        if figures is not None:
            from topkbench.errors import ConfigError

            raise ConfigError("--figures: the fine-tuning report has no plots",
                              hint="report --html writes its page")  # fmt: skip
        rep, records = build_finetune_report(exp)
    else:
        exp = ExperimentConfig.from_dict(root)
        rep = build_report(exp)
    paths: list = []
    try:
        paths += write_report(exp, rep)
        if records is not None and (as_html or figures is not None):
            from topkbench.experiments.html import write_table_page

            page = Path(exp.results_dir) / exp.name / "report.html"
            paths.append(write_table_page(exp.title, rep, records, page))
        elif as_html or figures is not None:
            from topkbench.experiments.html import write_html_report
            from topkbench.experiments.selection import current_records
            from topkbench.experiments.store import read_records

            records = current_records(exp, read_records(exp.results_dir, exp.name)[0])
            page = Path(exp.results_dir) / exp.name / "report.html"
            paths += write_html_report(exp, rep, records, page, figures)
    except OSError as exc:  # a read-only or full results directory: the report still prints
        reason = exc.strerror or exc
        written = [*paths, *getattr(exc, "replaced", [])]
        if paths:  # the report files are written; the page (or one of its figures) is not
            failed = Path(exc.filename or "")
            if figures is None or failed.parent != figures:  # else a temporary file's name
                failed = Path(exp.results_dir) / exp.name / "report.html"
            what = f"could not write {failed} ({reason})"
        else:
            where = exc.filename or Path(exp.results_dir) / exp.name
            what = f"could not write the report files ({where}: {reason})"
        if written:
            kept = f"{', '.join(p.name for p in written)} written; the report is also on stdout"
        else:
            kept = "the files there are as they were, and the report is printed to stdout only"
        typer.echo(f"warning: {what}; {kept}", err=True)
    sys.stdout.write(rep.markdown)
    if rep.incomplete:
        log.warning("the sweep of this configuration is incomplete: see the report's first line")
    if paths:
        sys.stderr.write("written: " + ", ".join(str(p) for p in paths) + "\n")


@app.command(
    help="Write an experiment's records (every configuration in its results directory) to a "
    "Parquet or CSV file. Example: export experiment=table3 --out results/table3.parquet"
)
@handle_errors
def export(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; experiment=NAME is required"
    ),
    out: Path = typer.Option(..., "--out", help="file to write: .parquet or .csv"),
) -> None:
    from topkbench.config import ExperimentConfig
    from topkbench.deep.config import FinetuneConfig, is_finetune
    from topkbench.experiments.store import RecordStore

    root = compose(overrides, "export")
    also = ()
    if is_finetune(root):  # its classifier rows' fits are an experiment of their own
        from topkbench.deep.protocol import classifier_store
        from topkbench.experiments.store import read_records

        exp = FinetuneConfig.from_dict(root)
        fits = read_records(*classifier_store(exp))[0]
        also = (fits.assign(stage="classifier"),) if len(fits) else ()
    else:
        exp = ExperimentConfig.from_dict(root)
    store = RecordStore(exp.results_dir, exp.name)
    path = store.export(out, also)
    sys.stderr.write(f"written: {path}\n")
