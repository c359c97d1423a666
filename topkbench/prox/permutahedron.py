"""Projections onto permutahedra, and the SDCA subproblem of Kato & Hirohashi's weighted top-k
hinge (papers/004 §4 eq. (8)) that they reduce to.

**Permutahedron.**  For ``w`` sorted in descending order, ``P(w) = conv{permutations of w}``
is the set of vectors majorized by ``w``.  Its support function is ``z -> sum_r w_r z_[r]`` (the
rearrangement inequality), and the Euclidean projection of ``z`` onto it is
``z - v[sigma^{-1}]``, where ``sigma`` sorts ``z`` in descending order and ``v`` is the
non-increasing isotonic regression of ``z_sigma - w`` (Blondel, Teboul, Berthet, Djolonga,
"Fast Differentiable Sorting and Ranking", ICML 2020, Prop. 3).  Pool-adjacent-violators
computes ``v`` in O(m) after the O(m log m) sort.

**The weighted top-k hinge's domain.**  With ``c = 1 - e_y + s - s_y 1`` and weights
``rho_1 >= ... >= rho_m >= 0``, eq. (8) is ``max{0, sum_r rho_r c_[r]}`` = the support function
of ``K = conv({0} u P(rho)) = u_{theta in [0, 1]} P(theta rho)`` at ``c`` (``P(theta rho) =
theta P(rho)``).  Writing the loss as ``h(M s + c)`` with ``(M s)_j = s_j - s_y``, its conjugate
is finite exactly at ``v = M^T p = p - (sum p) e_y`` for some ``p`` in K, where it equals
``-<c, p> = -sum_{j != y} p_j`` (``c_y = 0``).  ``v`` fixes ``p^{\\y}`` and leaves ``p_y`` free,
so the off-label block ranges over ``D = {p^{\\y} : p in K}`` and ``v_y = -<1, p^{\\y}>`` follows
(as for the other hinges, papers/002 Prop. 1).  Kato's smoothing (eq. (25), a Moreau envelope
over all m scores) adds ``gamma/2 ||v||^2 = gamma/2 (||x||^2 + <1, x>^2)`` to the conjugate,
``x = p^{\\y}``.

**The block update** (our scale: ``x`` is ``C`` times the conjugate argument, see
:mod:`topkbench.losses.weighted_topk`) is then, for both gamma = 0 and gamma > 0,

    argmin_{x in C D}  ||x - b||^2 + <1, x>^2.

Put ``R = C sum_r rho_r`` and ``p_y = t``.  In ``P(theta C rho)`` every vector sums to
``theta R``, so ``<1, x> = theta R - t`` and the problem is

    min_{theta in [0, 1]} g(theta),   g(theta) = min_{p in P(theta C rho)}
        sum_{j != y} (p_j - b_j)^2 + (p_y - theta R)^2,

i.e. the squared distance of ``z(theta) = (b, theta R)`` (``theta R`` at coordinate y) to
``P(theta C rho)``: one projection onto a permutahedron per theta, with the label coordinate's
target moving with theta.  g is convex: it is the partial minimum of a jointly convex function
of ``(theta, p)`` over the convex set ``{(theta, p) : p in theta P(C rho)}``.  With ``d(theta) =
z_sigma - theta C rho`` and ``v`` its isotonic regression, ``g = ||v||^2``.  Since ``1/2
||Pi(d)||^2`` has gradient ``Pi(d)`` for the projection Pi onto a closed convex cone (Moreau's
decomposition), and ``z_sigma`` is continuous in theta (the label's entry only changes rank
where it ties a neighbour),

    g'(theta) = 2 (R v_pos - C <rho, v>),     pos = the label's rank in z(theta).

On a piece where the rank and the pools of PAV stay fixed, each pooled ``v_B`` is the mean of
``d`` over its pool, affine in theta, so g' is affine there: ``g'/2 = A0 + A1 theta`` with
``A1 = sum_B |B| beta_B^2 >= 0``, ``beta_B = (R [pos in B] - C rho_B) / |B|``.  The search is a
safeguarded Newton method on the piecewise-affine g': the root of the current piece's affine
g' is taken when it lies inside the bracket (then it is exact if the piece is right), a
bisection step otherwise.  No closed form over all pieces: the label's rank and the pools can
change at O(m) values of theta.  Ends: ``g'(0) >= 0`` gives theta = 0 (x = 0) and ``g'(1) <= 0``
gives theta = 1.  Every theta gives a feasible point (``p`` in ``P(theta C rho)``), so an
inexact end of the search never leaves the domain.

Reductions (tested): flat ``rho = 1/k`` (k entries) gives the biased projection onto ``D_k(C)``
of the top-k hinge alpha as printed, and ``rho = e_1`` the simplex ``{x >= 0, <1,x> <= C}`` of
SVM^Multi.
"""

from __future__ import annotations

from numba import njit

# a bound on the steps of the theta search (a bisection step halves the bracket; a Newton step
# lands on a piece's root, each piece's at most once); seen: at most 23
MAX_THETA_STEPS = 200


@njit(cache=True)
def argsort_desc(keys, n, idx):
    """``idx[:n]`` = the indices of ``keys[:n]`` in descending order of key, by heapsort in
    place (no allocation: the SDCA update calls this once per example)."""
    for i in range(n):
        idx[i] = i
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(keys, idx, start, n)
    for end in range(n - 1, 0, -1):
        idx[0], idx[end] = idx[end], idx[0]
        _sift_down(keys, idx, 0, end)


@njit(cache=True)
def _sift_down(keys, idx, root, end):
    """Restore the min-heap below ``root`` over ``idx[:end]`` (a min-heap, so that popping to
    the back leaves the keys in descending order)."""
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and keys[idx[child + 1]] < keys[idx[child]]:
            child += 1
        if keys[idx[child]] < keys[idx[root]]:
            idx[root], idx[child] = idx[child], idx[root]
            root = child
        else:
            return


@njit(cache=True)
def pav_decreasing(d, n, bsum, bcnt):
    """Pool-adjacent-violators for the non-increasing isotonic regression of ``d[:n]``.

    Returns the number of pools ``nb``; pool q (in order) has ``bcnt[q]`` entries with sum
    ``bsum[q]``, and every entry of the regression in it equals ``bsum[q] / bcnt[q]``."""
    nb = 0
    for i in range(n):
        bsum[nb] = d[i]
        bcnt[nb] = 1
        nb += 1
        # a later pool with a larger mean violates the order: merge it into the one before
        while nb > 1 and bsum[nb - 2] * bcnt[nb - 1] < bsum[nb - 1] * bcnt[nb - 2]:
            bsum[nb - 2] += bsum[nb - 1]
            bcnt[nb - 2] += bcnt[nb - 1]
            nb -= 1
    return nb


@njit(cache=True)
def project_permutahedron_sorted(zs, w, out, d, bsum, bcnt):
    """``out`` = the projection of ``zs`` (sorted descending) onto ``P(w)`` (``w`` sorted
    descending, same length), in the same order; ``d``, ``bsum`` (float) and ``bcnt`` (int)
    are scratch of the same length."""
    n = zs.shape[0]
    for i in range(n):
        d[i] = zs[i] - w[i]
    nb = pav_decreasing(d, n, bsum, bcnt)
    i = 0
    for q in range(nb):
        v = bsum[q] / bcnt[q]
        for _ in range(bcnt[q]):
            out[i] = w[i] + (d[i] - v)  # = zs - v, exact for a pool of one
            i += 1


@njit(cache=True)
def _theta_piece(bs, rho, C, R, theta, z, d, bsum, bcnt):
    """At ``theta``: fill ``z`` (= z(theta) sorted, the label's target at its rank) and run PAV
    on ``d = z - theta C rho``.  Returns ``(pos, nb, half_slope, A0, A1, mag)``: the label's
    rank, the pool count, ``g'(theta) / 2``, its affine form ``A0 + A1 theta'`` on this piece
    (module docstring), and the size of the terms of ``g'/2`` (for a relative test of 0)."""
    m = rho.shape[0]
    target = theta * R
    pos = 0
    while pos < m - 1 and bs[pos] > target:
        pos += 1
    for i in range(m):
        if i < pos:
            z[i] = bs[i]
        elif i == pos:
            z[i] = target
        else:
            z[i] = bs[i - 1]
        d[i] = z[i] - theta * C * rho[i]
    nb = pav_decreasing(d, m, bsum, bcnt)
    half_slope = 0.0
    A0 = 0.0
    A1 = 0.0
    mag = 0.0
    i = 0
    for q in range(nb):
        cnt = bcnt[q]
        v = bsum[q] / cnt
        rsum = 0.0
        csum = 0.0
        has_pos = False
        for _ in range(cnt):
            rsum += rho[i]
            if i == pos:
                has_pos = True
            else:
                csum += z[i]
            i += 1
        alpha = csum / cnt
        beta = ((R if has_pos else 0.0) - C * rsum) / cnt
        half_slope -= C * rsum * v
        A0 -= C * rsum * alpha
        mag += C * rsum * abs(v)
        if has_pos:
            half_slope += R * v
            A0 += R * alpha
            mag += R * abs(v)
        A1 += cnt * beta * beta
    return pos, nb, half_slope, A0, A1, mag


@njit(cache=True)
def wtopk_biased_projection(b, rho, C, x, order, bs, z, d, bsum, bcnt):
    """``x = argmin_{x in C D} ||x - b||^2 + <1, x>^2`` for the weighted top-k domain D of
    non-increasing ``rho >= 0`` (length m, zero-padded; module docstring); ``b`` and ``x``
    have length m - 1.  Scratch: ``order`` (int, m), ``bs``, ``z``, ``d``, ``bsum`` (float,
    m) and ``bcnt`` (int, m).  Returns ``theta``: the solution's full vector ``(x, p_y)`` lies
    in ``P(theta C rho)``, so ``<1, x> + p_y = theta C sum rho``."""
    m = rho.shape[0]
    n = m - 1
    R = 0.0
    for r in range(m):
        R += rho[r]
    R *= C
    srt = order[:n]
    argsort_desc(b, n, srt)
    for i in range(n):
        bs[i] = b[srt[i]]
    pos, nb, hs, A0, A1, mag = _theta_piece(bs, rho, C, R, 0.0, z, d, bsum, bcnt)
    if hs >= 0.0 or R <= 0.0:
        for i in range(n):
            x[i] = 0.0
        return 0.0
    # g'(0) < 0; if g'(1) <= 0 too, theta = 1, else bracket the root of g' in (0, 1)
    theta = 1.0
    pos, nb, hs, A0, A1, mag = _theta_piece(bs, rho, C, R, theta, z, d, bsum, bcnt)
    lo, hi = 0.0, 1.0
    steps = 0
    while hs > 0.0 or theta < 1.0:
        if abs(hs) <= 1e-13 * mag or steps >= MAX_THETA_STEPS or hi - lo <= 1e-15 * hi:
            break
        steps += 1
        if hs > 0.0:
            hi = theta
        else:
            lo = theta
        nxt = 0.5 * (lo + hi)
        if A1 > 0.0:
            root = -A0 / A1  # exact if the current piece holds the root
            if lo < root < hi:
                nxt = root
        theta = nxt
        pos, nb, hs, A0, A1, mag = _theta_piece(bs, rho, C, R, theta, z, d, bsum, bcnt)
    # the projection at theta, p = z - v in sorted order, written as theta C rho_i + (d_i - v):
    # exact for a pool of one (z - v would lose theta C rho_i to rounding when |b| >> C rho,
    # i.e. for rows of tiny norm), and clipped to [0, theta C rho_1], where every entry of
    # P(theta C rho) lies; the label's entry is not returned
    top = theta * C * rho[0]
    i = 0
    for q in range(nb):
        v = bsum[q] / bcnt[q]
        for _ in range(bcnt[q]):
            p = theta * C * rho[i] + (d[i] - v)
            p = 0.0 if p < 0.0 else (top if p > top else p)
            if i < pos:
                x[srt[i]] = p
            elif i > pos:
                x[srt[i - 1]] = p
            i += 1
    return theta
