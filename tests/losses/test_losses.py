"""Losses and their conjugates as implemented by the SDCA kernels.

Pairing (derived from ``topkbench/losses/dispatch.py``).  The kernels minimise
``1/2 ||W||^2 + C sum_i L(y_i, s_i)``, ``s_i = W^T x_i``, with dual
``C sum_i -L*(y_i, v_i) - 1/2 ||W||^2``, ``W = X^T A``, ``v_i = -a_i / C``;
``neg_conjugate_value(loss, y, a, C, ...)`` returns ``-L*(y, v)``.  Since
``||W||^2 = sum_i <s_i, a_i> = -C sum_i <s_i, v_i>``, the duality gap in the P(W) scale of
DESIGN §2 (multiply by lambda = 1/(C n)) is

    P - D = 1/n sum_i FY_i,    FY_i = L(s_i) + L*(v_i) - <s_i, v_i> >= 0     (Fenchel-Young)

with equality iff v_i is a (sub)gradient of L at s_i.  Domains of L*: for the multiclass
losses ``v^{\\y}`` in the unit simplex {x >= 0, <1,x> <= 1} and ``v_y = -<1, v^{\\y}>``; for the
OVA losses ``v_c = -beta_c ytilde_c`` with ``beta_c`` in [0, 1].
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.special as sps
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference import SDCA_METHODS

import topkbench
from topkbench.losses.dispatch import loss_value, neg_conjugate_value
from topkbench.losses.ids import LOSS_LR_MULTI, LOSS_LR_OVA, LOSS_SVM_MULTI, LOSS_SVM_OVA

METHOD_LOSS = {
    "svm_multi": LOSS_SVM_MULTI,
    "lr_multi": LOSS_LR_MULTI,
    "svm_ova": LOSS_SVM_OVA,
    "lr_ova": LOSS_LR_OVA,
}
MULTICLASS = (LOSS_SVM_MULTI, LOSS_LR_MULTI)
# (loss, gamma): gamma is only meaningful for the two SVM losses
LOSS_CASES = [
    (LOSS_SVM_MULTI, 0.0),
    (LOSS_SVM_MULTI, 0.3),
    (LOSS_SVM_MULTI, 2.0),
    (LOSS_LR_MULTI, 0.0),
    (LOSS_SVM_OVA, 0.0),
    (LOSS_SVM_OVA, 0.3),
    (LOSS_SVM_OVA, 2.0),
    (LOSS_LR_OVA, 0.0),
]
SMOOTH_CASES = [
    (loss, g) for loss, g in LOSS_CASES if g > 0 or loss in (LOSS_LR_MULTI, LOSS_LR_OVA)
]


def L(loss, y, s, gamma):
    s = np.ascontiguousarray(s, dtype=np.float64)
    m = s.shape[0]
    return loss_value(
        loss, int(y), s, float(gamma), 1, np.empty(m), np.empty(m), np.empty(m, dtype=np.int64),
        np.empty(m),
    )  # fmt: skip


def L_star(loss, y, v, gamma, C=1.0):
    """L*(y, v) through the kernel, which takes the dual block a = -C v."""
    a = np.ascontiguousarray(-C * np.asarray(v, dtype=np.float64))
    scratch = (np.empty(a.shape[0]), np.empty(a.shape[0]), np.empty(a.shape[0]))
    return -neg_conjugate_value(loss, int(y), a, float(C), float(gamma), 1, *scratch)


def fenchel_young(loss, y, s, v, gamma):
    return L(loss, y, s, gamma) + L_star(loss, y, v, gamma) - float(np.dot(s, v))


# --- independent numpy reference formulas --------------------------------------------------------


def ytilde(y, m):
    yt = -np.ones(m)
    yt[y] = 1.0
    return yt


def simplex_leq_threshold(z, r):
    """t >= 0 with (z - t)_+ the projection onto {x >= 0, <1,x> <= r}, by sorting."""
    if np.maximum(z, 0.0).sum() <= r:
        return 0.0
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    ks = np.arange(1, z.shape[0] + 1)
    k = ks[u - (css - r) / ks > 0][-1]
    return (css[k - 1] - r) / k


def project_simplex_leq(z, r):
    return np.maximum(z - simplex_leq_threshold(z, r), 0.0)


def off_label_margins(y, s):
    return np.delete(1.0 + s - s[y], y)


def ref_loss(loss, y, s, gamma):
    m = s.shape[0]
    if loss == LOSS_SVM_MULTI:
        z = off_label_margins(y, s)
        if gamma == 0:
            return max(0.0, z.max())
        # sup_{v in Delta} <z, v> - gamma/2 |v|^2 is attained at v = p / gamma with
        # p = proj_{Delta(gamma)}(z) = (z - t)_+; the value (<z,p> - |p|^2/2) / gamma equals
        # t + |p|^2 / (2 gamma) (as <1,p> = gamma when t > 0), which does not cancel
        t = simplex_leq_threshold(z, gamma)
        p = np.maximum(z - t, 0.0)
        return t + (p @ p) / (2 * gamma)
    if loss == LOSS_LR_MULTI:
        return sps.logsumexp(s) - s[y]
    r = 1.0 - ytilde(y, m) * s
    if loss == LOSS_SVM_OVA:
        if gamma == 0:
            return np.maximum(r, 0.0).sum()
        h = np.where(r <= 0, 0.0, np.where(r < gamma, r**2 / (2 * gamma), r - gamma / 2))
        return h.sum()
    return np.logaddexp(0.0, -ytilde(y, m) * s).sum()


def ref_gradient(loss, y, s, gamma):
    """Gradient (smooth losses) or one subgradient (gamma = 0 hinge losses) w.r.t. s."""
    m = s.shape[0]
    if loss in MULTICLASS:
        if loss == LOSS_LR_MULTI:
            g = sps.softmax(s)
            g[y] -= 1.0
            return g
        z = off_label_margins(y, s)
        if gamma > 0:
            p = project_simplex_leq(z, gamma) / gamma  # grad wrt z = p/gamma
        else:
            p = np.zeros_like(z)
            if z.max() > 0:
                p[np.argmax(z)] = 1.0
        g = np.insert(p, y, 0.0)
        g[y] = -p.sum()
        return g
    yt = ytilde(y, m)
    r = 1.0 - yt * s
    if loss == LOSS_SVM_OVA:
        if gamma > 0:
            dh = np.clip(r / gamma, 0.0, 1.0)
        else:
            dh = (r > 0).astype(float)
        return -yt * dh
    return -yt * sps.expit(-yt * s)


# --- strategies --------------------------------------------------------------------------------


@st.composite
def labelled_scores(draw, lo=-5.0, hi=5.0, max_m=6):
    m = draw(st.integers(2, max_m))
    y = draw(st.integers(0, m - 1))
    s = draw(hnp.arrays(np.float64, m, elements=st.floats(lo, hi)))
    return y, s


@st.composite
def dual_points(draw, loss, y, m):
    """A point v in dom L*(y, .)."""
    if loss in MULTICLASS:
        w = draw(hnp.arrays(np.float64, m, elements=st.floats(0.0, 1.0)))
        if w.sum() > 0:
            w = w / w.sum()
        if draw(st.booleans()):
            w[-1] = 0.0  # on the face <1, x> = 1
        x = w[: m - 1]
        v = np.insert(x, y, 0.0)
        v[y] = -x.sum()
        return v
    beta = draw(hnp.arrays(np.float64, m, elements=st.floats(0.0, 1.0)))
    return -beta * ytilde(y, m)


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize("loss,gamma", LOSS_CASES)
@given(data=labelled_scores())
def test_value_matches_reference(loss, gamma, data):
    y, s = data
    assert L(loss, y, s, gamma) == pytest.approx(ref_loss(loss, y, s, gamma), rel=1e-13, abs=1e-13)


@pytest.mark.parametrize("loss,gamma", LOSS_CASES)
def test_value_is_finite_for_large_scores(loss, gamma):
    s = np.array([800.0, -900.0, 1e4, -1e4])
    for y in range(4):
        value = L(loss, y, s, gamma)
        assert np.isfinite(value)
        assert value == pytest.approx(ref_loss(loss, y, s, gamma), rel=1e-13)


# --- Fenchel-Young ------------------------------------------------------------------------------


@pytest.mark.parametrize("loss,gamma", LOSS_CASES)
@given(data=st.data())
def test_fenchel_young_inequality(loss, gamma, data):
    y, s = data.draw(labelled_scores())
    v = data.draw(dual_points(loss, y, s.shape[0]))
    gap = fenchel_young(loss, y, s, v, gamma)
    assert gap >= -1e-12 * (1 + np.abs(s).max())


@pytest.mark.parametrize("loss,gamma", LOSS_CASES)
@given(data=labelled_scores())
def test_fenchel_young_equality_at_gradient(loss, gamma, data):
    y, s = data
    v = ref_gradient(loss, y, s, gamma)
    assert abs(fenchel_young(loss, y, s, v, gamma)) <= 1e-12 * (1 + np.abs(s).max())


@pytest.mark.parametrize("loss,gamma", LOSS_CASES)
@settings(max_examples=30)
@given(data=st.data())
def test_gradient_maximises_the_conjugate_pairing(loss, gamma, data):
    """L(s) = sup_v <s, v> - L*(v): no feasible v does better than the (sub)gradient."""
    y, s = data.draw(labelled_scores())
    g = ref_gradient(loss, y, s, gamma)
    best = float(s @ g) - L_star(loss, y, g, gamma)
    for _ in range(5):
        v = data.draw(dual_points(loss, y, s.shape[0]))
        assert float(s @ v) - L_star(loss, y, v, gamma) <= best + 1e-12 * (1 + np.abs(s).max())


@pytest.mark.parametrize("loss", [LOSS_SVM_MULTI, LOSS_LR_MULTI])
def test_multiclass_conjugate_closed_forms(loss):
    """Spot values: TPAMI Prop. 2 (k = 1) and Prop. 3."""
    y, v = 1, np.array([0.2, -0.5, 0.3])
    if loss == LOSS_SVM_MULTI:
        gamma = 0.4
        expected = -(0.2 + 0.3) + gamma / 2 * (0.2**2 + 0.3**2)
    else:
        gamma = 0.0
        expected = 0.2 * np.log(0.2) + 0.3 * np.log(0.3) + 0.5 * np.log(0.5)
    assert L_star(loss, y, v, gamma, C=3.0) == pytest.approx(expected, rel=1e-15)


# --- gradients of the smooth losses ------------------------------------------------------------


@pytest.mark.parametrize("loss,gamma", SMOOTH_CASES)
@given(data=labelled_scores(lo=-3.0, hi=3.0))
def test_gradient_matches_finite_differences(loss, gamma, data):
    y, s = data
    g = ref_gradient(loss, y, s, gamma)
    h = 1e-6
    fd = np.empty_like(s)
    for j in range(s.shape[0]):
        e = np.zeros_like(s)
        e[j] = h
        fd[j] = (L(loss, y, s + e, gamma) - L(loss, y, s - e, gamma)) / (2 * h)
    # central differences: O(h^2 / gamma) truncation where smooth; the smoothed hinges are
    # only C^1 (second derivative jumps), which costs O(h / gamma) at a kink
    tol = 1e-7 + (4 * h / gamma if gamma > 0 else 0.0)
    np.testing.assert_allclose(fd, g, atol=tol, rtol=0)


@pytest.mark.parametrize("loss", [LOSS_SVM_MULTI, LOSS_SVM_OVA])
@given(data=labelled_scores())
def test_smoothing_sandwich_and_limit(loss, data):
    """Moreau smoothing with (gamma/2)|v|^2 on the conjugate: L_0 - gamma/2 max|v|^2 <= L_gamma
    <= L_0, where max |v^{\\y}|^2 = 1 (multiclass) or m (OVA, one unit per class)."""
    y, s = data
    m = s.shape[0]
    l0 = L(loss, y, s, 0.0)
    width = 1.0 if loss == LOSS_SVM_MULTI else float(m)
    previous = -np.inf
    for gamma in (4.0, 1.0, 0.25, 1e-2, 1e-4, 1e-8):
        lg = L(loss, y, s, gamma)
        assert lg <= l0 + 1e-13
        assert lg >= l0 - gamma / 2 * width - 1e-13
        assert lg >= previous - 1e-13  # increasing as gamma decreases
        previous = lg
    assert L(loss, y, s, 1e-12) == pytest.approx(l0, abs=1e-11)


# --- the pairing on trained models --------------------------------------------------------------


def per_example_fenchel_young(model, X, y, loss, gamma, C):
    S = np.asarray(X @ model.W)
    V = -model.A / C
    return np.array([fenchel_young(loss, y[i], S[i], V[i], gamma) for i in range(X.shape[0])])


def assert_in_domain(loss, y, V):
    for i, v in enumerate(V):
        if loss in MULTICLASS:
            x = np.delete(v, y[i])
            assert np.all(x >= -1e-15)
            assert x.sum() <= 1 + 1e-12
            assert v[y[i]] == pytest.approx(-x.sum(), abs=1e-12)
        else:
            beta = -v * ytilde(y[i], v.shape[0])
            assert np.all((beta >= -1e-15) & (beta <= 1 + 1e-15))


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
def test_gap_is_mean_fenchel_young_gap(problem_factory, method, gamma):
    """P - D = 1/n sum_i FY_i for any dual iterate (here after 2 epochs): the pairing of
    neg_conjugate_value with loss_value is the one stated in the module docstring."""
    X, y = problem_factory(n=25, d=3, m=4, seed=3, zero_rows=(5,))
    C = 2.0
    loss = METHOD_LOSS[method]
    model = topkbench.fit(X, y, method, C=C, gamma=gamma, eps=1e-12, max_epochs=2, warn=False)
    assert model.status == "max_epochs"
    assert_in_domain(loss, y, -model.A / C)
    fy = per_example_fenchel_young(model, X, y, loss, gamma, C)
    assert np.all(fy >= -1e-12)
    assert model.primal - model.dual == pytest.approx(fy.mean(), rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("method,gamma", SDCA_METHODS)
@pytest.mark.parametrize("C", [0.1, 3.0])
def test_fenchel_young_equality_at_the_optimum(problem_factory, method, gamma, C):
    X, y = problem_factory(n=30, d=3, m=4, seed=11, zero_rows=(0,))
    loss = METHOD_LOSS[method]
    with warnings.catch_warnings():
        warnings.simplefilter("error", topkbench.errors.ConvergenceWarning)
        model = topkbench.fit(X, y, method, C=C, gamma=gamma, eps=1e-10, max_epochs=100_000)
    assert model.status == "converged"
    fy = per_example_fenchel_young(model, X, y, loss, gamma, C)
    gap = model.primal - model.dual
    assert gap <= 1e-10 * abs(model.primal)
    # every term is >= 0 and they average to the gap, so each is at most n * gap
    assert np.all(fy >= -1e-12)
    assert np.all(fy <= X.shape[0] * gap + 1e-12)
    assert fy.mean() == pytest.approx(gap, rel=1e-6, abs=1e-13)
    if gamma > 0 or method.startswith("lr"):
        # smooth loss: v_i must be grad L(s_i).  FY(s, v) = L*(v) - L*(g) - <s, v - g> with
        # s in dL*(g), so mu-strong convexity of L* in its free coordinates (mu = gamma for the
        # smoothed hinges, >= 1 for the entropies) gives |dx|^2 <= 2 FY / mu; for the
        # multiclass losses v_y = -<1, x> adds at most a factor m.  FY (sums of O(10) terms) is
        # known to ~1e-14 absolute; the bound is an equality for the OVA quadratics.
        S = np.asarray(X @ model.W)
        m = S.shape[1]
        mu = gamma if gamma > 0 else 1.0
        factor = m if loss in MULTICLASS else 1.0
        for i in range(X.shape[0]):
            v = -model.A[i] / C
            g = ref_gradient(loss, y[i], S[i], gamma)
            bound = np.sqrt(factor * 2 * (max(fy[i], 0.0) + 1e-13) / mu)
            assert np.linalg.norm(v - g) <= bound
