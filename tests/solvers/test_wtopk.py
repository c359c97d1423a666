"""Weighted top-k SVM (Kato & Hirohashi, papers/004 §4-6; DESIGN §3) by SDCA with the exact
permutahedron projection (the default) and by Frank-Wolfe:

* SDCA reaches cvxpy's optimum of the weighted loss for flat, linear and exp weights and
  gamma in {0, 0.1}, certified (D <= P* <= P), dense and CSR, and with flat weights the
  optimum of ``topk_svm_alpha`` to 1e-8; k = 1 is SVM^Multi;

Frank-Wolfe:

* ``flat`` weights reach the optimum of ``topk_svm_alpha`` (the printed top-k hinge), and both
  agree with cvxpy;
* ``linear`` / ``exp`` weights against a cvxpy formulation of Kato eq. (8);
* smoothing (eq. (25)) through the augmented problem of Prop. 5, against cvxpy;
* the duality gap is non-negative at every iterate, for every variant;
* the closed-form direction (Lemma 3, eq. (24)) attains the optimum of the LP (21) over the
  dual domain of Thm. 2 / eq. (14), solved by scipy's HiGHS;
* weight validation.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import linprog

import topkbench
from topkbench.errors import ConfigError
from topkbench.losses.weighted_topk import wtopk_value, wtopk_vertices
from topkbench.solvers.frank_wolfe import weight_vector

N, D, M, K = 14, 3, 4, 2


def problem(seed: int, n: int = N, d: int = D, m: int = M):
    rng = np.random.default_rng(seed)
    means = 1.5 * rng.normal(size=(m, d))
    y = np.concatenate([np.arange(m), rng.integers(0, m, n - m)])
    X = means[y] + rng.normal(size=(n, d))
    return X, y.astype(np.int64)


def cvx_primal(X, y, C, rho, gamma=0.0) -> float:
    """min_W lambda/2 ||W||^2 + 1/n sum_i Phi(W^T x_i) with Phi of eq. (8) written as
    max(0, sum_r (rho_r - rho_{r+1}) T_r(c_i)); for gamma > 0 the augmented problem of Kato
    Prop. 5 (features [x_i; sqrt(gamma lambda n) e_i]), whose optimum is the smoothed one."""
    n, d = X.shape
    m = int(y.max()) + 1
    lam = 1.0 / (C * n)
    W = cp.Variable((d, m))
    S = X @ W
    reg = lam / 2 * cp.sum_squares(W)
    if gamma > 0:
        V = cp.Variable((n, m))
        S = S + np.sqrt(gamma * lam * n) * V
        reg = reg + lam / 2 * cp.sum_squares(V)
    diffs = np.diff(np.r_[rho, 0.0]) * -1.0  # rho_r - rho_{r+1} >= 0
    losses = []
    for i in range(n):
        delta = np.ones(m)
        delta[y[i]] = 0.0
        c = delta + S[i, :] - S[i, y[i]]
        inner = sum(diffs[r] * cp.sum_largest(c, r + 1) for r in range(len(rho)) if diffs[r] > 0)
        losses.append(cp.pos(inner))
    prob = cp.Problem(cp.Minimize(reg + sum(losses) / n))
    prob.solve(solver=cp.CLARABEL)
    return float(prob.value)


@pytest.mark.parametrize("seed", [0, 1])
def test_flat_weights_are_the_printed_topk_hinge(seed):
    X, y = problem(seed)
    C = 1.0
    fw = topkbench.fit(X, y, "wtopk_svm", C=C, k=K, fw="pairwise", eps=1e-7, max_epochs=50_000)
    sd = topkbench.fit(X, y, "topk_svm_alpha", C=C, k=K, eps=1e-10, max_epochs=100_000)
    ref = cvx_primal(X, y, C, weight_vector("flat", K, M))
    assert fw.converged and fw.relative_gap >= 0
    assert fw.primal == pytest.approx(ref, rel=1e-6)
    assert sd.primal == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("weights", ["linear", "exp", [0.5, 0.3, 0.2]])
def test_weighted_losses_against_cvxpy(weights):
    X, y = problem(2)
    C = 2.0
    k = 3 if not isinstance(weights, list) else 1
    fw = topkbench.fit(
        X, y, "wtopk_svm", C=C, k=k, weights=weights, fw="pairwise", eps=1e-7, max_epochs=50_000
    )
    ref = cvx_primal(X, y, C, weight_vector(weights, k, M))
    assert fw.converged
    assert fw.primal == pytest.approx(ref, rel=1e-6)


def test_smoothed_loss_against_the_augmented_problem():
    X, y = problem(3)
    C, gamma = 1.0, 0.5
    fw = topkbench.fit(
        X, y, "wtopk_svm", C=C, k=K, gamma=gamma, fw="pairwise", eps=1e-7, max_epochs=50_000
    )
    ref = cvx_primal(X, y, C, weight_vector("flat", K, M), gamma=gamma)
    assert fw.converged
    assert fw.primal == pytest.approx(ref, rel=1e-6)
    assert fw.dual == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("variant", ["standard", "away", "pairwise"])
def test_gap_is_nonnegative_at_every_iterate(variant):
    X, y = problem(4, n=30)
    fw = topkbench.fit(
        X, y, "wtopk_svm", C=10.0, k=K, weights="exp", gamma=0.01, fw=variant, eps=1e-4,
        max_epochs=3000, warn=False,
    )  # fmt: skip
    gaps = np.array([t.primal - t.dual for t in fw.trace])
    assert (gaps >= -1e-12 * np.abs([t.primal for t in fw.trace]).max()).all()
    assert fw.trace[-1].relative_gap < fw.trace[0].relative_gap
    # the dual never decreases (exact line search on a concave quadratic)
    duals = np.array([t.dual for t in fw.trace])
    assert (np.diff(duals) >= -1e-12 * np.abs(duals).max()).all()


def lp_direction_value(s, y, rho, C) -> float:
    """max <G, a> over a in C (-dom Phi*) with G = e_y - s, by a generic LP over the domain of
    Kato Thm. 2 / eq. (14): v with sum v = 0 and v + (b - v_y) e_y = sum_l lambda_l,
    lambda_l in Delta(k_l, rho'_l k_l), <1, lambda_l> = zeta k_l rho'_l (common zeta)."""
    m = s.shape[0]
    G = -s.copy()
    G[y] += 1.0
    rp = -np.diff(np.r_[rho, 0.0])
    ks = [r + 1 for r in range(len(rho)) if rp[r] > 1e-15]
    L = len(ks)
    # variables: v (m), b (1), zeta (1), lambda_l (m each)
    nv = m + 2 + L * m

    def lam(l, j):
        return m + 2 + l * m + j

    A_eq, b_eq, A_ub, b_ub = [], [], [], []
    row = np.zeros(nv)
    row[:m] = 1.0
    A_eq.append(row)
    b_eq.append(0.0)
    for j in range(m):
        row = np.zeros(nv)
        if j == y:
            row[m] = 1.0  # b
        else:
            row[j] = 1.0
        for l in range(L):
            row[lam(l, j)] -= 1.0
        A_eq.append(row)
        b_eq.append(0.0)
    for l, k in enumerate(ks):
        r = rp[k - 1]
        row = np.zeros(nv)
        row[[lam(l, j) for j in range(m)]] = 1.0
        row[m + 1] = -k * r
        A_eq.append(row)
        b_eq.append(0.0)
        row = np.zeros(nv)
        row[[lam(l, j) for j in range(m)]] = 1.0
        A_ub.append(row)
        b_ub.append(k * r)
        for j in range(m):
            row = np.zeros(nv)
            row[[lam(l, i) for i in range(m)]] = -1.0
            row[lam(l, j)] += k
            A_ub.append(row)
            b_ub.append(0.0)
    c = np.zeros(nv)
    c[:m] = C * G  # maximize <G, -C v>  <=>  minimize <C G, v>
    bounds = [(None, None)] * (m + 2) + [(0, None)] * (L * m)
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    assert res.status == 0, res.message
    return -float(res.fun)


@pytest.mark.parametrize("weights", ["flat", "linear", "exp", [0.6, 0.3, 0.3, 0.1]])
def test_closed_form_direction_solves_the_lp(weights):
    rng = np.random.default_rng(7)
    m, C = 5, 1.3
    for trial in range(12):
        k = 3
        rho = weight_vector(weights, k, m)
        y = np.array([trial % m])
        S = rng.normal(scale=rng.choice([0.3, 1.0, 3.0]), size=(1, m))
        U = np.empty((1, m))
        atom = np.empty((1, len(rho)), dtype=np.int32)
        wtopk_vertices(S, y, rho, C, U, atom, np.empty(m), np.empty(m, dtype=np.int64))
        G = -S[0].copy()
        G[y[0]] += 1.0
        assert float(G @ U[0]) == pytest.approx(lp_direction_value(S[0], y[0], rho, C), abs=1e-8)
        # and the vertex's value is C Phi(s) - <s, a> ... i.e. <G, U> = C Phi(s) + <G - e_y, 0>
        phi = wtopk_value(S[0], y[0], rho, np.empty(m), np.empty(m, dtype=np.int64))
        assert float(G @ U[0]) == pytest.approx(C * phi, abs=1e-10)


def test_weight_schemes_and_validation():
    np.testing.assert_allclose(weight_vector("flat", 4, 10), np.full(4, 0.25))
    lin = weight_vector("linear", 3, 10)
    np.testing.assert_allclose(lin, [3 / 6, 2 / 6, 1 / 6])
    e = weight_vector("exp", 3, 10)
    assert e.sum() == pytest.approx(1.0) and (np.diff(e) < 0).all()
    np.testing.assert_allclose(weight_vector([0.5, 0.5, 0.0], 1, 10), [0.5, 0.5])
    for bad in ([0.1, 0.5], [-0.1], [], [0.0, 0.0], [1.0] * 11, "cubic"):
        with pytest.raises(ConfigError):
            weight_vector(bad, 3, 10)
    X, y = problem(5)
    with pytest.raises(ConfigError, match="fw must be"):
        topkbench.fit(X, y, "wtopk_svm", k=2, fw="newton")
    with pytest.raises(ConfigError, match="k must be"):
        topkbench.fit(X, y, "wtopk_svm", k=M)


def test_top_k_selection_matches_a_sort():
    """The allocation-free top-K selection of the vertex kernel (insertion for K <= 32, a sort
    above) returns the K largest margins in decreasing order, ties included."""
    from topkbench.losses.weighted_topk import _margins_sorted

    rng = np.random.default_rng(0)
    for K in (1, 3, 5, 40):
        for _ in range(100):
            m = int(rng.integers(K, 60))
            s = np.round(rng.normal(size=m), 1)
            y = int(rng.integers(m))
            work, order = np.empty(m), np.empty(m, dtype=np.int64)
            _margins_sorted(s, y, K, work, order)
            np.testing.assert_array_equal(work[order[:K]], np.sort(work)[::-1][:K])


def test_atom_products_match_dense_products():
    """X^T V from an atom's indices (O(nnz K)) equals the dense product, for dense, CSR and
    Gram operands; hash lookup finds atoms, compaction keeps order."""
    import scipy.sparse as sp

    from topkbench.losses.weighted_topk import atom_hash, atom_matrix, compact_active, find_atom
    from topkbench.solvers.frank_wolfe import _Ops

    X, y = problem(6, n=25, d=7, m=6)
    X[X < 0.3] = 0.0
    rho = weight_vector("linear", 3, 6)
    S = np.random.default_rng(1).normal(size=(25, 6))
    U = np.empty((25, 6))
    atom = np.empty((25, 3), dtype=np.int32)
    wtopk_vertices(S, y, rho, 0.7, U, atom, np.empty(6), np.empty(6, dtype=np.int64))
    V = np.empty((25, 6))
    atom_matrix(atom, y, rho, 0.7, V)
    np.testing.assert_array_equal(U, V)
    for op, ref in ((X, X.T @ U), (sp.csr_matrix(X), X.T @ U), (X @ X.T, X @ X.T @ U)):
        got = _Ops(op, op.shape == (25, 25), 6).atom_product(atom, y, rho, 0.7)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # active-set arrays
    atoms = np.stack([atom, np.roll(atom, 1, axis=0), np.full_like(atom, -1)])
    hashes = np.array([atom_hash(a) for a in atoms])
    assert len(set(hashes.tolist())) == 3
    assert find_atom(atoms, hashes, 3, atoms[1].copy(), hashes[1]) == 1
    assert find_atom(atoms, hashes, 2, atoms[2].copy(), hashes[2]) == -1
    weights = np.array([0.5, 0.0, 0.5])
    assert compact_active(atoms, weights, hashes, 3, 1e-14) == 2
    np.testing.assert_array_equal(atoms[1], np.full_like(atom, -1))
    assert weights[:2].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("variant", ["away", "pairwise"])
def test_active_set_reproduces_the_dual(variant, monkeypatch):
    """After many steps (the active set grows past its first allocation, atoms are dropped),
    the convex combination of the active atoms is the final dual iterate: its dual value is
    the one reported, and the weights sum to 1."""
    import topkbench.solvers.frank_wolfe as fwmod
    from topkbench.losses.weighted_topk import atom_matrix

    made = []

    class Recording(fwmod._ActiveSet):
        def __init__(self, *a):
            super().__init__(*a)
            made.append(self)

    monkeypatch.setattr(fwmod, "_ActiveSet", Recording)
    X, y = problem(8, n=40)
    C, gamma = 3.0, 0.05
    rho = weight_vector("exp", 3, M)
    res = fwmod.solve_frank_wolfe(
        X, y, n_classes=M, rho=rho, C=C, gamma=gamma, variant=variant, eps=1e-12,
        max_iter=400, warn=False,
    )  # fmt: skip
    act = made[0]
    assert act.size > 8 and res.steps["drop"] > 0
    w = act.weights[: act.size]
    assert (w > 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
    A = np.zeros((40, M))
    V = np.empty((40, M))
    for a in range(act.size):
        atom_matrix(act.atoms[a], y, rho, C, V)
        A += w[a] * V
    Wt = X.T @ A
    sq = float(np.vdot(Wt, Wt)) + gamma / C * float(np.vdot(A, A))
    dual = (A[np.arange(40), y].sum() - 0.5 * sq) / (C * 40)
    assert dual == pytest.approx(res.dual, rel=1e-10)


# --- SDCA -------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", ["flat", "linear", "exp"])
@pytest.mark.parametrize("gamma", [0.0, 0.1])
@pytest.mark.parametrize("sparse", [False, True])
def test_sdca_reaches_the_weighted_optimum(weights, gamma, sparse):
    import scipy.sparse as sp

    X, y = problem(7, n=16, m=5)
    C, k = 2.0, 3
    model = topkbench.fit(sp.csr_matrix(X) if sparse else X, y, "wtopk_svm", C=C, k=k,
                          weights=weights, gamma=gamma, eps=1e-10, max_epochs=200_000)  # fmt: skip
    assert model.status == "converged" and model.relative_gap <= 1e-10
    p_ref = cvx_primal(X, y, C, weight_vector(weights, k, 5), gamma=gamma)
    assert model.primal == pytest.approx(p_ref, rel=1e-6)
    assert model.dual <= p_ref * (1 + 1e-7) <= model.primal * (1 + 2e-7)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sdca_flat_weights_reach_the_printed_alpha_optimum(k):
    X, y = problem(8, n=20, m=5)
    ours = topkbench.fit(X, y, "wtopk_svm", C=1.5, k=k, eps=1e-12, max_epochs=200_000)
    printed = topkbench.fit(X, y, "topk_svm_alpha" if k > 1 else "svm_multi", C=1.5, k=k,
                            eps=1e-12, max_epochs=200_000)  # fmt: skip
    assert ours.primal == pytest.approx(printed.primal, rel=1e-8)


def test_sdca_kernel_mode_weights_and_warm_starts():
    X, y = problem(9, n=18, m=4)
    K = X @ X.T
    lin = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="exp", eps=1e-10)
    ker = topkbench.fit(None, y, "wtopk_svm", K=K, C=1.0, k=2, weights="exp", eps=1e-10)
    assert ker.primal == pytest.approx(lin.primal, rel=1e-8)
    warm = topkbench.fit(X, y, "wtopk_svm", C=2.0, k=2, weights="exp", eps=1e-10,
                         warm_start=lin)  # fmt: skip
    cold = topkbench.fit(X, y, "wtopk_svm", C=2.0, k=2, weights="exp", eps=1e-10)
    assert warm.primal == pytest.approx(cold.primal, rel=1e-8)
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=18)
    weighted = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="linear", eps=1e-10,
                             sample_weight=w)  # fmt: skip
    assert weighted.status == "converged"
    with pytest.raises(ConfigError, match="not available with fw=pairwise"):
        topkbench.fit(X, y, "wtopk_svm", k=2, fw="pairwise", sample_weight=w)


@pytest.mark.parametrize("accelerate", ["newton", "catalyst"])
def test_sdca_phases_certify_the_same_optimum(accelerate):
    """The Newton (difference Hessians of the projection's gradient) and Catalyst phases."""
    X, y = problem(10, n=30, m=5)
    X = 20.0 * X  # ill-conditioned: C max ||x||^2 large
    plain = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="linear", eps=1e-9,
                          max_epochs=500_000, accelerate="never")  # fmt: skip
    fast = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="linear", eps=1e-9,
                         max_epochs=500_000, accelerate=accelerate)  # fmt: skip
    assert fast.status == "converged"
    assert fast.primal == pytest.approx(plain.primal, rel=1e-7)


def test_sdca_rows_of_tiny_norm_converge():
    """b ~ margin / ||x_i||^2 is huge for a row of tiny norm: the projection keeps the entries
    theta C rho_i exactly instead of losing them to rounding in (b - v)."""
    X, y = problem(11, n=40, m=5)
    X[0] *= 1e-8
    model = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="linear", eps=1e-9,
                          max_epochs=20_000, accelerate="never")  # fmt: skip
    assert model.status == "converged"
    ref = cvx_primal(X, y, 1.0, weight_vector("linear", 2, 5))
    assert model.primal == pytest.approx(ref, rel=1e-6)


def test_sdca_integer_weights_are_repetitions():
    X, y = problem(12, n=16, m=4)
    w = np.random.default_rng(2).integers(1, 4, size=16)
    rep = np.repeat(np.arange(16), w)
    a = topkbench.fit(X, y, "wtopk_svm", C=1.0, k=2, weights="exp", gamma=0.1, eps=1e-11,
                      max_epochs=200_000, sample_weight=w)  # fmt: skip
    b = topkbench.fit(X[rep], y[rep], "wtopk_svm", C=1.0, k=2, weights="exp", gamma=0.1,
                      eps=1e-11, max_epochs=200_000)  # fmt: skip
    assert a.primal * 16 == pytest.approx(b.primal * rep.size, rel=1e-9)


def test_solve_sdca_checks_its_rank_weights():
    from topkbench.errors import SolverError
    from topkbench.losses import ids
    from topkbench.solvers.sdca import solve_sdca

    X, y = problem(13, n=10, m=4)
    with pytest.raises(SolverError, match="non-increasing"):
        solve_sdca(X, y, n_classes=4, loss_id=ids.LOSS_WTOPK_SVM, C=1.0, k=2,
                   rho=np.array([0.2, 0.5]))  # fmt: skip
    with pytest.raises(SolverError, match="only with it"):
        solve_sdca(X, y, n_classes=4, loss_id=ids.LOSS_SVM_MULTI, C=1.0, rho=np.ones(1))
