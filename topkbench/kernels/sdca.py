"""SDCA kernels (DESIGN §5; TPAMI, 002 §5.1 eq. (9), §5.2).

Problem (DESIGN §2), with ``C = 1/(lambda n)``::

    P(W) = lambda/2 ||W||_F^2 + 1/n sum_i L(y_i, W^T x_i)
    D(A) = -1/n sum_i L*(y_i, -lambda n a_i) - lambda/2 ||W||_F^2,   W = sum_i x_i a_i^T

Internally everything is in the scale ``P / lambda`` (``1/2 ||W||^2 + C sum_i L``), which keeps
numbers O(1) for tiny ``lambda``; the Python wrapper reports the P(W) scale.

Dual blocks ``a_i`` (rows of ``A``, length m) are stored in the paper's scale. For the
multiclass losses ``x = -a_i^{\\y} / C`` is the conjugate argument ``v^{\\y}`` in the unit
simplex and ``a_{y,i} = C <1, x>``; for the OVA losses ``a_{ic} = C beta_ic ytilde_ic`` with
``beta_ic`` in [0, 1] and ``ytilde_ic = +1`` if ``c == y_i`` else ``-1``.

Block updates (exact maximization of D over ``a_i``, all other blocks fixed), with
``s = W^T x_i`` (current scores), ``K = ||x_i||^2`` and ``q = s - K a_i``:

* SVM^Multi_gamma (gamma >= 0), TPAMI Prop. 14 with k = 1: ``x' = -a^{\\y}`` is
  ``argmin_{x in Delta(C)} ||x - b||^2 + rho <1,x>^2`` with ``b = (q^{\\y} + (1 - q_y)) / (K +
  gamma/C)``, ``rho = K / (K + gamma/C)``.
* LR^Multi, TPAMI Prop. 15-16 with k = 1 (U empty): ``x_j = V(b_j - t) / alpha`` with
  ``alpha = C K``, ``b = q^{\\y} - q_y`` and ``t`` the root of eq. (14)
  ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0``.  ``h`` is convex and decreasing (V is
  convex increasing); we solve it by Halley's method (the paper uses a 4th-order Householder
  step; Halley is 3rd order and needs only V, V' and V'' which come free with V); we bracket
  the root by ``B - alpha - log(alpha) <= t <= B - alpha/m - log(alpha/m)`` with
  ``B = max(alpha, max_j b_j)`` (each of the m terms is at most alpha at the root, and the
  largest is at least alpha/m) and safeguard with bisection.
* Top-k hinges alpha (printed, D_k), alpha pseudo (Delta_k^alpha), beta (Delta_k^beta), all
  with gamma >= 0: Prop. 14 verbatim with the simplex replaced by the loss's conjugate domain
  (DESIGN §4.1), i.e. the same ``b`` and ``rho`` and the biased projections of
  :mod:`topkbench.kernels.topk` with radius C.
* Top-k Ent (and LR^Multi = top-1 Ent): Props. 15-16 with ``alpha = C K``, ``b = q^{\\y} -
  q_y``, solved by :func:`topkbench.kernels.topk_entropy.topk_ent_prox`.
* SVM^OVA_gamma: ``beta = clip((1 - ytilde g) / (gamma + C K), 0, 1)``, ``g = q_c``
  (the smoothed hinge has conjugate ``-beta + gamma beta^2 / 2``; TPAMI Prop. 10 / [8]).
* LR^OVA: ``u = logit(beta)`` solves ``u + ytilde g + C K sigmoid(u) = 0`` (increasing in u,
  root inside ``[-ytilde g - C K, -ytilde g]``), by Halley steps on all m classes at once
  (:func:`_lr_ova_block`) with safeguarded scalar Newton for the stragglers.

Zero-norm examples (DESIGN §4.3): with ``K = 0`` the block does not affect W, and the update
reduces to maximizing ``-L*(-a/C)``, i.e. ``v = grad L(0)``; each branch handles it explicitly
so the duality gap still closes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from topkbench.kernels.multilabel import (
    is_multilabel,
    loss_value_ml,
    neg_conjugate_value_ml,
    update_block_ml,
)
from topkbench.kernels.prefetch import prefetch_at, prefetch_row
from topkbench.kernels.projections import simplex_biased_threshold
from topkbench.kernels.roots import STATUS_OK, _logistic_dual_root, _sigmoid
from topkbench.kernels.topk import (
    SET_ALPHA,
    SET_BETA,
    SET_DK,
    insert_top,
    topk_threshold,
)
from topkbench.kernels.topk_entropy import topk_ent_loss, topk_ent_prox
from topkbench.kernels.vecmath import exp_rough, exp_shifted, log_into, vsum
from topkbench.losses.ids import (  # noqa: E402
    LOSS_LR_MULTI,
    LOSS_SVM_MULTI,
    LOSS_SVM_OVA,
    LOSS_TOPK_ENT,
    LOSS_TOPK_SVM_ALPHA,
    LOSS_TOPK_SVM_ALPHA_PSEUDO,
    LOSS_TOPK_SVM_BETA,
)


@njit(cache=True)
def is_hinge(loss):
    """The SVM^Multi / top-k hinge family (linear conjugate on a polytope)."""
    return loss == LOSS_SVM_MULTI or (
        loss == LOSS_TOPK_SVM_ALPHA
        or loss == LOSS_TOPK_SVM_ALPHA_PSEUDO
        or loss == LOSS_TOPK_SVM_BETA
    )


@njit(cache=True)
def is_entropic(loss):
    """LR^Multi and top-k Ent (negative-entropy conjugate)."""
    return loss == LOSS_LR_MULTI or loss == LOSS_TOPK_ENT


@njit(cache=True)
def hinge_set(loss):
    if loss == LOSS_TOPK_SVM_ALPHA:
        return SET_DK
    if loss == LOSS_TOPK_SVM_ALPHA_PSEUDO:
        return SET_ALPHA
    return SET_BETA


@njit(cache=True, error_model="numpy")
def _svm_ova_block(y, s, a, kii, C, gamma, out):
    """SVM^OVA_gamma block update (module docstring): ``out[c] = C beta_c ytilde_c`` with
    ``beta_c = clip((1 - ytilde_c g_c) / (gamma + C K), 0, 1)``; with ``gamma + C K = 0``
    (zero-norm example, hinge) ``beta_c = 1`` where ``1 - ytilde_c g_c > 0``, else 0.  The
    numpy error model drops the zero-division check, so the loop vectorizes."""
    den = gamma + C * kii
    m = s.shape[0]
    if den == 0.0:
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            out[c] = C * yt if 1.0 - yt * (s[c] - kii * a[c]) > 0.0 else 0.0
        return
    for c in range(m):
        yt = 1.0 if c == y else -1.0
        beta = min(max((1.0 - yt * (s[c] - kii * a[c])) / den, 0.0), 1.0)
        out[c] = C * beta * yt


# LR^OVA block update: vectorized Halley steps before the scalar safeguarded solver, which
# also takes the last few roots (on bench sdca's problem the second vector step leaves one or
# two roots unconverged in ~22 % of the updates, and a third vector step costs ~260 ns)
_OVA_HALLEY_STEPS = 6
_OVA_STRAGGLERS = 2


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _logistic_halley(u, z, ck, sg, q):
    """``(f, u')`` for ``f(u) = u + z + ck sigmoid(u)`` given ``sg = sigmoid(u)`` and ``q =
    sigmoid (1 - sigmoid)``: Halley's step with ``f' = 1 + ck q``, ``f'' = ck q (1 - 2 sg)``
    (Newton's where ``2 f'^2 - f f''`` is not positive), clipped to the bracket ``[-z - ck,
    -z]``.  Inlined into the vector loops below."""
    f = u + z + ck * sg
    d1 = 1.0 + ck * q
    d2 = ck * q * (1.0 - 2.0 * sg)
    den = 2.0 * d1 * d1 - f * d2
    # the two steps share one division (vectorized, both arms of a select are computed, and
    # an AVX-512 division costs ~10 cycles per vector on Zen 4)
    halley = den > 0.0
    num = 2.0 * f * d1 if halley else f
    step = u - num / (den if halley else d1)
    return f, min(max(step, -z - ck), -z)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _lr_ova_start(z, beta0, ck, m, u, ex, tmp):
    """Starting points ``u[c]`` for ``f(u) = u + z_c + ck sigmoid(u) = 0``, inside the bracket
    ``[-z - ck, -z]``.

    Where ``0 < beta0_c < 1`` the previous root ``u0 = logit(beta0_c)`` (one vector log of
    ``beta0 / (1 - beta0)``) is a warm start, and since ``sigmoid(u0) = beta0_c`` the first
    Halley step from it (:func:`_lr_ova_halley_step`'s formulas) needs no exp: it is taken
    here (unless u0 had to be clipped to the bracket, where that identity fails).  Elsewhere
    (a zero block: the first epoch) the start of
    :func:`~topkbench.kernels.roots._logistic_dual_root`, from which Newton converges
    monotonically: ``min(-z, 0)`` if ``f(0) > 0``, else ``max(-z - ck, 0)``."""
    for c in range(m):
        ex[c] = beta0[c] / (1.0 - beta0[c])
    log_into(ex, m, u, tmp)
    for c in range(m):
        lo = -z[c] - ck
        hi = -z[c]
        b = beta0[c]
        u0 = min(max(u[c], lo), hi)
        _, step = _logistic_halley(u0, z[c], ck, b, b * (1.0 - b))
        safe = min(hi, 0.0) if z[c] + 0.5 * ck > 0.0 else max(lo, 0.0)
        warm = 0.0 < b < 1.0
        u[c] = (step if u0 == u[c] else u0) if warm else safe


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _lr_ova_halley_step(z, ck, m, u, ex, sig, res):
    """One Halley step on every ``u[c]`` not yet converged, given ``ex[c] = e^{u_c}``.

    With ``sigma = sigmoid(u)``, ``q = sigma (1 - sigma)``: ``f = u + z + ck sigma``,
    ``f1 = 1 + ck q``, ``f2 = ck q (1 - 2 sigma)`` (first and second derivative), and the step
    ``delta = -2 f f1 / (2 f1^2 - f f2)`` (Newton's where that denominator is not positive),
    clipped to the bracket ``[-z - ck, -z]``.  A root is accepted (``res[c] = 0``, ``sig[c]``
    its sigmoid) when

    * ``|f| <= 4 eps (|u| + |z| + ck)``, the rounding floor of f (as in the scalar solver):
      ``sig[c] = sigma``; or
    * ``|delta|^3 (1 + ck) <= eps (1 + |u|)``: Halley's error after the step is
      ``O(|f3 / f1| delta^3)`` with ``f1 >= 1`` and the third derivative ``|f3| <= ck / 8``,
      below rounding, so the root is ``u + delta`` and ``sig[c] = sigma + q delta + q (1 - 2
      sigma) delta^2 / 2`` (Taylor; the remainder ``|delta|^3 / 48`` is below rounding too).

    Otherwise ``res[c] = 1`` and ``u[c]`` takes the step.  Returns how many are not accepted.
    Branch-free (selects), so the loop vectorizes."""
    bad = 0
    for c in range(m):
        e = ex[c]
        inv = 1.0 / (1.0 + e)
        sg = e * inv
        q = sg * inv
        uc = u[c]
        zc = z[c]
        f, step = _logistic_halley(uc, zc, ck, sg, q)
        delta = step - uc
        at_floor = abs(f) <= 8.881784197001252e-16 * (abs(uc) + abs(zc) + ck)
        tiny = delta * delta * abs(delta) * (1.0 + ck) <= 2.220446049250313e-16 * (1.0 + abs(uc))
        ok = at_floor or tiny
        sig[c] = sg if at_floor else sg + q * delta * (1.0 + 0.5 * (1.0 - 2.0 * sg) * delta)
        res[c] = 0.0 if ok else 1.0
        bad += 0 if ok else 1
        u[c] = uc if at_floor else step
    return bad


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _lr_ova_rough_step(z, ck, m, u, ex):
    """One Halley step on every ``u[c]`` from ``ex[c] ~ e^{u_c}`` (:func:`exp_rough`), without
    the acceptance tests of :func:`_lr_ova_halley_step`: the second step of every update (on
    bench sdca's problem its step is above the acceptance bound for all but ~0.03 % of the
    updates, median 2e-3), whose iterate the exact steps then correct.  Halley's method
    converges from any point of the bracket it is clipped to, so the rough exponential only
    perturbs one iterate."""
    for c in range(m):
        e = ex[c]
        inv = 1.0 / (1.0 + e)
        sg = e * inv
        _, step = _logistic_halley(u[c], z[c], ck, sg, sg * inv)
        u[c] = step


@njit(cache=True)
def _lr_ova_block(y, s, a, kii, C, out, z, u, ex, extra):
    """LR^OVA block update (module docstring): ``out[c] = C sigmoid(u_c) ytilde_c`` with ``u_c``
    the root of ``u + z_c + ck sigmoid(u) = 0``, ``z_c = ytilde_c (s_c - K a_c)``, ``ck = C K``.

    All m roots take Halley steps together, as branch-free loops with the vectorizable exp
    and log of :mod:`topkbench.kernels.vecmath`: the warm start's step (no exp,
    :func:`_lr_ova_start`), one step from a rough exponential (:func:`_lr_ova_rough_step`,
    ~60 ns less per update), then exact steps with acceptance tests
    (:func:`_lr_ova_halley_step`) until at most
    ``_OVA_STRAGGLERS`` are left (or after ``_OVA_HALLEY_STEPS``); a class not accepted by then
    goes to the safeguarded scalar solver :func:`~topkbench.kernels.roots._logistic_dual_root`
    from its current iterate, so the result is the same root either way.  ``z``, ``u``,
    ``ex`` (length m) and ``extra`` (3 x m) are scratch.  Returns a status."""
    m = s.shape[0]
    ck = C * kii
    tmp, sig, res = extra[0], extra[1], extra[2]
    inv_c = 1.0 / C  # the warm start only: one division, not m
    for c in range(m):
        yt = 1.0 if c == y else -1.0
        z[c] = yt * (s[c] - kii * a[c])
        sig[c] = min(max(a[c] * yt * inv_c, 0.0), 1.0)
    _lr_ova_start(z, sig, ck, m, u, ex, tmp)
    exp_rough(u, m, ex)
    _lr_ova_rough_step(z, ck, m, u, ex)
    bad = m
    for _ in range(_OVA_HALLEY_STEPS):
        exp_shifted(u, 0.0, m, ex, tmp)
        bad = _lr_ova_halley_step(z, ck, m, u, ex, sig, res)
        if bad <= _OVA_STRAGGLERS:
            # a vector step for one or two roots costs more than their scalar solves (below)
            break
    status = STATUS_OK
    if bad > 0:  # the stragglers' sigmoids from the scalar solver (res[c] != 0: not accepted)
        for c in range(m):
            if res[c] != 0.0:
                uc, st = _logistic_dual_root(z[c], ck, u[c])
                if st != STATUS_OK:
                    status = st
                sig[c] = _sigmoid(uc)
    _lr_ova_out(y, C, sig, m, out)
    return status


@njit(cache=True, error_model="numpy")
def _lr_ova_out(y, C, sig, m, out):
    """``out[c] = C sigma_c ytilde_c`` (a loop of its own: it vectorizes)."""
    for c in range(m):
        out[c] = -C * sig[c]
    out[y] = C * sig[y]


@njit(cache=True)
def _no_violation(b):
    """Whether every entry of ``b`` is ``<= 0``."""
    for p in range(b.shape[0]):
        if b[p] > 0.0:
            return False
    return True


@njit(cache=True)
def _b_vector(y, s, a, kii, work):
    """``b_j = (s_j - K a_j) - (s_y - K a_y)`` over the m-1 coordinates ``j != y``, stored
    compactly in ``work[:m-1]`` (one loop with a test per j: measured faster than two
    vectorized loops around y, whose remainders are long for m ~ 100).  Returns the view."""
    m = s.shape[0]
    qy = s[y] - kii * a[y]
    p = 0
    for j in range(m):
        if j != y:
            work[p] = s[j] - kii * a[j] - qy
            p += 1
    return work[: m - 1]


@njit(cache=True, error_model="numpy")
def _b_full(y, s, a, kii, work):
    """``b_j = (s_j - K a_j) - (s_y - K a_y)`` for every j, with ``b_y = -inf``, in
    ``work[:m]`` (returned): the label keeps its slot, where the entropic prox gives ``x_y =
    V(-inf) / alpha = 0``, so that this loop and the block's output loop vectorize (99 classes:
    145 -> 50 ns for both against the compact vector of :func:`_b_vector`)."""
    m = s.shape[0]
    qy = s[y] - kii * a[y]
    for j in range(m):
        work[j] = (s[j] - kii * a[j]) - qy
    work[y] = -np.inf
    return work[:m]


@njit(cache=True, error_model="numpy")
def _entropic_out(y, C, x, sx, out):
    """``out = -C x`` except ``out[y] = C sx`` with ``sx = <1, x>`` (x over all m slots, ``x_y
    = 0``)."""
    m = out.shape[0]
    for j in range(m):
        out[j] = -C * x[j]
    out[y] = C * sx


@njit(cache=True)
def _entropic_block(loss, y, s, a, kii, C, k, out, work, vals, srt, idx, extra, troots, i):
    """LR^Multi / top-k Ent block update (see :func:`update_block`): the prox of eq. (11) at
    ``b`` (LR^Multi is top-1 Ent, TPAMI Table 1), x written over b.

    The prox runs on all m slots with ``b_y = -inf`` (:func:`_b_full`): the label's
    coordinate is 0 and every other one is the prox of the m - 1 real entries (the extra slot
    adds nothing to any sum and is never among the k largest).  Not when ``k = m - 1``: that
    prox has its own all-capped case for ``k = n`` (every coordinate at the cap), which the
    extra slot would hide; the compact vector of :func:`_b_vector` serves it."""
    m = s.shape[0]
    kk = 1 if loss == LOSS_LR_MULTI else k
    # two call sites of the prox on purpose: one shared call (b chosen first) was slower
    if kk == 1 or kk < m - 1:
        b = _b_full(y, s, a, kii, work)
        t0, status, sx = topk_ent_prox(
            b, C * kii, kk, b, vals, srt, idx, extra[0], extra[1], extra[2], troots[i]
        )  # fmt: skip
        troots[i] = t0
        # the prox keeps <1, x> <= 1 (it rescales rounding excess itself)
        _entropic_out(y, C, b, sx, out)
        return status
    b = _b_vector(y, s, a, kii, work)
    t0, status, sx = topk_ent_prox(
        b, C * kii, kk, b, vals, srt, idx, extra[0], extra[1], extra[2], troots[i]
    )  # fmt: skip
    troots[i] = t0
    p = 0
    for j in range(m):
        if j != y:
            out[j] = -C * b[p]
            p += 1
    out[y] = C * sx
    return status


@njit(cache=True)
def update_block(loss, y, s, a, kii, C, gamma, k, out, work, vals, srt, idx, extra, troots, i):
    """New dual block for one example into ``out`` (see module docstring). Returns a status.

    ``work``, ``vals``, ``srt`` (float) and ``idx`` (int) are scratch arrays of length m,
    ``extra`` a float scratch of shape (3, m).
    ``troots[i]`` keeps the example's last root of eq. (14) as the next starting point (NaN if
    none); it only affects the number of iterations, not the result.
    """
    m = s.shape[0]
    status = STATUS_OK
    if is_entropic(loss):
        return _entropic_block(
            loss, y, s, a, kii, C, k, out, work, vals, srt, idx, extra, troots, i
        )
    if is_hinge(loss):
        b = _b_vector(y, s, a, kii, work)
        den = kii + gamma / C
        if den == 0.0:
            # zero-norm example, nonsmooth loss: any x in the domain with <1,x> = C
            # maximizes -L*; the uniform point lies in every top-k set (k <= m-1)
            for j in range(m):
                out[j] = -C / (m - 1)
            out[y] = C
            return status
        rho = kii / den
        for p in range(m - 1):
            b[p] = (b[p] + 1.0) / den
        if loss != LOSS_SVM_MULTI and _no_violation(b):
            # no margin violated even without this block: every top-k domain lies in the
            # nonnegative orthant and contains 0, where the objective's gradient -b >= 0,
            # so x = 0 is the projection (most updates near the optimum; skips the
            # selection and sweeps; the simplex's own threshold is cheap, svm_multi keeps it)
            for j in range(m):
                out[j] = 0.0
            return status
        if loss == LOSS_SVM_MULTI:
            t = simplex_biased_threshold(b, rho, C, idx)
            c = math.inf
        else:
            t, c, _ = topk_threshold(hinge_set(loss), b, k, rho, C, srt)
        total = 0.0
        p = 0
        for j in range(m):
            if j != y:
                v = b[p] - t
                if v > c:
                    v = c
                if v < 0.0:
                    v = 0.0
                out[j] = -v
                total += v
                p += 1
        if total > C:
            # b ~ 1/den is huge when |x_i|^2 and gamma/C are tiny; (b - t)_+ then carries
            # an absolute error ~eps max|b| and can leave Delta(C) (seen: <1,x> = C (1 +
            # 5e-5) for |x_i| ~ 1e-3, C = 1e-3), so that D(A) > P(W).  Scale back onto
            # the boundary to keep the dual feasible and the gap a certificate (scaling
            # keeps every cap and cone constraint of the top-k sets).
            for j in range(m):
                if j != y:
                    out[j] *= C / total
            total = C
        out[y] = total
    elif loss == LOSS_SVM_OVA:
        _svm_ova_block(y, s, a, kii, C, gamma, out)
    else:  # LOSS_LR_OVA
        status = _lr_ova_block(y, s, a, kii, C, out, work, vals, srt, extra)
    return status


@njit(cache=True)
def _scratch(m):
    """Per-call scratch of the epoch kernels (allocated once per call, not per example):
    scores, new block, the ``work``, ``vals``, ``srt``, ``idx`` arrays of update_block, the
    all-False label mask of the multilabel updates, the block change ``delta``, and
    update_block's ``extra`` (3 x m)."""
    return (
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m),
        np.empty(m, dtype=np.int64),
        np.zeros(m, dtype=np.bool_),
        np.empty(m),
        np.empty((3, m)),
    )


@njit(cache=True)
def _update(loss, yptr, yidx, i, s, a, kii, C, gamma, k, out, scratch, troots):
    """Dispatch one block update: labels of example ``i`` are ``yidx[yptr[i]:yptr[i+1]]``
    (exactly one for the multiclass losses)."""
    _, _, work, vals, srt, idx, mask, _, extra = scratch
    if is_multilabel(loss):
        labels = yidx[yptr[i] : yptr[i + 1]]
        return update_block_ml(
            loss, labels, s, a, kii, C, gamma, out, work, vals, idx, troots, i, mask
        )
    return update_block(
        loss, yidx[yptr[i]], s, a, kii, C, gamma, k, out, work, vals, srt, idx, extra, troots, i
    )


@njit(cache=True)
def gradient_duals(S, yptr, yidx, loss, C, gamma, k, out):
    """``out[i] = -C grad L_gamma(Y_i, S_i)`` for every row of the scores ``S``: the block
    update of an example with ``||x_i||^2 = 0`` (then ``q = s`` and the update maximizes
    ``-C L*(-a / C) - <a, s>``, whose maximizer is ``-C`` times the gradient; DESIGN §4.3's
    zero-norm branches).  For a nonsmooth loss (gamma = 0 hinges) it is *a* subgradient.
    Returns the count of failed inner root findings."""
    n, m = S.shape
    scratch = _scratch(m)
    troots = np.full(n, np.nan)
    a = np.zeros(m)
    failures = 0
    for i in range(n):
        if _update(loss, yptr, yidx, i, S[i], a, 0.0, C, gamma, k, out[i], scratch, troots) != (
            STATUS_OK
        ):
            failures += 1
    return failures


# A block change with at most m / _SPARSE_DELTA nonzeros (the hinge losses: an SVM^Multi
# support vector moves ~3 of its 100 dual variables) updates only those columns of W; the next
# scores then take a read-only pass, which is cheaper than the fused read-modify-write pass.
_SPARSE_DELTA = 4


@njit(cache=True)
def _sparse_change(nz, m):
    """Whether a change with ``nz`` nonzeros over m columns goes column by column."""
    return nz * _SPARSE_DELTA <= m


@njit(cache=True, error_model="numpy")
def _store_block(A, i, new, delta, cols):
    """``A[i] = new``; ``delta = new - old``; returns the number ``nz`` of nonzero entries of
    ``delta`` and, when the change is sparse enough for the column-wise update
    (:func:`_sparse_change`), lists their indices in ``cols``.

    The difference-and-store loop and the count vectorize (as two loops: fused, they did not;
    88 -> 50 ns per dense block at m = 100 with the row in cache); the compaction, a chain through
    its counter, runs only for sparse changes (the hinge losses near the optimum), not for the
    dense changes of the logistic and entropic losses."""
    m = new.shape[0]
    row = A[i]
    for j in range(m):
        delta[j] = new[j] - row[j]
        row[j] = new[j]
    nz = 0
    for j in range(m):
        nz += 1 if delta[j] != 0.0 else 0
    if _sparse_change(nz, m):
        q = 0
        for j in range(m):
            # branch-free: cols[q] is overwritten until a nonzero keeps it (which entries
            # of a block change are zero varies from example to example: a branch mispredicts)
            cols[q] = j
            q += delta[j] != 0.0
    return nz


@njit(cache=True)
def _update_columns_dense(X, i, delta, cols, nz, W):
    """``W[:, j] += x_i delta_j`` for the ``nz`` columns ``j`` in ``cols`` (the others have
    ``delta_j = 0``: the same W as the full update)."""
    for f in range(X.shape[1]):
        xf = X[i, f]
        for q in range(nz):
            j = cols[q]
            W[f, j] += xf * delta[j]


# Dense passes over W (d x m, row-major: one feature's m weights are contiguous).  Each example
# needs the scores s = W^T x_i and the rank-1 update W += x_i delta^T; W (100 KB at d = 128,
# m = 100) lives in L2, so the epoch is bound by moving W, not by flops.  Three measures: the
# updates of one pair of examples and the scores of the next pair share one pass over W
# (sdca_epochs_dense), each pass over the score vectors takes four feature rows (the score
# accumulators are loaded and stored once per four rows), and sparse block changes update only
# their columns (`topkbench bench sdca` measures the epochs against the flop bound).
# The passes are compiled with fastmath "contract" only: LLVM fuses each multiply-add into
# an FMA (one rounding instead of two; no reassociation, so the sums keep feature order).
_ROWS = 4
_LANES = 8  # float64 per AVX-512 vector: sdca_epochs_dense pads W's width to a multiple


@njit(cache=True)
def _four(X, i, f):
    """``X[i, f:f+4]`` as four scalars (inlined by LLVM; the passes below keep them in
    registers)."""
    return X[i, f], X[i, f + 1], X[i, f + 2], X[i, f + 3]


@njit(cache=True, fastmath={"contract"})
def _scores_dense(X, i, W, s):
    """``s = W^T x_i`` (sums in feature order)."""
    d = X.shape[1]
    m = W.shape[1]
    for j in range(m):
        s[j] = 0.0
    f = 0
    while f + _ROWS <= d:
        x0, x1, x2, x3 = _four(X, i, f)
        for j in range(m):
            s[j] = (((s[j] + x0 * W[f, j]) + x1 * W[f + 1, j]) + x2 * W[f + 2, j]) + x3 * W[
                f + 3, j
            ]
        f += _ROWS
    while f < d:
        xf = X[i, f]
        for j in range(m):
            s[j] += xf * W[f, j]
        f += 1


@njit(cache=True, fastmath={"contract"})
def _update_scores_dense(X, i, delta, nxt, W, s):
    """``W += x_i delta^T``, then ``s = W^T x_nxt`` with the new W, in one pass over W
    (``nxt < 0``: the update only)."""
    d = X.shape[1]
    m = W.shape[1]
    if nxt < 0:
        for f in range(d):
            xf = X[i, f]
            for j in range(m):
                W[f, j] += xf * delta[j]
        return
    for j in range(m):
        s[j] = 0.0
    f = 0
    while f + _ROWS <= d:
        x0, x1, x2, x3 = _four(X, i, f)
        n0, n1, n2, n3 = _four(X, nxt, f)
        for j in range(m):
            dj = delta[j]
            w0 = W[f, j] + x0 * dj
            W[f, j] = w0
            w1 = W[f + 1, j] + x1 * dj
            W[f + 1, j] = w1
            w2 = W[f + 2, j] + x2 * dj
            W[f + 2, j] = w2
            w3 = W[f + 3, j] + x3 * dj
            W[f + 3, j] = w3
            s[j] = (((s[j] + n0 * w0) + n1 * w1) + n2 * w2) + n3 * w3
        f += _ROWS
    while f < d:
        xf = X[i, f]
        xn = X[nxt, f]
        for j in range(m):
            w = W[f, j] + xf * delta[j]
            W[f, j] = w
            s[j] += xn * w
        f += 1


@njit(cache=True)
def _clear_pair(sc, sd):
    for j in range(sc.shape[0]):
        sc[j] = 0.0
        sd[j] = 0.0


@njit(cache=True, fastmath={"contract"})
def _scores_pair(X, c, d, W, sc, sd):
    """``sc = W^T x_c`` and ``sd = W^T x_d`` in one read-only pass over W (sums in feature
    order, as :func:`_scores_dense`).  Returns ``<x_c, x_d>``."""
    dim = X.shape[1]
    m = W.shape[1]
    _clear_pair(sc, sd)
    xcd = 0.0
    f = 0
    while f + _ROWS <= dim:
        c0, c1, c2, c3 = _four(X, c, f)
        d0, d1, d2, d3 = _four(X, d, f)
        xcd = (((xcd + c0 * d0) + c1 * d1) + c2 * d2) + c3 * d3
        for j in range(m):
            w0 = W[f, j]
            w1 = W[f + 1, j]
            w2 = W[f + 2, j]
            w3 = W[f + 3, j]
            sc[j] = (((sc[j] + c0 * w0) + c1 * w1) + c2 * w2) + c3 * w3
            sd[j] = (((sd[j] + d0 * w0) + d1 * w1) + d2 * w2) + d3 * w3
        f += _ROWS
    while f < dim:
        cf = X[c, f]
        df = X[d, f]
        xcd += cf * df
        for j in range(m):
            sc[j] += cf * W[f, j]
            sd[j] += df * W[f, j]
        f += 1
    return xcd


@njit(cache=True, fastmath={"contract"})
def _update_pair_scores_pair(X, a, da, b, db, c, d, W, sc, sd):
    """``W += x_a da^T + x_b db^T``, then ``sc = W^T x_c`` and ``sd = W^T x_d`` with the new W,
    all in one pass over W.  Returns ``<x_c, x_d>``."""
    dim = X.shape[1]
    m = W.shape[1]
    _clear_pair(sc, sd)
    xcd = 0.0
    f = 0
    while f + _ROWS <= dim:
        a0, a1, a2, a3 = _four(X, a, f)
        b0, b1, b2, b3 = _four(X, b, f)
        c0, c1, c2, c3 = _four(X, c, f)
        d0, d1, d2, d3 = _four(X, d, f)
        xcd = (((xcd + c0 * d0) + c1 * d1) + c2 * d2) + c3 * d3
        for j in range(m):
            ea = da[j]
            eb = db[j]
            w0 = (W[f, j] + a0 * ea) + b0 * eb
            W[f, j] = w0
            w1 = (W[f + 1, j] + a1 * ea) + b1 * eb
            W[f + 1, j] = w1
            w2 = (W[f + 2, j] + a2 * ea) + b2 * eb
            W[f + 2, j] = w2
            w3 = (W[f + 3, j] + a3 * ea) + b3 * eb
            W[f + 3, j] = w3
            sc[j] = (((sc[j] + c0 * w0) + c1 * w1) + c2 * w2) + c3 * w3
            sd[j] = (((sd[j] + d0 * w0) + d1 * w1) + d2 * w2) + d3 * w3
        f += _ROWS
    while f < dim:
        af = X[a, f]
        bf = X[b, f]
        cf = X[c, f]
        df = X[d, f]
        xcd += cf * df
        for j in range(m):
            w = (W[f, j] + af * da[j]) + bf * db[j]
            W[f, j] = w
            sc[j] += cf * w
            sd[j] += df * w
        f += 1
    return xcd


@njit(cache=True)
def _apply_change(X, i, delta, cols, nz, W, m):
    """``W += x_i delta^T`` for a block change with ``nz`` nonzeros (listed in ``cols``) over
    the first ``m`` columns: column by column when sparse (see ``_SPARSE_DELTA``), else one
    dense pass (over all of W's columns; those past m have ``delta = 0``)."""
    if not _sparse_change(nz, m):
        _update_scores_dense(X, i, delta, -1, W, delta)
    elif nz > 0:
        _update_columns_dense(X, i, delta, cols, nz, W)


@njit(cache=True)
def sdca_epochs_dense(X, yptr, yidx, sqnorms, A, W, perms, loss, C, gamma, k, troots):
    """Run ``perms.shape[0]`` SDCA epochs in place on dense ``X`` (n x d), ``W`` (d x m).

    Labels in CSR form: example ``i`` has ``yidx[yptr[i]:yptr[i+1]]`` (one label per example
    for the multiclass losses, the label set for the multilabel ones).

    ``troots`` (length n, NaN-initialized, kept by the caller across calls) holds per-example
    starting points for the softmax root finding.  Returns the number of block updates whose
    inner root finding did not converge.

    Examples go in pairs ``(a, b)`` of consecutive entries of the permutation, with one pass
    over W per pair instead of one per example (W lives in L2 and moving it bounds the epoch).
    ``s_a`` is exact when ``a``'s update starts; ``b``'s scores were computed in the same pass
    as ``a``'s, before ``a``'s change ``delta_a`` reached W, and are completed by the rank-one
    identity ``W'^T x_b = W^T x_b + <x_a, x_b> delta_a`` (``W' = W + x_a delta_a^T``).  The
    pass after the pair then applies both changes and computes the next pair's scores
    (:func:`_update_pair_scores_pair`); when both changes together are sparse (at most
    ``m / _SPARSE_DELTA`` nonzeros, e.g. SVM^Multi near the optimum) they go column by column
    and the scores take a read-only pass (:func:`_scores_pair`).  Every example's update sees
    the scores of exactly the W the sequential algorithm has (same trajectory; rounding
    differs from a per-example loop at the last bits of the scores).

    The epochs run on a copy of W whose rows start on 64-byte boundaries, padded with zero
    columns to a multiple of ``_LANES`` (copied back at the end; the pass vectors likewise).
    LLVM vectorizes the passes' column loops in blocks of 4 x 8 and runs the rest element by
    element unless it is a whole vector, and a vector load that straddles two cache lines
    costs two (numpy's and numba's arrays are only 16- or 32-byte aligned, so with m = 100
    at least every other row of W did).
    The padded columns have zero scores and zero changes: the result is the unpadded loop's.
    """
    m = W.shape[1]
    mp = -(-m // _LANES) * _LANES
    Wp = _aligned_zeros(W.shape[0], mp)
    Wp[:, :m] = W
    failures = _epochs_dense_padded(
        X, yptr, yidx, sqnorms, A, Wp, m, perms, loss, C, gamma, k, troots
    )
    W[:, :] = Wp[:, :m]
    return failures


@njit(cache=True)
def _aligned_zeros(r, c):
    """An r x c float64 array of zeros whose first element sits on a 64-byte boundary (so
    every row does when c is a multiple of ``_LANES``).  numba's own arrays start 32 bytes
    past a line boundary, numpy's anywhere on 16 bytes; an AVX-512 load that straddles two
    cache lines costs two."""
    buf = np.zeros(r * c + _LANES)
    off = ((-buf.ctypes.data) % 64) // 8
    return buf[off : off + r * c].reshape((r, c))


@njit(cache=True)
def _epochs_dense_padded(X, yptr, yidx, sqnorms, A, W, m, perms, loss, C, gamma, k, troots):
    """:func:`sdca_epochs_dense` on ``W`` with ``W.shape[1] >= m`` columns, those past m
    zero (the scores and block changes of the passes have W's width, the updates see their
    first m entries)."""
    n_epochs = perms.shape[0]
    npe = perms.shape[1]
    mp = W.shape[1]
    scratch = _scratch(m)
    new = scratch[1]
    # the passes' vectors have W's width (zero past m); own index arrays: a's changed columns
    # must survive b's update, which uses scratch[5]
    vecs = _aligned_zeros(4, mp)
    s_full, s_b_full, delta, delta_b = vecs[0], vecs[1], vecs[2], vecs[3]
    s, s_b = s_full[:m], s_b_full[:m]
    cols, cols_b = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    failures = 0
    for e in range(n_epochs):
        if npe == 0:
            continue
        xab = 0.0
        if npe >= 2:
            xab = _scores_pair(X, perms[e, 0], perms[e, 1], W, s_full, s_b_full)
        else:
            _scores_dense(X, perms[e, 0], W, s_full)
        for p in range(0, npe, 2):
            a = perms[e, p]
            b = perms[e, p + 1] if p + 1 < npe else -1
            for q in range(p + 2, min(p + 4, npe)):  # the next pair's data (kernels.prefetch)
                i = perms[e, q]
                prefetch_row(A, i)
                prefetch_at(troots, i)
                prefetch_at(sqnorms, i)
                if yptr[i] < yptr[i + 1]:  # a multilabel example can have no label
                    prefetch_at(yidx, yptr[i])
            if _update(loss, yptr, yidx, a, s, A[a], sqnorms[a], C, gamma, k, new, scratch, troots):
                failures += 1
            nz_a = _store_block(A, a, new, delta, cols)
            nz_b = 0
            if b >= 0:
                if nz_a > 0:
                    for j in range(m):
                        s_b[j] += xab * delta[j]
                if _update(
                    loss, yptr, yidx, b, s_b, A[b], sqnorms[b], C, gamma, k, new, scratch, troots
                ):
                    failures += 1
                nz_b = _store_block(A, b, new, delta_b, cols_b)
            c = perms[e, p + 2] if p + 2 < npe else -1
            d = perms[e, p + 3] if p + 3 < npe else -1
            if d >= 0 and not _sparse_change(nz_a + nz_b, m):
                xab = _update_pair_scores_pair(X, a, delta, b, delta_b, c, d, W, s_full, s_b_full)
                continue
            _apply_change(X, a, delta, cols, nz_a, W, m)
            if b >= 0:
                _apply_change(X, b, delta_b, cols_b, nz_b, W, m)
            if d >= 0:
                xab = _scores_pair(X, c, d, W, s_full, s_b_full)
            elif c >= 0:
                _scores_dense(X, c, W, s_full)
    return failures


@njit(cache=True)
def sdca_epochs_csr(
    indptr, indices, data, yptr, yidx, sqnorms, A, W, perms, loss, C, gamma, k, troots
):
    """As :func:`sdca_epochs_dense` for CSR features (``indptr``, ``indices``, ``data``)."""
    n_epochs = perms.shape[0]
    m = W.shape[1]
    scratch = _scratch(m)
    s, new, cols = scratch[0], scratch[1], scratch[5]
    failures = 0
    for e in range(n_epochs):
        for p in range(perms.shape[1]):
            i = perms[e, p]
            for j in range(m):
                s[j] = 0.0
            for q in range(indptr[i], indptr[i + 1]):
                xf = data[q]
                f = indices[q]
                for j in range(m):
                    s[j] += xf * W[f, j]
            if _update(loss, yptr, yidx, i, s, A[i], sqnorms[i], C, gamma, k, new, scratch, troots):
                failures += 1
            nz = _store_block(A, i, new, s, cols)
            if not _sparse_change(nz, m):
                for q in range(indptr[i], indptr[i + 1]):
                    xf = data[q]
                    f = indices[q]
                    for j in range(m):
                        W[f, j] += xf * s[j]
            elif nz > 0:
                for q in range(indptr[i], indptr[i + 1]):
                    xf = data[q]
                    f = indices[q]
                    for c in range(nz):
                        W[f, cols[c]] += xf * s[cols[c]]
    return failures


@njit(cache=True)
def sdca_epochs_gram(K, yptr, yidx, A, B, perms, loss, C, gamma, k, troots):
    """As :func:`sdca_epochs_dense` from a Gram matrix ``K`` (n x n): scores ``B^T K_i``.

    Kernel SDCA (DESIGN §5; TPAMI Props. 14-15 are stated with ``q = A K_i - K_ii a_i``): there
    is no W, so a step costs O(n m) and only the block ``A[i]`` changes.  ``B`` holds the
    coefficients of the primal point, ``W = sum_r phi(x_r) B_r``: plain SDCA passes ``A``
    itself; the proximal (accelerated) problems of :mod:`topkbench.solvers.accelerated` pass
    ``B = B0 + A`` with a fixed offset ``B0``, and every change of ``A[i]`` is added to ``B[i]``.
    """
    n_epochs = perms.shape[0]
    n = K.shape[0]
    m = A.shape[1]
    offset = B.ctypes.data != A.ctypes.data
    scratch = _scratch(m)
    s, new = scratch[0], scratch[1]
    failures = 0
    for e in range(n_epochs):
        for p in range(perms.shape[1]):
            i = perms[e, p]
            for j in range(m):
                s[j] = 0.0
            for r in range(n):
                kir = K[i, r]
                if kir != 0.0:
                    for j in range(m):
                        s[j] += kir * B[r, j]
            if _update(loss, yptr, yidx, i, s, A[i], K[i, i], C, gamma, k, new, scratch, troots):
                failures += 1
            _store_block(A, i, new, s, scratch[5])
            if offset:
                for j in range(m):
                    B[i, j] += s[j]
    return failures


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def _vdot(x, y, n):
    """``sum_{j<n} x_j y_j`` (vectorized as :func:`~topkbench.kernels.vecmath.vsum`)."""
    acc = 0.0
    for j in range(n):
        acc += x[j] * y[j]
    return acc


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def _log1p_sum(ex, lg, n):
    """``sum_j log(1 + ex_j)`` given ``lg_j = log(1 + ex_j)`` as computed from the rounded
    ``u_j = 1 + ex_j``: the factor ``ex_j / (u_j - 1)`` restores full relative accuracy for
    small ``ex_j`` (the classic log1p correction; ``log1p(ex) = ex`` where ``u_j = 1``)."""
    acc = 0.0
    for j in range(n):
        e = ex[j]
        u1 = (1.0 + e) - 1.0
        acc += lg[j] * (e / u1) if u1 != 0.0 else e
    return acc


@njit(cache=True)
def _lr_multi_loss(s, y, ex, tmp):
    """``log sum_j e^{s_j} - s_y`` (LR^Multi, TPAMI Table 1), shifted by ``max s``; ``ex`` and
    ``tmp`` are scratch.  Vectorized exp (:func:`~topkbench.kernels.vecmath.exp_shifted`)."""
    m = s.shape[0]
    mx = s[0]
    for j in range(m):
        mx = max(mx, s[j])
    exp_shifted(s, mx, m, ex, tmp)
    return mx + math.log(vsum(ex, m)) - s[y]


@njit(cache=True)
def _lr_ova_loss(s, y, z, ex, tmp):
    """``sum_c log(1 + e^{-ytilde_c s_c})`` (LR^OVA) as ``sum_c max(v_c, 0) + log(1 +
    e^{-|v_c|})`` with ``v_c = -ytilde_c s_c`` (no overflow); ``z``, ``ex``, ``tmp`` are
    scratch.  Vectorized exp and log."""
    m = s.shape[0]
    pos = 0.0
    for c in range(m):
        v = s[c] if c != y else -s[c]
        pos += max(v, 0.0)
        z[c] = -abs(v)
    exp_shifted(z, 0.0, m, ex, tmp)
    for c in range(m):
        z[c] = 1.0 + ex[c]
    log_into(z, m, z, tmp)
    return pos + _log1p_sum(ex, z, m)


@njit(cache=True)
def _entropic_neg_conj(a, y, C, x, lx, tmp):
    """``-<x, log x> - (1 - <1,x>) log(1 - <1,x>)`` with ``x_j = -a_j / C`` for ``j != y``
    (LR^Multi and top-k Ent, TPAMI Props. 3-4); ``x``, ``lx``, ``tmp`` are scratch.
    Vectorized log (``x log x = 0`` at ``x = 0`` through the clamp of
    :func:`~topkbench.kernels.vecmath.log_into`)."""
    m = a.shape[0]
    for j in range(m):
        x[j] = -a[j] / C
    x[y] = 0.0
    total = vsum(x, m)
    log_into(x, m, lx, tmp)
    return -_vdot(x, lx, m) - _xlogx(1.0 - total)


@njit(cache=True)
def _lr_ova_neg_conj(a, y, C, x, lx, tmp):
    """``-sum_c beta_c log beta_c + (1 - beta_c) log(1 - beta_c)`` with ``beta_c = ytilde_c
    a_c / C`` (LR^OVA); ``x``, ``lx``, ``tmp`` are scratch.  Vectorized log."""
    m = a.shape[0]
    for c in range(m):
        x[c] = a[c] / C if c == y else -a[c] / C
    log_into(x, m, lx, tmp)
    ent = _vdot(x, lx, m)
    for c in range(m):
        x[c] = 1.0 - x[c]
    log_into(x, m, lx, tmp)
    return -ent - _vdot(x, lx, m)


@njit(cache=True)
def _xlogx(x):
    return x * math.log(x) if x > 0.0 else 0.0


@njit(cache=True)
def _hinge_loss(loss, z, gamma, k, srt, idx):
    """Top-k hinge family on ``z = (1 + f_j - f_y)_{j != y}`` (length m-1).

    gamma = 0: closed forms with ``T_j`` = sum of the j largest entries of z (DESIGN §4.1):
    pseudo alpha ``max(0, T_k)/k``, printed alpha ``max(0, T_{k-1}, T_k)/k``, beta
    ``sum_{j<=k} max(0, z_[j])/k``; SVM^Multi is ``max(0, max z)``.
    gamma > 0 (TPAMI Prop. 2): ``(<z,p> - ||p||^2/2)/gamma`` with ``p = clip(z - t, 0, c)`` the
    projection onto the set of radius gamma.  Using ``z_j = p_j + t`` on M and ``z_j = c + t +
    nu_j`` on U, ``<z,p> - ||p||^2/2 = t s + ||p||^2/2 + c sum_U nu_j`` with the exact ``s`` the
    projection returns (= gamma whenever the sum constraint is active); this form keeps full
    relative accuracy for tiny gamma (the direct form loses ~eps |z| / gamma).
    """
    n = z.shape[0]
    if gamma == 0.0:
        if loss == LOSS_SVM_MULTI:
            mx = 0.0
            for j in range(n):
                if z[j] > mx:
                    mx = z[j]
            return mx
        # only the k largest margins matter (T_{k-1}, T_k): select them, no full sort
        zs = srt[: insert_top(z, k, srt)]
        if loss == LOSS_TOPK_SVM_BETA:
            total = 0.0
            for j in range(k):
                if zs[j] > 0.0:
                    total += zs[j]
            return total / k
        head = 0.0
        for j in range(k - 1):
            head += zs[j]
        full = head + zs[k - 1]
        best = max(0.0, full)
        if loss == LOSS_TOPK_SVM_ALPHA:
            best = max(best, head)
        return best / k
    if loss == LOSS_SVM_MULTI:
        t = simplex_biased_threshold(z, 0.0, gamma, idx)
        c = math.inf
        s = 0.0
        for j in range(n):
            if z[j] > t:
                s += z[j] - t
        if t > 0.0:
            s = gamma
    else:
        t, c, s = topk_threshold(hinge_set(loss), z, k, 0.0, gamma, srt)
    pp = 0.0
    nu = 0.0
    for j in range(n):
        v = z[j] - t
        if v > c:
            nu += v - c
            v = c
        if v > 0.0:
            pp += v * v
    val = (t * s + 0.5 * pp + c * nu if nu > 0.0 else t * s + 0.5 * pp) / gamma
    return val if val > 0.0 else 0.0


@njit(cache=True)
def loss_value(loss, y, s, gamma, k, work, srt, idx, extra):
    """Primal loss ``L(y, s)`` for one example with scores ``s``; ``work``, ``srt``, ``extra``
    (float) and ``idx`` (int) are scratch arrays of length m."""
    m = s.shape[0]
    sy = s[y]
    if is_hinge(loss) or loss == LOSS_TOPK_ENT:
        shift = 1.0 if is_hinge(loss) else 0.0
        p = 0
        for j in range(m):
            if j != y:
                work[p] = shift + s[j] - sy
                p += 1
        z = work[: m - 1]
        if loss == LOSS_TOPK_ENT:
            return topk_ent_loss(z, k, srt)
        return _hinge_loss(loss, z, gamma, k, srt, idx)
    elif loss == LOSS_LR_MULTI:
        return _lr_multi_loss(s, y, work, srt)
    elif loss == LOSS_SVM_OVA:
        total = 0.0
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            r = 1.0 - yt * s[c]
            if r <= 0.0:
                continue
            if gamma == 0.0:
                total += r
            elif r >= gamma:
                total += r - 0.5 * gamma
            else:
                total += r * r / (2.0 * gamma)
        return total
    else:
        return _lr_ova_loss(s, y, work, srt, extra)


@njit(cache=True)
def neg_conjugate_value(loss, y, a, C, gamma, k, x, lx, tmp):
    """``-L*(y, -a / C)`` for one dual block ``a`` (the example's share of D / (lambda C));
    ``x``, ``lx``, ``tmp`` are float scratch of length m.

    The hinge family shares ``<1,x> - gamma/2 ||x||^2`` and the entropic family
    ``-<x, log x> - (1-s) log(1-s)`` (TPAMI Props. 1-4); they differ only in the domain, which
    the updates keep feasible.
    """
    m = a.shape[0]
    if is_hinge(loss):
        # no log here: the certificate evaluates this for every example
        total = 0.0
        sq = 0.0
        for j in range(m):
            if j != y:
                x = -a[j] / C
                total += x
                sq += x * x
        return total - 0.5 * gamma * sq
    elif is_entropic(loss):
        return _entropic_neg_conj(a, y, C, x, lx, tmp)
    elif loss == LOSS_SVM_OVA:
        total = 0.0
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            beta = a[c] * yt / C
            total += beta - 0.5 * gamma * beta * beta
        return total
    else:
        return _lr_ova_neg_conj(a, y, C, x, lx, tmp)


@njit(cache=True)
def objective_terms(S, yptr, yidx, A, loss, C, gamma, k, lsum0, csum0, gaps):
    """Return ``(lsum0 + sum_i L(Y_i, S_i), csum0 + sum_i -L*(Y_i, -A_i / C))`` for scores
    ``S`` (n x m) and labels in CSR form (see :func:`sdca_epochs_dense`); the running sums
    ``lsum0``, ``csum0`` let callers go through the rows in blocks.

    If ``gaps`` has length n, it receives each example's Fenchel-Young gap in the ``P /
    lambda`` scale, ``g_i = C (L(Y_i, S_i) + L*(Y_i, -A_i/C)) + <A_i, S_i> >= 0``.  With
    ``S = X W`` and ``W = X^T A``, ``sum_i <A_i, S_i> = ||W||^2``, so ``sum_i g_i = (P - D) /
    lambda``; ``g_i = 0`` exactly when ``-A_i / C`` is a subgradient of the loss at ``S_i``,
    i.e. when block i is already the maximizer of its SDCA update (shrinking in
    :func:`topkbench.solvers.sdca.solve_sdca`).  Pass an empty array to skip."""
    n, m = S.shape
    want_gaps = gaps.shape[0] == n
    work = np.empty(m)
    srt = np.empty(m)
    x = np.empty(m)
    lx = np.empty(m)
    tmp = np.empty(m)
    idx = np.empty(m, dtype=np.int64)
    mask = np.zeros(m, dtype=np.bool_)
    ml = is_multilabel(loss)
    lsum = lsum0
    csum = csum0
    for i in range(n):
        if ml:
            labels = yidx[yptr[i] : yptr[i + 1]]
            li = loss_value_ml(loss, labels, S[i], gamma, work, idx, mask)
            ci = neg_conjugate_value_ml(loss, labels, A[i], C, gamma, mask)
        else:
            y = yidx[yptr[i]]
            li = loss_value(loss, y, S[i], gamma, k, work, srt, idx, tmp)
            ci = neg_conjugate_value(loss, y, A[i], C, gamma, k, x, lx, tmp)
        lsum += li
        csum += ci
        if want_gaps:
            gaps[i] = C * (li - ci) + _vdot(A[i], S[i], m)
    return lsum, csum
