"""Multilabel report layout (TPAMI Tables 7/9): one block per dataset, rows = methods, one column
group per metric with ours, the paper's value and the difference.

Selection (DESIGN §7, :mod:`topkbench.experiments.selection_multilabel`): every metric picks
its own C (and theta, and the threshold delta for partition metrics) by the mean over the
selection folds; the test value is that of the refit on all of train (cross-validated
datasets) or of the val-path model (datasets with a validation split), at the selected delta.
As in the paper, RLoss and HLoss are fractions and the other metrics percentages.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from topkbench.config import ExperimentConfig
from topkbench.experiments.render import UNCERTIFIED, TableReport, _tex, cell_stats, markdown_blocks
from topkbench.experiments.selection_multilabel import (
    FoldMeans,
    matching,
    metric_column,
    select,
    uses_grid,
)
from topkbench.metrics.multilabel import LOWER_IS_BETTER, delta_grid

# the report's statement of the partition metrics' 0/0 convention (metrics.multilabel)
EMPTY_NOTE = {
    "zero": "Partition metrics count 0/0 as 0 (empty_label=zero, the paper's convention and "
    "scikit-learn's zero_division=0): F1 of a class or an example with no positive and no "
    "prediction, and accuracy of an example whose true and predicted sets are both empty.",
    "one": "Partition metrics count 0/0 as 1 (empty_label=one, Mulan's convention and "
    "scikit-learn's zero_division=1): F1 of a class or an example with no positive and no "
    "prediction, and accuracy of an example whose true and predicted sets are both empty.",
}

METRIC_TITLES = {
    "rloss": "RLoss",
    "hloss": "HLoss",
    "acc": "Acc",
    "sacc": "SAcc",
    "f1_micro": "F1 mic",
    "f1_macro": "F1 mac",
    "f1_inst": "F1 inst",
    "map": "mAP",
}


def metric_title(metric: str) -> str:
    if metric in METRIC_TITLES:
        return METRIC_TITLES[metric]
    head, _, k = metric.partition("@")
    return f"{head.upper()}@{k}"


def in_percent(metric: str) -> bool:
    """The paper prints the two losses as fractions and everything else in percent."""
    return metric not in LOWER_IS_BETTER


def _scale(metric: str, value: float) -> float:
    return 100.0 * value if in_percent(metric) else value


def _fmt(metric: str, value: float, signed: bool = False) -> str:
    if value is None or not np.isfinite(value):
        return "—" if not signed else ""
    spec = ("+" if signed else "") + (".1f" if in_percent(metric) else ".3f")
    return format(value, spec)


def select_multilabel(records: pd.DataFrame, exp: ExperimentConfig) -> pd.DataFrame:
    """One line per (dataset, row, draw, metric): the selected point and its test value."""
    from topkbench.experiments.plan import REFIT, VAL, selection_folds

    deltas = delta_grid(exp.delta_grid)
    out = []
    for di, ds in enumerate(exp.datasets):
        recs_ds = records[records["dataset"] == ds.name]
        folds = selection_folds(exp, di)
        test_fold = VAL if folds == (VAL,) else REFIT
        for (row, draw), grp in recs_ds.groupby(["row", "draw"], sort=False):
            tests = grp[grp["fold"] == test_fold]
            fm = FoldMeans(grp, folds)
            for metric in exp.metrics:
                ch = select(fm, folds, metric, deltas, exp.threshold_rule)
                if ch is None:
                    continue
                hit = matching(tests, ch.C, ch.theta, ch.k)
                test = np.nan
                col = metric_column("test", metric, exp.threshold_rule)
                if len(hit) and col in hit:
                    v = hit[col].iloc[0]
                    if uses_grid(metric, exp.threshold_rule):
                        v = np.asarray(v, dtype=float)[ch.delta_index]
                    test = float(v)
                out.append(
                    {
                        "dataset": ds.name,
                        "row": row,
                        "draw": int(draw),
                        "metric": metric,
                        "C": ch.C,
                        "theta": ch.theta,
                        "k": ch.k,
                        "delta": ch.delta,
                        "val": ch.value,
                        "test": test,
                        "status": hit["status"].iloc[0] if len(hit) else "missing",
                        "relative_gap": hit["relative_gap"].iloc[0] if len(hit) else np.nan,
                    }
                )
    return pd.DataFrame(out)


def multilabel_table(exp, selected: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Long table (dataset, row, metric): ours in the paper's units, paper value, difference."""
    rows_run = [r.row for r in exp.rows if not r.block]
    out = []
    for ds in exp.datasets:
        if len(published) and "dataset" in published:
            pub = published[published["dataset"] == ds.name]
        else:  # a single-dataset table (Tables 11 and 12)
            pub = published
        rows = list(rows_run)
        if len(pub):
            rows += [r for r in pub["row"].unique() if r not in rows]
        sel_ds = selected[selected["dataset"] == ds.name] if len(selected) else selected
        for row in rows:
            for metric in exp.metrics:
                sel = (
                    sel_ds[(sel_ds["row"] == row) & (sel_ds["metric"] == metric)]
                    if len(sel_ds)
                    else sel_ds
                )
                paper = np.nan
                if len(pub):
                    hit = pub[(pub["row"] == row) & (pub["metric"] == metric)]
                    paper = float(hit["value"].iloc[0]) if len(hit) else np.nan
                tests = [_scale(metric, v) for v in sel["test"]] if len(sel) else []
                out.append(
                    {
                        "dataset": ds.name,
                        "row": row,
                        "metric": metric,
                        **cell_stats(tests, sel, paper),
                        "run": row in rows_run,
                    }
                )
    return pd.DataFrame(out)


def _cells(t: pd.DataFrame, row: str, metric: str, draws: int) -> tuple[str, str, str]:
    r = t[(t["row"] == row) & (t["metric"] == metric)].iloc[0]
    if r["draws"]:
        ours = _fmt(metric, r["ours_mean"])
        if draws > 1:
            ours += " ± " + _fmt(metric, r["ours_std"])
        if r["uncertified"]:
            ours += UNCERTIFIED
    else:
        ours = "—" if r["run"] else "not run"
    return ours, _fmt(metric, r["paper"]), _fmt(metric, r["diff"], signed=True)


def render_markdown(exp, table, titles, draws) -> list[str]:
    columns = [(m, metric_title(m)) for m in exp.metrics]
    return markdown_blocks(exp, table, titles, columns, lambda t, row, m: _cells(t, row, m, draws))


def render_latex(exp, table, titles, draws) -> str:
    out = [f"% {exp.title} -- generated by topkbench report", ""]
    for ds in exp.datasets:
        t = table[table["dataset"] == ds.name]
        if not t["draws"].any():
            continue
        out += [
            r"\begin{table}[t]",
            r"\centering",
            r"\scriptsize",
            rf"\begin{{tabular}}{{l{'rrr' * len(exp.metrics)}}}",
            r"\toprule",
            " & ".join(
                ["Method"]
                + [rf"\multicolumn{{3}}{{c}}{{{_tex(metric_title(m))}}}" for m in exp.metrics]
            )
            + r" \\",
            " & ".join([""] + ["ours & paper & $\\Delta$"] * len(exp.metrics)) + r" \\",
            r"\midrule",
        ]
        for row in t["row"].unique():
            cells = [_tex(row)]
            for metric in exp.metrics:
                cells += [_tex(c) for c in _cells(t, row, metric, draws)]
            out.append(" & ".join(cells) + r" \\")
        out += [
            r"\bottomrule",
            r"\end{tabular}",
            rf"\caption{{{_tex(titles[ds.name])}}}",
            r"\end{table}",
            "",
        ]
    return "\n".join(out)


def build_multilabel_report(exp, records: pd.DataFrame, published: pd.DataFrame):
    selected = select_multilabel(records, exp)
    table = multilabel_table(exp, selected, published)
    draws = int(records["draw"].nunique())
    titles = {d.name: str(d.get("title", d.name)) for d in exp.datasets}
    lines = render_markdown(exp, table, titles, draws)
    protocol = []
    for di, ds in enumerate(exp.datasets):
        if ds.name not in set(records["dataset"]):
            continue
        mode = exp.selection_for(di)
        protocol.append(
            f"{ds.name}: "
            + {
                "val": "its validation split",
                "cv": f"{exp.folds}-fold CV on train (random folds), then a refit on all of train",
                "half": "one random half of train (by image), then a refit on all of train",
            }[mode]
        )
    deltas = delta_grid(exp.delta_grid)
    n_rec = len(records)
    n_conv = int((records["status"] == "converged").sum())
    lines += [
        "Test values of the hyper-parameters each metric selects for itself; RLoss and HLoss "
        "are fractions (lower is better), the other metrics percentages; Δ = ours − paper. "
        "'not run': a paper row this experiment does not train.",
        f"Selection: {'; '.join(protocol)}.",
        f"C grid {min(exp.C_values):g} … {max(exp.C_values):g} ({len(exp.C_values)} points)"
        + (
            f"; RBF theta grid {min(exp.theta_values):g} … {max(exp.theta_values):g} "
            f"({len(exp.theta_values)} points)"
            if exp.theta_values
            else ""
        )
        + (
            f"; threshold delta on the {exp.delta_grid!r} grid ({len(deltas)} points, "
            "h(x) = {y : f_y(x) >= delta}), chosen per partition metric from stored scores."
            if exp.threshold_rule == "grid"
            else "; threshold delta set on each split to match the training label cardinality "
            "(h(x) = {y : f_y(x) >= delta}; TPAMI ref. [97])."
        ),
        f"Solver: SDCA to relative duality gap ε = {exp.eps:g} (budget {exp.max_epochs} epochs"
        + (f", {exp.time_limit:g} s" if exp.time_limit else "")
        + f" per fit); {n_conv}/{n_rec} fits reached ε. Training leaves out examples whose "
        "label set is empty or complete (no ranking constraint); evaluation keeps them.",
        EMPTY_NOTE[exp.empty_label],
    ]
    if draws > 1:
        lines.append(f"Ours: mean ± sample std over {draws} draws (data seeds from {exp.seed}).")
    md = "\n".join(lines) + "\n"
    return TableReport(md, table, selected, render_latex(exp, table, titles, draws))
