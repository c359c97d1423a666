"""``topkbench train`` and ``topkbench methods``."""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import typer

from topkbench.cli.app import (
    app,
    check_data_files,
    compose,
    handle_errors,
    log,
    setup_logging,
)


def _methods_help() -> str:
    from topkbench.losses.registry import METHODS

    return "; ".join(f"{s.name} ({', '.join(('C',) + s.params)})" for s in METHODS.values())


OVERRIDES_HELP = (
    "Hydra overrides key=value: method, C, k, gamma, eps, max_epochs, time_limit, seed, "
    "solver (topk_ent_tr: lbfgs | gd), empty_label (multilabel 0/0: zero | one), "
    "dataset=circle, dataset.n_train=..."
)


@app.command(help="Train and evaluate one model. Methods: " + _methods_help())
@handle_errors
def train(
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    save: Path = typer.Option(
        None, "--save", help="Write the model to this .npz file (topkbench predict reads it)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    setup_logging(verbose)
    from topkbench.api import fit
    from topkbench.config import TrainConfig, method_options
    from topkbench.data.dataset import load_dataset
    from topkbench.errors import ConfigError, ConvergenceWarning
    from topkbench.experiments.evaluation import evaluate_multilabel, training_targets
    from topkbench.experiments.fits import dataset_options
    from topkbench.metrics.topk import topk_accuracy

    cfg = TrainConfig.from_dict(compose(overrides, "train"))
    if save is not None and save.is_dir():
        raise ConfigError(
            f"--save {save} is a directory; give a file name (e.g. {save / 'model.npz'})"
        )
    check_data_files(cfg.dataset)
    ds = load_dataset(cfg.dataset, cfg.seed)
    if save is not None and ds.feature_map is None:
        raise ConfigError(
            f"--save: dataset {ds.name} is projected by PCA fitted on its training split, and a "
            "saved model keeps no projection to apply to new data",
            hint="train on the dataset without pca: to save the model",
        )
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
            **cfg.stop_rule(),
            seed=cfg.seed,
            n_classes=ds.n_classes,
            kernel=None if cfg.kernel == "linear" else cfg.kernel,
            theta=cfg.theta,
            **method_options(cfg.method, weights=cfg.weights, fw=cfg.fw, solver=cfg.solver),
            **dataset_options(ds, cfg.method),
        )
    for w in caught:
        log.warning("%s", w.message)
    ks = [k for k in cfg.topk if k < ds.n_classes] or [1]
    metrics = {}
    for split, (Xs, ys) in ds.splits.items():
        scores = model.decision_function(Xs)
        if ds.multilabel:
            metrics[split] = evaluate_multilabel(
                ds, split, scores, delta=cfg.delta, empty=cfg.empty_label
            )
        else:
            acc = topk_accuracy(scores, ys, ks)
            metrics[split] = {f"top{k}": v for k, v in acc.items()}
    if save is not None:
        from dataclasses import replace

        import numpy as np

        from topkbench.data.files import file_digests

        data = {"dataset": ds.name, "spec": cfg.dataset.spec_dict(), "seed": cfg.seed,
                "file_sha256": file_digests(cfg.dataset)}  # fmt: skip
        saved = replace(model, classes=np.asarray(ds.label_names), feature_map=ds.feature_map)
        log.info("model written to %s", saved.save(save, training_data=data))
    out = {
        "dataset": ds.name,
        "method": model.method,
        "params": {**model.params, "kernel": cfg.kernel, "theta": cfg.theta},
        "n": int(Xtr.shape[0]),
        "d": int(Xtr.shape[1]),
        "m": int(ds.n_classes),
        **model.certificate(),
        "metrics": metrics,
    }
    if model.info:
        out["info"] = model.info
    if as_json:
        # nonconvex methods have no dual: NaN is written as null (valid JSON)
        sys.stdout.write(json.dumps(_json_safe(out), allow_nan=False) + "\n")
        return
    _print_training(model, ds, cfg, out, metrics, ks)


def _print_training(model, ds, cfg, out, metrics, ks) -> None:
    """The human-readable summary of ``topkbench train``: the certificate and the metrics."""
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


@app.command(
    help="List the training methods (generated from the registry), each with the solvers "
    "that fit() chooses from for it (topkbench.api.SOLVERS)."
)
def methods() -> None:
    from topkbench.api import solver_routes
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
        for route in solver_routes(s):
            typer.echo(f"    fit by {route.name}: {route.when}")
