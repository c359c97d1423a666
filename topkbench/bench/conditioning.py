"""``topkbench bench conditioning``: time to a certified gap on ill-conditioned features,
plain SDCA against ``accelerate="auto"`` (DESIGN §5): Newton's method in the primal where it
applies (:mod:`topkbench.solvers.newton`), accelerated SDCA elsewhere
(:mod:`topkbench.solvers.accelerated`).

The problems (:func:`topkbench.data.synthetic.make_ill_conditioned`) have column scales from
1e-2 to 1e2 and ``||x||^2`` up to ~1e5, as raw real features do: plain SDCA then needs about
``C R^2`` epochs per digit at the large-C end of the papers' grids.  Every fit starts cold,
both modes see the same permutation stream, and each stops at the relative gap ``eps`` or at
the per-fit time limit (then it is reported as not converged, with its time as a lower bound).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from topkbench.bench.common import saved_figure
from topkbench.errors import ConvergenceWarning

# name -> (n, d, m, multilabel)
PROBLEMS = {
    "multiclass-400": (400, 72, 6, False),
    "multilabel-400": (400, 72, 6, True),
    "multiclass-10k": (10_000, 16, 26, False),
}
MULTICLASS_METHODS = (
    ("svm_multi", 0.0, 1), ("svm_multi", 1.0, 1), ("lr_multi", 0.0, 1), ("svm_ova", 0.0, 1),
    ("lr_ova", 0.0, 1), ("topk_svm_alpha_pseudo", 1.0, 3), ("topk_svm_beta", 0.0, 3),
    ("topk_ent", 0.0, 3),
)  # fmt: skip
MULTILABEL_METHODS = (("svm_ml", 0.0, 1), ("svm_ml", 1.0, 1), ("lr_ml", 0.0, 1))
LOG2_C = (-8, -4, 0, 4, 8)
MODES = {"plain": "never", "accelerated": "auto"}


@dataclass
class ConditioningRow:
    problem: str
    n: int
    d: int
    m: int
    r2_max: float
    method: str
    gamma: float
    k: int
    C: float
    mode: str  # plain | accelerated
    status: str
    epochs: int
    seconds: float
    relative_gap: float
    accelerated_from_epoch: int  # -1 if the run stayed plain
    phase: str  # the phases after the first plain epochs: plain | newton | catalyst | a>b


def _compile(X, y, methods) -> None:
    """One tiny fit per method and mode, so no timing includes numba compilation."""
    from topkbench.api import fit

    m = y.shape[1] if y.ndim == 2 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for method, gamma, k in methods:
            for mode in ("never", "catalyst", "newton"):
                fit(X[:30], y[:30], method, C=1.0, gamma=gamma, k=k, max_epochs=3,
                    accelerate=mode, warn=False, n_classes=m)  # fmt: skip


def bench_conditioning(
    problems=tuple(PROBLEMS), methods=None, log2_C=LOG2_C, *, eps=1e-3, time_limit=30.0,
    max_epochs=1_000_000, seed=0, progress=None,
) -> list[ConditioningRow]:  # fmt: skip
    """Every (problem, method, C, mode) run cold to ``eps`` within ``time_limit`` seconds.

    ``methods`` (``(name, gamma, k)`` triples) default to :data:`MULTICLASS_METHODS` on the
    multiclass problems and :data:`MULTILABEL_METHODS` on the multilabel one; a method whose
    task does not match a problem is skipped there.
    """
    from threadpoolctl import threadpool_limits

    from topkbench.api import fit
    from topkbench.data.synthetic import make_ill_conditioned
    from topkbench.losses.registry import get_method

    rows: list[ConditioningRow] = []
    for name in problems:
        n, d, m, multilabel = PROBLEMS[name]
        X, y = make_ill_conditioned(n, d, m, seed, multilabel=multilabel)
        task = "multilabel" if multilabel else "multiclass"
        chosen = methods or (MULTILABEL_METHODS if multilabel else MULTICLASS_METHODS)
        chosen = [t for t in chosen if get_method(t[0]).task == task]
        Y = y.toarray() if multilabel else y
        _compile(X, Y, chosen)
        r2 = float(np.einsum("ij,ij->i", X, X).max())
        for method, gamma, k in chosen:
            for e in log2_C:
                C = 2.0**e
                for mode, accelerate in MODES.items():
                    if progress is not None:
                        progress(f"{name} {method} gamma={gamma:g} k={k} C=2^{e} {mode}")
                    with warnings.catch_warnings(), threadpool_limits(1):
                        warnings.simplefilter("ignore", ConvergenceWarning)
                        t0 = time.perf_counter()
                        model = fit(X, y, method, C=C, gamma=gamma, k=k, eps=eps,
                                    max_epochs=max_epochs, time_limit=time_limit, seed=seed,
                                    accelerate=accelerate, warn=False)  # fmt: skip
                        seconds = time.perf_counter() - t0
                    rows.append(ConditioningRow(
                        name, n, d, m, r2, method, gamma, k, C, mode, model.status,
                        model.epochs, seconds, model.relative_gap,
                        int(model.info.get("accelerated_from_epoch",
                                           model.info.get("newton_from_epoch", -1))),
                        _phase(model.info),
                    ))  # fmt: skip
    return rows


def _phase(info: dict) -> str:
    """The phases that ran after the first plain epochs, in order (``plain`` if none), e.g.
    ``newton>catalyst`` when Newton stalled and handed its dual on."""
    keys = (("newton_from_epoch", "newton"), ("accelerated_from_epoch", "catalyst"),
            ("plain_from_epoch", "plain"))  # fmt: skip
    return ">".join(name for key, name in keys if key in info) or "plain"


def speedup_summary(rows: list[ConditioningRow], hard_epochs: int = 1000) -> list[dict]:
    """Per problem and method: the median over C of plain time / accelerated time, among the
    C where plain SDCA needed more than ``hard_epochs`` epochs or did not converge (a plain
    run stopped by the time limit counts with its time: the ratio is then a lower bound)."""
    by_key: dict[tuple, dict[str, ConditioningRow]] = {}
    for r in rows:
        by_key.setdefault((r.problem, r.method, r.gamma, r.k, r.C), {})[r.mode] = r
    out: dict[tuple, list] = {}
    for (problem, method, gamma, k, _C), pair in by_key.items():
        plain, acc = pair.get("plain"), pair.get("accelerated")
        if plain is None or acc is None:
            continue
        hard = plain.status != "converged" or plain.epochs > hard_epochs
        entry = out.setdefault((problem, method, gamma, k), [[], 0, 0, 0])
        if hard:
            entry[0].append(plain.seconds / max(acc.seconds, 1e-9))
            entry[1] += 1
            entry[2] += plain.status != "converged"
            entry[3] += acc.status != "converged"
    return [
        {"problem": p, "method": mth, "gamma": g, "k": k, "hard_C": cnt,
         "median_speedup": float(np.median(ratios)) if ratios else float("nan"),
         "plain_unconverged": pu, "accelerated_unconverged": au}
        for (p, mth, g, k), (ratios, cnt, pu, au) in out.items()
    ]  # fmt: skip


def plot_conditioning(rows: list[ConditioningRow], path, eps: float, time_limit: float) -> None:
    """Time to ``eps`` against C, one panel per problem; solid accelerated, dashed plain,
    a cross where the run hit the time limit."""
    problems = list(dict.fromkeys(r.problem for r in rows))
    size = (5.5 * len(problems), 4.5)
    with saved_figure(path, 1, len(problems), figsize=size, squeeze=False, dpi=110) as (fig, axes):
        for ax, problem in zip(axes[0], problems, strict=True):
            sub = [r for r in rows if r.problem == problem]
            labels = list(dict.fromkeys((r.method, r.gamma, r.k) for r in sub))
            for idx, (method, gamma, k) in enumerate(labels):
                color = f"C{idx % 10}"
                label = method + (f" γ={gamma:g}" if gamma else "") + (f" k={k}" if k > 1 else "")
                for mode, style in (("accelerated", "-"), ("plain", "--")):
                    pts = [r for r in sub if (r.method, r.gamma, r.k) == (method, gamma, k)
                           and r.mode == mode]  # fmt: skip
                    pts.sort(key=lambda r: r.C)
                    shown = label if mode == "accelerated" else None
                    ax.plot([r.C for r in pts], [r.seconds for r in pts], style, color=color,
                            marker="o", ms=3, label=shown)  # fmt: skip
                    bad = [r for r in pts if r.status != "converged"]
                    ax.plot([r.C for r in bad], [r.seconds for r in bad], "x", color=color, ms=8)
            r0 = sub[0]
            title = f"{problem}: n={r0.n}, d={r0.d}, m={r0.m}, R²={r0.r2_max:.2g}"
            ax.set(xscale="log", yscale="log", xlabel="C", ylabel=f"seconds to gap {eps:g}",
                   title=title)  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.axhline(time_limit, color="grey", lw=0.8)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("solid: accelerated (auto), dashed: plain SDCA, x: time limit reached")
