"""Top-k entropy prox, the capped candidates ``u = |U| >= 1`` (TPAMI 002 Props. 15-16, eqs.
(11)-(13)); DESIGN §4.2.

The prox's entry point, :func:`~topkbench.losses.topk_entropy.topk_ent_prox`, and its module
docstring (the notation ``n``, ``x``, ``s``, ``U``, ``M``, ``rho = |U|/k``, the problem, the
candidates ``u = 0`` and ``u = k``) are in :mod:`topkbench.losses.topk_entropy`.

The paper solves the 2x2 system (13) by Newton, which is
what diverges in the authors' code (DESIGN §4.2).  We eliminate ``s`` instead: the first line
of (13) gives ``alpha s = S(t) / (1 - rho)`` with ``S(t) = sum_M V(b_j - t)``; the second,
solved for ``alpha (1 - s)`` with ``V^{-1}(v) = v + log v``, gives
``alpha (1 - s) = V(g(t))``, ``g(t) = alpha - A - (1-rho) t + rho V^{-1}(alpha s / k)``.  So t
is the root of the scalar equation

    h(t) = S(t) / (1 - rho) + V(g(t)) - alpha = 0,

which reduces to eq. (14) at ``rho = 0`` and involves no ``1 - s`` cancellation. ``S`` is
decreasing in t, and ``g`` is decreasing (``-(1-rho) t`` and ``V^{-1}(alpha s/k)`` with s
decreasing), so h is strictly decreasing: one root, found by Halley's method with a bisection
safeguard inside a bracket. Lower end: at the root ``V(b_j - t) <= alpha (1-rho)`` on M, so ``t
>= max_M b_j - V^{-1}(alpha (1 - rho))``, where ``h >= V(g) > 0``; the upper end is found by
stepping right (``h -> -alpha`` as ``t -> inf``; see the end of this docstring). Derivatives:
``S' = -sum_M V/(1+V)``, ``g' = -(1-rho) + rho (1 + 1/sigma) sigma'`` with ``sigma = alpha s/k =
S/(k(1-rho))``, ``h' = S'/(1-rho) + V(g)/(1+V(g)) g'`` (h'' in :func:`_ent_h`).
The iteration runs on the same equation in the log domain, ``F(t) = V^{-1}(alpha (1 - s)) -
g(t) = 0`` (:func:`_ent_f`: no Lambert W per evaluation), or, where ``1 - s < 1e-3`` makes
``alpha (1 - s) = alpha - S / (1 - rho)`` cancel, on ``log(h(t) + alpha) - log(alpha)``, which
is nearly linear in t where V behaves like exp (small alpha); plain Newton on h moves by about
one unit of t per step there.
The candidates are not tried in order but located by the sign of the cap violation, galloping
up from ``u = 1`` and then bisecting (:func:`_capped_search`), from the ``u = 0`` root or from
a capped hint's warm start.  Upper ends of the capped brackets: doubling steps when there is no
guess; from a guess below the root, Halley's steps (which move right) until one lands above.
"""

from __future__ import annotations

import math

from numba import njit

from topkbench.prox.lambertw import SERIES_T_MAX, lambertw_exp
from topkbench.prox.roots import (
    _Q_LOG,
    NEWTON_MAX_ITER,
    STATUS_OK,
    STATUS_ROOT_NOT_CONVERGED,
    _series_values,
    _v_sums,
)
from topkbench.prox.topk import insert_top
from topkbench.prox.vecmath import exp_shifted, vmax

_EPS = 2.220446049250313e-16
_CONSISTENCY_TOL = 1e-10  # also the loss's and the u = 0 candidate's (topk_entropy)

_ANCHOR_SPAN = 30.0  # _m_sums: recompute e^{bs_j - t_ref} when t moves farther (as in roots)
_SUMS_TAYLOR = 1e-5  # _ent_root_capped: shorter steps move M's sums by Taylor's formula
# the capped candidates' first evaluation (_ent_root_capped's at_guess): M in full, from the
# u = 0 root's sums, or one aiming step from the rough sums of a capped hint
GUESS_NONE = 0
GUESS_EXACT = 1
GUESS_ROUGH = 2
_LAZY_MAX = 8  # candidates past u = 7 order the k largest at once (_top_k_first), not one by one


@njit(cache=True)
def _top_k_first(b, k, bs):
    """``bs[:k]`` = the k largest entries of ``b`` in descending order, ``bs[k:n]`` = the other
    entries in b's order (``k <= n``).

    The capped candidates (``u < k``) read only ``bs[:u+1]`` in order (the u largest and
    ``bs[u]``); M = ``bs[u:]`` is a set.  They build that prefix one entry at a time
    (:func:`_extract_next`) and call this only for ``u >= _LAZY_MAX``: a full sort of the m-1
    entries cost ~3 us per update (mispredicted comparisons), this ~0.5 us
    (:func:`insert_top`, then one copy pass), two extractions ~0.1 us."""
    n = b.shape[0]
    insert_top(b, k, bs)
    bar = bs[k - 1]
    ties = 0  # entries equal to the bar that are among the k largest
    for p in range(k):
        ties += bs[p] == bar
    q = k
    for j in range(n):
        v = b[j]
        if v > bar:
            continue
        if v == bar and ties > 0:
            ties -= 1
            continue
        bs[q] = v
        q += 1


@njit(cache=True)
def _extract_next(bs, ks, n, ex, pos):
    """Move the largest of ``bs[ks:n]`` (its first occurrence, at j) to ``bs[ks]`` and return
    ``ks + 1``: one more entry of the sorted prefix that the capped candidates read
    (``bs[:ks]`` the ks largest in descending order, the rest unordered), swapping ``ex``
    alongside and recording ``pos[ks] = j`` (as a float), so that the swaps can be undone.  Used
    lazily, one entry at a time: the common capped candidate ``u = 1`` needs only the two
    largest (~0.1 us against ~0.5 us for ordering the k largest by insertion,
    :func:`_top_k_first`)."""
    mx = vmax(bs[ks:], n - ks)
    j = ks
    while bs[j] != mx:
        j += 1
    bs[j] = bs[ks]
    bs[ks] = mx
    e = ex[j]  # the anchored exponentials follow their entries
    ex[j] = ex[ks]
    ex[ks] = e
    pos[ks] = j
    return ks + 1


@njit(cache=True)
def _m_values(bs, u, t, t_ref, ex, vals):
    """``vals[j] = V(bs_j - t)`` for ``j >= u``: the vectorized series of V from the anchored
    ``ex_j = e^{bs_j - t_ref}`` for all of them, then the closed form for the entries whose
    argument is at least ``SERIES_T_MAX`` (the series clamps those).

    ``bs[u]`` is the largest of ``bs[u:]`` (the sorted prefix covers u), so when ``bs[u] - t <
    SERIES_T_MAX`` no entry needs the closed form and nothing is scanned.  That is the common
    case: on bench sdca's problem (top-5 Ent, epoch-3 state) the second largest entry of a u =
    1 candidate is in the closed form's range at the root in 9 % of the capped updates.  The
    scan used to run over a list of the entries within SERIES_T_MAX of the candidate's lower
    bracket, which is loose by ``alpha (1 - u/k)`` and held all 98 entries there; the test
    instead of that list took the capped prox from 1.92 to 1.69 us in isolation."""
    n = bs.shape[0]
    _series_values(ex[u:], math.exp(t_ref - t), n - u, vals[u:], math.exp(SERIES_T_MAX))
    if bs[u] - t < SERIES_T_MAX:
        return
    for j in range(u, n):
        a = bs[j] - t
        if a >= SERIES_T_MAX:
            vals[j] = lambertw_exp(a)


@njit(cache=True)
def _m_sums(bs, u, t, ex, tmp, vals, t_ref):
    """``(S, D1, D2, t_ref)`` at t: ``S = sum_M V(bs_j - t)``, ``D1 = sum_M V/(1+V) = -S'``,
    ``D2 = sum_M V/(1+V)^3 = S''`` over ``M = bs[u:]``.  ``ex``, ``tmp``, ``vals`` (length >=
    n) are scratch; ``ex[u:]`` holds ``e^{bs_j - t_ref}`` for the returned anchor ``t_ref``
    (pass it back in; NaN recomputes), moved when ``|t - t_ref| > _ANCHOR_SPAN`` as in
    :func:`~topkbench.prox.roots._entropic_root`."""
    n = bs.shape[0]
    if not abs(t - t_ref) <= _ANCHOR_SPAN:
        t_ref = t
        exp_shifted(bs[u:], t_ref, n - u, ex[u:], tmp[u:])
    _m_values(bs, u, t, t_ref, ex, vals)
    S, D1, D2 = _v_sums(vals[u:], n - u)
    return S, D1, D2, t_ref


@njit(cache=True)
def _ent_h(u, kf, alpha, A, t, S, D1, D2):
    """``(h, h', h'')`` at t (module docstring) for ``|U| = u`` from the sums of
    :func:`_m_sums`.

    Second derivative (for Halley's method): ``sigma' = -D1 / (k (1-rho))``, ``sigma'' = D2 /
    (k (1-rho))``, ``g'' = rho ((1 + 1/sigma) sigma'' - sigma'^2 / sigma^2)`` and ``h'' =
    S''/(1-rho) + V''(g) g'^2 + V'(g) g''`` with ``V' = V/(1+V)``, ``V'' = V/(1+V)^3``
    (``tests/losses/test_topk_entropy.py`` checks both derivatives by finite differences)."""
    rho = u / kf
    om = 1.0 - rho
    sigma = S / (kf * om)
    if sigma <= 0.0:
        return S / om - alpha, -D1 / om, D2 / om
    g = alpha - A - om * t + rho * (sigma + math.log(sigma))
    vg = lambertw_exp(g)
    inv = 1.0 / (1.0 + vg)
    v1 = vg * inv  # V'(g)
    v2 = v1 * inv * inv  # V''(g)
    dsig = -D1 / (kf * om)
    d2sig = D2 / (kf * om)
    isig = 1.0 / sigma
    dg = -om + rho * (1.0 + isig) * dsig
    d2g = rho * ((1.0 + isig) * d2sig - dsig * dsig * isig * isig)
    h = S / om + vg - alpha
    hp = -D1 / om + v1 * dg
    hpp = D2 / om + v2 * dg * dg + v1 * d2g
    return h, hp, hpp


@njit(cache=True)
def _ent_f(u, kf, alpha, A, t, S, D1, D2):
    """``(F, F', F'')`` at t for ``|U| = u`` (where ``Q > 0`` and ``P > 0``): the candidate's
    equation in the log domain, from the sums of :func:`_m_sums`.

    With ``P = S / (1-rho) = alpha s``, ``Q = alpha - P = alpha (1 - s)`` and ``sigma = P/k``,
    ``h = 0`` says ``Q = V(g)``, i.e. ``V^{-1}(Q) = g`` (``V^{-1}(v) = v + log v``):

        F(t) = V^{-1}(Q) - g = -P + log Q + A + (1-rho) t - rho (sigma + log sigma) = 0.

    No Lambert W at all (h needs ``V(g)`` at every evaluation): two independent logarithms
    and two reciprocals, which shortens the chain of dependent scalar operations behind each
    pass over M (on bench sdca's problem: the u = 1 candidate 0.85 -> 0.67 us, the whole
    capped prox 2.38 -> 2.24 us, in isolation).  F is strictly increasing: with ``P' =
    -D1/(1-rho) < 0`` and ``c = 1 + 1/Q + rho/k + rho/P > 0``, ``F' = (1-rho) - P' c > 0``;
    and ``F'' = -P'' c - P'^2 (1/Q^2 - rho/P^2)`` with ``P'' = D2/(1-rho)`` (checked by
    finite differences in ``tests/losses/test_topk_entropy.py``).
    Near the root ``F ~ -(1 + 1/Q) h`` (``V^{-1}' = 1 + 1/v``).
    """
    rho = u / kf
    om = 1.0 - rho
    P = S / om
    Q = alpha - P
    sig = P / kf
    f = (A + om * t) - P + math.log(Q) - rho * (sig + math.log(sig))
    iq = 1.0 / Q
    ip = 1.0 / P
    c = 1.0 + iq + rho * (1.0 / kf + ip)
    p1 = -D1 / om
    f1 = om - p1 * c
    f2 = -(D2 / om) * c - p1 * p1 * (iq * iq - rho * ip * ip)
    return f, f1, f2


@njit(cache=True)
def _ent_g(u, kf, alpha, A, t, S, D1, D2, tol):
    """``(G, G', G'', done)``: the increasing function whose root :func:`_ent_root_capped`
    finds, and whether t is the root to rounding (h's tolerance ``tol``).

    ``G = F`` (:func:`_ent_f`) where ``Q > _Q_LOG alpha`` and ``P > 0``, done when ``|F| <=
    (1 + 1/Q) tol + 4 eps (|(1 - rho) t| + |A|)`` (h's tolerance carried over by ``F ~ -(1 +
    1/Q) h``, plus the rounding of F's linear terms).  Elsewhere (``1 - s`` so small that
    ``alpha - P`` cancels, or M's mass underflowing) ``G = -H = -log((h + alpha) / alpha)``
    from :func:`_ent_h` (module docstring), done when ``|h| <= tol``; where H is undefined
    (``h + alpha <= 0`` or ``h' >= 0`` under rounding) ``G = -h`` with ``G' = 0``, which makes
    the caller bisect.  Both have the root of h, with ``G < 0`` below it."""
    om = 1.0 - u / kf
    P = S / om
    Q = alpha - P
    if Q > _Q_LOG * alpha and P > 0.0:
        f, f1, f2 = _ent_f(u, kf, alpha, A, t, S, D1, D2)
        done = abs(f) <= (1.0 + 1.0 / Q) * tol + 4.0 * _EPS * (abs(om * t) + abs(A))
        return f, f1, f2, done
    h, hp, hpp = _ent_h(u, kf, alpha, A, t, S, D1, D2)
    done = abs(h) <= tol
    ha = h + alpha
    if hp < 0.0 and ha > 0.0:
        H = math.log(ha / alpha)
        Hp = hp / ha
        return -H, -Hp, Hp * Hp - hpp / ha, done
    return -h, 0.0, 0.0, done


@njit(cache=True)
def _minus_top(bs, u, t, v_top, sums):
    """M's sums at t from the sums over all n entries: ``sums`` minus the terms of the u
    largest, ``bs[:u]`` (``v_top``: V of the largest, NaN to compute it)."""
    S0, D10, D20 = sums
    for j in range(u):
        v = v_top if j == 0 and v_top == v_top else lambertw_exp(bs[j] - t)
        inv = 1.0 / (1.0 + v)
        S0 -= v
        D10 -= v * inv
        D20 -= v * inv * inv * inv
    return S0, D10, D20


@njit(cache=True)
def _ent_root_capped(bs, u, kf, alpha, A, t_guess, ex, tmp, vals, at_guess, v_top, sums, t_ref):
    """Root of h for ``u >= 1`` (bracketed, safeguarded Halley on the increasing G of
    :func:`_ent_g`: F where it is well conditioned, else ``-log((h + alpha) / alpha)``).

    ``t_guess`` (e.g. the root for the previous candidate u) seeds the bracket search and the
    iteration.  Returns ``(t, S, status, t_ref)``.  ``ex``, ``tmp``, ``vals`` are
    :func:`_m_sums`'s scratch; ``ex[u:]`` may hold ``e^{bs_j -
    t_ref}`` for the given anchor ``t_ref`` (NaN: none), and holds them for the returned one
    (the u = 0 root's exponentials, permuted with bs: no exp pass for the first candidate;
    capped update 2.34 -> 2.24 us).  ``at_guess`` says what is known at ``t_guess``:
    ``GUESS_NONE`` nothing; ``GUESS_EXACT``: ``sums`` are the sums over all n entries at
    ``t_guess`` (as :func:`_m_sums` returns them; the u = 0 root's,
    :func:`~topkbench.prox.roots._entropic_root`), and the first evaluation takes M's from
    them (all minus the u largest) instead of a pass, with ``v_top`` (NaN: unknown) ``V(bs_0 -
    t_guess)``, the largest value, which saves its evaluation for ``u = 1``; ``GUESS_ROUGH``:
    the same sums from rough values (a capped hint's), which only aim one Halley step, neither
    bracketing on their sign nor stopping (G from rough sums may have the wrong sign near the
    root); the iteration then starts at the aimed point.

    The lower end of the bracket has ``S >= alpha (1 - rho)`` (module docstring), so ``Q <=
    0`` there: G is the h form's, and negative.  Halley's step on H (the h form) took three
    evaluations from the u = 0 root where Newton on h took four on bench sdca's problem; on F
    it takes three as well, each with a shorter scalar chain.  An evaluation within
    ``_SUMS_TAYLOR = 1e-5`` of the last full one takes the sums by Taylor's formula, ``S(t +
    d) = S - D1 d + D2 d^2 / 2`` (the remainder is at most ``D1 |d|^3 / 6 <= alpha 2e-16``:
    the third derivative of V is at most V' and ``D1 <= S <= alpha``; h's stopping tolerance
    is ``8 (n + 2) eps alpha``), ``D1 - D2 d`` and ``D2`` (the derivatives only steer the
    next step): the evaluation that confirms the root costs no pass over M.
    """
    n = bs.shape[0]
    om = 1.0 - u / kf
    ao = alpha * om
    lo = bs[u] - (ao + math.log(ao))  # G(lo) < 0, see the module docstring
    hi = math.inf
    t = t_guess
    tol = 8.0 * (n + 2) * _EPS * alpha
    have = False  # (G, G', G'', done) at t already known (reused by the first step)
    G = G1 = G2 = 0.0
    done = False
    t_s = math.nan  # (S0, D10, D20): the sums last computed in full, at t_s
    S0 = D10 = D20 = 0.0
    if at_guess == GUESS_ROUGH and lo < t < math.inf:
        # aim only: one Halley step from the rough sums (a capped hint's first evaluation),
        # without bracketing on its sign or stopping; the next evaluation is in full
        S0, D10, D20 = _minus_top(bs, u, t, v_top, sums)
        G, G1, G2, _ = _ent_g(u, kf, alpha, A, t, S0, D10, D20, tol)
        if G1 > 0.0:
            den = 2.0 * G1 * G1 - G * G2
            t_aim = t - 2.0 * G * G1 / den if den > 0.0 else t - G / G1
            if lo < t_aim < math.inf:
                t = t_aim
    if t > lo and t < math.inf:
        if at_guess == GUESS_EXACT:
            S0, D10, D20 = _minus_top(bs, u, t, v_top, sums)
        else:
            S0, D10, D20, t_ref = _m_sums(bs, u, t, ex, tmp, vals, t_ref)
        t_s = t
        G, G1, G2, done = _ent_g(u, kf, alpha, A, t, S0, D10, D20, tol)
        have = True
        if G < 0.0:
            lo = t
        else:
            hi = t
    if hi == math.inf and not have:
        # no guess: the upper end by doubling steps from the lower one.  (A guess below the
        # root does without: Halley's steps from it move right, and the first point with G > 0
        # becomes the upper end; a capped hint's warm start lands there half of the time, and
        # a blind probe would cost a pass over M.)
        step = max(1.0, 1e-8 * abs(lo))
        hi = lo + step
        for _ in range(2000):
            S0, D10, D20, t_ref = _m_sums(bs, u, hi, ex, tmp, vals, t_ref)
            t_s = hi
            Gb, _, _, _ = _ent_g(u, kf, alpha, A, hi, S0, D10, D20, tol)
            if Gb > 0.0:
                break
            lo = hi
            step *= 2.0
            hi = lo + step
    # the iteration starts from the guess when it is evaluated and inside the bracket (it is
    # then one of its ends), else from the bracket's midpoint
    if not (have and lo <= t <= hi) and not (lo < t < hi):
        t = 0.5 * (lo + hi)
        have = False
    S = S0
    probe = max(1.0, 1e-8 * abs(lo))  # steps to the right while there is no upper end
    for _ in range(NEWTON_MAX_ITER):
        if not have:
            S, D1, D2, t_ref, t_s, S0, D10, D20 = _sums_at(
                bs, u, t, ex, tmp, vals, t_ref, t_s, S0, D10, D20
            )  # fmt: skip
            G, G1, G2, done = _ent_g(u, kf, alpha, A, t, S, D1, D2, tol)
        else:
            S = S0
        have = False
        if done:
            return t, S, STATUS_OK, t_ref
        if G < 0.0:
            lo = t
        else:
            hi = t
        if G1 > 0.0:
            den = 2.0 * G1 * G1 - G * G2
            t_new = t - 2.0 * G * G1 / den if den > 0.0 else t - G / G1
        else:
            t_new = 0.5 * (lo + hi)
        if not (lo < t_new < hi):
            if hi == math.inf:
                t_new = lo + probe
                probe *= 2.0
            else:
                t_new = 0.5 * (lo + hi)
        if abs(t_new - t) <= 4.0 * _EPS * max(1.0, abs(t)):
            S, _, _, _, _, _, _, _ = _sums_at(
                bs, u, t_new, ex, tmp, vals, t_ref, t_s, S0, D10, D20
            )  # fmt: skip
            return t_new, S, STATUS_OK, t_ref
        t = t_new
    return t, S, STATUS_ROOT_NOT_CONVERGED, t_ref


@njit(cache=True)
def _sums_at(bs, u, t, ex, tmp, vals, t_ref, t_s, S0, D10, D20):
    """M's sums at t for :func:`_ent_root_capped`: by Taylor's formula from the full
    evaluation ``(S0, D10, D20)`` at ``t_s`` when ``|t - t_s| <= _SUMS_TAYLOR``, else in full
    (which becomes the new base).  Returns ``(S, D1, D2, t_ref, t_s, S0, D10, D20)``."""
    d = t - t_s
    if abs(d) <= _SUMS_TAYLOR:
        return S0 - d * (D10 - 0.5 * d * D20), D10 - d * D20, D20, t_ref, t_s, S0, D10, D20
    S, D1, D2, t_ref = _m_sums(bs, u, t, ex, tmp, vals, t_ref)
    return S, D1, D2, t_ref, t, S, D1, D2


@njit(cache=True)
def _capped_candidate(bs, u, kf, alpha, head, t_guess, ex, tmp, vals, at_guess, v_top, sums, t_ref):
    """Root and cap violations for ``|U| = u`` (``bs[:u+1]`` sorted, ``head`` = sum of its u
    largest; ``at_guess``, ``v_top``, ``sums`` as in :func:`_ent_root_capped`).

    Returns ``(t, alpha s, over, under, status, t_ref)`` (``t_ref`` the anchor of ``ex``, as in
    :func:`_ent_root_capped`): ``over`` is the relative excess of the first uncapped
    coordinate over the cap alpha s / k, ``under`` the relative shortfall of the last capped
    one; both <= tolerance means U is consistent.  They are measured in the log domain:
    ``V(a) - cap ~ V'(a*) (a - a*)`` with ``a* = V^{-1}(cap) = cap + log cap`` and ``V'(a*) =
    cap / (1 + cap)``, so the relative excess is ``(a - a*) / (1 + cap)`` to first order, with
    the same sign exactly (V is increasing): one logarithm instead of two Lambert W.
    """
    om = 1.0 - u / kf
    t, S, st, t_ref = _ent_root_capped(
        bs, u, kf, alpha, head / kf, t_guess, ex, tmp, vals, at_guess, v_top, sums, t_ref
    )  # fmt: skip
    s_alpha = S / om  # alpha s
    cap = s_alpha / kf  # alpha s / k
    if cap > 0.0:
        a_star = cap + math.log(cap)
        ic = 1.0 / (1.0 + cap)
        over = ((bs[u] - t) - a_star) * ic
        under = (a_star - (bs[u - 1] - t)) * ic
    else:
        # the mass on M underflows, hence so does s and x = 0 to double precision
        over = 0.0
        under = 0.0
    return t, s_alpha, over, under, st, t_ref


@njit(cache=True)
def _capped_search(b, alpha, k, vals, srt, ex, tmp, pos, t_first, t_ref0, guess, v_top, sums0):
    """The search for the consistent capped set U of
    :func:`~topkbench.losses.topk_entropy._topk_ent_prox_raw`, from ``t_first``: the u = 0
    root (``guess = GUESS_EXACT``: ``sums0`` and ``v_top`` are its sums and largest value,
    which the first candidate starts from), or the warm start of a capped hint
    (``GUESS_ROUGH``: ``sums0`` are the rough evaluation's, which aim the first step).
    ``srt`` holds ``e^{b_j - t_ref0}`` (the root's anchor).  Returns ``(found, u, ks, t,
    alpha s, status, anchor, anchor_lo, lazy)`` for :func:`_capped_output`; bs is left in
    ``tmp``.  From a hint it gives up (``found`` False) as soon as the bisection is exhausted:
    the caller then runs the root.
    """
    n = b.shape[0]
    kf = float(k)
    status = STATUS_OK
    # bs in tmp: srt keeps the root's exponentials e^{b_j - t_ref0}, permuted along with bs
    # (_extract_next), so that the capped roots start from the root's anchor instead of a new
    # exp pass; ex is their scratch.  anchor_lo: the positions >= it hold e^{bs_j - anchor}.
    bs = tmp[:n]
    for j in range(n):
        bs[j] = b[j]
    exb = srt
    anchor = t_ref0
    anchor_lo = 0
    ks = 0  # bs[:ks] = the ks largest in order, extended on demand (_extract_next)
    best_v = math.inf
    best_t = 0.0
    best_s = 0.0
    found = False
    # The consistent |U| = u is located by bisection on the sign of the violation: for u too
    # small the first uncapped coordinate exceeds the cap ("over"), for u too large the last
    # capped one falls below it ("under").  The probes gallop up from u = 1 (1, 2, 4, ...) until
    # one is "under", then bisect: few capped entries are the common case (on bench sdca's
    # problem, top-5 Ent: u = 1 in 91 % of the capped updates, u = 2 in 8.5 %; starting at the
    # midpoint cost a second candidate for u = 1, bisecting right after u = 1 a third for
    # u = 2).  If bisection finds no consistent u (the monotonicity it assumes failing at
    # rounding level), every candidate is scanned as before.
    n_cand = min(k, n)  # candidates u = 1 .. n_cand - 1
    lo_u = 1
    hi_u = n_cand - 1
    bisect = True
    gallop = True
    u = 0
    u_scan = 0
    n_tried = 0
    lazy = True  # bs is b permuted by the swaps recorded in pos[:ks]
    t = t_first
    while True:
        if bisect and lo_u > hi_u:  # bisection exhausted: scan every candidate from u = 1
            if guess != GUESS_EXACT:
                break
            bisect = False
            u_scan = 1
            t = t_first
        if bisect:
            u = min(max(2 * u, 1), hi_u) if gallop else (lo_u + hi_u) // 2
        elif u_scan < n_cand:
            u = u_scan
            u_scan += 1
        else:
            break
        if ks < u + 1:
            if u + 1 > _LAZY_MAX:
                _top_k_first(b, n_cand, bs)
                ks = n_cand
                anchor_lo = n + 1  # exb no longer follows bs
                lazy = False  # nor does pos record how bs came from b
            while ks < u + 1:
                ks = _extract_next(bs, ks, n, exb, pos)
        head = 0.0  # sum of the u largest
        for j in range(u):
            head += bs[j]
        # the first candidate starts at t_first (at the u = 0 root vals holds every V(b_j - t0))
        t_ref = anchor if u >= anchor_lo else math.nan
        first = guess if n_tried == 0 else GUESS_NONE
        t, s_alpha, over, under, st, t_new_ref = _capped_candidate(
            bs, u, kf, alpha, head, t, exb, ex, vals, first, v_top, sums0, t_ref
        )  # fmt: skip
        if not (t_new_ref == t_ref):  # re-anchored at t_new_ref over positions >= u
            anchor = t_new_ref
            anchor_lo = u
        n_tried += 1
        viol = max(over, under)
        if viol < best_v:
            best_v, best_t, best_s, status = viol, t, s_alpha, st
        if viol <= _CONSISTENCY_TOL:
            found = True
            break
        if bisect:
            if over > under:
                lo_u = u + 1
            else:
                hi_u = u - 1
                gallop = False
    return found, u, ks, best_t, best_s, status, anchor, anchor_lo, lazy


@njit(cache=True)
def _capped_output(
    b,
    alpha,
    k,
    out,
    vals,
    srt,
    ex,
    tmp,
    pos,
    found,
    u,
    ks,
    best_t,
    best_s,
    anchor,
    anchor_lo,
    lazy,
):
    """x into ``out`` from the capped candidate of :func:`_capped_search` (its results passed
    on: the consistent one if ``found``, else the least violated)."""
    n = b.shape[0]
    kf = float(k)
    bs = tmp[:n]
    exb = srt
    cap = best_s / kf
    if found and lazy and anchor_lo <= u:
        # x from the found candidate (the last one tried, at t = best_t) in bs's order: the
        # series from the anchored exponentials exb[u:] (no exp pass), the cap on U, then
        # the recorded swaps undone in reverse (capped prox 2.26 -> 2.12 us in isolation)
        _m_values(bs, u, best_t, anchor, exb, vals)
        for j in range(u):
            vals[j] = cap
        _capped_out(vals, cap, alpha, n, out)
        for r in range(ks - 1, -1, -1):
            j = int(pos[r])
            x = out[r]
            out[r] = out[j]
            out[j] = x
        return
    # x_j = min(V(b_j - t), cap) / alpha: the series (vectorized) for every entry, then the
    # closed form where the argument is at least SERIES_T_MAX (out may be b: every b_j is read
    # before out is written)
    exp_shifted(b, best_t, n, ex, tmp)
    _series_values(ex, 1.0, n, vals, math.exp(SERIES_T_MAX))
    for j in range(n):
        a = b[j] - best_t
        if a >= SERIES_T_MAX:
            vals[j] = lambertw_exp(a)
    _capped_out(vals, cap, alpha, n, out)


@njit(cache=True, error_model="numpy")
def _capped_out(vals, cap, alpha, n, out):
    """``out[j] = min(vals_j, cap) / alpha``: a loop of its own, so that it vectorizes (inline,
    next to the closed-form branch, the divisions ran one at a time)."""
    for j in range(n):
        out[j] = min(vals[j], cap) / alpha
