"""(Biased) projections onto the top-k sets (NIPS 001 §4; TPAMI 002 §3.2 eqs. (2)-(3), Prop. 14;
DESIGN §4.1, §4.5).

Every problem here has the form, for ``b`` in R^n, ``rho >= 0``, ``r > 0``::

    argmin_x  1/2 ||x - b||^2 + rho/2 <1, x>^2   s.t.  x in S(r)

for one of the sets

* ``SET_ALPHA``: the top-k simplex  Delta_k^alpha(r) = {x >= 0, <1,x> <= r, x_j <= <1,x>/k}
  (the conjugate domain of the *pseudo* top-k hinge the authors' code optimizes; eq. (2));
* ``SET_BETA``:  Delta_k^beta(r) = {0 <= x_j <= r/k, <1,x> <= r} (eq. (3));
* ``SET_DK``:    D_k(r) = {x >= 0, <1,x> <= r, x_j <= r/k, (k-1) x_j <= <1,x>}, the conjugate
  domain of the top-k hinge alpha *as printed* (DESIGN §4.1);
* ``SET_CONE``:  the top-k cone  {x >= 0, k x_j <= <1,x>}  (``r`` is ignored).

All solutions have the form ``x = clip(b - t, 0, c)``: the functions return the thresholds
``(t, c, s)`` with ``s = <1, x>`` as implied by the algorithm (exact when a sum constraint is
active, which keeps the smoothed losses accurate for tiny gamma), and the caller applies them
(STYLE.md, "Numerical kernels").  Input to the ``*_sorted`` kernels is ``b`` sorted in
*descending* order; the sort is the only O(n log n) step, everything else is O(n).

Derivation (ours; the NIPS paper's Lemma 3 enumerates up to (k-1)(n-k+1) partitions and falls
back to ``x = 0`` when none fits, which we do not want to rely on):

**Top-k cone / Delta_k^alpha.**  Split the problem by the value of the sum:
``F(s) = min {1/2 ||x - b||^2 : 0 <= x_j <= s/k, <1,x> = s} + rho/2 s^2``.  F is convex (a
partial minimization of a jointly convex function over a convex set) and the top-k simplex
problem is ``min_{0 <= s <= r} F(s)``; the cone problem drops ``s <= r``.  For fixed s the
inner problem is a box-constrained knapsack, ``x = clip(b - t, 0, c)`` with ``c = s/k``; with
multipliers ``t`` for the sum and ``nu_j = (b_j - t - c)_+`` for the caps, the envelope theorem
gives ``F'(s) = rho s - t - P/k`` with ``P = sum_j nu_j``.  Let U = {capped}, M = {strictly
between}, u = |U|, with sums ``B_U``, ``B_M``; then ``sum x = s`` gives
``t = (B_M - (k - u) c) / |M|`` and, in terms of c,

    F'(kc) * k |M| = c (rho k^2 |M| + (k - u)^2 + u |M|) - (k - u) B_M - |M| B_U,

whose root is exactly the NIPS Lemma 3 formula.  As s grows the lower threshold ``t`` falls and
the upper threshold ``t + c`` rises, so elements only move L -> M (``t`` passes ``b_j``) and
U -> M (``t + c`` passes ``b_j``): U is always a prefix and M the next block of the sorted
``b``.  Starting at ``s = 0+`` with ``U`` = the k largest, ``M`` empty (``x`` constant on the
top k), we sweep the at most ``n + k`` events in increasing ``c`` and stop in the first piece
containing the root of the increasing piecewise-linear ``F'`` (or ``c = r/k``, where the sum
constraint becomes active and the problem is the knapsack with box ``r/k`` -- NIPS §4.1).
Consequences: ``x = 0`` iff ``T_k(b) <= 0`` (sum of the k largest), for every ``rho >= 0``
(NIPS Lemma 4 states only sufficiency for ``rho > 0``).

**Delta_k^beta (biased continuous quadratic knapsack with box r/k).**  Same idea with a fixed
box ``cap = r/k``: ``G(s) = min {1/2 ||x-b||^2 : 0 <= x <= cap, <1,x> = s} + rho/2 s^2`` has
``G'(s) = rho s - t(s)``; as s grows ``t`` falls and elements move L -> M (``t = b_j``) and
M -> U (``t = b_j - cap``); each piece gives ``t = (u cap + B_M - s)/|M|`` and the root
``s = (u cap + B_M) / (1 + rho |M|)``; stop at the root or at ``s = r``.  With
``force_sum`` the sweep stops exactly at ``s = r`` (the plain knapsack with box; DESIGN §4.1
primitive (iii)).

**D_k** (DESIGN §4.1, checked there numerically; the case analysis is ours): D_k(r) is
Delta_k^beta(r) intersected with the top-(k-1) cone.  (i) Solve over Delta_k^beta(r); if
``k <= 2`` or ``(k-1) max x <= sum x`` it is optimal.  (ii) Else solve over the biased top-(k-1)
cone; if ``max x <= r/k`` and ``sum x <= r`` it is optimal.  (iii) Else a cone constraint and a
box/sum constraint are both active at the optimum.  A cone constraint active at j means
``x_j = max x = s/(k-1)``, hence ``s <= (k-1) r/k < r``, so the active one is a box constraint
``x_j' = r/k``; as ``x_j' <= x_j <= r/k`` this forces ``max x = r/k``, ``s = (k-1) r/k``, and
on that face all remaining constraints reduce to ``x_j <= r/k``: the knapsack with box ``r/k``
and sum ``(k-1) r/k`` (the bias is constant there).

**Linear time for long vectors** (TPAMI 002 §5 claims linear-time projections; the sweeps
above are O(n) but need ``b`` sorted).  Every solution is ``x = clip(b - t, 0, c)`` and every
sweep only ever touches the elements with ``b_j > t`` (they enter in decreasing order), so if
the sweep run on the q largest entries returns ``t >= `` the smallest of them (or ``c = 0``,
i.e. ``x = 0``), the excluded entries are all ``<= t`` and get ``x_j = 0`` from the same
thresholds; the sums, hence the pieces and the root, are exactly those of the full sweep.  For
``n > PRESELECT_MIN_N`` :func:`topk_threshold` therefore selects the q largest in one pass
(:func:`select_top`, a 2q buffer that is sorted and halved when full, which raises its entry
bar), sorts only those, runs the sweep(s) and checks that condition for every sweep it used
(D_k runs up to three); if it fails, q grows 8-fold, and falls back to the full sort once
``2q >= n``.  Supports are tiny for the N(0,1) problems of Fig. 3a, so one pass does it.
Short vectors (``n <= PRESELECT_MIN_N``: the m - 1 margins of an SDCA update at m ~ 100), and
longer ones when ``2k + 8 <= INSERT_MAX_Q`` (the margins at m ~ 1,000 with small k), first keep
their ``2k + 8`` largest entries by insertion (:func:`insert_top`) and make the same check;
then the select_top rounds (long vectors) and the full sort, which is the top-k hinges' main
cost at m = 100.

Numerics: sums over U and M are recomputed from scratch for the final partition (the sweep
updates them incrementally), so the result does not carry the sweep's accumulated rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SET_ALPHA = 0
SET_BETA = 1
SET_DK = 2
SET_CONE = 3

_INF = math.inf
# relative rounding within which an entry counts as capped (projection_jacobian)
_CAP_ROUNDING = 8.0 * 2.220446049250313e-16


@njit(cache=True)
def sort_descending(b, out):
    """``out[:] = b`` sorted in descending order (in place in ``out``, no allocation)."""
    n = b.shape[0]
    for j in range(n):
        out[j] = -b[j]
    out[:n].sort()
    for j in range(n):
        out[j] = -out[j]


@njit(cache=True)
def _range_sum(bs, lo, hi):
    total = 0.0
    for j in range(lo, hi):
        total += bs[j]
    return total


@njit(cache=True)
def _max_clipped(bs, t, c):
    v = bs[0] - t
    if v > c:
        v = c
    return v if v > 0.0 else 0.0


@njit(cache=True)
def _sum_clipped(bs, t, c):
    total = 0.0
    for j in range(bs.shape[0]):
        v = bs[j] - t
        if v > c:
            v = c
        if v > 0.0:
            total += v
    return total


@njit(cache=True)
def cone_sweep_sorted(bs, k, rho, cmax):
    """Thresholds of the biased projection onto ``{x in top-k cone, <1,x> <= k cmax}``.

    ``bs`` sorted descending, ``len(bs) >= k >= 1``; ``cmax = inf`` gives the cone, ``cmax =
    r/k`` gives Delta_k^alpha(r).  Returns ``(t, c, s)``; ``x = clip(b - t, 0, c)``.
    """
    n = bs.shape[0]
    bu = _range_sum(bs, 0, k)
    if bu <= 0.0 or cmax <= 0.0:
        return bs[0], 0.0, 0.0
    kf = float(k)
    # first piece: U = top k, M empty, x = c on U
    c_end = bs[k - 1] - bs[k] if k < n else _INF
    c_root = bu / (kf * (1.0 + rho * kf))
    if c_root <= c_end or cmax <= c_end:
        c = min(c_root, cmax)
        return bs[k - 1] - c, c, kf * c
    c_cur = c_end
    u = k
    il = k
    bm = 0.0
    # events at c_end: the smallest of U and the largest of L both join M
    while True:
        nm = il - u
        if nm == 0:
            # only right after the constant piece: move both boundary elements
            u -= 1
            bu -= bs[u]
            bm += bs[u]
            if il < n:
                bm += bs[il]
                il += 1
            continue
        km = kf - u
        den = rho * kf * kf * nm + km * km + u * nm
        c_root = (km * bm + nm * bu) / den
        # next events: t(c) = (bm - km c)/nm reaches bs[il]; t + c reaches bs[u - 1]
        c_l = _INF
        if il < n and km > 0.0:
            c_l = (bm - nm * bs[il]) / km
        c_u = _INF
        if u > 0 and nm > km:
            c_u = (nm * bs[u - 1] - bm) / (nm - km)
        c_next = min(c_l, c_u)
        if c_next < c_cur:
            c_next = c_cur
        target = min(c_root, cmax)
        if target <= c_next:
            c = max(target, c_cur)
            break
        c_cur = c_next
        if c_u <= c_l:
            u -= 1
            bu -= bs[u]
            bm += bs[u]
        if c_l <= c_u and il < n:
            bm += bs[il]
            il += 1
    # recompute the partition sums exactly and the final thresholds
    nm = il - u
    bu = _range_sum(bs, 0, u)
    bm = _range_sum(bs, u, il)
    km = kf - u
    # the solution is the root of this piece clamped to [start of piece, cmax]; the root lies
    # below the start only at a kink reached through a zero-length piece
    c = (km * bm + nm * bu) / (rho * kf * kf * nm + km * km + u * nm)
    c = min(max(c, c_cur), cmax)
    t = (bm - km * c) / nm
    if c == cmax:
        return t, c, kf * c
    # s from the thresholds themselves: at a kink c_cur carries the sweep's rounding, and
    # callers use s with t (the smoothed losses multiply its error by |t| / gamma)
    return t, c, _sum_clipped(bs, t, c)


@njit(cache=True)
def box_sweep_sorted(bs, cap, rho, smax, force_sum):
    """Thresholds of ``argmin 1/2||x-b||^2 + rho/2 <1,x>^2, 0 <= x <= cap, <1,x> <= smax``.

    With ``force_sum`` the constraint is ``<1,x> = smax`` (then ``rho`` has no effect).
    ``bs`` sorted descending; requires ``smax <= n cap``.  Returns ``(t, c, s)`` with ``c =
    cap``; ``x = clip(b - t, 0, cap)``.
    """
    n = bs.shape[0]
    iu = 0
    il = 0
    bm = 0.0
    s_cur = 0.0
    s = 0.0
    while True:
        nm = il - iu
        if nm == 0:
            if il == n:
                # everything capped: s = n cap >= smax, so only reachable when equal
                return bs[n - 1] - cap, cap, n * cap
            bm += bs[il]
            il += 1
            continue
        base = iu * cap + bm
        s_root = _INF if force_sum else base / (1.0 + rho * nm)
        # t(s) = (base - s)/nm reaches bs[il] (entry) or bs[iu] - cap (cap)
        s_l = base - nm * bs[il] if il < n else _INF
        s_c = base - nm * (bs[iu] - cap)
        s_next = min(s_l, s_c)
        if s_next < s_cur:
            s_next = s_cur
        target = min(s_root, smax)
        if target <= s_next:
            s = max(target, s_cur)
            break
        s_cur = s_next
        if s_c <= s_l:
            bm -= bs[iu]
            iu += 1
        if s_l <= s_c and il < n:
            bm += bs[il]
            il += 1
    nm = il - iu
    bm = _range_sum(bs, iu, il)
    base = iu * cap + bm
    s = smax
    if not force_sum:
        s = min(max(base / (1.0 + rho * nm), s_cur), smax)
    if s == smax:
        return (base - s) / nm, cap, s
    # sum constraint inactive: the KKT multiplier is exactly t = rho s.  (The piece formula
    # gives the same t in exact arithmetic, but at a kink it lands on a breakpoint b_j and
    # rounding then leaves a spurious p_j ~ eps |b_j|, which the smoothed losses divide by gamma.)
    t = rho * s
    return t, cap, _sum_clipped(bs, t, cap)


@njit(cache=True)
def _covers(t, c, floor):
    """Whether thresholds found on the entries ``>= floor`` are those of the whole vector
    (module docstring): every excluded entry (``<= floor``) is clipped to 0."""
    return c == 0.0 or t >= floor


@njit(cache=True)
def _topk_threshold_floor(kind, bs, k, rho, r, floor):
    """:func:`topk_threshold_sorted` on the q largest entries ``bs`` of a longer vector whose
    other entries are ``<= floor``; returns ``(t, c, s, ok)``, ``ok`` False when a sweep it
    used reached below ``floor`` (then the result is not the full vector's)."""
    if kind == SET_ALPHA or kind == SET_CONE:
        cmax = r / k if kind == SET_ALPHA else _INF
        t, c, s = cone_sweep_sorted(bs, k, rho, cmax)
        return t, c, s, _covers(t, c, floor)
    t, c, s = box_sweep_sorted(bs, r / k, rho, r, False)
    if not _covers(t, c, floor):
        return t, c, s, False
    if kind == SET_BETA or k <= 2:
        return t, c, s, True
    # SET_DK, k >= 3: DESIGN §4.1 primitives (i)-(iii)
    tol = 1e-12
    mx = _max_clipped(bs, t, c)
    if (k - 1) * mx <= s * (1.0 + tol) + 1e-300:
        return t, c, s, True
    t, c, s = cone_sweep_sorted(bs, k - 1, rho, _INF)
    if not _covers(t, c, floor):
        return t, c, s, False
    mx = _max_clipped(bs, t, c)
    if mx <= (r / k) * (1.0 + tol) and s <= r * (1.0 + tol):
        return t, c, min(s, r), True
    t, c, s = box_sweep_sorted(bs, r / k, 0.0, r * (k - 1) / k, True)
    return t, c, s, _covers(t, c, floor)


@njit(cache=True)
def topk_threshold_sorted(kind, bs, k, rho, r):
    """Thresholds ``(t, c, s)`` of the biased projection onto the set ``kind`` of radius r."""
    t, c, s, _ = _topk_threshold_floor(kind, bs, k, rho, r, -_INF)
    return t, c, s


# below this length a full sort is cheaper than selecting candidates first (SDCA updates
# with m - 1 < 256 classes always sort)
PRESELECT_MIN_N = 256
# Longer vectors also try insert_top first when its 2k + 8 candidates are at most this many:
# an insertion then shifts at most this many entries even on adversarial (increasing) input,
# and on the margins of an SDCA update at m ~ 1,000 one insertion pass costs half of
# select_top's, whose buffer sorts dominate there.
INSERT_MAX_Q = 64


@njit(cache=True)
def select_top(b, q, buf):
    """Write the ``qq = min(q, n)`` largest entries of ``b`` to ``buf[:qq]`` in descending
    order and return ``qq``.  ``buf`` needs length ``>= min(2q, n)``.

    One pass: entries above the current bar go to the buffer; when it holds 2q entries it is
    sorted and its q largest kept, and the bar rises to the smallest of them.  O(n) plus one
    O(q log q) sort per refill (refills get rare as the bar rises; O(n log q) at worst)."""
    n = b.shape[0]
    cap = min(2 * q, n)
    bar = -_INF
    cnt = 0
    for j in range(n):
        v = b[j]
        if v > bar:
            buf[cnt] = v
            cnt += 1
            if cnt == cap and j + 1 < n:
                buf[:cnt].sort()
                for p in range(q):
                    buf[p] = buf[cnt - q + p]
                cnt = q
                bar = buf[0]
    buf[:cnt].sort()
    for p in range(cnt // 2):  # descending: the largest first
        v = buf[cnt - 1 - p]
        buf[cnt - 1 - p] = buf[p]
        buf[p] = v
    return min(q, cnt)


@njit(cache=True)
def insert_top(b, q, buf):
    """Write the ``qq = min(q, n)`` largest entries of ``b`` to ``buf[:qq]`` in descending
    order and return ``qq`` (``buf`` needs length ``>= qq``).

    One pass keeping ``buf`` sorted: an entry above the smallest kept one is inserted by
    shifting.  For the short vectors of SDCA updates (n = m - 1 classes) and small q this beats
    both a full sort and :func:`select_top`: on N(0,1) data about q log(n/q) entries are
    inserted, each shifting O(q)."""
    n = b.shape[0]
    cnt = 0
    for j in range(n):
        v = b[j]
        if cnt == q:
            if not v > buf[q - 1]:
                continue
            p = q - 1
        else:
            p = cnt
            cnt += 1
        while p > 0 and buf[p - 1] < v:
            buf[p] = buf[p - 1]
            p -= 1
        buf[p] = v
    return cnt


@njit(cache=True)
def short_candidates(k):
    """Candidates kept by insertion (:func:`topk_threshold_counted`): ``2k + 8``."""
    return 2 * k + 8


@njit(cache=True)
def topk_threshold_counted(kind, b, k, rho, r, work):
    """:func:`topk_threshold` that also returns how many entries it sorted last (``n`` when
    it fell back to the full sort)."""
    n = b.shape[0]
    q = short_candidates(k)
    if q < n and (n <= PRESELECT_MIN_N or q <= INSERT_MAX_Q):
        insert_top(b, q, work)
        bs = work[:q]
        t, c, s, ok = _topk_threshold_floor(kind, bs, k, rho, r, bs[q - 1])
        if ok:
            return t, c, s, q
    q = max(4 * k, 32)
    while n > PRESELECT_MIN_N and 2 * q < n:
        qq = select_top(b, q, work)
        bs = work[:qq]
        t, c, s, ok = _topk_threshold_floor(kind, bs, k, rho, r, bs[qq - 1])
        if ok:
            return t, c, s, qq
        q *= 8
    bs = work[:n]
    sort_descending(b, bs)
    t, c, s = topk_threshold_sorted(kind, bs, k, rho, r)
    return t, c, s, n


@njit(cache=True)
def topk_threshold(kind, b, k, rho, r, work):
    """As :func:`topk_threshold_sorted` for unsorted ``b``; ``work`` (len >= n) is scratch.

    Only candidates are sorted: the ``2k + 8`` largest by :func:`insert_top` (short vectors,
    and long ones with small k), then those of :func:`select_top` (long vectors), before
    the full sort (module docstring, "Linear time")."""
    t, c, s, _ = topk_threshold_counted(kind, b, k, rho, r, work)
    return t, c, s


@njit(cache=True)
def apply_box_threshold(b, t, c, out):
    """``out = clip(b - t, 0, c)``; returns ``<1, out>``."""
    total = 0.0
    for j in range(b.shape[0]):
        v = b[j] - t
        if v > c:
            v = c
        if v < 0.0:
            v = 0.0
        out[j] = v
        total += v
    return total


def project(kind: int, b, k: int, rho: float = 0.0, r: float = 1.0) -> np.ndarray:
    """Convenience wrapper (allocates): the biased projection of ``b`` onto ``kind``."""
    b = np.ascontiguousarray(b, dtype=np.float64)
    work = np.empty_like(b)
    t, c, _ = topk_threshold(kind, b, int(k), float(rho), float(r), work)
    out = np.empty_like(b)
    apply_box_threshold(b, t, c, out)
    return out


@njit(cache=True)
def projection_face(kind, k, r, t, c):
    """The face of the set on which ``x = clip(b - t, 0, c)`` (unbiased, ``rho = 0``, as
    :func:`topk_threshold` returns it) lies, as ``(K, fixed_sum)``: ``K = 0`` when the caps
    are the fixed box ``x_j <= r/k`` and ``K > 0`` when they are the cone's ``x_j <= <1,x>/K``
    (``K = k``, or ``k - 1`` on D_k's cone case); ``fixed_sum`` whether ``<1,x>`` is held
    (the sum constraint binds, or D_k's face ``<1,x> = (k-1) r/k``).

    Read off the thresholds: the sweeps return the cap ``r/k`` exactly when it binds
    (Delta_k^alpha's ``c = cmax``, the box sweeps' ``c = cap``), and with ``rho = 0`` an
    inactive sum constraint gives ``t = rho s = 0`` exactly (:func:`box_sweep_sorted`); D_k's
    cases (i)-(iii) (module docstring) are: the box with ``c = r/k`` and the sum free (t = 0)
    or held (the radius, or case (iii)), or the top-(k-1) cone."""
    if kind == SET_CONE:
        return k, False
    if kind == SET_ALPHA:
        if c >= r / k:
            return 0, True
        return k, False
    if kind == SET_BETA or k <= 2 or c == r / k:
        return 0, t != 0.0
    return k - 1, False


@njit(cache=True)
def _at_cap(bj, t, c):
    """Whether ``clip(b_j - t, 0, c)`` is at its cap ``c``, up to the rounding of ``b_j - t``
    (a few ulps of the larger operand)."""
    return bj - t >= c - _CAP_ROUNDING * max(abs(bj), abs(t), c)


@njit(cache=True)
def projection_jacobian(kind, b, k, r, t, c, sup, J):
    """The (generalized) Jacobian ``dx/db`` of the unbiased projection ``x = clip(b - t, 0,
    c)`` onto the set ``kind`` (``rho = 0``), restricted to the support ``sup`` (the indices
    with ``x_j > 0``; it vanishes elsewhere), into ``J[:q, :q]``, ``q = len(sup)``.

    A projection onto a polyhedron is, on the face where it lands, the projection onto that
    face's affine hull, so its Jacobian is the orthogonal projection onto the hull's
    direction space T.  With L = {x_j = 0} (v_L = 0 in T), U = {x_j = cap} and M the others
    (u = |U|, |M| their sizes; :func:`projection_face` gives the face):

    * fixed caps (K = 0): ``v_U = 0``, and ``<1, v_M> = 0`` when the sum is held, so ``J =
      I_M`` or ``I_M - 1_M 1_M^T / |M|``;
    * cone caps ``x_j = <1,x>/K`` on U: ``v_U = tau 1_U`` with ``K tau = <1, v_M> + u tau``.
      T is the subspace of ``V = span{e_j (j in M), 1_U / sqrt(u)}`` orthogonal to ``w = -1_M
      + ((K - u)/u) 1_U``, hence ``J = I_M + 1_U 1_U^T / u - w w^T / ||w||^2``, ``||w||^2 =
      |M| + (K - u)^2 / u`` (``J = I_M`` when u = 0; ``1_U 1_U^T / u`` when M is empty).

    An entry counts as capped when ``b_j - t`` reaches ``c`` to a few roundings
    (:func:`_at_cap`): the sweeps put ``t`` at ``b_j - c`` exactly where a group of entries
    is capped by construction (the cone's first piece, a box whose top group is full), and
    ``b_j - (b_j - c)`` may round below ``c``, which would move a tied group into M where the
    projection is locally constant.  On a true kink (a multiplier of 0) either face's
    Jacobian is an element of the generalized one, as a semismooth Newton method needs."""
    q = sup.shape[0]
    K, fixed_sum = projection_face(kind, k, r, t, c)
    u = 0
    for p in range(q):
        if _at_cap(b[sup[p]], t, c):
            u += 1
    nm = q - u
    for p in range(q):
        for p2 in range(q):
            J[p, p2] = 0.0
        if not _at_cap(b[sup[p]], t, c):
            J[p, p] = 1.0
    if K == 0:
        if fixed_sum and nm > 0:
            for p in range(q):
                if not _at_cap(b[sup[p]], t, c):
                    for p2 in range(q):
                        if not _at_cap(b[sup[p2]], t, c):
                            J[p, p2] -= 1.0 / nm
        return
    if u == 0:
        return
    a = (K - u) / u
    norm2 = nm + a * a * u
    for p in range(q):
        capped = _at_cap(b[sup[p]], t, c)
        wp = a if capped else -1.0
        for p2 in range(q):
            capped2 = _at_cap(b[sup[p2]], t, c)
            if capped and capped2:
                J[p, p2] += 1.0 / u
            if norm2 > 0.0:
                J[p, p2] -= wp * (a if capped2 else -1.0) / norm2
