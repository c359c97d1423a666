"""float32 and memory-mapped features (issue 7, "memory at scale"): SDCA trains on a float32
matrix without a float64 copy (the kernels accumulate in float64), the row-blocked products
give the single-call results, and NaN checks and errors find the offending entry by blocks."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import topkbench
from topkbench.bench.common import make_gaussian_problem
from topkbench.errors import InputError
from topkbench.losses.registry import get_method
from topkbench.solvers import problem as S
from topkbench.validation import check_features


@pytest.fixture(scope="module")
def problem():
    X, y = make_gaussian_problem(300, 6, 4, seed=3, separation=0.5)
    return X.astype(np.float32), y


def test_float32_fit_equals_the_float64_fit_of_the_same_values(problem):
    X32, y = problem
    m32 = topkbench.fit(X32, y, "lr_multi", C=1.0, eps=1e-10, seed=1)
    m64 = topkbench.fit(X32.astype(np.float64), y, "lr_multi", C=1.0, eps=1e-10, seed=1,
                        float32="never")  # fmt: skip
    assert m32.status == m64.status == "converged"
    # the same arithmetic except W's resynchronization (blocked for float32): same optimum
    assert m32.primal == pytest.approx(m64.primal, rel=1e-9)
    np.testing.assert_allclose(m32.W, m64.W, rtol=1e-6, atol=1e-9)
    assert m32.relative_gap <= 1e-10 and m32.epochs == m64.epochs


def test_memmapped_float32_is_not_copied(tmp_path, problem):
    X32, _ = problem
    path = tmp_path / "X.npy"
    np.save(path, X32)
    mm = np.load(path, mmap_mode="r")
    checked = check_features(mm)
    kind, Xk = S._as_features(checked)
    assert kind == "dense" and Xk.dtype == np.float32 and np.shares_memory(Xk, mm)


def test_blocked_products_equal_single_calls(monkeypatch, problem):
    X32, y = problem
    X = X32.astype(np.float64)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(300, 4))
    W = rng.normal(size=(6, 4))
    want_w = S.features_t_dot(X, A)
    want_obj = S.evaluate_objective(X, y, A, W, 1, 0.7, 0.0, 1)
    want_sq = S.row_sqnorms(X)
    monkeypatch.setattr(S, "ROW_BLOCK", 64)
    monkeypatch.setattr(S, "_BLOCK_ENTRIES", 10)  # force blocks of 64 rows
    np.testing.assert_allclose(S.features_t_dot(X, A), want_w, rtol=1e-13, atol=1e-13)
    got = S.evaluate_objective(X, y, A, W, 1, 0.7, 0.0, 1)
    np.testing.assert_allclose(got, want_obj, rtol=1e-13)
    np.testing.assert_allclose(S.row_sqnorms(X32), want_sq, rtol=1e-15)


@pytest.mark.parametrize("kind", ["dense", "csr", "float32"])
@pytest.mark.parametrize("method,gamma", [("svm_ml", 0.0), ("svm_ml", 1.0), ("svm_multi", 0.5)])
def test_certificate_by_score_blocks_equals_one_block(monkeypatch, kind, method, gamma):
    """Certificates score the rows block by block into one buffer (``_score_blocks``): P, D
    and every example's gap equal the one-block evaluation, across blocks of 7 rows (labels'
    offsets, gaps' slices), empty rows and W = 0 included."""
    rng = np.random.default_rng(4)
    n, d, m = 53, 9, 5
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.4)
    X[[0, 20, 52]] = 0.0
    if method == "svm_ml":
        y = sp.csr_matrix((rng.random((n, m)) < 0.4).astype(float))  # some sets empty
    else:
        y = rng.integers(0, m, size=n)
    Xk = {"dense": X, "csr": sp.csr_matrix(X), "float32": X.astype(np.float32)}[kind]
    lid = get_method(method).loss_id
    A = rng.normal(size=(n, m)) * 0.1
    for W in (rng.normal(size=(d, m)), np.zeros((d, m))):
        gaps_one, gaps_blocks = np.empty(n), np.empty(n)
        want = S.evaluate_objective(Xk, y, A, W, lid, 0.7, gamma, 1, gaps_one)
        with monkeypatch.context() as mp:
            mp.setattr(S, "_SCORE_BLOCK_ENTRIES", 7 * m)
            mp.setattr(S, "_BLOCK_ENTRIES", 10)  # dense rows go through the blocks too
            got = S.evaluate_objective(Xk, y, A, W, lid, 0.7, gamma, 1, gaps_blocks)
        np.testing.assert_allclose(got, want, rtol=1e-13)
        np.testing.assert_allclose(gaps_blocks, gaps_one, rtol=1e-12, atol=1e-15)


def test_nonfinite_entry_is_located_past_the_first_block():
    X = np.ones((40_000, 3), dtype=np.float32)
    X[33_333, 2] = np.nan
    with pytest.raises(InputError, match="contains nan at row 33333, column 2"):
        check_features(X)


@pytest.mark.parametrize("blocked", [False, True])
def test_csr_scores_match_scipy(monkeypatch, blocked):
    """The compiled CSR-times-dense products (scores and certificates, X W and X^T A) equal
    dense ones, empty rows, unsorted and int32 indices included, in one pass or by row
    blocks."""
    rng = np.random.default_rng(3)
    X = sp.random(257, 40, density=0.1, format="csr", random_state=rng)
    X[[0, 100, 256]] = 0.0
    X.eliminate_zeros()
    X.indices[X.indptr[5] : X.indptr[6]] = X.indices[X.indptr[5] : X.indptr[6]][::-1].copy()
    W = rng.normal(size=(40, 7))
    A = rng.normal(size=(257, 7))
    y = rng.integers(0, 7, size=257)
    want_obj = S.evaluate_objective(X.toarray(), y, A, W, 1, 0.7, 0.0, 1)
    if blocked:
        monkeypatch.setattr(S, "ROW_BLOCK", 64)
        monkeypatch.setattr(S, "_BLOCK_ENTRIES", 10)
    got = S.features_dot(X, W)
    assert got.flags.c_contiguous and got.dtype == np.float64
    np.testing.assert_allclose(got, X.toarray() @ W, rtol=1e-13, atol=1e-13)
    got_t = S.features_t_dot(X, A)  # the W resynchronization: X^T A
    assert got_t.flags.c_contiguous and got_t.shape == (40, 7)
    np.testing.assert_allclose(got_t, X.toarray().T @ A, rtol=1e-13, atol=1e-13)
    assert not got[[0, 100, 256]].any()
    np.testing.assert_allclose(S.evaluate_objective(X, y, A, W, 1, 0.7, 0.0, 1), want_obj,
                               rtol=1e-13)  # fmt: skip


def _kernel_state(sparse, method, gamma, k, single, epochs=2):
    """A dual and W after one double epoch from 0, then ``epochs`` epochs of the double or
    the single kernels with the same permutations."""

    rng = np.random.default_rng(11)
    n, d, m = 121, 9, 12  # odd: the last pair of a full permutation is a single example
    X = (rng.normal(size=(n, d)) * (rng.random((n, d)) < (0.4 if sparse else 1.0))).astype(
        np.float32
    )
    spec = get_method(method)
    if spec.task == "multilabel":
        y = sp.csr_matrix((rng.random((n, m)) < 0.3).astype(float))
    else:
        y = rng.integers(0, m, size=n)
    prob = S.SDCAProblem(sp.csr_matrix(X) if sparse else X, y, gram=False, n_classes=m,
                         loss_id=spec.loss_id, k=k)  # fmt: skip
    A = np.zeros((n, m))
    W = np.zeros((d, m))
    troots = np.full(n, np.nan)
    perms = np.stack([rng.permutation(n) for _ in range(1 + epochs)]).astype(np.int64)
    prob.run_epochs(A, W, perms[:1], 2.0, gamma, troots)
    prob.run_epochs(A, W, perms[1:], 2.0, gamma, troots, single)
    # and one epoch over a shrunk active set (an even count of the examples, filtered)
    kept = perms[1][perms[1] % 3 != 0][None, :]
    prob.run_epochs(A, W, kept, 2.0, gamma, troots, single)
    return prob, A, W


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize(
    "method,gamma,k",
    [("svm_multi", 0.0, 1), ("topk_svm_alpha", 0.0, 3), ("lr_multi", 0.0, 1),
     ("svm_ml", 1.0, 1), ("lr_ml", 0.0, 1)],
)  # fmt: skip
def test_single_epochs_follow_the_double_ones(sparse, method, gamma, k):
    """The float32 passes (``sdca_epochs_*_single``) take the double kernels' trajectory up to
    the rounding of float32 scores: the same permutations from the same dual give the same
    dual to ~1e-5 of its scale, and W stays X^T A to float32 rounding."""
    prob, A64, W64 = _kernel_state(sparse, method, gamma, k, single=False)
    _, A32, W32 = _kernel_state(sparse, method, gamma, k, single=True)
    scale = np.abs(A64).max()
    assert scale > 0.1 and np.abs(A32 - A64).max() <= 1e-5 * scale
    assert not np.array_equal(A32, A64)  # the float32 kernels did run
    Wx = S.features_t_dot(prob.X, A32)
    np.testing.assert_allclose(W32, Wx, rtol=0, atol=1e-5 * np.abs(Wx).max())
    np.testing.assert_allclose(W64, S.features_t_dot(prob.X, A64), rtol=0,
                               atol=1e-12 * np.abs(W64).max())  # fmt: skip


def test_keeps_single_until_a_stall_or_the_floor():
    def trace(*gaps):
        return [S.TracePoint(e, 1.0, 1.0 - g, g, 0.0) for e, g in enumerate(gaps)]

    assert S.keeps_single(trace(1.0, 0.5))
    assert S.keeps_single(trace(1.0, 0.5, 0.6, 0.7, 0.4))  # a rise is not a stall
    assert not S.keeps_single(trace(1.0, 0.5, 0.6, 0.7, 0.5))  # three without a new best
    assert not S.keeps_single(trace(1.0, 1e-4, 0.5 * S.SINGLE_MIN_GAP))  # the floor


@pytest.mark.parametrize("sparse", [False, True])
def test_float32_fit_hands_its_last_digits_to_float64(sparse):
    """A fit to eps below SINGLE_MIN_GAP on float32 features runs float32 epochs first and
    float64 ones after, reaches the double fit's optimum, and reports the certificate of
    the float64 W = X^T A of its dual."""
    X, y = make_gaussian_problem(400, 8, 5, seed=2, separation=0.5)
    X = X.astype(np.float32)
    if sparse:
        X[np.random.default_rng(0).random(X.shape) < 0.5] = 0.0
    Xk = sp.csr_matrix(X) if sparse else X
    Xd = sp.csr_matrix(X.astype(np.float64)) if sparse else X.astype(np.float64)
    kw = dict(C=1.0, eps=1e-9, seed=1, accelerate="never")
    m32 = topkbench.fit(Xk, y, "lr_multi", **kw)
    m64 = topkbench.fit(Xd, y, "lr_multi", **kw, float32="never")
    assert m32.status == m64.status == "converged" and m32.relative_gap <= 1e-9
    assert 0 < m32.info["float32_epochs"] < m32.epochs and "float32_epochs" not in m64.info
    assert m32.primal == pytest.approx(m64.primal, rel=1e-8)
    np.testing.assert_array_equal(m32.W, S.features_t_dot(S._as_features(Xk)[1], m32.A))
    P, D = S.evaluate_objective(Xd, y, m32.A, m32.W, get_method("lr_multi").loss_id, 1.0, 0.0, 1)
    assert (P, D) == pytest.approx((m32.primal, m32.dual), rel=1e-12)


def test_badly_scaled_float32_features_still_reach_eps():
    """Columns scaled from 10^-1.5 to 10^1.5 (plain SDCA takes thousands of epochs): the run
    certifies eps like the double fit, in float32 until it stalls or nears the floor."""
    X, y = make_gaussian_problem(300, 6, 4, seed=5, separation=0.5)
    X = (X * np.logspace(-1.5, 1.5, 6)).astype(np.float32)
    kw = dict(C=0.1, eps=1e-4, seed=0, max_epochs=20_000, accelerate="never")
    m32 = topkbench.fit(X, y, "svm_multi", gamma=1.0, **kw)
    m64 = topkbench.fit(X.astype(np.float64), y, "svm_multi", gamma=1.0, **kw)
    assert m32.status == m64.status == "converged"
    assert 10 < m32.info["float32_epochs"] < m32.epochs  # float32, then float64 at a stall
    assert m32.primal == pytest.approx(m64.primal, rel=1e-4)


def test_no_float32_epochs_near_the_optimum():
    """A warm start already below SINGLE_MIN_GAP, and plain SDCA handed back by the
    accelerated phase, run float64 epochs only."""
    X, y = make_gaussian_problem(200, 6, 4, seed=3, separation=0.3)
    X = X.astype(np.float32)
    kw = dict(C=1.0, seed=1)
    smooth = dict(kw, gamma=1.0, accelerate="never")
    tight = topkbench.fit(X, y, "svm_multi", eps=1e-7, **smooth)
    assert tight.relative_gap < S.SINGLE_MIN_GAP
    warm = topkbench.fit(X, y, "svm_multi", eps=1e-11, warm_start=tight, **smooth)
    assert warm.epochs > 0 and "float32_epochs" not in warm.info
    acc = topkbench.fit(X, y, "svm_multi", eps=1e-10, accelerate="catalyst", max_epochs=5000, **kw)
    assert acc.status == "converged" and "plain_from_epoch" in acc.info
    assert acc.info.get("float32_epochs", 0) <= acc.info["accelerated_from_epoch"]


@pytest.mark.parametrize("sparse", [False, True])
def test_rbf_kernel_of_float32_features_is_the_float64_one(sparse):
    """Table 7's RBF rows take their Gram matrices from the dataset's features, which a
    ``float32: true`` record stores as float32: the kernel is computed in float64."""
    from topkbench.gram import rbf_kernel

    rng = np.random.default_rng(2)
    X = (rng.random((50, 40)) < 0.2).astype(np.float64)
    Z = X[:7] * 0.5
    conv = sp.csr_matrix if sparse else np.asarray
    want = rbf_kernel(conv(X), conv(Z), theta=0.0137)
    got = rbf_kernel(conv(X.astype(np.float32)), conv(Z.astype(np.float32)), theta=0.0137)
    assert got.dtype == np.float64 and np.array_equal(got, want)
    assert np.array_equal(rbf_kernel(conv(X.astype(np.float32)), theta=0.3),
                          rbf_kernel(conv(X), theta=0.3))  # fmt: skip


@pytest.mark.parametrize("sparse", [False, True])
def test_features_exact_in_float32_get_float32_passes(sparse):
    """float64 features whose every value is a float32 (binary pixels, bag-of-words counts)
    get float32 passes through fit (float32="auto"), certified as the float64 fit is; values
    that are not exact, and float32="never", keep float64 passes; a float32 input with
    "never" is widened."""
    from topkbench.errors import ConfigError

    rng = np.random.default_rng(5)
    X = (rng.random((300, 20)) < 0.3) * rng.integers(1, 4, (300, 20)).astype(np.float64)
    y = rng.integers(0, 4, 300)
    Xk = sp.csr_matrix(X) if sparse else X
    kw = dict(C=1.0, eps=1e-6, seed=1, accelerate="never")
    auto = topkbench.fit(Xk, y, "svm_multi", gamma=1.0, **kw)
    never = topkbench.fit(Xk, y, "svm_multi", gamma=1.0, float32="never", **kw)
    assert auto.info["float32_epochs"] > 0 and "float32_epochs" not in never.info
    assert auto.converged and never.converged
    assert auto.primal == pytest.approx(never.primal, rel=2e-6)
    inexact = Xk * 0.1  # 0.1, 0.2, 0.3 are not floats32
    assert "float32_epochs" not in topkbench.fit(inexact, y, "svm_multi", gamma=1.0, **kw).info
    widened = topkbench.fit(Xk.astype(np.float32), y, "svm_multi", gamma=1.0, float32="never",
                            **kw)  # fmt: skip
    assert "float32_epochs" not in widened.info and widened.primal == never.primal
    with pytest.raises(ConfigError, match="float32 must be one of auto, never"):
        topkbench.fit(Xk, y, "svm_multi", float32="yes")


def test_float32_never_reaches_the_lr_multi_start_of_ent_tr(monkeypatch):
    """top-k Ent_tr's LR^Multi start honours float32="never" (a dataset's float32: false)."""
    import topkbench.api as api

    seen = []
    real = api.pass_precision
    monkeypatch.setattr(api, "pass_precision", lambda X, mode: seen.append(mode) or real(X, mode))
    rng = np.random.default_rng(2)
    X = (rng.random((60, 5)) < 0.4).astype(np.float64)
    topkbench.fit(X, np.arange(60) % 4, "topk_ent_tr", k=2, float32="never", max_epochs=50)
    assert seen == ["never"]
