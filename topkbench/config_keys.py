"""The keys each level of a composed configuration may hold, and the checks that refuse
the others: an override either takes effect or is refused, with the valid keys or range
(:func:`topkbench.cli.app.compose` runs them on every composed configuration)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from topkbench.config import DOC_KEYS, LOCATION_KEYS
from topkbench.dataset_specs import ALL_KINDS, PreprocessSpec
from topkbench.errors import ConfigError
from topkbench.validation import check_int, check_int_list, check_n_jobs, check_number

# the keys each level of a composed configuration may hold (an unknown one is a typo: refused)
SOLVER_KEYS = ("eps", "max_epochs", "time_limit", "eval_every")
TRAIN_KEYS = frozenset(
    {"method", "C", "k", "gamma", "weights", "fw", "kernel", "theta", "topk", "delta",
     "empty_label", "solver", *SOLVER_KEYS}
)  # fmt: skip
RUN_KEYS = frozenset({"seed", "results_dir", "n_jobs", "scheduler"})
ROOT_KEYS = TRAIN_KEYS | RUN_KEYS | {"dataset", "experiment"}
EXPERIMENT_KEYS = frozenset(
    {"name", "title", "dataset", "datasets", "rows", "C_grid", "theta_grid", "ks", "draws",
     "selection", "folds", "extend", "published", "layout", "warm_start", "ent_tr_init",
     "blocks", "metrics", "delta_grid", "max_gram_gb", "class_columns", "threshold_rule",
     "certify_time_limit", "certify_max_epochs", "empty_label", *SOLVER_KEYS}
)  # fmt: skip
# a dataset's keys: its identity, its files (topkbench.data.files), and every typed option
DATASET_KEYS = DOC_KEYS | LOCATION_KEYS | {
    "name", "kind", "base", "files", "train", "val", "test", "xml", "holdout",
} | {f.name for cls in (*ALL_KINDS.values(), PreprocessSpec) for f in fields(cls)}  # fmt: skip


def check_override_keys(command: str, overrides: list[str] | None) -> None:
    """Refuse command-line overrides that would do nothing for ``command``.

    ``sweep`` / ``report`` / ``export`` take every solver setting from the experiment, so a
    top-level ``eps=`` (a ``train`` option) would be silently ignored: it is refused with the
    right spelling, ``experiment.eps=``.  ``train`` has no experiment.
    """
    for item in overrides or ():
        key = item.split("=", 1)[0].lstrip("+~")
        value = item.split("=", 1)[1] if "=" in item else ""
        if command != "train" and key in TRAIN_KEYS:
            if key in (*SOLVER_KEYS, "empty_label"):
                hint = f"use experiment.{key}={value} (the experiment's own setting)"
            elif key == "solver":
                hint = "an experiment row chooses its solver (solver: gd | lbfgs on the row)"
            else:
                hint = "the experiment's rows and C grid set it; topkbench train fits one model"
            raise ConfigError(
                f"{key}= is an option of topkbench train, not of {command}", hint=hint
            )
        if command == "train" and key.split(".")[0] == "experiment":
            raise ConfigError(
                f"{key}= is an experiment option; train runs one model",
                hint="topkbench sweep experiment=NAME ... runs an experiment",
            )


def check_config_keys(root: dict[str, Any]) -> None:
    """Refuse unknown keys at every level of a composed configuration (``+methd=lr_multi``
    would otherwise train the default method), naming the valid ones."""

    def refuse(where: str, unknown, valid) -> None:
        raise ConfigError(
            f"unknown {where} key(s): {', '.join(sorted(unknown))}",
            hint=f"valid: {', '.join(sorted(valid))}",
        )

    if unknown := set(root) - ROOT_KEYS:
        refuse("configuration", unknown, ROOT_KEYS)
    exp = root.get("experiment")
    if isinstance(exp, dict):
        from topkbench.deep.config import FINETUNE_KEYS, LAYOUT

        valid = FINETUNE_KEYS if exp.get("layout") == LAYOUT else EXPERIMENT_KEYS
        if unknown := set(exp) - valid:
            refuse("experiment", unknown, valid)
        for d in exp.get("datasets") or ():
            if isinstance(d, dict) and (unknown := set(d) - DATASET_KEYS):
                refuse(f"dataset ({d.get('name')})", unknown, DATASET_KEYS)
    ds = root.get("dataset")
    if isinstance(ds, dict) and (unknown := set(ds) - DATASET_KEYS):
        refuse("dataset", unknown, DATASET_KEYS)


def check_dataset_overrides(overrides: list[str] | None, root: dict[str, Any]) -> None:
    """An experiment with a ``datasets:`` list ignores the top-level dataset: refuse
    ``dataset=...`` and ``dataset.KEY=...`` for it rather than ignore them."""
    exp = root.get("experiment")
    if not (isinstance(exp, dict) and exp.get("datasets")):
        return
    for item in overrides or ():
        key = item.split("=", 1)[0].lstrip("+~")
        if key == "dataset" or key.startswith("dataset."):
            names = ", ".join(str(d.get("name", d)) if isinstance(d, dict) else str(d)
                              for d in exp["datasets"])  # fmt: skip
            raise ConfigError(
                f"{key}= does not apply: experiment {exp.get('name')} lists its own datasets "
                f"({names})",
                hint="change them in the experiment's datasets: list (topkbench/conf/experiment/)",
            )


def check_run_options(root: dict[str, Any]) -> None:
    """Types and ranges of the top-level options every command shares."""
    check_int("seed", root.get("seed", 0), 0)
    check_n_jobs(root.get("n_jobs", 1))
    results = root.get("results_dir", "results")
    if not isinstance(results, str) or not results:
        raise ConfigError(f"results_dir must be a path; got {results!r}")
    check_number("delta", root.get("delta", 0.0))
    if not check_int_list("topk", root.get("topk", [1]), 1):
        raise ConfigError("topk must be a non-empty list of integers >= 1; got []")
