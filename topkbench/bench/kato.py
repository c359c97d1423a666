"""``topkbench bench kato-fig2|kato-fig3|kato-fig4`` (Kato & Hirohashi Figs. 2-4): SDCA against
Frank-Wolfe on the weighted top-k hinge, duality gap against time and iterations."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from topkbench.bench.common import (
    make_gaussian_problem,
    saved_figure,
)
from topkbench.losses.registry import get_method


@dataclass
class KatoTracePoint:
    solver: str
    iteration: int
    seconds: float  # the solver's own work: SDCA's epoch kernel, Frank-Wolfe's CPU time
    primal_printed: float  # P(W(A)) with the printed top-k hinge (TPAMI Table 1 / Kato eq. (3))
    dual: float
    gap: float  # primal_printed - dual, absolute, P(W) scale


def _sdca_study(X, y, m, loss_id, label, k, C, iters, seed, rho=None) -> list[KatoTracePoint]:
    """Plain SDCA epochs (no shrinking), the gap measured with the printed alpha primal after
    each; the time is the epoch kernel's alone (``on_batch``), the gap is computed in
    ``on_eval``, outside it."""
    from topkbench.solvers.problem import evaluate_objective
    from topkbench.solvers.sdca import solve_sdca

    printed = get_method("topk_svm_alpha").loss_id
    out: list[KatoTracePoint] = []
    clock = [0.0]

    def on_batch(_epochs, seconds):
        clock[0] += seconds

    def on_eval(epoch, A, W):
        # the dual formula is the same for both domains (Kato §8); the pseudo domain lies
        # inside the printed one, so its A is feasible there and P_printed - D is a valid gap
        P, D = evaluate_objective(X, y, A, W, printed, C, 0.0, k)
        out.append(KatoTracePoint(label, epoch, clock[0], P, D, P - D))

    solve_sdca(X, y, n_classes=m, loss_id=loss_id, C=C, k=k, eps=1e-300, max_epochs=iters,
               eval_every=1, seed=seed, shrink=False, warn=False, on_eval=on_eval,
               on_batch=on_batch, rho=rho)  # fmt: skip
    return out


def kato_fig2(
    X, y, *, k: int = 3, C: float = 1.0, iters: int = 200, seed: int = 0
) -> list[KatoTracePoint]:
    """Kato Fig. 2: duality gap (with the printed top-k hinge primal) against CPU time for
    (a) the pseudo-alpha SDCA of the authors' code, (b) our printed-alpha SDCA (domain D_k,
    DESIGN §4.1), (c) our SDCA of the weighted top-k hinge with flat weights (the same loss,
    through the permutahedron projection of :mod:`topkbench.prox.permutahedron`), (d)
    Frank-Wolfe standard / away / pairwise with flat weights, at ``k`` and ``C = 1/(lambda
    n)`` (Kato: lambda = 1/n, i.e. C = 1).  ``iters`` epochs for SDCA and iterations for
    Frank-Wolfe."""
    from topkbench.api import fit
    from topkbench.losses.registry import get_method as gm
    from topkbench.validation import check_k, check_positive

    m = int(y.max()) + 1
    k = check_k(k, m)
    C = check_positive("C", C)
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.int64)
    # compile everything on a tiny problem first (timings exclude JIT)
    Xs, ys = make_gaussian_problem(12, 3, 4, seed)
    for name in ("topk_svm_alpha_pseudo", "topk_svm_alpha"):
        _sdca_study(Xs, ys, 4, gm(name).loss_id, name, 2, C, 1, seed)
    _sdca_study(Xs, ys, 4, gm("wtopk_svm").loss_id, "wtopk", 2, C, 1, seed, np.full(2, 0.5))
    for v in ("standard", "away", "pairwise"):
        fit(Xs, ys, "wtopk_svm", k=2, C=C, fw=v, max_epochs=2, warn=False)
    out = []
    out += _sdca_study(X, y, m, gm("topk_svm_alpha_pseudo").loss_id, "SDCA pseudo alpha (authors)",
                       k, C, iters, seed)  # fmt: skip
    out += _sdca_study(X, y, m, gm("topk_svm_alpha").loss_id, "SDCA printed alpha (ours)",
                       k, C, iters, seed)  # fmt: skip
    out += _sdca_study(X, y, m, gm("wtopk_svm").loss_id, "SDCA weighted, flat (ours)", k, C,
                       iters, seed, np.full(k, 1.0 / k))  # fmt: skip
    for v in ("standard", "away", "pairwise"):
        t0 = time.process_time()
        model = fit(X, y, "wtopk_svm", k=k, C=C, fw=v, eps=1e-12, max_epochs=iters, warn=False)
        cpu = time.process_time() - t0
        wall = model.trace[-1].seconds or 1.0
        for tp in model.trace:  # the trace's wall clock, scaled to the run's CPU time
            out.append(
                KatoTracePoint(
                    f"Frank-Wolfe {v}",
                    tp.epoch,
                    tp.seconds * cpu / wall,
                    tp.primal,
                    tp.dual,
                    tp.primal - tp.dual,
                )  # fmt: skip
            )
    return out


def plot_kato_fig2(points: list[KatoTracePoint], path, title: str) -> None:
    with saved_figure(path, figsize=(6.4, 4.4)) as (fig, ax):
        for solver in dict.fromkeys(p.solver for p in points):
            pts = [p for p in points if p.solver == solver and p.seconds > 0 and p.gap > 0]
            ax.loglog([p.seconds for p in pts], [p.gap for p in pts], label=solver)
        ax.set_xlabel("CPU time (s)")
        ax.set_ylabel("duality gap P(W) - D(A), printed top-k hinge")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)


@dataclass
class FWStudyPoint:
    panel: str
    label: str
    variant: str
    gamma: float
    weights: str
    iteration: int
    seconds: float  # wall clock inside the solver
    primal: float  # certified primal (best iterate so far), P(W) scale
    dual: float
    gap: float  # primal - dual, absolute
    relative_gap: float


KATO_FIG3_GAMMAS = (0.0, 1e-3, 1e-2, 1e-1)


FW_PANELS = {"standard": "(a) Std FW", "away": "(b) AFW", "pairwise": "(c) PFW"}
SDCA_PANEL = "SDCA (ours)"


def fw_study(
    X, y, runs: list[tuple[str, str, str, float, str]], *, k: int, C: float, iters: int
) -> list[FWStudyPoint]:
    """Frank-Wolfe traces for ``runs`` = (panel, label, variant, gamma, weights) on one problem,
    and SDCA's (variant ``"sdca"``: plain SDCA with the permutahedron projection, one
    certificate per epoch): each run goes ``iters`` iterations or epochs (no early stop) and
    every certificate is kept.  For gamma > 0 SDCA's primal is the smoothed loss itself and
    Frank-Wolfe's the upper bound of its augmented problem (Kato Prop. 5): both certify the
    same optimum, SDCA's a little more tightly.  Compiles on a tiny problem first so the
    first run's times exclude JIT."""
    from topkbench.api import fit

    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.int64)
    Xs, ys = make_gaussian_problem(12, 3, 4, 0)

    def run(X, y, variant, **kw):
        if variant == "sdca":
            return fit(X, y, "wtopk_svm", eval_every=1, accelerate="never", warn=False, **kw)
        return fit(X, y, "wtopk_svm", fw=variant, warn=False, **kw)

    for v in dict.fromkeys(r[2] for r in runs):
        run(Xs, ys, v, k=2, C=C, gamma=0.1, max_epochs=3)
    out = []
    for panel, label, variant, gamma, weights in runs:
        model = run(X, y, variant, k=k, C=C, gamma=gamma, weights=weights, eps=1e-300,
                    max_epochs=iters)  # fmt: skip
        for tp in model.trace:
            out.append(
                FWStudyPoint(
                    panel,
                    label,
                    variant,
                    gamma,
                    weights,
                    tp.epoch,
                    tp.seconds,
                    tp.primal,
                    tp.dual,
                    tp.primal - tp.dual,
                    tp.relative_gap,
                )  # fmt: skip
            )
    return out


def kato_fig3(X, y, *, k=3, C=1.0, iters=300, gammas=KATO_FIG3_GAMMAS) -> list[FWStudyPoint]:
    """Kato Fig. 3 (§7.2): the smoothed unweighted top-k hinge (eq. (25), flat weights) for
    each smoothing gamma, by Std FW, AFW and PFW (panels (a)-(c)) and by our SDCA (panel
    (d)); gap vs iterations (epochs for SDCA)."""
    runs = [
        (FW_PANELS[v], f"gamma = {g:g}", v, float(g), "flat") for v in FW_PANELS for g in gammas
    ]
    runs += [(f"(d) {SDCA_PANEL}", f"gamma = {g:g}", "sdca", float(g), "flat") for g in gammas]
    return fw_study(X, y, runs, k=k, C=C, iters=iters)


def kato_fig4(X, y, *, k=3, C=1.0, iters=300, variant="standard") -> list[FWStudyPoint]:
    """Kato Fig. 4 (§7.3): flat, linear and exp weights (non-smooth), one Frank-Wolfe
    variant and our SDCA beside it; gap vs iterations (epochs for SDCA)."""
    runs = [(FW_PANELS[variant], w, variant, 0.0, w) for w in ("flat", "linear", "exp")]
    runs += [(SDCA_PANEL, w, "sdca", 0.0, w) for w in ("flat", "linear", "exp")]
    return fw_study(X, y, runs, k=k, C=C, iters=iters)


def plot_fw_study(points: list[FWStudyPoint], path, title: str) -> None:
    """One log-log panel per ``panel`` (gap vs iteration + 1), a line per ``label``."""
    panels = list(dict.fromkeys(p.panel for p in points))
    size = (4.6 * len(panels), 4.0)
    with saved_figure(path, 1, len(panels), figsize=size, squeeze=False) as (fig, axes):
        for ax, panel in zip(axes[0], panels, strict=True):
            for label in dict.fromkeys(p.label for p in points if p.panel == panel):
                pts = [p for p in points if p.panel == panel and p.label == label and p.gap > 0]
                ax.loglog([p.iteration + 1 for p in pts], [p.gap for p in pts], label=label)
            ax.set_title(panel)
            ax.set_xlabel("iteration + 1")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][0].set_ylabel("duality gap P - D (P(W) scale)")
        fig.suptitle(title)


def fw_study_summary(points: list[FWStudyPoint], target: float) -> list[dict]:
    """Per run: first iteration and seconds with gap <= ``target`` (absolute, as Kato quotes
    them), the final gap and relative gap."""
    rows = []
    runs = dict.fromkeys((p.panel, p.label) for p in points)
    for panel, label in runs:
        pts = [p for p in points if p.panel == panel and p.label == label]
        hit = next((p for p in pts if p.gap <= target), None)
        rows.append({
            "panel": panel, "label": label,
            "iterations_to_target": None if hit is None else hit.iteration,
            "seconds_to_target": None if hit is None else hit.seconds,
            "final_gap": pts[-1].gap, "final_relative_gap": pts[-1].relative_gap,
            "iterations": pts[-1].iteration, "seconds": pts[-1].seconds,
        })  # fmt: skip
    return rows
