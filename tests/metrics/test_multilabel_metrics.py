"""Multilabel metrics and threshold selection (:mod:`topkbench.metrics.multilabel`).

What is tested:

* the metrics of TPAMI (/work/shared/papers/002_0e6cc4a42c89f487.txt) §3.1 against
  scikit-learn on random continuous scores (rank loss, mAP, Hamming loss, the three F1
  averagings, accuracy / Jaccard, subset accuracy), rows with empty and complete label sets
  included;
* ties: rank loss counts tied (relevant, irrelevant) pairs as reversed (TPAMI's ``D_i`` uses
  ``<=``), P@k / R@k break ties against the prediction, and R@k of a singleton label set is the
  top-k accuracy of :mod:`topkbench.metrics.topk`;
* small hand-computed cases (P@k, R@k, rank loss, step-wise AP with ties, VOC07 11-point AP);
* both conventions for vanishing denominators (module docstring);
* the threshold grids and per-metric threshold selection of TPAMI §6.3 and DESIGN
  (/work/shared/DESIGN.md) §7, the label-cardinality threshold, metric names (DESIGN §6.2 data
  feed these metrics) and input errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    hamming_loss,
    jaccard_score,
    label_ranking_loss,
)

from topkbench.errors import ConfigError, InputError
from topkbench.metrics.multilabel import (
    LOWER_IS_BETTER,
    PARTITION_METRICS,
    average_precision,
    best_index,
    cardinality_threshold,
    delta_grid,
    is_metric,
    label_cardinality,
    multilabel_metrics,
    partition_metrics,
    partition_metrics_grid,
    ranking_metrics,
    select_thresholds,
)
from topkbench.metrics.topk import topk_accuracy

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def random_problem(seed: int, decimals: int | None = None):
    """Random scores and labels; row 0 has an empty label set, row 1 a complete one."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 301))
    m = int(rng.integers(2, 13))
    S = rng.normal(size=(n, m))
    if decimals is not None:
        S = np.round(S, decimals)
    Y = (rng.random(size=(n, m)) < rng.uniform(0.2, 0.6)).astype(np.int8)
    Y[0] = 0
    Y[1] = 1
    return S, Y


def sk_map(S, Y) -> float:
    aps = [average_precision_score(Y[:, j], S[:, j]) for j in range(Y.shape[1]) if Y[:, j].any()]
    return float(np.mean(aps))


SEEDS = list(range(8))


# ---------------------------------------------------------------------------------------------
# against scikit-learn
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_ranking_metrics_match_sklearn(seed):
    S, Y = random_problem(seed)
    out = ranking_metrics(S, Y)
    assert out["rloss"] == pytest.approx(label_ranking_loss(Y, S), abs=1e-12)
    assert out["map"] == pytest.approx(sk_map(S, Y), abs=1e-12)
    # sparse ground truth gives the same
    assert ranking_metrics(S, sp.csr_matrix(Y)) == out


@pytest.mark.parametrize("empty,zero_division", [("zero", 0), ("one", 1)])
@pytest.mark.parametrize("seed", SEEDS)
def test_partition_metrics_match_sklearn(seed, empty, zero_division):
    S, Y = random_problem(seed)
    Y[:, -1] = 0  # a class without positives: F1-macro depends on the convention
    deltas = [-np.inf, -0.5, 0.0, 0.3, float(np.quantile(S, 0.9)), 1e9]
    grid = partition_metrics_grid(S, Y, deltas, empty)
    for q, delta in enumerate(deltas):
        P = (S >= delta).astype(np.int8)
        out = partition_metrics(S, Y, delta, empty)
        zd = zero_division
        ref = {
            "hloss": hamming_loss(Y, P),
            "f1_micro": f1_score(Y, P, average="micro", zero_division=zd),
            "f1_macro": f1_score(Y, P, average="macro", zero_division=zd),
            "f1_inst": f1_score(Y, P, average="samples", zero_division=zd),
            "acc": jaccard_score(Y, P, average="samples", zero_division=zd),
            "sacc": accuracy_score(Y, P),
        }
        for name, value in ref.items():
            assert out[name] == pytest.approx(value, abs=1e-12), (name, delta)
            assert grid[name][q] == pytest.approx(value, abs=1e-12), (name, delta)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_rank_loss_with_ties_matches_sklearn(seed):
    """sklearn's label_ranking_loss also counts ties as reversed pairs."""
    S, Y = random_problem(seed, decimals=0)  # many exact ties
    assert ranking_metrics(S, Y)["rloss"] == pytest.approx(label_ranking_loss(Y, S), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_map_with_ties_matches_sklearn(seed):
    S, Y = random_problem(seed, decimals=1)
    assert ranking_metrics(S, Y)["map"] == pytest.approx(sk_map(S, Y), abs=1e-12)
    for j in range(Y.shape[1]):
        if Y[:, j].any():
            assert average_precision(S[:, j], Y[:, j] != 0) == pytest.approx(
                average_precision_score(Y[:, j], S[:, j]), abs=1e-12
            )


# ---------------------------------------------------------------------------------------------
# ties
# ---------------------------------------------------------------------------------------------


def test_rank_loss_counts_tied_pairs_as_reversed():
    S = np.array([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    Y = np.array([[1, 0, 0], [0, 1, 1]])
    # row 0: pair (0, 1) tied -> reversed, (0, 2) fine: 1/2; row 1: all tied: 2/2
    assert ranking_metrics(S, Y)["rloss"] == pytest.approx((0.5 + 1.0) / 2)


def test_topk_at_zero_scores_is_zero():
    S = np.zeros((4, 5))
    Y = np.array([[1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 0]])
    out = ranking_metrics(S, Y, p_at=(1, 2), r_at=(1, 2))
    assert out["p@1"] == 0.0 and out["r@1"] == 0.0
    # row 3 has 4 relevant among 5: the single irrelevant one is placed first
    assert out["p@2"] == pytest.approx(np.mean([0, 0, 0, 0.5]))
    assert out["rloss"] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recall_at_k_of_singletons_is_topk_accuracy(seed):
    rng = np.random.default_rng(seed)
    n, m = 200, 7
    S = np.round(rng.normal(size=(n, m)), 0)  # ties everywhere
    S[:10] = 0.0
    y = rng.integers(0, m, size=n)
    Y = np.zeros((n, m), dtype=np.int8)
    Y[np.arange(n), y] = 1
    ks = tuple(range(1, m + 1))
    out = ranking_metrics(S, Y, p_at=(), r_at=ks)
    acc = topk_accuracy(S, y, ks)
    for k in ks:
        assert out[f"r@{k}"] == pytest.approx(acc[k], abs=1e-15), k
        assert out[f"r@{k}"] >= 0.0
    assert out[f"r@{m}"] == 1.0


# ---------------------------------------------------------------------------------------------
# hand-computed cases
# ---------------------------------------------------------------------------------------------


def test_precision_recall_rank_loss_by_hand():
    S = np.array([[0.5, 0.9, 0.1, 0.7, 0.3]])
    Y = np.array([[1, 0, 0, 1, 0]])
    # order: 1, 3, 0, 4, 2 -> relevance 0, 1, 1, 0, 0
    out = ranking_metrics(S, Y, p_at=(1, 2, 3, 5, 6), r_at=(1, 2, 3, 5, 10))
    assert out["p@1"] == 0.0
    assert out["p@2"] == pytest.approx(1 / 2)
    assert out["p@3"] == pytest.approx(2 / 3)
    assert out["p@5"] == pytest.approx(2 / 5)
    assert out["r@1"] == 0.0
    assert out["r@2"] == pytest.approx(1 / 2)
    assert out["r@3"] == 1.0 and out["r@5"] == 1.0
    assert "p@6" not in out and "r@10" not in out  # k > m skipped
    # reversed pairs: (0, 1) and (3, 1) out of 2 * 3
    assert out["rloss"] == pytest.approx(1 / 3)


def test_average_precision_by_hand():
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    t = np.array([True, False, True, False, True])
    # precision at the hits: 1, 2/3, 3/5
    assert average_precision(s, t) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)
    # ties: {0.9: +}, {0.5 x 3: +, -, +}; points (R, P) = (1/3, 1), (1, 3/4)
    s = np.array([0.9, 0.5, 0.5, 0.5, 0.1])
    t = np.array([True, True, False, True, False])
    expected = 1 / 3 * 1.0 + 2 / 3 * 3 / 4
    assert average_precision(s, t) == pytest.approx(expected)
    assert average_precision_score(t, s) == pytest.approx(expected)
    assert np.isnan(average_precision(s, np.zeros(5, dtype=bool)))


def test_voc07_ap_by_hand():
    s = np.array([0.9, 0.8, 0.7, 0.6])
    t = np.array([True, False, True, False])
    # (R, P): (.5, 1), (.5, .5), (1, 2/3), (1, .5); r = 0..0.5 -> 1, r = 0.6..1 -> 2/3
    assert average_precision(s, t, "voc07") == pytest.approx((6 * 1 + 5 * 2 / 3) / 11)
    assert average_precision(s, t) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    S = np.column_stack([s, s[::-1]])
    Y = np.column_stack([t, t[::-1]]).astype(int)
    assert ranking_metrics(S, Y, ap="voc07")["map"] == pytest.approx(28 / 33)
    with pytest.raises(InputError, match="voc07"):
        average_precision(s, t, "nope")


def test_map_over_classes_by_hand():
    S = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.4], [0.5, 0.6, 0.1]])
    Y = np.array([[1, 0, 0], [0, 0, 0], [0, 1, 0]])
    # class 0: ranks 0.9(+), 0.5, 0.2 -> AP 1; class 1: 0.8, 0.6(+), 0.1 -> AP 1/2;
    # class 2 has no positive: left out
    assert ranking_metrics(S, Y)["map"] == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------
# conventions for empty and complete label sets
# ---------------------------------------------------------------------------------------------


def test_empty_and_complete_label_sets():
    S = np.array([[0.3, -0.2, 0.9], [0.1, 0.5, -1.0]])
    Y = np.array([[0, 0, 0], [1, 1, 1]])
    out = ranking_metrics(S, Y, p_at=(1, 3), r_at=(1, 2))
    assert out["rloss"] == 0.0
    assert out["p@1"] == pytest.approx(0.5)  # empty row: 0, complete row: 1
    assert out["r@1"] == pytest.approx((1.0 + 1 / 3) / 2)  # empty row counts as 1
    assert ranking_metrics(S[:1], Y[:1], r_at=(1, 2, 3))["r@1"] == 1.0


@pytest.mark.parametrize("empty,e", [("zero", 0.0), ("one", 1.0)])
def test_empty_prediction_and_truth_by_hand(empty, e):
    S = np.array([[-1.0, -2.0, -3.0], [1.0, -1.0, 0.5]])
    Y = np.array([[0, 0, 0], [1, 0, 0]])
    out = partition_metrics(S, Y, 0.0, empty=empty)
    # row 0: h and Y empty -> acc = f1 = e; row 1: h = {0, 2}, Y = {0} -> acc 1/2, f1 2/3
    assert out["acc"] == pytest.approx((e + 1 / 2) / 2)
    assert out["f1_inst"] == pytest.approx((e + 2 / 3) / 2)
    assert out["sacc"] == pytest.approx(0.5)  # h = Y = {} is a correct prediction
    assert out["hloss"] == pytest.approx(1 / 6)
    # classes: 0 -> F1 1; 1 -> no positive, no prediction -> e; 2 -> FP only -> 0
    assert out["f1_macro"] == pytest.approx((1 + e + 0) / 3)
    assert out["f1_micro"] == pytest.approx(2 / 3)  # tp 1, fp 1, fn 0: no 0/0


@pytest.mark.parametrize("empty,e", [("zero", 0.0), ("one", 1.0)])
def test_all_empty_partition_scores(empty, e):
    S = -np.ones((3, 4))
    Y = np.zeros((3, 4))
    out = partition_metrics(S, Y, 0.0, empty=empty)
    assert out == {"hloss": 0.0, "acc": e, "sacc": 1.0, "f1_micro": e, "f1_macro": e, "f1_inst": e}


def test_the_paper_convention_is_the_default_and_others_are_refused():
    S = np.array([[1.0, -1.0], [1.0, -1.0]])
    Y = np.array([[1, 0], [1, 0]])
    assert partition_metrics(S, Y, 0.0)["f1_macro"] == 0.5  # class 1: 0/0 -> 0
    assert multilabel_metrics(S, Y, empty="one")["f1_macro"] == 1.0
    with pytest.raises(ConfigError, match="empty must be one of zero, one"):
        partition_metrics(S, Y, 0.0, empty="mulan")


def test_map_skips_classes_without_positives_and_is_nan_without_any():
    rng = np.random.default_rng(3)
    S = rng.normal(size=(30, 4))
    Y = (rng.random(size=(30, 4)) < 0.4).astype(int)
    Y[:, 2] = 0
    out = ranking_metrics(S, Y)
    assert out["map"] == pytest.approx(
        np.mean([average_precision_score(Y[:, j], S[:, j]) for j in (0, 1, 3)])
    )
    assert np.isnan(ranking_metrics(S, np.zeros_like(Y))["map"])


# ---------------------------------------------------------------------------------------------
# threshold grids and selection
# ---------------------------------------------------------------------------------------------


def test_mulan_delta_grid():
    g = delta_grid("mulan")
    assert g.shape == (71,)
    assert np.all(np.diff(g) > 0)
    np.testing.assert_allclose(g, -g[::-1], rtol=0, atol=0)
    assert 0.0 in g and g[35] == 0.0
    pos = g[g > 0]
    assert pos.size == 35
    assert pos[0] == pytest.approx(10**-5.9, rel=1e-12)
    assert pos[-1] == pytest.approx(10**0.9, rel=1e-12)
    np.testing.assert_allclose(pos, 10.0 ** np.linspace(-5.9, 0.9, 35), rtol=1e-12)
    assert np.array_equal(delta_grid(), g)


def test_voc_delta_grid_and_unknown_name():
    np.testing.assert_array_equal(delta_grid("voc"), np.linspace(0.1, 10, 100))
    with pytest.raises(InputError, match="unknown threshold grid"):
        delta_grid("imagenet")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_select_thresholds_is_brute_force_best(seed):
    S, Y = random_problem(seed)
    deltas = np.concatenate([np.linspace(-2, 2, 21), [0.0, 0.0]])  # duplicates: first wins
    sel = select_thresholds(S, Y, deltas)
    values = {
        name: [partition_metrics(S, Y, d)[name] for d in deltas] for name in PARTITION_METRICS
    }
    grid = partition_metrics_grid(S, Y, deltas)
    assert set(sel) == set(PARTITION_METRICS)
    for name in PARTITION_METRICS:
        v = np.array(values[name])
        np.testing.assert_allclose(grid[name], v, rtol=0, atol=1e-12)  # summation order
        score = -v if name in LOWER_IS_BETTER else v
        q = int(np.flatnonzero(score >= score.max() - 1e-9)[0])  # first within the tie tolerance
        assert sel[name][0] == float(deltas[q]), name
        assert sel[name][1] == pytest.approx(float(v[q]), abs=1e-12), name


def test_select_thresholds_feeds_multilabel_metrics():
    S, Y = random_problem(5)
    deltas = delta_grid("mulan")
    sel = select_thresholds(S, Y, deltas)
    out = multilabel_metrics(S, Y, delta={k: d for k, (d, _) in sel.items()})
    for name, (_, value) in sel.items():
        assert out[name] == pytest.approx(value, abs=1e-15)
    assert out["rloss"] == ranking_metrics(S, Y)["rloss"]


def test_best_index_direction_and_ties():
    assert LOWER_IS_BETTER == {"rloss", "hloss"}
    v = [3.0, 1.0, 1.0, 3.0]
    assert best_index(v, "hloss") == 1
    assert best_index(v, "rloss") == 1
    assert best_index(v, "acc") == 0
    assert best_index(v, "f1_macro") == 0
    assert best_index([0.2, 0.7, 0.7], "map") == 1


@pytest.mark.parametrize("card", [0.0, 0.37, 1.0, 2.5, 4.0])
def test_cardinality_threshold_matches_label_cardinality(card):
    rng = np.random.default_rng(7)
    n, m = 57, 4
    S = rng.normal(size=(n, m))
    delta = cardinality_threshold(S, card)
    predicted = (S >= delta).sum(axis=1).mean()
    assert predicted == pytest.approx(round(card * n) / n, abs=1e-12)


def test_cardinality_threshold_bounds_and_label_cardinality():
    S = np.arange(6.0).reshape(3, 2)
    with pytest.raises(InputError, match="cardinality"):
        cardinality_threshold(S, 2.5)
    with pytest.raises(InputError):
        cardinality_threshold(S, -0.1)
    Y = np.array([[1, 0], [1, 1], [0, 0]])
    assert label_cardinality(Y) == pytest.approx(1.0)
    assert label_cardinality(sp.csr_matrix(Y)) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# names and input errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rloss", "map", "hloss", "acc", "f1_inst", "p@3", "r@10"])
def test_is_metric_accepts(name):
    assert is_metric(name)


@pytest.mark.parametrize("name", ["p@0", "foo", "r@x", "p@", "q@3", "p@-1", "top1"])
def test_is_metric_rejects(name):
    assert not is_metric(name)


@pytest.mark.parametrize(
    "fn", [ranking_metrics, multilabel_metrics, lambda S, Y: partition_metrics(S, Y, 0.0)]
)
def test_input_errors(fn):
    S = np.zeros((3, 4))
    Y = np.zeros((3, 4))
    bad = S.copy()
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match="NaN"):
        fn(bad, Y)
    bad[1, 2] = np.inf
    with pytest.raises(InputError):
        fn(bad, Y)
    with pytest.raises(InputError, match="shape"):
        fn(S, np.zeros((3, 5)))
    with pytest.raises(InputError, match="shape"):
        fn(S, sp.csr_matrix(np.zeros((4, 4))))
    with pytest.raises(InputError, match="n x m"):
        fn(np.zeros(4), np.zeros(4))
