"""The fine-tuning protocol's report (TPAMI Table 6's layout): top-k test accuracy, mean ±
std over the seeds, of the reference network, of each fine-tuned row and of each classifier
trained on the reference's features, with each row's difference to the reference (the mean
over seeds of the paired differences), and the paper's Places 205 and ImageNet 2012 rows
beside as context.  Needs no torch: it reads the store."""

from __future__ import annotations

import numpy as np
import pandas as pd

from topkbench.deep.config import REFERENCE_ROW, FinetuneConfig
from topkbench.deep.protocol import (
    FINETUNE,
    REFERENCE,
    classifier_experiment,
    features_file,
    finetune_points,
    reference_keys,
)
from topkbench.errors import ConfigError
from topkbench.experiments.render import UNCERTIFIED, TableReport, load_published
from topkbench.experiments.selection import best_point
from topkbench.experiments.store import read_records

PUBLISHED_TITLES = {"places205": "Places 205", "imagenet2012": "ImageNet 2012"}


def stored_digests(cfg: FinetuneConfig, records: pd.DataFrame) -> dict[str, str] | None:
    """None where the data file is on this machine (it is hashed), else the digests its
    reference records carry (a report elsewhere; empty when there is none)."""
    from topkbench.data.files import missing_files

    if not missing_files(cfg.dataset):
        return None
    refs = records[records["stage"] == REFERENCE] if "stage" in records else records[:0]
    return next((d for d in refs.get("data_sha256", []) if isinstance(d, dict)), {})


def current(cfg: FinetuneConfig, records: pd.DataFrame, digests=None) -> pd.DataFrame:
    """The records of this configuration (``digests``: :func:`stored_digests`): the keys its
    specs give (other settings, data files or code versions are left out), each fine-tuning
    record under the name its row has now (a row's name is a label, not part of its key)."""
    if records.empty or digests == {}:
        return records[:0]
    rows = {}
    for ref_key in reference_keys(cfg, digests).values():
        rows[ref_key] = REFERENCE_ROW
        for row in cfg.rows:
            for lr in cfg.finetune_lrs:
                rows |= {key: row.row for _, key, _ in finetune_points(cfg, ref_key, row, lr)}
    out = records[records["key"].isin(rows)].reset_index(drop=True)
    out["row"] = out["key"].map(rows)
    return out


def select_finetuned(ft: pd.DataFrame, ks) -> pd.DataFrame:
    """Per (seed, row, k): the (rate, epoch) with the best val top-k accuracy (ties: fewer
    epochs, then the smaller rate; :func:`~topkbench.experiments.selection.best_point`) and
    its test accuracy (%); a diverged candidate (NaN) is never selected."""
    out = []
    for (seed, row), grp in ft.groupby(["seed", "row"], sort=False):
        for k in ks:
            p = best_point(grp, k, keys=("epoch", "lr"))
            if p is None:
                continue
            hit = grp[(grp["epoch"] == p["epoch"]) & (grp["lr"] == p["lr"])].iloc[0]
            out.append(
                {
                    "seed": int(seed),
                    "row": row,
                    "k": k,
                    "epoch": int(hit["epoch"]),
                    "lr": float(hit["lr"]),
                    "val": 100.0 * float(hit[f"val_top{k}"]),
                    "test": 100.0 * float(hit[f"test_top{k}"]),
                    "status": "trained",
                }
            )
    return pd.DataFrame(out)


def _classifier_selected(cfg: FinetuneConfig, digests) -> tuple[pd.DataFrame, int, int]:
    """The classifier rows' selected models (per seed, row, k), their fit count, and how
    many base-grid fits are missing (:func:`topkbench.experiments.report.missing_fits`; a
    seed without records, or without its features file, misses all of its own)."""
    from topkbench.experiments.report import missing_fits
    from topkbench.experiments.selection import current_records, select_per_k

    rows = cfg.classifier.get("rows") or ()
    if not rows:
        return pd.DataFrame(), 0, 0
    keys = reference_keys(cfg, digests)
    files = {s: features_file(cfg, s, key) for s, key in keys.items()}
    exp = classifier_experiment(cfg, files)
    per_seed = len(rows) * len(exp.C_values)
    records = current_records(exp, read_records(exp.results_dir, exp.name)[0])
    if records.empty:
        return pd.DataFrame(), 0, len(files) * per_seed
    sel = select_per_k(records, exp)
    sel["seed"] = sel["dataset"].str.removeprefix("seed").astype(int)
    missing, _ = missing_fits(exp, records)
    not_run = len(files) - records["dataset"].nunique()
    return sel, len(records), missing + not_run * per_seed


def _summary(block: str, row: str, sel: pd.DataFrame, ref: dict, ks) -> dict[str, object]:
    """Mean, std over seeds and the paired difference to the reference, per k."""
    entry: dict[str, object] = {"block": block, "row": row}
    for k in ks:
        s = sel[sel["k"] == k] if len(sel) else sel
        t = s["test"].to_numpy(dtype=float) if len(s) else np.array([])
        d = (
            np.array(
                [
                    v - ref[(int(seed), k)]
                    for seed, v in zip(s["seed"], t, strict=True)
                    if (int(seed), k) in ref
                ]
            )
            if len(s)
            else np.array([])
        )
        entry[f"top{k}_mean"] = t.mean() if len(t) else np.nan
        entry[f"top{k}_std"] = t.std(ddof=1) if len(t) > 1 else (0.0 if len(t) else np.nan)
        entry[f"top{k}_diff"] = d.mean() if len(d) else np.nan
        entry[f"top{k}_seeds"] = len(t)
        entry[f"top{k}_uncertified"] = (
            int((~s["status"].isin(["converged", "trained"])).sum()) if len(s) else 0
        )
        if "epoch" in s and len(s):
            entry[f"top{k}_epochs"] = ",".join(str(v) for v in sorted(set(s["epoch"])))
            entry[f"top{k}_lrs"] = ",".join(f"{v:g}" for v in sorted(set(s["lr"])))
    return entry


def _cell(r, k, reference: bool) -> list[str]:
    if not r.get(f"top{k}_seeds"):
        return ["—", ""]
    mark = UNCERTIFIED if r.get(f"top{k}_uncertified") else ""
    d = r[f"top{k}_diff"]
    return [
        f"{r[f'top{k}_mean']:.1f} ± {r[f'top{k}_std']:.1f}{mark}",
        "" if reference or not np.isfinite(d) else f"{d:+.1f}",
    ]


def _block(title: str, table: pd.DataFrame, ks) -> list[str]:
    header = ["Method"] + [h for k in ks for h in (f"Top-{k}", "Δ")]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in table.iterrows():
        reference = r["block"] == "finetune" and r["row"] == REFERENCE_ROW
        cells = [c for k in ks for c in _cell(r, k, reference)]
        lines.append("| " + " | ".join([str(r["row"]), *cells]) + " |")
    return [*lines, ""]


def _published_block(published: pd.DataFrame, ks) -> tuple[list[str], list[dict]]:
    if published.empty:
        return [], []
    lines = [
        "## The paper's Table 6 (context: Caffe networks fine-tuned on Places 205 and "
        "ImageNet 2012; Δ to their LR^Multi line)",
        "",
    ]
    datasets = list(dict.fromkeys(published["dataset"]))
    header = ["Method"] + [f"{PUBLISHED_TITLES.get(d, d)} top-{k}" for d in datasets for k in ks]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = []
    for row in dict.fromkeys(published["row"]):
        cells = [row]
        for d in datasets:
            for k in ks:
                at = published[(published["dataset"] == d) & (published["k"] == k)]
                v = at[at["row"] == row]["value"]
                base = at[at["row"] == REFERENCE_ROW]["value"]
                if not len(v):
                    cells.append("—")
                    continue
                value = float(v.iloc[0])
                diff = value - float(base.iloc[0]) if len(base) else np.nan
                rows.append(
                    {"block": f"paper {d}", "row": row, "k": k, "value": value, "diff": diff}
                )
                cells.append(
                    f"{value:.2f}"
                    + ("" if row == REFERENCE_ROW or not np.isfinite(diff) else f" ({diff:+.2f})")
                )
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""], rows


def build_finetune_report(cfg: FinetuneConfig) -> tuple[TableReport, pd.DataFrame]:
    """The report and the configuration's records (for the HTML page)."""
    everything, where = read_records(cfg.results_dir, cfg.name)
    digests = stored_digests(cfg, everything)
    records = current(cfg, everything, digests)
    if records.empty or not (records["stage"] == REFERENCE).any():
        raise ConfigError(
            f"no records for experiment {cfg.name!r} in this configuration under {where}",
            hint=f"topkbench sweep experiment={cfg.name} (with the same overrides)",
        )
    refs = records[records["stage"] == REFERENCE]
    ft = records[records["stage"] == FINETUNE]
    ks = cfg.ks
    ref_sel = pd.DataFrame(
        [
            {
                "seed": int(r["seed"]),
                "row": REFERENCE_ROW,
                "k": k,
                "epoch": int(r["epoch"]),
                "lr": cfg.reference.lr,
                "test": 100.0 * float(r[f"test_top{k}"]),
                "status": "trained",
            }
            for _, r in refs.iterrows()
            for k in ks
        ]
    )
    ref = {
        (s, k): v for s, k, v in zip(ref_sel["seed"], ref_sel["k"], ref_sel["test"], strict=True)
    }
    ft_sel = select_finetuned(ft, ks) if len(ft) else pd.DataFrame()
    cls_sel, n_cls, cls_missing = _classifier_selected(cfg, digests)
    rows = [_summary("finetune", REFERENCE_ROW, ref_sel, ref, ks)]
    for r in cfg.rows:
        part = ft_sel[ft_sel["row"] == r.row] if len(ft_sel) else ft_sel
        rows.append(_summary("finetune", r.row, part, ref, ks))
    cls_rows = [r["row"] for r in cfg.classifier.get("rows") or ()]
    for name in cls_rows:
        part = cls_sel[cls_sel["row"] == name] if len(cls_sel) else cls_sel
        rows.append(_summary("classifier", name, part, ref, ks))
    table = pd.DataFrame(rows)
    published = load_published(cfg.published) if cfg.published else pd.DataFrame()
    seeds = sorted(refs["seed"].astype(int))
    lines = [f"# {cfg.title}", ""]
    lines += _block(
        f"{cfg.dataset.name}: the reference network and its fine-tuning ({len(seeds)} seeds)",
        table[table["block"] == "finetune"],
        ks,
    )
    if cls_rows:
        lines += _block(
            f"{cfg.dataset.name}: the classifier alone, trained by topkbench on the "
            "reference network's penultimate features",
            table[table["block"] == "classifier"],
            ks,
        )
    paper_lines, paper_rows = _published_block(published, ks)
    lines += paper_lines
    lines += _notes(cfg, refs, ft, cls_sel, n_cls, seeds)
    if digests is not None:
        lines.insert(-1, f"The data file of {cfg.dataset.name} is not on this machine: the "
                         "records' own data digests were used.")  # fmt: skip
    selected = pd.concat(
        [
            ref_sel.assign(block="finetune"),
            ft_sel.assign(block="finetune"),
            cls_sel.assign(block="classifier"),
        ],
        ignore_index=True,
    )
    if paper_rows:
        table = pd.concat([table, pd.DataFrame(paper_rows)], ignore_index=True)
    rep = TableReport("\n".join(lines) + "\n", table, selected)
    missing = _missing(cfg, refs, ft, cls_missing)
    rep.incomplete = bool(missing)
    if missing:
        rep.markdown = (
            f"> **Incomplete run:** missing {'; '.join(missing)}; the cells below come from "
            "what is there. Finish it with `topkbench sweep` (same overrides).\n\n" + rep.markdown
        )
    return rep, records


def _missing(cfg, refs, ft, cls_missing: int) -> list[str]:
    """What a finished run of this configuration holds that the store does not."""
    out = []
    if len(refs) < cfg.seeds:
        out.append(f"{cfg.seeds - len(refs)} of {cfg.seeds} reference networks")
    expected = cfg.seeds * len(cfg.rows) * len(cfg.finetune_lrs) * cfg.finetune_epochs
    if len(ft) < expected:
        out.append(f"{expected - len(ft)} of {expected} fine-tuning candidates")
    if cls_missing:
        out.append(f"{cls_missing} of the classifier rows' grid fits")
    return out


def _notes(cfg: FinetuneConfig, refs, ft, cls_sel, n_cls, seeds) -> list[str]:
    ref_epochs = ", ".join(str(int(e)) for e in refs.sort_values("seed")["epoch"])
    listed = ", ".join(map(str, seeds))
    lines = [
        f"Test accuracy (%), mean ± sample std over {len(seeds)} seeds ({listed}"
        "; each drives its network's initialization and data order). "
        "Δ = the mean over seeds of the row minus the reference network of the same seed.",
        f"Reference: a CNN ({cfg.channels[0]}-{cfg.channels[1]} 3x3 convolutions, "
        f"{cfg.hidden} hidden units) trained from scratch with LR^Multi, SGD (momentum "
        f"{cfg.reference.momentum:g}, weight decay {cfg.reference.weight_decay:g}, batch "
        f"{cfg.reference.batch_size}), cosine learning rate from {cfg.reference.lr:g} over "
        f"{cfg.reference_epochs} epochs; the epoch with the best val top-1 kept (epochs "
        f"{ref_epochs}).",
        f"Fine-tuning (FT): the whole network from the reference, {cfg.finetune_epochs} epochs "
        f"at a constant learning rate in {{{', '.join(f'{v:g}' for v in cfg.finetune_lrs)}}} "
        "(the same schedule for every loss, the same data order for every row); each column's "
        "rate and number of epochs selected on val by that column's top-k accuracy. "
        f"{len(ft)} fine-tuning candidates recorded.",
    ]
    if cfg.classifier.get("rows"):
        n_sel = len(cls_sel)
        n_cert = int((cls_sel["status"] == "converged").sum()) if n_sel else 0
        lines.append(
            "Classifier alone: topkbench's solvers on the reference network's penultimate "
            f"features (Table 5's protocol: C selected on val per column, {n_cls} fits). "
            f"Selected models certified (relative gap ≤ ε, or the gradient test of the "
            f"nonconvex Ent_tr rows): {n_cert} of {n_sel}."
            + (f" {UNCERTIFIED} marks a cell with an uncertified model." if n_cert < n_sel else "")
        )
    diverged = int((ft["status"] == "diverged").sum()) if len(ft) else 0
    if diverged:
        lines.append(f"{diverged} fine-tuning candidates diverged (their rate is too large for "
                     "their loss) and were not selectable.")  # fmt: skip
    lines.append(
        "The paper's rows come from much larger networks and datasets (TPAMI Table 6); "
        "they are context, not targets."
    )
    return lines
