"""``topkbench predict``: a saved model's top-k labels and scores for every example of a file."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from topkbench.cli.app import app, handle_errors, log, setup_logging


@app.command(
    help=(
        "Predict with a saved model (topkbench train ... --save MODEL.npz, or Model.save): "
        "write each example's top-k labels and scores as CSV (to --out, else to stdout), and "
        "report top-k accuracy (multiclass) or precision@k (multilabel) when DATA has labels. "
        "DATA is a LibSVM/SVMlight text file (optionally .gz/.bz2/.xz) or a .npy feature "
        "matrix (no labels), with the raw features the model was trained from: its scaling and "
        "bias are applied by the model."
    )
)
@handle_errors
def predict(
    model_path: Path = typer.Argument(..., metavar="MODEL", help="saved model (.npz)"),
    data: Path = typer.Argument(..., metavar="DATA", help="LibSVM text file or .npy features"),
    top: int = typer.Option(
        None,
        "--top",
        help="labels written per example (k); default: the model's k if it was trained with "
        "k > 1, else min(5, classes - 1)",
        show_default=False,
    ),
    out: Path = typer.Option(None, "--out", help="CSV output (default: stdout)"),
    zero_based: bool = typer.Option(
        None,
        "--zero-based/--one-based",
        help="LibSVM feature indices start at 0 / at 1 (default: as in the training data)",
        show_default=False,
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    setup_logging(verbose)
    from topkbench.atomic import write_outputs
    from topkbench.errors import ConfigError
    from topkbench.predict import predict_file

    if out is not None and out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name (e.g. {out / 'p.csv'})")

    result = predict_file(model_path, data, top=top, zero_based=zero_based)
    frame = result.frame
    if result.top_rule is not None:
        typer.echo(f"--top not given: {result.top_rule}", err=True)
    if out is None:
        frame.to_csv(sys.stdout, index=False)
    else:
        write_outputs([(out, lambda tmp: frame.to_csv(tmp, index=False))])
        log.info("%d predictions written to %s", len(frame), out)
    for note in result.notes:
        log.warning("%s", note)
    if result.metric is not None:  # the summary goes to stderr, so stdout stays pure CSV
        name, value = result.metric
        typer.echo(f"{name} on {data.name}: {100 * value:.2f} % ({len(frame)} examples)", err=True)
