"""``topkbench.fit`` (DESIGN §9): input validation, error types and messages, stopping status,
warm starts, reproducibility; top-k accuracy's tie rule (DESIGN §2)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import topkbench
from topkbench.errors import (
    ConfigError,
    ConvergenceWarning,
    InputError,
    SolverError,
    TopkbenchError,
)
from topkbench.losses.registry import available_methods
from topkbench.metrics.topk import label_ranks, topk_accuracy


@pytest.fixture(scope="module")
def data(problem_factory):
    return problem_factory(n=20, d=3, m=4, seed=5)


# --- parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize("C", [0.0, -1.0, float("nan"), float("inf"), "abc", None])
def test_rejects_bad_C(data, C):
    X, y = data
    with pytest.raises(ConfigError, match="C must"):
        topkbench.fit(X, y, "svm_multi", C=C)


@pytest.mark.parametrize("gamma", [-0.1, float("nan"), float("-inf")])
def test_rejects_bad_gamma(data, gamma):
    X, y = data
    with pytest.raises(ConfigError, match="gamma"):
        topkbench.fit(X, y, "svm_multi", gamma=gamma)


def test_rejects_gamma_for_methods_without_smoothing(data):
    X, y = data
    with pytest.raises(ConfigError, match="lr_multi"):
        topkbench.fit(X, y, "lr_multi", gamma=0.5)


@pytest.mark.parametrize("k", [0, -1, 4, 10, 1.5, True, "2"])
def test_rejects_k_outside_1_to_m_minus_1(data, k):
    X, y = data  # m = 4
    with pytest.raises(ConfigError, match=r"k must"):
        topkbench.fit(X, y, "svm_multi", k=k)


def test_top1_methods_take_no_k(data):
    X, y = data
    with pytest.raises(ConfigError, match="k=1"):
        topkbench.fit(X, y, "svm_multi", k=2)


@pytest.mark.parametrize("eps", [0.0, 1.0, -1e-3, float("nan")])
def test_rejects_bad_eps(data, eps):
    X, y = data
    with pytest.raises(ConfigError, match="eps"):
        topkbench.fit(X, y, "svm_multi", eps=eps)


@pytest.mark.parametrize("max_epochs", [-1, 2.5, "ten"])
def test_rejects_bad_max_epochs(data, max_epochs):
    X, y = data
    with pytest.raises(ConfigError, match="max_epochs"):
        topkbench.fit(X, y, "svm_multi", max_epochs=max_epochs)


def test_unknown_method_lists_available_ones(data):
    X, y = data
    with pytest.raises(ConfigError) as info:
        topkbench.fit(X, y, "svm_multy")
    message = str(info.value)
    assert "svm_multy" in message
    assert "Available methods are" in message
    for name in available_methods():
        assert name in message


def test_method_aliases_and_case(data):
    X, y = data
    a = topkbench.fit(X, y, "svm_multi", eps=1e-4)
    b = topkbench.fit(X, y, " CS_SVM ", eps=1e-4)
    assert b.method == "svm_multi"
    np.testing.assert_array_equal(a.W, b.W)


def test_errors_are_valueerrors_of_one_hierarchy():
    for cls in (ConfigError, InputError):
        assert issubclass(cls, TopkbenchError)
        assert issubclass(cls, ValueError)


# --- features -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nonfinite_dense_features_naming_row_and_column(data, bad):
    X, y = data
    X = X.copy()
    X[7, 2] = bad
    with pytest.raises(InputError, match=r"row 7, column 2"):
        topkbench.fit(X, y, "svm_multi")


def test_rejects_nonfinite_sparse_features_naming_row_and_column(data):
    X, y = data
    X = X.copy()
    X[11, 1] = np.nan
    Xs = sp.csr_matrix(np.where(np.isnan(X), 0.0, X) + 0.0)
    Xs = Xs.tolil()
    Xs[11, 1] = np.nan
    with pytest.raises(InputError, match=r"row 11, column 1"):
        topkbench.fit(Xs.tocsr(), y, "svm_multi")


@pytest.mark.parametrize(
    "X", [np.zeros(5), np.zeros((0, 3)), np.zeros((2, 2, 2)), [["a", "b"], ["c", "d"]]]
)
def test_rejects_malformed_feature_arrays(X):
    with pytest.raises(InputError):
        topkbench.fit(X, [0, 1], "svm_multi")


# --- labels ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "labels, fragment",
    [
        ([0, 1, 0.5, 2], "0.5"),
        ([0, 1, "a", 2], "'a'"),
        ([0, 1, np.nan, 2], "nan"),
    ],
)
def test_rejects_bad_labels(labels, fragment):
    X = np.eye(4)
    with pytest.raises(InputError, match="labels must be integers") as info:
        topkbench.fit(X, np.array(labels, dtype=object), "svm_multi")
    assert fragment in str(info.value)


def test_accepts_integer_valued_float_labels():
    X = np.eye(4)
    model = topkbench.fit(X, np.array([0.0, 1.0, 2.0, 1.0]), "svm_multi", eps=1e-6)
    assert model.n_classes == 3


@pytest.mark.parametrize(
    "labels, n_classes, match",
    [
        ([0, 1, 0], None, "got 3 labels for 4 rows"),
        ([0, 0, 0, 0], None, "at least 2 classes"),
        ([0, 1, 5, 1], 3, "outside"),
        ([[0, 1], [1, 0]], None, "1-D"),
    ],
)
def test_rejects_inconsistent_labels(labels, n_classes, match):
    with pytest.raises(InputError, match=match):
        topkbench.fit(np.eye(4), labels, "svm_multi", n_classes=n_classes)


def test_labels_become_classes_without_empty_ones():
    X = np.random.default_rng(0).normal(size=(9, 3))
    y = np.array([5, 7, 9] * 3)
    model = topkbench.fit(X, y, "svm_multi", eps=1e-6)
    assert model.n_classes == 3 and list(model.classes) == [5, 7, 9]
    ref = topkbench.fit(X, y // 2 - 2, "svm_multi", eps=1e-6)  # the same problem as 0, 1, 2
    assert ref.classes is None
    np.testing.assert_allclose(model.W, ref.W)
    signed = topkbench.fit(X, np.array([-1, 1, 1] * 3), "svm_multi", eps=1e-6)
    assert list(signed.classes) == [-1, 1]
    big = topkbench.fit(X, np.array([0, 2**40, 3] * 3), "svm_multi", eps=1e-6)
    assert big.n_classes == 3 and list(big.classes) == [0, 3, 2**40]


@pytest.mark.parametrize(
    "labels, match",
    [
        ([7, 7, 7, 7], "need at least 2 classes; every label is 7"),
        ([0, 1, 1e20, 2], "outside the int64 range"),
        (np.array([0, 1, 2**70, 2], dtype=object), "outside the int64 range"),
    ],
)
def test_rejects_one_class_and_labels_beyond_int64(labels, match):
    with pytest.raises(InputError, match=match):
        topkbench.fit(np.eye(4), labels, "svm_multi")


def test_class_indices_with_n_classes_stay_indices():
    with pytest.raises(InputError, match="0-based"):
        topkbench.fit(np.eye(4), [0, 1, -1, 2], "svm_multi", n_classes=3)


@pytest.mark.parametrize("dtype", [np.complex128, object])
def test_rejects_complex_and_object_features(dtype):
    X = np.eye(4).astype(dtype)
    with pytest.raises(InputError, match="complex|dtype object"):
        topkbench.fit(X, [0, 1, 0, 1], "svm_multi")
    if dtype is np.complex128:
        with pytest.raises(InputError, match="complex"):
            topkbench.fit(sp.csr_matrix(X), [0, 1, 0, 1], "svm_multi")


def test_refuses_a_model_larger_than_memory():
    X = sp.csr_matrix((np.ones(2), ([0, 1], [0, 99_999_999_998])), shape=(4, 99_999_999_999))
    with pytest.raises(InputError, match=r"needs \d+\.\d GB .*99,999,999,999 features"):
        topkbench.fit(X, [0, 1, 0, 1], "svm_multi")


def test_dual_above_primal_is_an_error_not_convergence():
    X = np.random.default_rng(0).normal(size=(30, 3))
    with pytest.raises(SolverError, match="primal .* < dual"):
        topkbench.fit(X, np.arange(30) % 3, "svm_multi", gamma=1e300)


def test_n_classes_adds_unseen_classes():
    model = topkbench.fit(np.eye(4), [0, 1, 0, 1], "lr_multi", n_classes=5, eps=1e-6)
    assert model.W.shape == (4, 5)


# --- stopping, status, warm start, reproducibility -----------------------------------------


def test_max_epochs_warns_and_does_not_claim_convergence(data):
    X, y = data
    with pytest.warns(ConvergenceWarning, match="max_epochs"):
        model = topkbench.fit(X, y, "svm_multi", C=10.0, eps=1e-12, max_epochs=2)
    assert model.status == "max_epochs"
    assert not model.converged
    assert model.epochs == 2
    assert model.relative_gap > 1e-12
    assert [p.epoch for p in model.trace] == [0, 1, 2]


def test_warn_false_silences_the_budget_warning(data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = topkbench.fit(X, y, "svm_multi", eps=1e-12, max_epochs=1, warn=False)
    assert model.status == "max_epochs"


def test_time_limit_status(data):
    X, y = data
    with pytest.warns(ConvergenceWarning, match="time_limit"):
        model = topkbench.fit(X, y, "svm_multi", C=100.0, eps=1e-15, time_limit=1e-9)
    assert model.status == "time_limit"


@pytest.mark.parametrize("method", ["svm_multi", "lr_multi", "svm_ova", "lr_ova"])
def test_converged_status_and_certificate(data, method):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = topkbench.fit(X, y, method, eps=1e-6, max_epochs=100_000)
    assert model.status == "converged" and model.converged
    assert model.relative_gap <= 1e-6
    assert model.relative_gap == pytest.approx(
        (model.primal - model.dual) / max(abs(model.primal), abs(model.dual)), rel=1e-12
    )
    trace = model.trace
    assert trace[0].epoch == 0 and trace[-1].epoch == model.epochs
    assert trace[-1].primal == model.primal and trace[-1].dual == model.dual
    if not {"newton_from_epoch", "accelerated_from_epoch"} & model.info.keys():
        assert all(
            p.dual <= q.dual + 1e-12 for p, q in zip(trace[:-1], trace[1:], strict=True)
        )  # plain SDCA's D ascends (a second-order phase's gradient duals need not)
    assert all(p.dual <= p.primal + 1e-12 for p in trace)  # weak duality
    np.testing.assert_allclose(model.decision_function(X), X @ model.W, rtol=1e-12)


def test_eval_every(data):
    X, y = data
    model = topkbench.fit(X, y, "svm_multi", eps=1e-12, max_epochs=7, eval_every=3, warn=False)
    assert [p.epoch for p in model.trace] == [0, 3, 6, 7]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "often", True])
def test_eval_every_refuses_bad_values(data, bad):
    X, y = data
    with pytest.raises(ConfigError, match="eval_every must be 'auto' or an integer >= 1"):
        topkbench.fit(X, y, "svm_multi", eval_every=bad)


def test_eval_every_auto_is_reproducible(data):
    """The default schedule uses no timings: the same call evaluates at the same epochs and
    returns the same model (shrinking follows the evaluations)."""
    X, y = data
    runs = [topkbench.fit(X, y, "svm_multi", C=1.0, eps=1e-4, warn=False) for _ in range(2)]
    epochs = [[p.epoch for p in r.trace] for r in runs]
    assert epochs[0] == epochs[1] and len(epochs[0]) >= 3
    assert np.array_equal(runs[0].A, runs[1].A)
    assert runs[0].status == "converged" and runs[0].relative_gap <= 1e-4
    every = topkbench.fit(X, y, "svm_multi", C=1.0, eps=1e-4, eval_every="3", warn=False)
    assert [p.epoch for p in every.trace][:3] == [0, 3, 6]


def test_zero_epochs_returns_the_starting_point(data):
    X, y = data
    model = topkbench.fit(X, y, "lr_multi", max_epochs=0, warn=False)
    assert model.epochs == 0
    assert np.all(model.W == 0.0)
    assert model.primal == pytest.approx(np.log(4.0), rel=1e-15)  # L(0) = log m


@pytest.mark.parametrize(
    "method,gamma",
    [("svm_multi", 0.0), ("svm_multi", 1.0), ("lr_multi", 0.0), ("svm_ova", 0.0), ("lr_ova", 0.0)],
)
def test_warm_start_reaches_the_same_optimum(data, method, gamma):
    X, y = data
    cold = topkbench.fit(X, y, method, C=2.0, gamma=gamma, eps=1e-10, max_epochs=100_000)
    previous = topkbench.fit(X, y, method, C=0.5, gamma=gamma, eps=1e-10, max_epochs=100_000)
    warm = topkbench.fit(
        X, y, method, C=2.0, gamma=gamma, eps=1e-10, max_epochs=100_000, warm_start=previous
    )
    assert warm.status == cold.status == "converged"
    assert warm.primal == pytest.approx(cold.primal, rel=1e-9)
    # the rescaled dual of the previous C is feasible: D of the first trace point is finite
    assert np.isfinite(warm.trace[0].dual)
    # warm start from the tuple form, and from the solution itself (already optimal)
    again = topkbench.fit(X, y, method, C=2.0, gamma=gamma, eps=1e-9, warm_start=(2.0, cold.A))
    assert again.epochs <= 1
    assert again.primal == pytest.approx(cold.primal, rel=1e-9)


def test_warm_start_must_match_method_and_data(data):
    X, y = data
    svm = topkbench.fit(X, y, "svm_multi", eps=1e-4)
    with pytest.raises(ConfigError, match="svm_multi"):
        topkbench.fit(X, y, "lr_multi", warm_start=svm)
    with pytest.raises(ConfigError, match="shape"):
        topkbench.fit(X[:10], y[:10], "svm_multi", warm_start=svm)
    state = svm.warm_state()
    with pytest.raises(ConfigError, match="primal W has shape"):
        topkbench.fit(X, y, "svm_multi", warm_start=state._replace(W=state.W[:-1]))
    with pytest.raises(ConfigError, match="pair"):
        topkbench.fit(X, y, "svm_multi", warm_start=(1.0, svm.A, svm.W))


def test_a_warm_state_continues_as_its_model_does():
    """What a checkpoint holds (Model.warm_state) warm-starts a fit exactly as the model
    itself: the same iterates for a Newton continuation and for Ent_tr, whose inner
    LR^Multi fit (here in its Newton phase) takes the dual only."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((80, 4)) * 5.0, np.arange(80) % 4
    for method, kw in (("svm_multi", {}), ("topk_ent_tr", {"k": 2})):
        prev = topkbench.fit(X, y, method, C=5.0, eps=1e-6, warn=False, **kw)
        a = topkbench.fit(X, y, method, C=50.0, eps=1e-6, warm_start=prev, warn=False, **kw)
        b = topkbench.fit(X, y, method, C=50.0, eps=1e-6, warm_start=prev.warm_state(),
                          warn=False, **kw)  # fmt: skip
        np.testing.assert_array_equal(a.W, b.W)


@pytest.mark.parametrize("method", ["svm_multi", "lr_multi", "svm_ova", "lr_ova"])
def test_same_seed_same_model(data, method):
    X, y = data
    a = topkbench.fit(X, y, method, C=3.0, eps=1e-8, seed=7, max_epochs=50, warn=False)
    b = topkbench.fit(X, y, method, C=3.0, eps=1e-8, seed=7, max_epochs=50, warn=False)
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.A, b.A)
    assert a.epochs == b.epochs
    c = topkbench.fit(X, y, method, C=3.0, eps=1e-8, seed=8, max_epochs=2, warn=False)
    d = topkbench.fit(X, y, method, C=3.0, eps=1e-8, seed=7, max_epochs=2, warn=False)
    assert not np.array_equal(c.A, d.A)  # the seed does drive the permutations


def test_decision_function_checks_width(data):
    X, y = data
    model = topkbench.fit(X, y, "svm_multi", eps=1e-4)
    with pytest.raises(InputError, match="features"):
        model.decision_function(np.ones((2, 5)))
    S = model.decision_function(sp.csr_matrix(X))
    np.testing.assert_allclose(S, X @ model.W, rtol=1e-12)


# --- top-k accuracy ---------------------------------------------------------------------------


def test_zero_scores_give_zero_accuracy():
    y = np.array([0, 1, 2, 3, 2])
    acc = topk_accuracy(np.zeros((5, 4)), y, ks=(1, 2, 3, 4))
    # all m - 1 other classes tie with the label, so the rank is m - 1 = 3
    assert acc == {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}


def test_untrained_model_has_zero_top1_accuracy(data):
    X, y = data
    model = topkbench.fit(X, y, "svm_multi", max_epochs=0, warn=False)
    assert topk_accuracy(model.decision_function(X), y)[1] == 0.0


def test_ties_count_against_the_prediction():
    scores = np.array(
        [
            [1.0, 1.0, 0.0],  # label 0 ties with class 1: rank 1
            [0.0, 2.0, 1.0],  # label 1 strictly best: rank 0
            [3.0, 3.0, 3.0],  # label 2 ties with both: rank 2
            [0.5, 0.2, 0.1],  # label 2 worst: rank 2
        ]
    )
    y = np.array([0, 1, 2, 2])
    np.testing.assert_array_equal(label_ranks(scores, y), [1, 0, 2, 2])
    assert topk_accuracy(scores, y, ks=(1, 2, 3)) == {1: 0.25, 2: 0.5, 3: 1.0}


def test_topk_accuracy_matches_eq1_for_distinct_scores():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(200, 6))
    y = rng.integers(0, 6, size=200)
    order = np.argsort(-scores, axis=1)
    for k in (1, 2, 3, 5):
        expected = np.mean([y[i] in order[i, :k] for i in range(200)])
        assert topk_accuracy(scores, y, ks=(k,))[k] == pytest.approx(expected)


def test_ent_tr_init_is_the_start_point():
    """init=M starts L-BFGS from M.W: LR^Multi at the same C gives the default path's result."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4))
    y = np.arange(60) % 4
    lr = topkbench.fit(X, y, "lr_multi", C=0.7, eps=1e-6)
    default = topkbench.fit(X, y, "topk_ent_tr", C=0.7, k=2, eps=1e-6)
    started = topkbench.fit(X, y, "topk_ent_tr", C=0.7, k=2, eps=1e-6, init=lr)
    np.testing.assert_allclose(started.W, default.W, rtol=1e-10, atol=1e-12)
    assert started.info["init_C"] == 0.7
    other = topkbench.fit(X, y, "topk_ent_tr", C=0.7, k=2, eps=1e-6,
                          init=topkbench.fit(X, y, "lr_multi", C=0.01))  # fmt: skip
    assert other.info["init_C"] == 0.01
    assert not np.allclose(other.W, default.W)  # a different start, a different local optimum
    with pytest.raises(ConfigError, match="init= is for topk_ent_tr"):
        topkbench.fit(X, y, "lr_multi", C=1.0, init=lr)
    with pytest.raises(ConfigError, match="init= is for topk_ent_tr"):  # not ignored by FW
        topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, fw="standard", init=lr)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_seed_is_a_non_negative_integer(data, seed):
    """The Python API refuses what the CLI refuses, with the same message."""
    X, y = data
    with pytest.raises(ConfigError, match=r"seed must be an integer >= 0; got"):
        topkbench.fit(X, y, "lr_multi", seed=seed)
    assert topkbench.fit(X, y, "lr_multi", seed=np.int64(3), max_epochs=2, warn=False).params[
        "seed"] == 3  # fmt: skip
