"""Reports (DESIGN §8): paper table layouts with the published numbers beside ours.

Selection (DESIGN §7): for every (row, draw, k) the C with the best validation top-k accuracy
is chosen (ties go to the smallest C, i.e. the strongest regularization), and its test top-k
accuracy is reported.  Across draws we give mean +- sample std (ddof = 1) and min-max.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from topkbench.config import ExperimentConfig
from topkbench.errors import ConfigError
from topkbench.store import RecordStore


def load_published(name: str) -> pd.DataFrame:
    """Published numbers (``row, k, value`` in %) from ``topkbench/published/<name>``."""
    with resources.files("topkbench.published").joinpath(name).open() as fh:
        return pd.read_csv(fh, comment="#")


def select_per_k(records: pd.DataFrame, ks: tuple[int, ...], by: str = "val") -> pd.DataFrame:
    """One row per (row, draw, k): the selected C and its test accuracy (in %)."""
    out = []
    for (row, draw), grp in records.groupby(["row", "draw"], sort=False):
        grp = grp.sort_values("C")
        for k in ks:
            col = f"{by}_top{k}"
            if col not in grp:
                continue
            best = grp.loc[grp[col].idxmax()]  # idxmax returns the first (smallest C) on ties
            out.append(
                {
                    "row": row,
                    "draw": int(draw),
                    "k": k,
                    "C": best["C"],
                    "val": 100.0 * best[col],
                    "test": 100.0 * best[f"test_top{k}"],
                    "status": best["status"],
                    "relative_gap": best["relative_gap"],
                }
            )
    return pd.DataFrame(out)


@dataclass
class TableReport:
    markdown: str
    table: pd.DataFrame
    selected: pd.DataFrame


def _fmt(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.1f}"


def _summarize(row, block, paper_row, selected, published, ks) -> dict[str, object]:
    """Mean, std, min, max over draws of the selected test accuracy, and the paper's value."""
    entry: dict[str, object] = {"row": row, "block": block, "paper_row": paper_row}
    for k in ks:
        sel = selected[(selected["row"] == row) & (selected["k"] == k)] if len(selected) else []
        paper = np.nan
        if not published.empty:
            hit = published[(published["row"] == paper_row) & (published["k"] == k)]
            paper = float(hit["value"].iloc[0]) if len(hit) else np.nan
        if len(sel):
            t = sel["test"].to_numpy()
            entry.update(
                {
                    f"top{k}_mean": t.mean(),
                    f"top{k}_std": t.std(ddof=1) if len(t) > 1 else 0.0,
                    f"top{k}_min": t.min(),
                    f"top{k}_max": t.max(),
                    f"top{k}_draws": len(t),
                }
            )
        else:
            entry.update({f"top{k}_mean": np.nan, f"top{k}_draws": 0})
        entry[f"top{k}_paper"] = paper
        entry[f"top{k}_diff"] = entry[f"top{k}_mean"] - paper
    return entry


def _render_block(title: str, table: pd.DataFrame, ks, extra: bool) -> list[str]:
    header = ["Method"]
    for k in ks:
        paper = f"Top-{k} paper" + (" (row)" if extra else "")
        header += [f"Top-{k} ours (mean ± std)", f"Top-{k} min–max", paper, "Δ"]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    for _, r in table.iterrows():
        cells = [str(r["row"])]
        for k in ks:
            n = int(r.get(f"top{k}_draws", 0) or 0)
            if n:
                cells.append(f"{r[f'top{k}_mean']:.1f} ± {r[f'top{k}_std']:.1f}")
                cells.append(f"{r[f'top{k}_min']:.1f}–{r[f'top{k}_max']:.1f}")
            else:
                cells += ["not run", ""]
            paper = _fmt(r[f"top{k}_paper"])
            if extra and np.isfinite(r[f"top{k}_paper"]):
                paper += f" ({r['paper_row']})"
            cells.append(paper)
            d = r[f"top{k}_diff"]
            cells.append("" if not np.isfinite(d) else f"{d:+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def build_report(exp: ExperimentConfig) -> TableReport:
    store = RecordStore(exp.results_dir, exp.name)
    records = store.load()
    if records.empty:
        raise ConfigError(
            f"no records for experiment {exp.name!r} under {store.records}",
            hint=f"topkbench sweep experiment={exp.name}",
        )
    selected = select_per_k(records, exp.ks, exp.selection)
    published = load_published(exp.published) if exp.published else pd.DataFrame()
    row_specs = {r.row: r for r in exp.rows}
    main = [r.row for r in exp.rows if not r.block]
    if not published.empty:
        main += [r for r in published["row"].unique() if r not in row_specs]
    blocks = [(exp.title, "", main)]
    for name, title in exp.blocks:
        blocks.append((title, name, [r.row for r in exp.rows if r.block == name]))
    rows = []
    for _, block, names in blocks:
        for row in names:
            spec = row_specs.get(row)
            paper_row = spec.paper_row if spec is not None and spec.paper_row else row
            rows.append(_summarize(row, block, paper_row, selected, published, exp.ks))
    table = pd.DataFrame(rows)

    lines = []
    for title, block, _ in blocks:
        lines += _render_block(title, table[table["block"] == block], exp.ks, bool(block))
    n_rec = len(records)
    n_conv = int((records["status"] == "converged").sum())
    n_sel = len(selected)
    n_sel_conv = int((selected["status"] == "converged").sum()) if n_sel else 0
    draws = sorted(records["draw"].unique())
    lines += [
        f"Test accuracy (%) of the C selected per column on the {exp.selection} split, over "
        f"{len(draws)} draw(s) (data seeds {exp.seed}..{exp.seed + len(draws) - 1}); "
        "std is the sample std across draws; Δ = our mean − paper.",
        f"Solver: SDCA to relative duality gap ε = {exp.eps:g} (budget {exp.max_epochs} epochs, "
        f"{exp.time_limit} s per fit). {n_conv}/{n_rec} fits reached ε; "
        f"{n_sel_conv}/{n_sel} selected models reached ε"
        + (
            "."
            if n_sel_conv == n_sel
            else " (the others stopped on the budget; their gap is recorded in the store)."
        ),
        "Rows marked 'not run' are in the paper but not in this experiment's method list.",
    ]
    from topkbench.losses.registry import get_method

    nonconvex = [r.row for r in exp.rows if get_method(r.method).solver == "lbfgs"]
    if nonconvex:
        lines.append(
            f"{', '.join(nonconvex)}: nonconvex, L-BFGS from the LR^Multi solution at the same "
            f"C until the largest gradient entry falls by ε = {exp.eps:g} (a local optimum; "
            "no duality gap exists, its 'converged' means this gradient test)."
        )
    if exp.blocks:
        lines.append(
            "In extra blocks, the paper column shows the published value of the row named in "
            "brackets, and Δ is our mean minus that value."
        )
    if n_rec > n_conv:
        worst = records.loc[records["status"] != "converged"]
        lines.append(
            f"Fits stopped on the budget had C ≥ {worst['C'].min():g} "
            f"(largest relative gap {worst['relative_gap'].max():.2g})."
        )
    return TableReport("\n".join(lines) + "\n", table, selected)


def write_report(exp: ExperimentConfig, rep: TableReport) -> list[Path]:
    out = Path(exp.results_dir) / exp.name
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.md", out / "report.csv", out / "selected.csv"]
    paths[0].write_text(rep.markdown)
    rep.table.to_csv(paths[1], index=False)
    rep.selected.to_csv(paths[2], index=False)
    return paths
