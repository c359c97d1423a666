"""Reports (DESIGN §8): paper table layouts with the published numbers beside ours.

Selection (DESIGN §7): for every (row, draw, k) the C with the best validation top-k accuracy
is chosen (ties go to the smallest C, i.e. the strongest regularization), and its test top-k
accuracy is reported.  Across draws we give mean +- sample std (ddof = 1) and min-max.  A report
reads exactly the records of the configuration it is given, says when that sweep is
incomplete, and counts and marks the selected models that are not certified.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from topkbench.config import ExperimentConfig
from topkbench.errors import ConfigError
from topkbench.experiments.protocols.datasets import build_datasets_report
from topkbench.experiments.protocols.rows import build_rows_report
from topkbench.experiments.render import UNCERTIFIED, TableReport, load_published
from topkbench.experiments.selection import select_per_k
from topkbench.experiments.store import read_records


def build_report(exp: ExperimentConfig) -> TableReport:
    from topkbench.experiments.selection import current_records

    everything, where = read_records(exp.results_dir, exp.name)
    records = current_records(exp, everything)
    if records.empty:
        raise ConfigError(
            f"no records for experiment {exp.name!r} in this configuration under {where}"
            + (
                f" ({len(everything)} records of other settings, data or code versions)"
                if len(everything)
                else ""
            ),  # fmt: skip
            hint=f"topkbench sweep experiment={exp.name} (with the same overrides)",
        )
    published = load_published(exp.published) if exp.published else pd.DataFrame()
    if exp.layout == "multilabel":
        from topkbench.experiments.protocols.multilabel import build_multilabel_report

        rep = build_multilabel_report(exp, records, published)
    elif exp.layout == "class_ap":
        from topkbench.experiments.protocols.class_ap import build_class_ap_report

        rep = build_class_ap_report(exp, records, published)
    else:
        selected = select_per_k(records, exp)
        if exp.layout == "datasets":
            rep = build_datasets_report(exp, records, selected, published)
        else:
            rep = build_rows_report(exp, records, selected, published)
    return _with_store_notes(exp, rep, records, len(everything) - len(records))


def missing_fits(exp: ExperimentConfig, records: pd.DataFrame) -> tuple[int, int]:
    """(missing, expected) base-grid fits of the selection stage, over the datasets that have
    records (a sweep with ``--skip-missing`` runs only the datasets whose files are present;
    :func:`datasets_not_run` names the others): a report on a partial sweep says so instead
    of selecting from incomplete grids in silence.  Rows the sweep skips (k >= m on that
    dataset) are not expected."""
    from topkbench.experiments.plan import base_jobs

    theta = records["theta"].astype(float) if "theta" in records else np.full(len(records), np.nan)
    have = set(
        zip(records["dataset"], records["draw"], records["row"], records["k"].astype(int),
            records["gamma"].astype(float), records["fold"], records["C"].astype(float),
            np.round(np.nan_to_num(theta, nan=-1.0), 12), strict=True)
    )  # fmt: skip
    m_of = records.groupby("dataset")["n_classes"].first().to_dict()
    expected = missing = 0
    for job in base_jobs(exp):
        ds = exp.datasets[job.dataset].name
        if ds not in m_of or job.row.k >= m_of[ds]:
            continue
        th = -1.0 if job.theta is None else round(float(job.theta), 12)
        for C in job.C_values:
            expected += 1
            coords = (ds, job.draw, job.row.row, job.row.k, job.row.gamma, job.fold, C, th)
            missing += coords not in have
    return missing, expected


def datasets_not_run(exp: ExperimentConfig, records: pd.DataFrame) -> list[str]:
    """The experiment's datasets without a single record of this configuration."""
    have = set(records["dataset"]) if len(records) else set()
    return [d.name for d in exp.datasets if d.name not in have]


def _with_store_notes(exp, rep: TableReport, records, n_other: int) -> TableReport:
    """Certification count and marks' legend, incompleteness and ignored records."""
    sel = rep.selected
    n_sel = len(sel)
    n_cert = int((sel["status"] == "converged").sum()) if n_sel else 0
    notes = [
        f"Selected models certified (relative gap ≤ ε = {exp.eps:g}, or the gradient test of "
        f"a nonconvex row): {n_cert} of {n_sel}."
        + (
            f" {UNCERTIFIED} marks a number from a model that is not (its gap is in selected.csv)."
            if n_cert < n_sel
            else ""
        )  # fmt: skip
    ]
    if records.attrs.get("unverified"):
        notes.append(
            f"Data files of {', '.join(records.attrs['unverified'])} are not on this machine: "
            "the records' own data digests were used."
        )
    if n_other:
        notes.append(
            f"{n_other} records in {Path(exp.results_dir) / exp.name} belong to other settings, "
            "data files or code versions and were not used."
        )
    banners = []
    if not exp.multilabel or exp.layout != "class_ap":
        missing, expected = missing_fits(exp, records)
        if missing:
            banners.append(
                f"> **Incomplete sweep:** {missing} of {expected} grid fits of the datasets "
                "it ran are missing; the selections below come from partial grids. Finish it "
                "with `topkbench sweep` (same overrides)."
            )
    unfinished = int((sel["status"] == "missing").sum()) if n_sel else 0
    if unfinished:
        banners.append(
            f"> **Incomplete sweep:** {unfinished} of {n_sel} selected models have no test "
            "record (the refit stage is missing or unfinished); their cells are empty. Finish "
            "it with `topkbench sweep` (same overrides)."
        )
    head = [*banners, ""] if banners else []
    skipped = datasets_not_run(exp, records)
    if skipped:
        notes.append(
            f"Not run (no records of this configuration; their files were missing, or the "
            f"sweep was not run on them): {', '.join(skipped)}."
        )
    rep.markdown = "\n".join(head) + rep.markdown + "\n".join(notes) + "\n"
    rep.incomplete = bool(head)
    return rep
