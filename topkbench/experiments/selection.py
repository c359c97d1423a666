"""Selection rules (DESIGN §7), shared by the sweep's later stages and the report.

Which records belong to a configuration (:func:`current_records`), the validation curves and
their best points, and what a protocol selects (:func:`selected_points`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topkbench.config import ExperimentConfig, SweepRow
from topkbench.experiments.plan import (
    REFIT,
    VAL,
    init_row,
    record_spec,
    selection_folds,
)
from topkbench.experiments.store import spec_key

log = logging.getLogger(__name__)


def mean_validation(records: pd.DataFrame, folds: Iterable[str], ks) -> pd.DataFrame:
    """Per C: the mean over ``folds`` of held-out top-k accuracy (only C values with all folds).

    Records are summed in fold order, so the means do not depend on the order of the store.
    """
    folds = list(folds)
    sel = records[records["fold"].isin(folds)]
    cols = [f"val_top{k}" for k in ks if f"val_top{k}" in sel]
    if sel.empty or not cols:
        return pd.DataFrame(columns=["C", *cols])
    # rows with a k or gamma grid (Kato Table 1) select those too: one point per (C, k, gamma)
    keys = ["C"] + [h for h in ("k", "gamma") if h in sel and sel[h].nunique() > 1]
    sel = sel.sort_values([*keys, "fold"], kind="stable")
    g = sel.groupby(keys)
    agg = g[cols].mean()
    agg = agg[g["fold"].nunique() == len(folds)]
    return agg.reset_index().sort_values(keys, kind="stable")


TIE_TOL = 1e-9  # accuracies are multiples of 1/n: closer means are ties


def best_point(curve: pd.DataFrame, k: int, keys=("C", "k", "gamma")) -> dict[str, float] | None:
    """The point (``C``, and ``k`` / ``gamma`` for rows with such grids; or the columns
    ``keys`` name) with the best mean validation top-k accuracy; ties (within TIE_TOL) go to
    the smallest C (the strongest regularization), then the smallest k, then the smallest
    gamma (the smallest values of ``keys`` in their order).  None where no point has one."""
    col = f"val_top{k}"
    if curve.empty or col not in curve:
        return None
    keys = [h for h in keys if h in curve]
    c = curve.sort_values(keys, kind="stable")
    vals = c[col].to_numpy(dtype=float)
    if not np.isfinite(vals).any():
        return None
    i = int(np.flatnonzero(vals >= np.nanmax(vals) - TIE_TOL)[0])
    return {h: float(c[h].iloc[i]) for h in keys}


def best_C(curve: pd.DataFrame, k: int) -> float | None:
    """The C of :func:`best_point`."""
    p = best_point(curve, k)
    return None if p is None else p["C"]


def point_row(row: SweepRow, point: dict[str, float]) -> SweepRow:
    """The row's variant at a selected point (its own k and gamma when they are fixed)."""
    return dataclasses.replace(
        row, k=int(point.get("k", row.k)), gamma=float(point.get("gamma", row.gamma))
    )


@dataclass(frozen=True)
class Selected:
    """The C values a protocol selected for one variant (k, gamma, theta) of a row."""

    dataset: int
    draw: int
    row: SweepRow  # the variant
    theta: float | None
    Cs: tuple[float, ...]
    folds: tuple[str, ...]  # the selection folds
    grid: tuple[float, ...]  # the C values the selection saw (the refit path walks them)


def selected_points(
    exp: ExperimentConfig, records: pd.DataFrame, init: dict[tuple, float] | None = None
) -> list[Selected]:
    """What the selection rule picks from ``records``: per (dataset, draw, row, variant) the
    selected C values (top-k: per column k; multilabel: per metric, DESIGN §7)."""
    out: list[Selected] = []
    if records.empty:
        return out
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        recs_ds = records[records["dataset"] == ds.name]
        for draw in range(exp.draws):
            for row in exp.rows:
                recs = recs_ds[(recs_ds["draw"] == draw) & (recs_ds["row"] == row.row)]
                if recs.empty:
                    continue
                recs = recs[recs["fold"].isin(folds)]
                if exp.multilabel:
                    from topkbench.experiments.selection_multilabel import refit_points
                    from topkbench.metrics.multilabel import delta_grid

                    points = refit_points(
                        recs, folds, exp.metrics, delta_grid(exp.delta_grid), exp.threshold_rule
                    )
                    for (theta, k), Cs in sorted(
                        points.items(), key=lambda t: (t[0][0] or 0.0, t[0][1])
                    ):
                        at = recs["k"] == k
                        if theta is not None:
                            at &= np.isclose(recs["theta"].astype(float), theta, rtol=1e-12)
                        grid = tuple(sorted(set(recs.loc[at, "C"].astype(float))))
                        variant = dataclasses.replace(row, k=k)
                        out.append(
                            Selected(di, draw, variant, theta, tuple(sorted(Cs)), folds, grid)
                        )
                    continue
                curve = mean_validation(recs, folds, exp.ks)
                by_variant: dict[tuple[int, float], set[float]] = {}
                for k in exp.ks:
                    p = best_point(curve, k)
                    if p is not None:
                        v = point_row(row, p)
                        by_variant.setdefault((v.k, v.gamma), set()).add(p["C"])
                for (kt, g), Cs in sorted(by_variant.items()):
                    at = np.ones(len(curve), dtype=bool)
                    for h, v in (("k", kt), ("gamma", g)):
                        if h in curve:
                            at &= curve[h].to_numpy() == v
                    grid = tuple(sorted(set(curve.loc[at, "C"].astype(float))))
                    variant = dataclasses.replace(row, k=kt, gamma=g)
                    out.append(Selected(di, draw, variant, None, tuple(sorted(Cs)), folds, grid))
    return out


def ent_tr_init_Cs(
    exp, records: pd.DataFrame, lr: SweepRow, rows, quiet=False
) -> dict[tuple, float]:
    """Per (dataset, draw, Ent_tr row): the C selected for LR^Multi's top-k, k of the row."""
    out = {}
    for di, ds in enumerate(exp.datasets):
        folds = selection_folds(exp, di)
        for draw in range(exp.draws):
            recs = records[
                (records["dataset"] == ds.name)
                & (records["draw"] == draw)
                & (records["row"] == lr.row)
            ] if not records.empty else records  # fmt: skip
            curve = mean_validation(recs, folds, sorted({*exp.ks, *(r.k for r in rows)}))
            for row in rows:
                C = best_C(curve, row.k)
                if C is None:
                    if quiet:
                        continue
                    log.error("%s draw %d: no LR^Multi selection for %s; it starts from "
                              "LR^Multi at its own C", ds.name, draw, row.row)  # fmt: skip
                    continue
                out[(di, draw, row.row)] = C
    return out


def current_records(exp: ExperimentConfig, records: pd.DataFrame) -> pd.DataFrame:
    """The records of ``exp``'s configuration (DESIGN §8).

    A record is kept when its stored key is the key :func:`record_spec` gives its coordinates
    under ``exp``, its (k, gamma) is one of its row's variants and its theta one of the grid's
    (so records of other solver settings, data file contents, row definitions or code versions
    are left out), and, for Ent_tr rows started from the selected LR^Multi, its init_C is the
    current selection.  Where a dataset's files are not on this machine (a report elsewhere),
    the digests the records carry stand in for them; ``records.attrs["unverified"]`` names
    those datasets.
    """
    from topkbench.data.files import missing_files

    if records.empty:
        return records
    rows = {r.row: r for r in exp.rows}
    datasets = {d.name: d for d in exp.datasets}
    absent = {d.name for d in exp.datasets if missing_files(d)}
    keep = np.zeros(len(records), dtype=bool)
    for i, rec in enumerate(records.to_dict("records")):
        row, ds = rows.get(rec.get("row")), datasets.get(rec.get("dataset"))
        if row is None or ds is None:
            continue
        variant = dataclasses.replace(row, k=int(rec["k"]), gamma=float(rec["gamma"]))
        if variant not in row.variants():
            continue
        init_C, theta = (_opt_float(rec.get(h)) for h in ("init_C", "theta"))
        if (theta is None) != (row.kernel != "rbf") or (
            theta is not None and not np.isclose(exp.theta_values, theta, rtol=1e-12).any()
        ):
            continue
        digests = rec.get("data_sha256") if ds.name in absent else None
        if ds.name in absent and not isinstance(digests, dict):
            continue
        spec = record_spec(exp, ds, variant, int(rec["draw"]), rec["fold"],
                           _opt_float(rec["C"]), init_C, theta, digests)  # fmt: skip
        keep[i] = spec_key(spec) == rec["key"]
    out = records[keep].reset_index(drop=True)
    lr = init_row(exp)
    dependent = tuple(r for r in exp.rows if lr is not None and r.method == "topk_ent_tr")
    if dependent and not out.empty:
        init = ent_tr_init_Cs(exp, out, lr, dependent, quiet=True)
        ok = np.ones(len(out), dtype=bool)
        for i, rec in enumerate(out.to_dict("records")):
            if rec["row"] in {r.row for r in dependent}:
                di = next(j for j, d in enumerate(exp.datasets) if d.name == rec["dataset"])
                want = init.get((di, int(rec["draw"]), rec["row"]))
                ok[i] = _opt_float(rec.get("init_C")) == want
        out = out[ok].reset_index(drop=True)
    out.attrs["unverified"] = sorted(absent & set(out["dataset"])) if not out.empty else []
    return out


def _opt_float(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def select_per_k(records: pd.DataFrame, exp: ExperimentConfig) -> pd.DataFrame:
    """One row per (dataset, row, draw, k): the selected C and its test accuracy (in %).

    C maximizes the mean held-out top-k accuracy over the selection folds (the val split, or
    the K cross-validation folds; ties go to the smallest C); the test accuracy comes from the
    val-path record at that C, or from the refit record for cross-validated datasets.
    """
    out = []
    for di, ds in enumerate(exp.datasets):
        recs_ds = records[records["dataset"] == ds.name]
        folds = selection_folds(exp, di)
        test_fold = VAL if folds == (VAL,) else REFIT
        for (row, draw), grp in recs_ds.groupby(["row", "draw"], sort=False):
            curve = mean_validation(grp, folds, exp.ks)
            tests = grp[grp["fold"] == test_fold]
            for k in exp.ks:
                p = best_point(curve, k)
                if p is None:
                    continue
                C = p["C"]
                at = tests["C"] == C
                for h in ("k", "gamma"):
                    if h in p:
                        at &= tests[h] == p[h]
                hits = tests[at]
                hit = hits.iloc[0] if len(hits) else None
                col = f"test_top{k}"
                test = 100.0 * hit[col] if hit is not None and col in hit else np.nan
                out.append(
                    {
                        "dataset": ds.name,
                        "row": row,
                        "draw": int(draw),
                        "k": k,
                        "C": C,
                        "k_trained": int(p.get("k", hit["k"] if hit is not None else k)),
                        "gamma": float(p.get("gamma", hit["gamma"] if hit is not None else 0.0)),
                        "C_on_boundary": C in (curve["C"].min(), curve["C"].max()),
                        "val": 100.0 * _curve_value(curve, p, f"val_top{k}"),
                        "test": test,
                        "status": hit["status"] if hit is not None else "missing",
                        "relative_gap": hit["relative_gap"] if hit is not None else np.nan,
                    }
                )
    return pd.DataFrame(out)


def _curve_value(curve: pd.DataFrame, point: dict[str, float], col: str) -> float:
    at = np.ones(len(curve), dtype=bool)
    for h, v in point.items():
        at &= curve[h].to_numpy() == v
    return float(curve.loc[at, col].iloc[0])
