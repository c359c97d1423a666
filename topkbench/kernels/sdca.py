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
* SVM^OVA_gamma: ``beta = clip((1 - ytilde g) / (gamma + C K), 0, 1)``, ``g = q_c``
  (the smoothed hinge has conjugate ``-beta + gamma beta^2 / 2``; TPAMI Prop. 10 / [8]).
* LR^OVA: ``u = logit(beta)`` solves ``u + ytilde g + C K sigmoid(u) = 0`` (increasing in u),
  by safeguarded Newton inside ``[-ytilde g - C K, -ytilde g]``.

Zero-norm examples (DESIGN §4.3): with ``K = 0`` the block does not affect W, and the update
reduces to maximizing ``-L*(-a/C)``, i.e. ``v = grad L(0)``; each branch handles it explicitly
so the duality gap still closes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from topkbench.kernels.lambertw import lambertw_exp
from topkbench.kernels.projections import simplex_biased_threshold

LOSS_SVM_MULTI = 0
LOSS_LR_MULTI = 1
LOSS_SVM_OVA = 2
LOSS_LR_OVA = 3

STATUS_OK = 0
STATUS_ROOT_NOT_CONVERGED = 1

_LR_ALPHA_TINY = 1e-100
_NEWTON_MAX_ITER = 100


@njit(cache=True)
def _softmax_tail(b, out):
    """``out_j = exp(b_j) / (1 + sum_k exp(b_k))``; returns ``sum out``."""
    mx = 0.0
    for j in range(b.shape[0]):
        if b[j] > mx:
            mx = b[j]
    z = math.exp(-mx)
    for j in range(b.shape[0]):
        out[j] = math.exp(b[j] - mx)
        z += out[j]
    s = 0.0
    for j in range(b.shape[0]):
        out[j] /= z
        s += out[j]
    return s


@njit(cache=True)
def _entropic_root(b, alpha, vals, t_start):
    """Root ``t`` of ``h(t) = V(alpha - t) + sum_j V(b_j - t) - alpha = 0`` (TPAMI eq. (14)).

    Halley's method (``h' = -sum V/(1+V)``, ``h'' = sum V/(1+V)^3``, both free once V is known)
    inside the bracket of the module docstring, with bisection as the safeguard.  It stops when
    the residual is at rounding level, ``|h| <= 4 (m+1) eps alpha`` (a test on the step size
    alone can stall under rounding).  On return ``vals[j] = V(b_j - t)``.  Returns
    ``(t, status)``.
    """
    mb = b.shape[0]
    big = alpha
    mx = 0.0
    for j in range(mb):
        if b[j] > big:
            big = b[j]
        if b[j] > mx:
            mx = b[j]
    la = math.log(alpha)
    nterms = mb + 1.0
    lo = big - alpha - la
    hi = big - alpha / nterms - (la - math.log(nterms))
    # start from the root of this example's previous update when there is one (it moves
    # little between epochs), else from the softmax solution (exact as alpha -> 0)
    t = t_start
    if not (lo < t < hi):
        acc = math.exp(-mx)
        for j in range(mb):
            acc += math.exp(b[j] - mx)
        t = mx + math.log(acc) - la
    if not (lo < t < hi):
        t = 0.5 * (lo + hi)
    tol = 4.0 * nterms * 2.220446049250313e-16 * alpha
    for _it in range(_NEWTON_MAX_ITER):
        v = lambertw_exp(alpha - t)
        h = v - alpha
        w = v / (1.0 + v)
        d1 = w
        d2 = w / ((1.0 + v) * (1.0 + v))
        for j in range(mb):
            v = lambertw_exp(b[j] - t)
            vals[j] = v
            h += v
            w = v / (1.0 + v)
            d1 += w
            d2 += w / ((1.0 + v) * (1.0 + v))
        if abs(h) <= tol:
            return t, STATUS_OK
        if h > 0.0:
            lo = t
        else:
            hi = t
        den = 2.0 * d1 * d1 - h * d2
        if den > 0.0:
            t_new = t + 2.0 * h * d1 / den
        else:
            t_new = t + h / d1
        if not (lo < t_new < hi):
            t_new = 0.5 * (lo + hi)
        if abs(t_new - t) <= 1e-15 * max(1.0, abs(t)):
            for j in range(mb):
                vals[j] = lambertw_exp(b[j] - t_new)
            return t_new, STATUS_OK
        t = t_new
    return t, STATUS_ROOT_NOT_CONVERGED


@njit(cache=True)
def _sigmoid(u):
    if u >= 0:
        return 1.0 / (1.0 + math.exp(-u))
    e = math.exp(u)
    return e / (1.0 + e)


@njit(cache=True)
def _logistic_dual_root(g, ck, u0):
    """Root ``u`` of ``u + g + ck * sigmoid(u) = 0`` (``ck >= 0``), safeguarded Newton.

    ``f(u) = u + g + ck sigmoid(u)`` is increasing, convex for ``u <= 0`` and concave for
    ``u >= 0``, so Newton started between the root and 0 converges monotonically.  The sign of
    ``f(0) = g + ck/2`` tells on which side of 0 the root lies; ``u0`` (the previous root) is
    used when it is on the right side, else the start is ``min(-g, 0)`` / ``max(-g - ck, 0)``.
    (Started on the wrong side, plain Newton can bounce between both ends of the bracket
    forever, e.g. g = -3.6947..., ck = 1.88e6, u0 = -41.49.)
    """
    lo = -g - ck
    hi = -g
    if ck == 0.0:
        return hi, STATUS_OK
    if g + 0.5 * ck > 0.0:  # root < 0: start where f >= 0, u <= 0
        u = min(hi, 0.0)
        if lo <= u0 <= u and u0 + g + ck * _sigmoid(u0) >= 0.0:
            u = u0
    else:  # root >= 0: start where f <= 0, u >= 0
        u = max(lo, 0.0)
        if u <= u0 <= hi and u0 + g + ck * _sigmoid(u0) <= 0.0:
            u = u0
    for _it in range(_NEWTON_MAX_ITER):
        sig = _sigmoid(u)
        f = u + g + ck * sig
        # f is known only to ~eps (|u| + |g| + ck); a step-size test alone can stall with
        # Newton alternating between two floats (e.g. g = -17.196..., ck = 24.49...)
        if abs(f) <= 4.0 * 2.220446049250313e-16 * (abs(u) + abs(g) + ck):
            return u, STATUS_OK
        if f > 0.0:
            hi = u
        elif f < 0.0:
            lo = u
        else:
            return u, STATUS_OK
        df = 1.0 + ck * sig * (1.0 - sig)
        u_new = u - f / df
        if not (lo <= u_new <= hi):
            u_new = 0.5 * (lo + hi)
        if abs(u_new - u) <= 1e-15 * max(1.0, abs(u)):
            return u_new, STATUS_OK
        u = u_new
    return u, STATUS_ROOT_NOT_CONVERGED


@njit(cache=True)
def update_block(loss, y, s, a, kii, C, gamma, k, out, work, vals, idx, troots, i):
    """New dual block for one example into ``out`` (see module docstring). Returns a status.

    ``troots[i]`` keeps the example's last root of eq. (14) as the next starting point (NaN if
    none); it only affects the number of iterations, not the result.
    """
    m = s.shape[0]
    status = STATUS_OK
    if loss == LOSS_SVM_MULTI or loss == LOSS_LR_MULTI:
        # b over the m-1 coordinates j != y, stored compactly in work[:m-1]
        qy = s[y] - kii * a[y]
        p = 0
        for j in range(m):
            if j != y:
                work[p] = s[j] - kii * a[j] - qy
                p += 1
        b = work[: m - 1]
        if loss == LOSS_SVM_MULTI:
            den = kii + gamma / C
            if den == 0.0:
                # zero-norm example, nonsmooth loss: any x in Delta(C) with <1,x> = C
                # maximizes -L*; take the uniform point
                for j in range(m):
                    out[j] = -C / (m - 1)
                out[y] = C
                return status
            rho = kii / den
            for p in range(m - 1):
                b[p] = (b[p] + 1.0) / den
            t = simplex_biased_threshold(b, rho, C, idx)
            total = 0.0
            p = 0
            for j in range(m):
                if j != y:
                    v = b[p] - t
                    if v < 0.0:
                        v = 0.0
                    out[j] = -v
                    total += v
                    p += 1
            if total > C:
                # b ~ 1/den is huge when |x_i|^2 and gamma/C are tiny; (b - t)_+ then carries
                # an absolute error ~eps max|b| and can leave Delta(C) (seen: <1,x> = C (1 +
                # 5e-5) for |x_i| ~ 1e-3, C = 1e-3), so that D(A) > P(W).  Scale back onto
                # the boundary to keep the dual feasible and the gap a certificate.
                for j in range(m):
                    if j != y:
                        out[j] *= C / total
                total = C
            out[y] = total
        else:
            alpha = C * kii
            total = 0.0
            if alpha < _LR_ALPHA_TINY:
                _softmax_tail(b, b)
                p = 0
                for j in range(m):
                    if j != y:
                        out[j] = -C * b[p]
                        total += b[p]
                        p += 1
            else:
                t, status = _entropic_root(b, alpha, vals, troots[i])
                troots[i] = t
                p = 0
                for j in range(m):
                    if j != y:
                        xj = vals[p] / alpha
                        out[j] = -C * xj
                        total += xj
                        p += 1
                if total > 1.0:
                    # guard against rounding past the simplex boundary
                    for j in range(m):
                        out[j] /= total
                    total = 1.0
            out[y] = C * total
    elif loss == LOSS_SVM_OVA:
        den = gamma + C * kii
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            g = s[c] - kii * a[c]
            num = 1.0 - yt * g
            if den == 0.0:
                beta = 1.0 if num > 0.0 else 0.0
            else:
                beta = num / den
                if beta < 0.0:
                    beta = 0.0
                elif beta > 1.0:
                    beta = 1.0
            out[c] = C * beta * yt
    else:  # LOSS_LR_OVA
        ck = C * kii
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            g = s[c] - kii * a[c]
            beta0 = a[c] * yt / C
            u0 = 0.0
            if 0.0 < beta0 < 1.0:
                u0 = math.log(beta0 / (1.0 - beta0))
            u, st = _logistic_dual_root(yt * g, ck, u0)
            if st != STATUS_OK:
                status = st
            out[c] = C * _sigmoid(u) * yt
    return status


@njit(cache=True)
def _store_block(A, i, new, delta):
    """``A[i] = new``; ``delta = new - old``.  Returns whether anything changed."""
    changed = False
    for j in range(new.shape[0]):
        dj = new[j] - A[i, j]
        delta[j] = dj
        if dj != 0.0:
            changed = True
        A[i, j] = new[j]
    return changed


@njit(cache=True)
def sdca_epochs_dense(X, y, sqnorms, A, W, perms, loss, C, gamma, k, troots):
    """Run ``perms.shape[0]`` SDCA epochs in place on dense ``X`` (n x d), ``W`` (d x m).

    ``troots`` (length n, NaN-initialized, kept by the caller across calls) holds per-example
    starting points for the softmax root finding.  Returns the number of block updates whose
    inner root finding did not converge.
    """
    n_epochs = perms.shape[0]
    d = X.shape[1]
    m = W.shape[1]
    s = np.empty(m)
    new = np.empty(m)
    work = np.empty(m)
    vals = np.empty(m)
    idx = np.empty(m, dtype=np.int64)
    failures = 0
    for e in range(n_epochs):
        for p in range(perms.shape[1]):
            i = perms[e, p]
            for j in range(m):
                s[j] = 0.0
            for f in range(d):
                xf = X[i, f]
                for j in range(m):
                    s[j] += xf * W[f, j]
            if update_block(
                loss, y[i], s, A[i], sqnorms[i], C, gamma, k, new, work, vals, idx, troots, i
            ) != 0:
                failures += 1
            if _store_block(A, i, new, s):
                for f in range(d):
                    xf = X[i, f]
                    for j in range(m):
                        W[f, j] += xf * s[j]
    return failures


@njit(cache=True)
def sdca_epochs_csr(indptr, indices, data, y, sqnorms, A, W, perms, loss, C, gamma, k, troots):
    """As :func:`sdca_epochs_dense` for CSR features (``indptr``, ``indices``, ``data``)."""
    n_epochs = perms.shape[0]
    m = W.shape[1]
    s = np.empty(m)
    new = np.empty(m)
    work = np.empty(m)
    vals = np.empty(m)
    idx = np.empty(m, dtype=np.int64)
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
            if update_block(
                loss, y[i], s, A[i], sqnorms[i], C, gamma, k, new, work, vals, idx, troots, i
            ) != 0:
                failures += 1
            if _store_block(A, i, new, s):
                for q in range(indptr[i], indptr[i + 1]):
                    xf = data[q]
                    f = indices[q]
                    for j in range(m):
                        W[f, j] += xf * s[j]
    return failures


@njit(cache=True)
def _log1p_exp(z):
    """log(1 + e^z) without overflow."""
    if z > 0.0:
        return z + math.log1p(math.exp(-z))
    return math.log1p(math.exp(z))


@njit(cache=True)
def _xlogx(x):
    return x * math.log(x) if x > 0.0 else 0.0


@njit(cache=True)
def loss_value(loss, y, s, gamma, k, work, idx):
    """Primal loss ``L(y, s)`` for one example with scores ``s``."""
    m = s.shape[0]
    sy = s[y]
    if loss == LOSS_SVM_MULTI:
        p = 0
        mx = 0.0
        for j in range(m):
            if j != y:
                work[p] = 1.0 + s[j] - sy
                if work[p] > mx:
                    mx = work[p]
                p += 1
        if gamma == 0.0:
            return mx
        # smooth: (<z,p> - ||p||^2/2) / gamma with p = proj_{Delta(gamma)}(z) (TPAMI Prop. 2).
        # With p = (z - t)_+, <z,p> = ||p||^2 + t <1,p>, and t > 0 only when <1,p> = gamma,
        # so the loss is t + ||p||^2 / (2 gamma) (or ||p||^2 / (2 gamma) when t = 0):
        # nonnegative terms, error ~eps |z|. The direct form cancels and loses ~eps |z| / gamma
        # (1.5e-8 relative at gamma = 1e-8, z = (2, 2, 2)).
        z = work[: m - 1]
        t = simplex_biased_threshold(z, 0.0, gamma, idx)
        pp = 0.0
        for p in range(m - 1):
            v = z[p] - t
            if v > 0.0:
                pp += v * v
        return t + 0.5 * pp / gamma
    elif loss == LOSS_LR_MULTI:
        mx = s[0]
        for j in range(m):
            if s[j] > mx:
                mx = s[j]
        acc = 0.0
        for j in range(m):
            acc += math.exp(s[j] - mx)
        return mx + math.log(acc) - sy
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
        total = 0.0
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            total += _log1p_exp(-yt * s[c])
        return total


@njit(cache=True)
def neg_conjugate_value(loss, y, a, C, gamma, k):
    """``-L*(y, -a / C)`` for one dual block ``a`` (the example's share of D / (lambda C))."""
    m = a.shape[0]
    if loss == LOSS_SVM_MULTI or loss == LOSS_LR_MULTI:
        total = 0.0
        sq = 0.0
        ent = 0.0
        for j in range(m):
            if j != y:
                x = -a[j] / C
                total += x
                sq += x * x
                ent += _xlogx(x)
        if loss == LOSS_SVM_MULTI:
            return total - 0.5 * gamma * sq
        return -ent - _xlogx(1.0 - total)
    elif loss == LOSS_SVM_OVA:
        total = 0.0
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            beta = a[c] * yt / C
            total += beta - 0.5 * gamma * beta * beta
        return total
    else:
        total = 0.0
        for c in range(m):
            yt = 1.0 if c == y else -1.0
            beta = a[c] * yt / C
            total -= _xlogx(beta) + _xlogx(1.0 - beta)
        return total


@njit(cache=True)
def objective_terms(S, y, A, loss, C, gamma, k):
    """Return ``(sum_i L(y_i, S_i), sum_i -L*(y_i, -A_i / C))`` for scores ``S`` (n x m)."""
    n, m = S.shape
    work = np.empty(m)
    idx = np.empty(m, dtype=np.int64)
    lsum = 0.0
    csum = 0.0
    for i in range(n):
        lsum += loss_value(loss, y[i], S[i], gamma, k, work, idx)
        csum += neg_conjugate_value(loss, y[i], A[i], C, gamma, k)
    return lsum, csum
