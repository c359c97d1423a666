"""Multilabel evaluation metrics (TPAMI, 002 §3.1) and threshold selection (§6.3, DESIGN §7).

All functions take scores ``S`` (n x m, higher = more relevant) and the ground truth ``Y`` as an
n x m 0/1 indicator (dense or sparse).

**Ranking metrics** (no threshold):

* ``rloss`` rank loss ``1/n sum_i |D_i| / (|Y_i| |Ybar_i|)``, ``D_i = {(y, j) in Y_i x Ybar_i :
  f_y <= f_j}``: ties count as reversed pairs, as printed;
* ``p@k`` = ``|pi_{1:k} cap Y_i| / k`` and ``r@k`` = ``|pi_{1:k} cap Y_i| / |Y_i|``, where the top-k
  list ``pi_{1:k}`` breaks ties *against* the prediction (irrelevant labels first among equal
  scores, as for top-k accuracy in DESIGN §2; for a singleton ``Y_i`` ``r@k`` is exactly the
  top-k accuracy);
* ``map``: one-vs-all average precision averaged over classes; AP is the step-wise
  (non-interpolated) area ``sum_n (R_n - R_{n-1}) P_n`` over distinct score thresholds (the
  definition of scikit-learn's ``average_precision_score``), or the 11-point interpolated AP
  of the VOC 2007 devkit with ``ap="voc07"``.  Classes without a positive example are left
  out of the mean (their AP is undefined).

**Partition metrics** for predictions ``h(x) = {y : f_y(x) >= delta}``: ``hloss`` (Hamming
loss), ``acc`` (``|h cap Y| / |h cup Y|``), ``sacc`` (subset accuracy), ``f1_micro``,
``f1_macro``, ``f1_inst`` (TPAMI's three averagings of F1 = 2TP / (2TP + FP + FN)).

**Empty sets** (Mulan's delicious has examples without labels, and a test split can hold no
positive of a class; such examples carry no ranking constraint and are left out of training,
but kept in evaluation, and every example counts in ``n``).  Ranking metrics: ``rloss = 0``
when ``Y_i`` is empty or complete (no pair can be reversed; scikit-learn's
``label_ranking_loss`` does the same) and ``r@k = 1`` when ``Y_i`` is empty.  Partition
metrics take the convention for a ratio 0/0 as the option ``empty``:

* ``"zero"`` (the default; TPAMI Tables 7/9 and 10-12, scikit-learn's ``zero_division=0``):
  F1 = 0 for a class (``f1_macro``) or an example (``f1_inst``) with ``TP + FP + FN = 0``,
  ``f1_micro = 0`` when nothing is predicted and nothing is true, ``acc = 0`` for an example
  whose predicted and true sets are both empty;
* ``"one"`` (Mulan's ``InformationRetrievalMeasures``, scikit-learn's ``zero_division=1``):
  the same cases count as perfect, 1.

Why ``"zero"`` for the paper: TPAMI §3.1 defines F1 and accuracy as ratios without saying
what 0/0 is, and its F1-macro numbers are those of ``"zero"`` (docs/findings.md).  One guard
for every ratio (0/0 is 0) is the implementation this implies, so ``acc``, ``f1_inst`` and
``f1_micro`` follow it; they differ only where the true and predicted sets are both empty.
Hamming loss and subset accuracy have no ratio to decide (``h = Y = {}`` is a correct
prediction for both).

**Threshold selection**: each partition metric selects its own ``delta`` on a grid from stored
scores (no retraining): :func:`delta_grid` gives the 71-point grid of Tables 7/9 and the
100-point grid of Tables 10-12; :func:`cardinality_threshold` is the "match label
cardinality" rule of Madjarov et al. [97] as an option.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from topkbench.errors import InputError

RANKING_METRICS = ("rloss", "map")
PARTITION_METRICS = ("hloss", "acc", "sacc", "f1_micro", "f1_macro", "f1_inst")
LOWER_IS_BETTER = frozenset({"rloss", "hloss"})


MAX_AT = 10  # sweeps record P@K and R@K for K = 1..MAX_AT


def is_metric(name: str) -> bool:
    """Whether ``name`` is a metric the sweep records (``p@K`` / ``r@K`` for 1 <= K <= 10)."""
    if name in RANKING_METRICS or name in PARTITION_METRICS:
        return True
    head, _, k = name.partition("@")
    return head in ("p", "r") and k.isdigit() and 1 <= int(k) <= MAX_AT


def delta_grid(kind: str = "mulan") -> NDArray[np.float64]:
    """Threshold grids of DESIGN §7, ascending.

    ``"mulan"`` (Tables 7/9, TPAMI §6.3): ``{-10^e} cup {0} cup {10^e}`` for ``e = -5.9, -5.7,
    ..., 0.9`` (71 values; the extracted text's "-5.9:2:1" lost the dot of ".2").
    ``"voc"`` (Tables 10-12): 100 equally spaced points in ``[0.1, 10]``.
    """
    if kind == "mulan":
        e = np.round(np.arange(-5.9, 0.9 + 1e-9, 0.2), 10)
        pos = 10.0**e
        return np.concatenate([-pos[::-1], [0.0], pos])
    if kind == "voc":
        return np.linspace(0.1, 10.0, 100)
    raise InputError(f"unknown threshold grid {kind!r}; use 'mulan' or 'voc'")


def _dense_truth(Y, shape) -> NDArray[np.bool_]:
    if sp.issparse(Y):
        T = Y.toarray() != 0
    else:
        T = np.asarray(Y) != 0
    if T.shape != shape:
        raise InputError(f"label indicator has shape {T.shape}; the scores have shape {shape}")
    return T


def _scores(S) -> NDArray[np.float64]:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2:
        raise InputError(f"scores must be n x m, got shape {S.shape}")
    if not np.isfinite(S).all():
        raise InputError("scores contain NaN or Inf")
    return S


EMPTY_CONVENTIONS = ("zero", "one")


def _ratio(num, den, empty: str = "one"):
    """num / den with 0/0 -> 0 (``empty="zero"``) or 1 (``"one"``; module docstring)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, 1.0 if empty == "one" else 0.0)
    np.divide(num, den, out=out, where=den != 0)
    return out


def _check_empty(empty: str) -> str:
    from topkbench.validation import check_choice

    return check_choice("empty", empty, EMPTY_CONVENTIONS)


def pessimistic_order(S, T) -> NDArray[np.bool_]:
    """Relevance of each row's labels sorted by score, ties broken with irrelevant labels
    first (against the prediction): row ``i`` of the result is ``T[i, order_i]``."""
    order0 = np.argsort(T, axis=1, kind="stable")  # irrelevant (False) first
    keyed = np.take_along_axis(-S, order0, axis=1)
    order1 = np.argsort(keyed, axis=1, kind="stable")
    perm = np.take_along_axis(order0, order1, axis=1)
    return np.take_along_axis(T, perm, axis=1)


def average_precision(scores, truth, ap: str = "step") -> float:
    """AP of one class (``scores``, boolean ``truth`` over examples); NaN without positives."""
    n_pos = int(truth.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    s = scores[order]
    t = truth[order]
    tp = np.cumsum(t)
    # one point per distinct score (the last index of each tie group)
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
    tp = tp[last].astype(np.float64)
    precision = tp / (last + 1.0)
    recall = tp / n_pos
    if ap == "voc07":
        total = 0.0
        for r in np.linspace(0.0, 1.0, 11):
            above = precision[recall >= r]
            total += above.max() if above.size else 0.0
        return total / 11.0
    if ap != "step":
        raise InputError(f"unknown AP definition {ap!r}; use 'step' or 'voc07'")
    dr = np.diff(np.r_[0.0, recall])
    return float(np.sum(dr * precision))


def ranking_metrics(
    S,
    Y,
    *,
    p_at: tuple[int, ...] = (1, 2, 3, 5),
    r_at: tuple[int, ...] = (1, 3, 5, 10),
    ap: str = "step",
    aps: NDArray[np.float64] | None = None,
) -> dict[str, float]:
    """Rank loss, P@k, R@k and mAP (module docstring); values of k above m are skipped.
    ``aps``: the classes' APs when the caller already has them (:func:`class_aps`)."""
    S = _scores(S)
    n, m = S.shape
    T = _dense_truth(Y, S.shape)
    R = pessimistic_order(S, T)
    n_rel = T.sum(axis=1)
    # irrelevant labels at or above each position (ties placed first), summed over relevant
    irr_before = np.cumsum(~R, axis=1)
    reversed_pairs = (irr_before * R).sum(axis=1).astype(np.float64)
    pairs = (n_rel * (m - n_rel)).astype(np.float64)
    rloss = np.zeros(n)  # a loss: no pair to reverse is a perfect 0
    np.divide(reversed_pairs, pairs, out=rloss, where=pairs > 0)
    out = {"rloss": float(np.mean(rloss))}
    hits = np.cumsum(R, axis=1)
    for k in (int(k) for k in p_at if int(k) <= m):
        out[f"p@{k}"] = float(np.mean(hits[:, k - 1] / k))
    for k in (int(k) for k in r_at if int(k) <= m):
        out[f"r@{k}"] = float(np.mean(_ratio(hits[:, k - 1], n_rel)))
    aps = class_aps(S, T, ap) if aps is None else np.asarray(aps, dtype=float)
    out["map"] = float(np.nanmean(aps)) if np.any(np.isfinite(aps)) else float("nan")
    return out


def class_aps(S, Y, ap: str = "step") -> NDArray[np.float64]:
    """Average precision of every class (NaN for a class without positives)."""
    S = _scores(S)
    T = _dense_truth(Y, S.shape)
    return np.array([average_precision(S[:, j], T[:, j], ap) for j in range(S.shape[1])])


def partition_counts(S, T, delta: float):
    """Per-example and per-class TP/FP/FN of ``h(x) = {y : f_y >= delta}``."""
    H = S >= delta
    tp = H & T
    fp = H & ~T
    fn = ~H & T
    return (
        (tp.sum(axis=1), fp.sum(axis=1), fn.sum(axis=1)),
        (tp.sum(axis=0), fp.sum(axis=0), fn.sum(axis=0)),
    )


def partition_metrics(S, Y, delta: float, empty: str = "zero") -> dict[str, float]:
    """Hamming loss, accuracy, subset accuracy and the three F1 averagings at threshold
    ``delta``, with 0/0 counted as ``empty`` prescribes (module docstring)."""
    S = _scores(S)
    T = _dense_truth(Y, S.shape)
    return _partition_from_truth(S, T, float(delta), _check_empty(empty))


def _partition_from_truth(S, T, delta, empty: str) -> dict[str, float]:
    n, m = S.shape
    (tp_i, fp_i, fn_i), (tp_j, fp_j, fn_j) = partition_counts(S, T, delta)
    err_i = fp_i + fn_i
    tp, fp, fn = tp_i.sum(), fp_i.sum(), fn_i.sum()
    return {
        "hloss": float(err_i.sum() / (n * m)),
        "acc": float(np.mean(_ratio(tp_i, tp_i + err_i, empty))),
        "sacc": float(np.mean(err_i == 0)),
        "f1_micro": float(_ratio(2 * tp, 2 * tp + fp + fn, empty)),
        "f1_macro": float(np.mean(_ratio(2 * tp_j, 2 * tp_j + fp_j + fn_j, empty))),
        "f1_inst": float(np.mean(_ratio(2 * tp_i, 2 * tp_i + err_i, empty))),
    }


def _suffix_counts(keys, mask, n_groups, G):
    """``out[g, q] = #{entries of group g in mask with bucket > q}``, q = 0..G-1, from the
    bucket index ``keys = g * (G + 1) + bucket`` of every entry."""
    c = np.bincount(keys[mask], minlength=n_groups * (G + 1)).reshape(n_groups, G + 1)
    return np.cumsum(c[:, ::-1], axis=1)[:, ::-1][:, 1:]


def partition_metrics_grid(S, Y, deltas, empty: str = "zero") -> dict[str, NDArray[np.float64]]:
    """Every partition metric at every ``delta`` of the grid: ``{metric: array(len(deltas))}``.

    One pass instead of one per threshold: with the grid sorted, entry (i, j) is predicted at
    ``delta_q`` iff ``q < b_ij = #{q : delta_q <= S_ij}``; per-example and per-class TP and FP
    at every q are suffix sums of bucket counts, O(n m log G + (n + m) G) in all.
    """
    empty = _check_empty(empty)
    S = _scores(S)
    T = _dense_truth(Y, S.shape)
    deltas = np.asarray(deltas, dtype=np.float64).ravel()
    order = np.argsort(deltas, kind="stable")
    ds = deltas[order]
    n, m = S.shape
    G = ds.size
    b = np.searchsorted(ds, S, side="right")  # predicted at q iff q < b
    rows = (np.arange(n)[:, None] * (G + 1) + b).ravel()
    cols = (np.arange(m)[None, :] * (G + 1) + b).ravel()
    t = T.ravel()
    tp_i, fp_i = _suffix_counts(rows, t, n, G), _suffix_counts(rows, ~t, n, G)
    tp_j, fp_j = _suffix_counts(cols, t, m, G), _suffix_counts(cols, ~t, m, G)
    fn_i = T.sum(axis=1)[:, None] - tp_i
    fn_j = T.sum(axis=0)[:, None] - tp_j
    err_i = fp_i + fn_i
    tp, fp, fn = tp_i.sum(0), fp_i.sum(0), fn_i.sum(0)
    sorted_out = {
        "hloss": err_i.sum(axis=0) / (n * m),
        "acc": _ratio(tp_i, tp_i + err_i, empty).mean(axis=0),
        "sacc": (err_i == 0).mean(axis=0),
        "f1_micro": _ratio(2 * tp, 2 * tp + fp + fn, empty),
        "f1_macro": _ratio(2 * tp_j, 2 * tp_j + fp_j + fn_j, empty).mean(axis=0),
        "f1_inst": _ratio(2 * tp_i, 2 * tp_i + err_i, empty).mean(axis=0),
    }
    out = {}
    for name in PARTITION_METRICS:
        v = np.empty(G)
        v[order] = sorted_out[name]
        out[name] = v
    return out


TIE_TOL = 1e-9  # values this close are ties (the sweep's selection rule)


def best_index(values, metric: str) -> int:
    """Index of the first value within ``TIE_TOL`` of the best, for ``metric``'s direction."""
    values = np.asarray(values, dtype=np.float64)
    score = -values if metric in LOWER_IS_BETTER else values
    return int(np.flatnonzero(score >= np.nanmax(score) - TIE_TOL)[0])


def select_thresholds(S, Y, deltas, empty: str = "zero") -> dict[str, tuple[float, float]]:
    """For each partition metric, ``(best delta, value there)`` on the grid (first on ties)."""
    deltas = np.asarray(deltas, dtype=np.float64)
    grid = partition_metrics_grid(S, Y, deltas, empty)
    out = {}
    for name, values in grid.items():
        q = best_index(values, name)
        out[name] = (float(deltas[q]), float(values[q]))
    return out


def cardinality_threshold(S, cardinality: float) -> float:
    """``delta`` such that the mean number of predicted labels per example in ``S`` is as
    close as possible to ``cardinality`` (the training label cardinality; [97])."""
    S = _scores(S)
    if not 0.0 <= cardinality <= S.shape[1]:
        raise InputError(f"cardinality must be in [0, {S.shape[1]}]; got {cardinality}")
    flat = np.sort(S.ravel())[::-1]
    target = int(round(cardinality * S.shape[0]))
    if target <= 0:
        return float(np.nextafter(flat[0], np.inf))
    return float(flat[min(target, flat.size) - 1])


def label_cardinality(Y) -> float:
    """Mean number of labels per example."""
    if sp.issparse(Y):
        return float(Y.getnnz() / Y.shape[0])
    return float(np.mean((np.asarray(Y) != 0).sum(axis=1)))


def multilabel_metrics(
    S, Y, *, delta: float | dict[str, float] = 0.0, ap: str = "step", empty: str = "zero"
) -> dict[str, float]:
    """Ranking metrics plus the partition metrics at ``delta`` (one value for all, or a
    ``{metric: delta}`` mapping as produced by threshold selection)."""
    empty = _check_empty(empty)
    S = _scores(S)
    T = _dense_truth(Y, S.shape)
    out = ranking_metrics(S, T, ap=ap)
    if isinstance(delta, dict):
        for name in PARTITION_METRICS:
            out[name] = _partition_from_truth(S, T, float(delta[name]), empty)[name]
    else:
        out.update(_partition_from_truth(S, T, float(delta), empty))
    return out
