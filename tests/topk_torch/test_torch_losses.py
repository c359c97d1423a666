"""topkbench.torch: the registry's losses under autograd, checked against the numba kernels
(values and gradients to 1e-10 in float64), by gradcheck, and in the hard regimes (ties,
scores up to 1e4, gamma down to 1e-8, k up to m - 1, float32, m = 1,000 with batches of
1,024, empty label sets); bad inputs are refused with the valid range."""

from __future__ import annotations

import math

import numpy as np
import pytest
from torch_required import import_torch

torch = import_torch()

from topk_torch.reference import (  # noqa: E402
    HINGES,
    limit_gradient,
    numba_ent_tr_values,
    numba_gradient,
    numba_values,
    rank_weights,
    smoothed_gradient,
    weights_of,
    wtopk_limit_gradient,
)

from topkbench.torch import AVAILABLE, TopKLoss, loss  # noqa: E402

SMOOTHABLE = (
    "svm_ova",
    "svm_multi",
    "topk_svm_alpha",
    "topk_svm_alpha_pseudo",
    "topk_svm_beta",
    "svm_ml",
    "wtopk_svm",
)
TOPK = ("topk_svm_alpha", "topk_svm_alpha_pseudo", "topk_svm_beta", "topk_ent", "topk_ent_tr",
        "wtopk_svm")  # fmt: skip
MULTILABEL = ("svm_ml", "lr_ml")
BATCHES_PER_METHOD = 100  # 12 methods: 1,200 random batches


def _draw(rng, method):
    """A random small batch: m classes, k, gamma, scores with ties in about half the batches."""
    m = int(rng.integers(2, 13))
    B = int(rng.integers(1, 10))
    k = int(rng.integers(1, m)) if method in TOPK else 1
    gamma = 0.0
    if method in SMOOTHABLE and rng.random() < 0.7:
        gamma = float(10.0 ** rng.uniform(-3, 1))
    S = rng.standard_normal((B, m)) * 10.0 ** rng.uniform(-1, 1)
    if rng.random() < 0.5:  # ties: scores on a coarse grid
        S = np.round(S * 2) / 2
    if method in MULTILABEL:
        y = (rng.random((B, m)) < rng.uniform(0.0, 1.0)).astype(np.float64)
        y[0] = 0.0  # an empty label set
    else:
        y = rng.integers(0, m, B)
    return S, y, k, gamma


def _torch_values_and_grad(method, S, y, k, gamma, dtype=torch.float64):
    St = torch.tensor(S, dtype=dtype, requires_grad=True)
    v = loss(method, St, torch.tensor(y), k=k, gamma=gamma, reduction="none",
             weights=weights_of(method, k))  # fmt: skip
    v.sum().backward()
    return v.detach().double().numpy(), St.grad.double().numpy()


@pytest.mark.parametrize("method", AVAILABLE)
def test_matches_the_numba_losses_on_random_batches(method):
    rng = np.random.default_rng(abs(hash(method)) % 2**32)
    for _ in range(BATCHES_PER_METHOD):
        S, y, k, gamma = _draw(rng, method)
        value, grad = _torch_values_and_grad(method, S, y, k, gamma)
        if method == "topk_ent_tr":
            ref_value = numba_ent_tr_values(S, y, k)
        else:
            ref_value = numba_values(method, S, y, k, gamma)
        ref_grad = numba_gradient(method, S, y, k, gamma)
        np.testing.assert_allclose(value, ref_value, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", [m for m in HINGES if m in AVAILABLE])
def test_gamma_zero_gradient_is_the_limit_of_the_smoothed_ones(method):
    """At gamma = 0 a hinge's gradient is the limit of the smoothed gradients (checked here
    against the kernels' at gamma = 1e-9, to their rounding), a subgradient of the loss."""
    rng = np.random.default_rng(7)
    S = rng.standard_normal((60, 9)) * 2
    y = rng.integers(0, 9, 60)
    k = 1 if method == "svm_multi" else 3
    _, grad = _torch_values_and_grad(method, S, y, k, 0.0)
    np.testing.assert_allclose(grad, limit_gradient(method, S, y, k), atol=0)
    np.testing.assert_allclose(grad, smoothed_gradient(method, S, y, k, 1e-9), atol=1e-6)
    # a subgradient: L(s') >= L(s) + <g, s' - s> for random s'
    for _ in range(20):
        T = S + rng.standard_normal(S.shape)
        lhs = numba_values(method, T, y, k, 0.0)
        rhs = numba_values(method, S, y, k, 0.0) + ((T - S) * grad).sum(axis=1)
        assert (lhs >= rhs - 1e-12).all()


@pytest.mark.parametrize("method,k,gamma", [
    ("svm_ova", 1, 0.5), ("lr_ova", 1, 0.0), ("lr_multi", 1, 0.0), ("svm_multi", 1, 0.5),
    ("topk_svm_alpha", 4, 0.5),
    ("topk_svm_alpha_pseudo", 3, 0.5), ("topk_svm_beta", 3, 0.5), ("topk_ent_tr", 3, 0.0),
    ("topk_ent", 3, 0.0),
    ("lr_ml", 1, 0.0), ("svm_ml", 1, 0.5), ("wtopk_svm", 3, 0.5),
])  # fmt: skip
def test_gradcheck(method, k, gamma):
    """Finite differences of the value agree with the gradient where the loss is smooth (the
    smoothed hinges; top-k Ent_tr away from ties of its dropped classes)."""
    rng = np.random.default_rng(3)
    S = torch.tensor(rng.standard_normal((5, 7)), dtype=torch.float64, requires_grad=True)
    if method in MULTILABEL:
        y = torch.tensor((rng.random((5, 7)) < 0.4).astype(np.float64))
        y[0] = 0.0
    else:
        y = torch.tensor(rng.integers(0, 7, 5))
    assert torch.autograd.gradcheck(
        lambda s: loss(
            method, s, y, k=k, gamma=gamma, reduction="none", weights=weights_of(method, k)
        ),  # fmt: skip
        (S,),
        eps=1e-6,
        atol=1e-6,
    )


@pytest.mark.parametrize("method", AVAILABLE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_regimes_stay_finite_and_consistent(method, dtype):
    """Scores up to 1e4, gamma down to 1e-8, k = m - 1, ties everywhere: finite values and
    gradients; in float32 within float32's rounding of the float64 result."""
    rng = np.random.default_rng(11)
    m = 12
    k = m - 1 if method in TOPK else 1
    gammas = (1e-8, 1.0) if method in SMOOTHABLE else (0.0,)
    for scale in (1.0, 1e4):
        S = np.round(rng.standard_normal((40, m)) * scale)  # integer scores: many ties
        S[0] = 0.0  # all tied
        if method in MULTILABEL:
            y = (rng.random((40, m)) < 0.3).astype(np.float64)
            y[1] = 0.0
        else:
            y = rng.integers(0, m, 40)
        for gamma in gammas:
            v64, g64 = _torch_values_and_grad(method, S, y, k, gamma)
            assert np.isfinite(v64).all() and np.isfinite(g64).all()
            v32, g32 = _torch_values_and_grad(method, S, y, k, gamma, dtype)
            assert np.isfinite(v32).all() and np.isfinite(g32).all()
            if dtype == torch.float32:
                np.testing.assert_allclose(v32, v64, rtol=1e-5, atol=1e-5 * scale)
            # a hinge's gradient lies in its set (off-label sum at most 1, the label's entry
            # minus that sum), to the rounding of the margins, ulp(scale) / gamma per entry
            if method in HINGES:
                tol = 1e-12 + 4 * m * np.spacing(scale) / max(gamma, 1.0 if gamma == 0 else gamma)
                at_label = g64[np.arange(40), y]
                assert (at_label <= tol).all() and (-at_label <= 1.0 + tol).all()
                np.testing.assert_allclose(g64.sum(axis=1), 0.0, atol=tol)


def test_weighted_hinge_at_gamma_zero_is_the_limit_of_kato_smoothing():
    """wtopk_svm at gamma = 0: the gradient is the kernels' smoothed one at gamma = 1e-9 (no
    ties), the group rule where margins tie (the label's own tie at 0 included), and a
    subgradient of the loss."""
    rng = np.random.default_rng(8)
    for k, scores in ((3, rng.standard_normal((60, 9)) * 2),
                      (4, np.round(rng.standard_normal((60, 9)) * 2))):  # fmt: skip
        y = rng.integers(0, 9, 60)
        _, grad = _torch_values_and_grad("wtopk_svm", scores, y, k, 0.0)
        rho = rank_weights("wtopk_svm", k, 9)
        np.testing.assert_allclose(grad, wtopk_limit_gradient(scores, y, rho), atol=1e-15)
        if k == 3:
            smooth = smoothed_gradient("wtopk_svm", scores, y, k, 1e-9)
            np.testing.assert_allclose(grad, smooth, atol=1e-6)
        else:  # the label tied with other classes at margin 0, for some rows
            c = 1.0 + scores - scores[np.arange(60), y][:, None]
            assert ((c == 0).sum(axis=1) > 1).any()
        for _ in range(20):
            T = scores + rng.standard_normal(scores.shape)
            lhs = numba_values("wtopk_svm", T, y, k, 0.0)
            rhs = numba_values("wtopk_svm", scores, y, k, 0.0) + ((T - scores) * grad).sum(1)
            assert (lhs >= rhs - 1e-12).all()


def test_wide_batch_matches_numba():
    """m = 1,000 classes, a batch of 1,024, k = 5: the smoothed top-k hinges and top-k
    Ent_tr agree with the kernels."""
    rng = np.random.default_rng(5)
    S = rng.standard_normal((1024, 1000)) * 3
    y = rng.integers(0, 1000, 1024)
    rows = rng.choice(1024, 40, replace=False)
    for method, gamma in (("topk_svm_alpha", 1.0), ("topk_svm_alpha_pseudo", 1.0),
                          ("topk_svm_beta", 1.0), ("topk_ent", 0.0),
                          ("topk_ent_tr", 0.0), ("wtopk_svm", 1.0)):  # fmt: skip
        value, grad = _torch_values_and_grad(method, S, y, 5, gamma)
        sub = S[rows], y[rows]
        if method == "topk_ent_tr":
            ref = numba_ent_tr_values(*sub, 5)
        else:
            ref = numba_values(method, *sub, 5, gamma)
        np.testing.assert_allclose(value[rows], ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(grad[rows], numba_gradient(method, *sub, 5, gamma), atol=1e-10)


def test_reductions_and_module():
    rng = np.random.default_rng(2)
    S = torch.tensor(rng.standard_normal((6, 5)))
    y = torch.tensor(rng.integers(0, 5, 6))
    each = loss("topk_svm_beta", S, y, k=2, gamma=1.0, reduction="none")
    assert each.shape == (6,)
    assert loss("topk_svm_beta", S, y, k=2, gamma=1.0).item() == pytest.approx(each.mean().item())
    assert loss("topk_beta", S, y, k=2, gamma=1.0, reduction="sum").item() == pytest.approx(
        each.sum().item()
    )
    module = TopKLoss("topk_svm_beta", k=2, gamma=1.0)
    assert module(S, y).item() == pytest.approx(each.mean().item())
    assert "topk_svm_beta" in repr(module)


def test_backward_scales_by_the_incoming_gradient():
    rng = np.random.default_rng(4)
    S = torch.tensor(rng.standard_normal((4, 6)), requires_grad=True)
    y = torch.tensor(rng.integers(0, 6, 4))
    weights = torch.tensor([0.5, 2.0, 0.0, -1.0], dtype=torch.float64)
    (loss("svm_multi", S, y, gamma=0.3, reduction="none") * weights).sum().backward()
    _, grad = _torch_values_and_grad("svm_multi", S.detach().numpy(), y.numpy(), 1, 0.3)
    np.testing.assert_allclose(S.grad.numpy(), weights.numpy()[:, None] * grad, atol=1e-15)


def test_empty_and_complete_label_sets_give_zero():
    S = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.1, -0.3]], requires_grad=True)
    Y = torch.tensor([[0, 0, 0], [1, 1, 1]])
    v = loss("lr_ml", S, Y, reduction="none")
    v.sum().backward()
    assert v.tolist() == [0.0, 0.0] and S.grad.abs().sum().item() == 0.0


@pytest.mark.parametrize("kwargs,message", [
    (dict(method="topk_svm_beta", k=5), r"k must be in \[1, 4\]"),
    (dict(method="topk_svm_beta", k=0), r"k must be in \[1, 4\]"),
    (dict(method="topk_svm_beta", k=2.5), r"k must be an integer in \[1, 4\]"),
    (dict(method="lr_multi", k=2), "takes no k"),
    (dict(method="svm_multi", gamma=-1.0), "gamma must be a finite number >= 0"),
    (dict(method="svm_multi", gamma=math.nan), "gamma must be a finite number >= 0"),
    (dict(method="lr_multi", gamma=1.0), "has no smoothing"),
    (dict(method="svm_multi", target=[0, 1, 5]), r"class 5, outside \[0, 5\)"),
    (dict(method="svm_multi", target=[0, 1, -1]), r"class -1, outside \[0, 5\)"),
    (dict(method="svm_multi", target=[0, 1]), r"shape \(3,\)"),
    (dict(method="svm_multi", target=[0.0, 1.0, 2.0]), "integer tensor"),
    (dict(method="lr_ml", target=[0, 1, 2]), r"0/1 matrix of shape \(3, 5\)"),
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(method="svm_multi", reduction="max"), "reduction must be one of"),
    (dict(method="wtopk_svm", k=2, weights=[0.2, 0.5]), r"non-increasing .* got \[0.2, 0.5\]"),
    (dict(method="wtopk_svm", k=2, weights="steep"), "weights must be flat, linear, exp"),
    (dict(method="topk_svm_beta", k=2, weights="linear"), "weights= is an option of wtopk_svm"),
])  # fmt: skip
def test_bad_inputs_are_refused_with_the_valid_range(kwargs, message):
    from topkbench.errors import ConfigError

    S = torch.zeros((3, 5))
    target = torch.tensor(kwargs.pop("target", [0, 1, 2]))
    with pytest.raises((ValueError, ConfigError), match=message):
        loss(scores=S, target=target, **kwargs)


def test_bad_scores_are_refused():
    y = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="2-D tensor"):
        loss("svm_multi", torch.zeros(5), y)
    with pytest.raises(ValueError, match="floating-point"):
        loss("svm_multi", torch.zeros((2, 3), dtype=torch.long), y)
    with pytest.raises(ValueError, match="NaN or infinite"):
        loss("svm_multi", torch.tensor([[0.0, math.inf, 1.0], [0.0, 1.0, 2.0]]), y)
    with pytest.raises(ValueError, match="at least 2 classes"):
        loss("svm_multi", torch.zeros((2, 1)), torch.tensor([0, 0]))


def test_a_multilabel_target_must_be_zero_one():
    with pytest.raises(ValueError, match="only 0 and 1"):
        loss("lr_ml", torch.zeros((2, 3)), torch.tensor([[0, 2, 1], [1, 0, 0]]))


@pytest.mark.parametrize("method", ["svm_multi", "topk_svm_alpha", "topk_svm_alpha_pseudo",
                                    "topk_svm_beta", "svm_ml"])  # fmt: skip
def test_projections_on_the_largest_margins_fall_back_to_whole_rows(method):
    """The smoothed hinges project on each row's few largest margins where that is exact,
    and on more (up to the whole row) where the support is wider: with gamma from 0.1 to 300
    on 300 classes the supports range from a few margins to all of them, and every row agrees
    with the kernels."""
    rng = np.random.default_rng(13)
    m, k = 300, 4
    for gamma in (0.1, 5.0, 300.0):
        S = rng.standard_normal((12, m))
        if method == "svm_ml":
            y = (rng.random((12, m)) < 0.05).astype(np.float64)
            y[:, 0] = 1.0
        else:
            y = rng.integers(0, m, 12)
        kk = 1 if method in ("svm_multi", "svm_ml") else k
        value, grad = _torch_values_and_grad(method, S, y, kk, gamma)
        np.testing.assert_allclose(value, numba_values(method, S, y, kk, gamma), rtol=1e-10,
                                   atol=1e-10)  # fmt: skip
        np.testing.assert_allclose(grad, numba_gradient(method, S, y, kk, gamma), atol=1e-10)


@pytest.mark.parametrize("method", ["svm_multi", "topk_svm_alpha", "topk_svm_alpha_pseudo",
                                    "topk_svm_beta", "svm_ml"])  # fmt: skip
@pytest.mark.parametrize("scale,gamma", [(1e4, 1e-3), (1e4, 1e-6), (1e3, 1e-8)])
def test_smoothed_values_keep_their_accuracy_for_large_margins(method, scale, gamma):
    """With the label scored far below the others the thresholds are large; the values use the
    sum of p the solution defines (the radius, k c, ...), not the rounded sum, and agree with
    the kernels to 1e-10 relative, never above the gamma = 0 loss."""
    rng = np.random.default_rng(17)
    S = rng.standard_normal((60, 10)) * scale
    if method == "svm_ml":
        y = np.zeros((60, 10))
        y[:, 0] = 1.0
    else:
        y = np.zeros(60, dtype=np.int64)
    S[:, 0] -= 3 * scale
    k = 1 if method in ("svm_multi", "svm_ml") else 3
    value, _ = _torch_values_and_grad(method, S, y, k, gamma)
    np.testing.assert_allclose(value, numba_values(method, S, y, k, gamma), rtol=1e-10)
    assert (value <= numba_values(method, S, y, k, 0.0) * (1 + 1e-12)).all()


def test_a_second_derivative_is_refused():
    """Only first derivatives exist: a second backward through the loss raises instead of
    silently dropping the Hessian's term (here d/dS <grad(L^2), v>)."""
    S = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    value = loss("lr_multi", S, torch.tensor([0, 1, 2]))
    (g,) = torch.autograd.grad(value**2, S, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiable"):
        (g * torch.ones_like(g)).sum().backward()


def test_numpy_and_tensor_integers_are_accepted_as_k():
    S = torch.randn(4, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3])
    want = loss("topk_svm_beta", S, y, k=2, gamma=1.0)
    assert loss("topk_svm_beta", S, y, k=np.int64(2), gamma=1.0).item() == want.item()
    assert loss("topk_svm_beta", S, y, k=torch.tensor(2).item(), gamma=1.0).item() == want.item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method,k", [("topk_ent_tr", 1), ("topk_ent", 1), ("lr_multi", 1),
                                      ("topk_svm_beta", 1)])  # fmt: skip
def test_half_precision_margins_beyond_its_range_keep_finite_gradients(dtype, method, k):
    """Scores of +-4e4 in float16: the margin 8e4 passes float16's range; the losses are
    evaluated in float32 and their gradients stay finite."""
    S = torch.tensor([[4e4, -4e4, 0.0]], dtype=dtype, requires_grad=True)
    loss(method, S, torch.tensor([1]), k=k, gamma=1.0 if method == "topk_svm_beta" else 0.0
         ).backward()  # fmt: skip
    assert torch.isfinite(S.grad.float()).all() and S.grad.dtype == dtype
