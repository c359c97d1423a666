"""The one-vs-all losses: SVM^OVA_gamma and LR^OVA (TPAMI 002 §3.1, Prop. 10; DESIGN §3).

Conventions as in :mod:`topkbench.losses.dispatch`.  The dual block is ``a_ic = C beta_ic
ytilde_ic`` with ``beta_ic`` in [0, 1] and ``ytilde_ic = +1`` if ``c == y_i`` else ``-1``.

* SVM^OVA_gamma: ``beta = clip((1 - ytilde g) / (gamma + C K), 0, 1)``, ``g = q_c`` (the
  smoothed hinge has conjugate ``-beta + gamma beta^2 / 2``; TPAMI Prop. 10 / [8]).
* LR^OVA: ``u = logit(beta)`` solves ``u + ytilde g + C K sigmoid(u) = 0`` (increasing in u,
  root inside ``[-ytilde g - C K, -ytilde g]``), by Halley steps on all m classes at once
  (:func:`_lr_ova_block`) with safeguarded scalar Newton for the stragglers.

Newton's derivatives in the scores (:mod:`topkbench.losses.curvature`) are diagonal, with
``t_c = ytilde_c``: LR^OVA ``L = sum_c log(1 + exp(-t_c s_c))`` has ``G_c = -t_c sigmoid(-t_c
s_c)`` and ``H = diag(sigmoid(s) (1 - sigmoid(s)))``; SVM^OVA_gamma (gamma > 0), the Huber
hinge of ``z_c = 1 - t_c s_c``, has ``G_c = -t_c beta_c``, ``beta = clip(z / gamma, 0, 1)``
and ``H = diag([0 < z_c < gamma] / gamma)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from scipy.special import expit

from topkbench.losses.curvature import Curvature, StructuredDerivatives
from topkbench.prox.roots import STATUS_OK, _logistic_dual_root, _sigmoid
from topkbench.prox.vecmath import exp_rough, exp_shifted, log_into, vdot


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
    :func:`~topkbench.prox.roots._logistic_dual_root`, from which Newton converges
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
    and log of :mod:`topkbench.prox.vecmath`: the warm start's step (no exp,
    :func:`_lr_ova_start`), one step from a rough exponential (:func:`_lr_ova_rough_step`,
    ~60 ns less per update), then exact steps with acceptance tests
    (:func:`_lr_ova_halley_step`) until at most
    ``_OVA_STRAGGLERS`` are left (or after ``_OVA_HALLEY_STEPS``); a class not accepted by then
    goes to the safeguarded scalar solver :func:`~topkbench.prox.roots._logistic_dual_root`
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
def _lr_ova_neg_conj(a, y, C, x, lx, tmp):
    """``-sum_c beta_c log beta_c + (1 - beta_c) log(1 - beta_c)`` with ``beta_c = ytilde_c
    a_c / C`` (LR^OVA); ``x``, ``lx``, ``tmp`` are scratch.  Vectorized log."""
    m = a.shape[0]
    for c in range(m):
        x[c] = a[c] / C if c == y else -a[c] / C
    log_into(x, m, lx, tmp)
    ent = vdot(x, lx, m)
    for c in range(m):
        x[c] = 1.0 - x[c]
    log_into(x, m, lx, tmp)
    return -ent - vdot(x, lx, m)


@njit(cache=True)
def svm_ova_loss(s, y, gamma):
    """``sum_c l_gamma(1 - ytilde_c s_c)`` with the hinge ``l_0(r) = max(0, r)`` and its
    Huber smoothing ``l_gamma(r) = r - gamma/2`` for ``r >= gamma``, ``r^2 / (2 gamma)`` on
    ``[0, gamma]``."""
    total = 0.0
    for c in range(s.shape[0]):
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


@njit(cache=True)
def svm_ova_neg_conj(a, y, C, gamma):
    """``sum_c beta_c - gamma/2 beta_c^2`` with ``beta_c = a_c ytilde_c / C``."""
    total = 0.0
    for c in range(a.shape[0]):
        yt = 1.0 if c == y else -1.0
        beta = a[c] * yt / C
        total += beta - 0.5 * gamma * beta * beta
    return total


class _OVADerivatives(StructuredDerivatives):
    """The one-vs-all losses' derivatives: diagonal Hessians, kept in :attr:`state`."""

    kernel_gradient = False
    class_separable = True
    row_arrays = ("labels", "sign")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        y, m = self.y, self.m
        n = self.rows.size
        self.labels = y[1]
        self.sign = -np.ones((n, m))
        self.sign[self.rows, self.labels] = 1.0

    def curvature(self, a: int, b: int) -> Curvature:
        return Curvature(self.state[a:b])


class LogisticOVADerivatives(_OVADerivatives):
    """LR^OVA (module docstring); its curvature is bounded (by 1/4)."""

    bounded_curvature = True
    smoothness = 4.0

    def gradient(self, S, gamma: float):
        self.state = expit(S) * expit(-S)  # sigma (1 - sigma) without underflow
        return -self.sign * expit(-self.sign * S)


class HuberOVADerivatives(_OVADerivatives):
    """SVM^OVA_gamma (module docstring): the gradient is a projection onto ``[0, 1]`` per
    class, whose Hessian vanishes off the margin; the smoothing regularizes every class
    (TPAMI Prop. 10)."""

    fenchel_young = True
    support_curvature = True
    smoothed_on_all_classes = True

    def gradient(self, S, gamma: float):
        z = 1.0 - self.sign * S
        self.state = ((z > 0.0) & (z < gamma)) / gamma
        return -self.sign * np.clip(z / gamma, 0.0, 1.0)
