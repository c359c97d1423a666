"""``report.html``: one self-contained results page per experiment (no network to view it).

The page holds the report's table (values from ``report.csv``, the paper's numbers beside ours,
Δ coloured by size, uncertified selections marked), the report's notes and protocol footers,
and static plots rendered by matplotlib to inline SVG -- no script, no external file, nothing
to load, so the page opens from disk on an offline machine and shows no console errors
(matplotlib already draws the benches' figures; a JavaScript renderer would need vendoring):

* first the report's own tables and notes (its Markdown), then every value of ``report.csv``;
* per dataset, the validation metric against C (log axis) for every row, the selected C
  marked, one panel per RBF width; test accuracy against k (top-k layouts) or the partition
  metrics against the threshold delta, the selected delta marked (multilabel); ours against
  the paper's value for every cell, with the diagonal;
* solver health: the distribution of final relative gaps and of epochs per fit, budget stops
  in their own colour;
* provenance: code version, data file digests, machines, fit time, the command line.

``figures_dir`` also writes every plot as PNG and PDF for papers.
"""

from __future__ import annotations

import html
import io
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from topkbench.atomic import replace_file, write_text

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table.report { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
table.report th, table.report td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
table.report th { background: #f3f3f3; }
td.d0 { background: #e6f4e6; } td.d1 { background: #fff5d6; } td.d2 { background: #fbe0dc; }
td.uncertified { color: #b00020; font-weight: bold; }
figure.plot { display: inline-block; margin: 0.5em; vertical-align: top; }
figure.plot figcaption { font-size: 0.8em; color: #555; max-width: 460px; }
p, blockquote { font-size: 0.85em; max-width: 60em; }
blockquote { background: #fff3cd; padding: 0.5em; }
dl.provenance dt { font-weight: bold; } dl.provenance dd { margin: 0 0 0.5em 1.5em; }
"""

# |ours - paper| in points below which a cell is green, then yellow; red above
DIFF_BANDS = (1.0, 3.0)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


class _Plots:
    """Collects figures as inline SVG (and PNG/PDF files when ``figures_dir`` is given)."""

    def __init__(self, figures_dir: Path | None):
        self.figures_dir = figures_dir
        self.written: list[Path] = []

    def add(self, fig, name: str, caption: str) -> str:
        import matplotlib.pyplot as plt

        fig.tight_layout(rect=(0, 0, 1, 0.95) if fig._suptitle is not None else None)
        svg = _svg(fig)
        if self.figures_dir is not None:
            self.figures_dir.mkdir(parents=True, exist_ok=True)
            for ext in ("png", "pdf"):
                path = self.figures_dir / f"{name}.{ext}"
                fig.savefig(path, bbox_inches="tight", dpi=150)
                self.written.append(path)
        plt.close(fig)
        return (
            f'<figure class="plot" id="{html.escape(name)}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )


def _metric_column(records: pd.DataFrame) -> str | None:
    """The validation column the plots against C show: top-1 accuracy, else the first
    validation metric the records carry."""
    cols = [c for c in records.columns if c.startswith("val_")]
    return "val_top1" if "val_top1" in cols else (cols[0] if cols else None)


def _c_curves(records, selected, dataset, plots) -> str:
    """Validation metric against C per row; one panel per RBF width theta when the rows have
    one (small multiples), the selected C ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col = _metric_column(records)
    part = records[(records["dataset"] == dataset) & (records["fold"] != "refit")]
    if col is None or part.empty or part[col].isna().all():
        return ""
    part = part[pd.to_numeric(part[col], errors="coerce").notna()]
    thetas = [None]
    if "theta" in part.columns and part["theta"].notna().any():
        thetas = sorted(part["theta"].dropna().unique())
        if part["theta"].isna().any():
            thetas = [None, *thetas]
    ncol = min(len(thetas), 3)
    nrow = -(-len(thetas) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.4 if ncol == 1 else 4.2 * ncol, 4.0 * nrow),
                             squeeze=False, sharey=True)  # fmt: skip
    for ax, theta in zip(axes.ravel(), thetas, strict=False):
        sub = part[part["theta"].isna()] if theta is None and "theta" in part else part
        if theta is not None:
            sub = part[np.isclose(part["theta"].astype(float), theta)]
        for row, grp in sub.groupby("row", sort=False):
            curve = grp.groupby("C")[col].mean()
            ax.semilogx(curve.index, curve.values, marker=".", label=str(row))
            sel = selected[(selected["dataset"] == dataset) & (selected["row"] == row)]
            if "k" in sel.columns and "metric" not in sel.columns:
                sel = sel[sel["k"] == sel["k"].min()]
            if theta is not None and "theta" in sel.columns:
                sel = sel[np.isclose(sel["theta"].astype(float), theta)]
            for C in sel["C"].dropna().unique():
                if C in curve.index:
                    ax.plot([C], [curve.loc[C]], marker="o", markersize=9, fillstyle="none",
                            color=ax.lines[-1].get_color())  # fmt: skip
        ax.set_title("linear" if theta is None else f"RBF theta = {theta:g}", fontsize=9)
        ax.set_xlabel("C (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in axes.ravel()[len(thetas) :]:
        ax.axis("off")
    axes[0][0].set_ylabel(col.removeprefix("val_"))
    fig.suptitle(f"{dataset}: validation {col.removeprefix('val_')} against C")
    return plots.add(
        fig, f"{dataset}-val-vs-C",
        f"Mean over folds and draws of the validation {col.removeprefix('val_')} at every C the "
        "sweep fitted (grid extensions included); a ring marks the selected C.",
    )  # fmt: skip


def _delta_curves(exp, records, selected, dataset, plots) -> str:
    """Multilabel: each partition metric of the selected models (test split) against the
    threshold delta, the selected delta marked; one panel per metric."""
    import matplotlib.pyplot as plt

    from topkbench.metrics.multilabel import PARTITION_METRICS, delta_grid

    metrics = [m for m in exp.metrics if m in PARTITION_METRICS]
    if not metrics or "metric" not in selected.columns:
        return ""
    deltas = delta_grid(exp.delta_grid)
    ncol = min(len(metrics), 3)
    nrow = -(-len(metrics) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
    drawn = False
    for ax, metric in zip(axes.ravel(), metrics, strict=False):
        col = f"test_{metric}_grid"
        sel = selected[(selected["dataset"] == dataset) & (selected["metric"] == metric)]
        for _, s in sel[sel["draw"] == sel["draw"].min()].iterrows():
            recs = records[(records["dataset"] == dataset) & (records["row"] == s["row"])
                           & np.isclose(records["C"].astype(float), s["C"])
                           & records["fold"].isin(["refit", "val"])]  # fmt: skip
            if col not in recs or recs.empty:
                continue
            curve = np.asarray(recs[col].iloc[0], dtype=float)
            if curve.shape != deltas.shape:
                continue
            ax.plot(deltas, curve, label=str(s["row"]))
            if np.isfinite(s["delta"]):
                q = int(np.argmin(np.abs(deltas - s["delta"])))
                ax.plot([deltas[q]], [curve[q]], marker="o", fillstyle="none", markersize=8,
                        color=ax.lines[-1].get_color())  # fmt: skip
            drawn = True
        if deltas.min() > 0:
            ax.set_xscale("log")
        else:  # the Mulan grid: -10^e, 0, 10^e
            ax.set_xscale("symlog", linthresh=1e-6)
            ax.set_xticks([-1.0, -1e-3, 0.0, 1e-3, 1.0], ["-1", "-1e-3", "0", "1e-3", "1"])
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("threshold delta")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(metrics) :]:
        ax.axis("off")
    if not drawn:
        plt.close(fig)
        return ""
    fig.suptitle(f"{dataset}: partition metrics against delta (test split)")
    return plots.add(
        fig, f"{dataset}-metrics-vs-delta",
        "Each selected model's partition metric on the test split at every threshold of the "
        "grid; a ring marks the delta selected on the validation folds.",
    )  # fmt: skip


def _long(table: pd.DataFrame) -> pd.DataFrame:
    """The report table as (dataset?, row, k, ours_mean, paper) rows: the datasets layout has
    that form; the rows layout (Table 3) has ``top{k}_mean`` / ``top{k}_paper`` columns."""
    import re

    if "ours_mean" in table.columns:
        return table
    parts = []
    for col in table.columns:
        hit = re.fullmatch(r"top(\d+)_mean", str(col))
        if hit:
            k = int(hit.group(1))
            paper = table.get(f"top{k}_paper", pd.Series(np.nan, index=table.index))
            parts.append(pd.DataFrame({"row": table["row"], "k": k, "ours_mean": table[col],
                                       "paper": paper}))  # fmt: skip
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _topk_curves(table, dataset, plots) -> str:
    import matplotlib.pyplot as plt

    table = _long(table)
    if not {"k", "ours_mean", "row"} <= set(table.columns):
        return ""
    part = table[table["dataset"] == dataset] if "dataset" in table.columns else table
    part = part.dropna(subset=["ours_mean"])
    if part.empty or part["k"].nunique() < 2:
        return ""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row, grp in part.groupby("row", sort=False):
        grp = grp.sort_values("k")
        ax.plot(grp["k"], grp["ours_mean"], marker="o", label=str(row))
    ax.set_xlabel("k")
    ax.set_ylabel("test top-k accuracy (%)")
    ax.set_title(f"{dataset}: test top-k accuracy against k")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return plots.add(fig, f"{dataset}-topk-vs-k", "Selected models' test top-k accuracy.")


def _scatter(table, dataset, plots) -> str:
    import matplotlib.pyplot as plt

    table = _long(table)
    if not {"ours_mean", "paper"} <= set(table.columns):
        return ""
    part = table[table["dataset"] == dataset] if "dataset" in table.columns else table
    part = part.dropna(subset=["ours_mean", "paper"])
    if part.empty:
        return ""
    fig, ax = plt.subplots(figsize=(4.6, 4.6))
    ax.scatter(part["paper"], part["ours_mean"], s=14)
    lo = float(min(part["paper"].min(), part["ours_mean"].min()))
    hi = float(max(part["paper"].max(), part["ours_mean"].max()))
    ax.plot([lo, hi], [lo, hi], color="gray", lw=1)
    ax.set_xlabel("paper")
    ax.set_ylabel("ours")
    ax.set_title(f"{dataset}: ours against the paper")
    ax.grid(True, alpha=0.3)
    return plots.add(fig, f"{dataset}-ours-vs-paper", "Every cell with a published value.")


def _health(records, plots) -> str:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    stopped = records["status"] != "converged"
    gaps = records["relative_gap"].astype(float)
    ok = np.isfinite(gaps) & (gaps > 0)
    bins = np.linspace(np.log10(gaps[ok].min()), np.log10(gaps[ok].max()) + 1e-9, 30) if (
        ok.any()
    ) else 10  # fmt: skip
    for mask, label, color in ((~stopped, "converged", "tab:blue"),
                               (stopped, "budget stop", "tab:red")):  # fmt: skip
        g = gaps[mask & ok]
        if len(g):
            a1.hist(np.log10(g), bins=bins, label=f"{label} ({int(mask.sum())})", color=color,
                    alpha=0.7)  # fmt: skip
        a2.hist(records.loc[mask, "epochs"], bins=30, label=label, color=color, alpha=0.7)
    a1.set_xlabel("log10 final relative duality gap")
    a1.set_ylabel("fits")
    a1.legend(fontsize=7)
    a2.set_xlabel("epochs (iterations) per fit")
    a2.legend(fontsize=7)
    fig.suptitle(f"Solver health: {len(records)} fits")
    return plots.add(
        fig, "solver-health",
        "Final relative gaps (convex fits) and epochs of every fit of this configuration; "
        "budget stops in red.",
    )  # fmt: skip


def _cell(value, column: str, bands: bool = True) -> str:
    if isinstance(value, (float, np.floating)):
        text = "—" if not np.isfinite(value) else f"{value:.4g}"
        attr = f' data-value="{float(value)!r}"'
    else:
        text = html.escape(str(value))
        attr = f' data-value="{html.escape(str(value))}"'
    cls = ""
    number = isinstance(value, (float, np.floating)) and np.isfinite(value)
    if bands and column == "diff" and number:
        band = int(np.searchsorted(DIFF_BANDS, abs(value), side="right"))
        cls = f' class="d{band}"'
    elif column == "uncertified" and value and value != 0:
        cls = ' class="uncertified"'
    return f"<td{cls}{attr}>{text}</td>"


def _inline(text: str) -> str:
    """A line escaped, then the reports' inline Markdown (``**bold**``, ```code```) as HTML;
    escaping first keeps any name in the text inert."""
    import re

    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def _markdown(text: str, bands: bool = True) -> str:
    """The report's Markdown as HTML: headings, pipe tables (Δ cells coloured by their size
    as distances to the paper where ``bands``, cells marked uncertified in red), quotes and
    paragraphs; the only Markdown the reports write."""
    from topkbench.experiments.render import UNCERTIFIED

    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, body = rows[0], [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]
            cells = "".join(f"<th>{html.escape(c)}</th>" for c in head)
            trs = [f"<tr>{cells}</tr>"]
            for r in body:
                tds = []
                for name, c in zip(head, r, strict=False):
                    cls = ""
                    if name == "Δ" and bands:
                        try:
                            band = int(np.searchsorted(DIFF_BANDS, abs(float(c)), side="right"))
                            cls = f' class="d{band}"'
                        except ValueError:
                            pass
                    elif UNCERTIFIED in c:
                        cls = ' class="uncertified"'
                    tds.append(f"<td{cls}>{html.escape(c)}</td>")
                trs.append("<tr>" + "".join(tds) + "</tr>")
            out.append('<table class="report paper">' + "".join(trs) + "</table>")
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith(">"):
            out.append(f"<blockquote>{_inline(line.lstrip('> '))}</blockquote>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def _table(table: pd.DataFrame, bands: bool = True) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join(
        "<tr>"
        + "".join(_cell(v, c, bands) for c, v in zip(table.columns, row, strict=True))
        + "</tr>"
        for row in table.itertuples(index=False)
    )
    return f'<table class="report" id="report-table"><tr>{head}</tr>{body}</table>'


def _provenance(records: pd.DataFrame) -> str:
    import topkbench

    def values(col):
        if col not in records:
            return "—"
        found = sorted({str(v) for v in records[col].dropna()} - {"{}"})
        return ", ".join(found) or "none (generated data)"

    items = {
        "topkbench": f"{topkbench.__version__} (git {values('git_rev')})",
        "data files (SHA-256)": values("data_sha256"),
        "machines": values("host"),
        "python / numpy / scipy / numba": " / ".join(
            values(c) for c in ("python", "numpy", "scipy", "numba")
        ),
        "fits, summed training time": f"{len(records)} fits, "
        f"{float(records['train_seconds'].sum()):.1f} s",
        "finished": f"{records['finished_at'].min()} … {records['finished_at'].max()}"
        if "finished_at" in records else "—",
        "page written by": " ".join(sys.argv) + f" on {platform.node()}",
    }  # fmt: skip
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items.items())
    return f'<dl class="provenance">{rows}</dl>'


def write_html_report(exp, rep, records: pd.DataFrame, path: Path,
                      figures_dir: Path | None = None) -> list[Path]:  # fmt: skip
    """Write ``report.html`` for the report ``rep`` of ``exp`` built from ``records`` (the
    configuration's own); returns the files written (the page, then any figure files)."""
    plots = _Plots(figures_dir)
    table = rep.table
    parts = [_markdown(rep.markdown),
             "<details><summary>Every value of report.csv</summary>", _table(table),
             "</details>"]  # fmt: skip
    datasets = list(dict.fromkeys(records["dataset"]))
    for ds in datasets:
        figs = [
            _c_curves(records, rep.selected, ds, plots),
            _topk_curves(table, ds, plots),
            _delta_curves(exp, records, rep.selected, ds, plots),
            _scatter(table, ds, plots),
        ]
        figs = [f for f in figs if f]
        if figs:
            parts += [f"<h2>{html.escape(str(ds))}</h2>", *figs]
    parts += ["<h2>Solver health</h2>", _health(records, plots),
              "<h2>Provenance</h2>", _provenance(records)]  # fmt: skip
    return [_write_page(exp.title, parts, path), *plots.written]


def _write_page(title: str, parts: list[str], path: Path) -> Path:
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )
    return replace_file(Path(path), write_text(page))


def write_table_page(title: str, rep, records: pd.DataFrame, path: Path) -> Path:
    """A page of the report's tables and notes, every value of ``report.csv`` and the
    provenance of ``records``, for layouts without C paths (the fine-tuning protocol, whose
    Δ are differences to its own reference network, not distances to the paper: uncoloured)."""
    parts = [_markdown(rep.markdown, bands=False),
             "<details><summary>Every value of report.csv</summary>",
             _table(rep.table, bands=False), "</details>",
             "<h2>Provenance</h2>", _provenance(records)]  # fmt: skip
    return _write_page(title, parts, path)
