"""What every report layout shares: the report value, published numbers, number and LaTeX
formatting, the per-dataset Markdown blocks and the files written."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from topkbench.atomic import replace_files, write_text
from topkbench.config import ExperimentConfig


def load_published(name: str) -> pd.DataFrame:
    """Published numbers (``row, k, value`` in %) from ``topkbench/published/<name>``."""
    with resources.files("topkbench.published").joinpath(name).open() as fh:
        return pd.read_csv(fh, comment="#")


@dataclass
class TableReport:
    markdown: str
    table: pd.DataFrame
    selected: pd.DataFrame
    latex: str | None = None
    incomplete: bool = False


def _fmt(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.1f}"


def markdown_blocks(exp, table, titles, columns, cells) -> list[str]:
    """One Markdown table per dataset that has results: rows = methods, a column group
    ``(title, paper, Δ)`` per ``columns`` entry ``(key, title)``; ``cells(t, row, key)`` gives
    the three cells from the dataset's part ``t`` of the long ``table``."""
    lines = [f"# {exp.title}", ""]
    for ds in exp.datasets:
        t = table[table["dataset"] == ds.name]
        if not t["draws"].any():
            continue
        header = ["Method"]
        for _, title in columns:
            header += [title, "paper", "Δ"]
        lines += [f"## {titles[ds.name]}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        for row in t["row"].unique():
            out = [row]
            for key, _ in columns:
                out += list(cells(t, row, key))
            lines.append("| " + " | ".join(out) + " |")
        lines.append("")
    return lines


_TEX_ESCAPES = {
    "&": r"\&",
    "%": r"\%",
    "_": r"\_",
    "#": r"\#",
    "^": r"\^{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "—": "--",
}


def _tex(text: str) -> str:
    """Escape for LaTeX; the paper's row names' ``^X`` / ``_X`` become super/subscripts."""
    import re

    parts = re.split(r"([\^_][A-Za-z0-9]+)", str(text))
    out = []
    for part in parts:
        if re.fullmatch(r"[\^_][A-Za-z0-9]+", part):
            out.append(f"${part[0]}{{\\mathrm{{{part[1:]}}}}}$")
        else:
            out.append("".join(_TEX_ESCAPES.get(ch, ch) for ch in part))
    return "".join(out)


UNCERTIFIED = "†"


def write_report(exp: ExperimentConfig, rep: TableReport) -> list[Path]:
    """Write ``report.md``, ``report.csv``, ``selected.csv`` (and ``report.tex``) under the
    experiment's results directory, all of them or none (:func:`topkbench.atomic.
    replace_files`: a full disk leaves the previous report whole)."""
    out = Path(exp.results_dir) / exp.name
    files = [
        (out / "report.md", write_text(rep.markdown)),
        (out / "report.csv", lambda tmp: rep.table.to_csv(tmp, index=False)),
        (out / "selected.csv", lambda tmp: rep.selected.to_csv(tmp, index=False)),
    ]
    if rep.latex is not None:
        files.append((out / "report.tex", write_text(rep.latex)))
    return replace_files(files)


def exp_row_names(exp: ExperimentConfig) -> set[str]:
    return {r.row for r in exp.rows}


def ent_tr_note(exp: ExperimentConfig) -> list[str]:
    """The footer line on the nonconvex top-k Ent_tr rows: which solver each used, from where."""
    from topkbench.losses.registry import get_method

    rows = [r for r in exp.rows if get_method(r.method).solver == "lbfgs"]
    if not rows:
        return []
    start = (
        "the LR^Multi model selected for the row's k (TPAMI §6.2), retrained on each fold or "
        "on all of train"
        if exp.ent_tr_init == "selected"
        else "the LR^Multi solution at the same C"
    )
    gd = [r.row for r in rows if r.solver == "gd"]
    lbfgs = [r.row for r in rows if r.solver != "gd"]
    parts = []
    if gd:
        parts.append(
            f"{', '.join(gd)}: the authors' gradient descent (Armijo line search; stops at "
            "||grad F||_2 <= 1e-3 or after 1,000 iterations, as the paper's numbers were made)"
        )
    if lbfgs:
        parts.append(
            f"{', '.join(lbfgs)}: L-BFGS until the largest gradient entry falls by ε = {exp.eps:g}"
        )
    return [
        "Nonconvex top-k Ent_tr, from " + start + ". " + "; ".join(parts) + ". A local "
        "optimum: no duality gap exists, and 'converged' means the solver's gradient test."
    ]


def cell_stats(values, selected: pd.DataFrame, paper: float) -> dict[str, object]:
    """One table cell of ours against the paper: mean and sample std over the draws' finite
    values, their count, how many selected models are not certified, the paper and Δ."""
    t = np.asarray(values, dtype=np.float64)
    t = t[np.isfinite(t)]
    mean = t.mean() if len(t) else np.nan
    return {
        "ours_mean": mean,
        "ours_std": t.std(ddof=1) if len(t) > 1 else (0.0 if len(t) else np.nan),
        "draws": len(t),
        "uncertified": int((selected["status"] != "converged").sum()) if len(selected) else 0,
        "paper": paper,
        "diff": mean - paper,
    }
