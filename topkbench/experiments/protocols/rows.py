"""Rows layout (TPAMI Table 3): one table, rows = methods, per k our mean ± std and min–max
over draws beside the paper's value; extra blocks compare variants with a named paper row."""

from __future__ import annotations

import numpy as np
import pandas as pd

from topkbench.experiments.render import UNCERTIFIED, TableReport, _fmt, ent_tr_note


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
                    f"top{k}_uncertified": int((sel["status"] != "converged").sum()),
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
                mark = UNCERTIFIED if r.get(f"top{k}_uncertified", 0) else ""
                cells.append(f"{r[f'top{k}_mean']:.1f} ± {r[f'top{k}_std']:.1f}{mark}")
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


def build_rows_report(exp, records, selected, published) -> TableReport:
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
    draws = sorted(records["draw"].unique())
    lines += [
        f"Test accuracy (%) of the C selected per column on the {exp.selection} split, over "
        f"{len(draws)} draw(s) (data seeds {exp.seed}..{exp.seed + len(draws) - 1}); "
        "std is the sample std across draws; Δ = our mean − paper.",
        f"Solver: SDCA to relative duality gap ε = {exp.eps:g} (budget {exp.max_epochs} epochs"
        + (f", {exp.time_limit:g} s" if exp.time_limit else "")
        + " per fit; a selected fit stopped on the budget is continued "
        f"within {exp.certify_time_limit:g} s). {n_conv}/{n_rec} fits reached ε.",
        "Rows marked 'not run' are in the paper but not in this experiment's method list.",
    ]
    lines += ent_tr_note(exp)
    if exp.blocks:
        lines.append(
            "In extra blocks, the paper column shows the published value of the row named in "
            "brackets, and Δ is our mean minus that value."
        )
    if n_rec > n_conv:
        worst = records.loc[records["status"] != "converged"]
        gaps = worst["relative_gap"].astype(float)
        convex = gaps[np.isfinite(gaps)]
        lines.append(
            f"Fits stopped on the budget had C ≥ {worst['C'].min():g} ("
            + (f"largest relative gap {convex.max():.2g}" if len(convex) else "")
            + ("; " if len(convex) and len(convex) < len(gaps) else "")
            + (
                f"{len(gaps) - len(convex)} nonconvex Ent_tr fits, which have no gap"
                if len(convex) < len(gaps)
                else ""
            )  # fmt: skip
            + ")."
        )
    return TableReport("\n".join(lines) + "\n", table, selected)
