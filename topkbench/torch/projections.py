"""Batched Euclidean projections onto the conjugate domains of the top-k hinges, in torch
operations (sorting, cumulative sums, searches), for :mod:`topkbench.torch.losses`.

Each function takes ``z`` (B x n, rows independent) and returns the thresholds ``(t, c)`` of
the projection ``p = clip(z - t, 0, c)`` row by row (``c`` may be ``inf``), as the numba
kernels of :mod:`topkbench.prox.topk` do (NIPS 001 §4, their derivations in that module):

* :func:`capped_simplex`: ``{0 <= p <= cap, <1, p> <= r}`` (the unit simplex of SVM^Multi
  with ``cap = inf``, and Delta_k^beta(r) with ``cap = r / k``), or ``<1, p> = r`` exactly;
* :func:`topk_cone`: ``{p >= 0, k p_j <= <1, p>}``;
* :func:`topk_simplex`: Delta_k^alpha(r) = the top-k cone with ``<1, p> <= r``;
* :func:`dk_set`: D_k(r), the domain of the top-k hinge alpha as printed (DESIGN §4.1);
* :func:`bipartite`: the bipartite simplex B(r) of SVM^ML (TPAMI 002 eq. (17)), thresholds
  ``(t, s)`` of its two blocks.

All rows are solved at once; the only loop is over the ``k + 1`` sizes of the capped set in
:func:`topk_cone`.  Every solution is ``clip(z - t, 0, c)`` and its sums only involve entries
above t, so a row may be solved on its few largest entries: where the smallest threshold the
solver used (``guard``) is at least the smallest entry kept, the left-out entries get 0 and
the result is the whole row's (:func:`topkbench.torch.losses._smoothed_hinge`, as
:func:`topkbench.prox.topk.topk_threshold` does in numba).
"""

from __future__ import annotations

import torch


def _prefix(v: torch.Tensor) -> torch.Tensor:
    """``P[:, j] = v[:, :j].sum(1)``, j = 0 .. n (a zero column first)."""
    return torch.cat([torch.zeros_like(v[:, :1]), torch.cumsum(v, dim=1)], dim=1)


def _excess(asc: torch.Tensor, pre: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``<1, (v - t)_+>`` of each row v at the (B x q) points t, from the row sorted ascending
    (``asc``) and its prefix sums (``pre``, :func:`_prefix`)."""
    n = asc.shape[1]
    above = n - torch.searchsorted(asc, t.contiguous(), right=True)  # v_j > t
    return (pre[:, -1:] - torch.gather(pre, 1, n - above)) - t * above


def _root(points: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The root of each row's decreasing piecewise-linear function whose values at its sorted
    breakpoints ``points`` (every one included, f > 0 at the first) are ``values``: exact by
    interpolation on the piece that brackets it."""
    last = (values > 0).sum(dim=1, keepdim=True).clamp(1, points.shape[1] - 1) - 1
    t0, t1 = torch.gather(points, 1, last), torch.gather(points, 1, last + 1)
    f0, f1 = torch.gather(values, 1, last), torch.gather(values, 1, last + 1)
    width = f0 - f1
    t = torch.where(width > 0, t0 + f0 / torch.where(width > 0, width, 1.0) * (t1 - t0), t1)
    return t[:, 0]


def capped_simplex(z: torch.Tensor, cap, r, force_sum: bool = False):
    """Thresholds ``(t, c)`` of the projection of each row of ``z`` onto ``{0 <= p <= cap,
    <1, p> <= r}`` (``<1, p> = r`` with ``force_sum``); ``cap`` and ``r`` are scalars or
    (B,) tensors, ``cap`` may be ``inf``.

    ``p = clip(z - t, 0, cap)`` with ``t = 0`` when that already satisfies the sum (and not
    ``force_sum``), else the root of the decreasing piecewise-linear ``f(t) = <1, clip(z - t,
    0, cap)> - r``, whose breakpoints are the ``z_j`` and ``z_j - cap``: f is evaluated at
    every breakpoint from the sorted ``z`` and its prefix sums, and the root interpolated
    exactly on the piece that brackets it."""
    B = z.shape[0]
    cap = torch.as_tensor(cap, dtype=z.dtype, device=z.device).expand(B)
    r = torch.as_tensor(r, dtype=z.dtype, device=z.device).expand(B)
    asc, _ = torch.sort(z, dim=1)
    pre = _prefix(asc)
    finite = torch.isfinite(cap)[:, None]

    def f(t):
        """``<1, clip(z - t, 0, cap)> - r = <1, (z - t)_+> - <1, (z - t - cap)_+> - r`` at
        the (B x q) points t."""
        over = _excess(asc, pre, torch.where(finite, t + cap[:, None], t))
        return _excess(asc, pre, t) - torch.where(finite, over, 0.0) - r[:, None]

    low = torch.where(finite, asc - cap[:, None], asc)
    lower = torch.minimum(asc[:, :1], low[:, :1]) - r[:, None].abs() - 1.0
    points, _ = torch.sort(torch.cat([lower, low, asc], dim=1), dim=1)
    t = _root(points, f(points))
    if not force_sum:
        inside = f(torch.zeros_like(t)[:, None])[:, 0] <= 0
        t = torch.where(inside, torch.zeros_like(t), t)
    return t, cap


def topk_cone(z: torch.Tensor, k: int):
    """Thresholds ``(t, c)`` of the projection of each row of ``z`` onto the top-k cone
    ``{p >= 0, k p_j <= <1, p>}``.

    With z sorted descending, the optimum caps the ``u`` largest at ``c = <1, p> / k``, keeps
    the next ``f`` strictly between 0 and c and zeroes the rest (:mod:`topkbench.prox.topk`).
    For given ``(u, f)``, with ``B_U`` and ``B_M`` the sums of the two blocks, stationarity in
    the sum gives ``c = ((k - u) B_M + f B_U) / ((k - u)^2 + u f)`` and ``t = (B_M - (k - u)
    c) / f``; ``u = k, f = 0`` is ``p = T_k / k`` on the k largest, and ``p = 0`` (``c = 0``)
    is optimal iff ``T_k <= 0``.  Every ``(u, f)`` with ``u < k`` is tried at once per ``u``,
    and each row takes the candidate that violates its own set conditions least (ties in z
    make several exact, with the same p)."""
    B, n = z.shape
    v, _ = torch.sort(z, dim=1, descending=True)
    pre = _prefix(v)
    big = torch.finfo(z.dtype).max
    pad = torch.cat([v, torch.full_like(v[:, :1], -big)], dim=1)  # v_{n+1} = -inf
    best_viol = torch.full((B,), float("inf"), dtype=z.dtype, device=z.device)
    best_t = torch.zeros(B, dtype=z.dtype, device=z.device)
    best_c = torch.zeros(B, dtype=z.dtype, device=z.device)
    scale = v.abs().amax(dim=1).clamp_min(1.0)
    for u in range(0, min(k, n) + 1):
        if u == k:
            # p = T_k / k on the k largest: valid while v_k - v_{k+1} >= c >= 0; any t in
            # [v_{k+1}, v_k - c] gives it, the upper end keeps t finite (the loss's value is
            # written with t)
            c = pre[:, k] / k
            t = v[:, k - 1] - c
            viol = torch.maximum(-c, c - (v[:, k - 1] - pad[:, k]).clamp_max(big))
            cand_t, cand_c, cand_v = t[:, None], c[:, None], viol[:, None]
        else:
            f = torch.arange(1, n - u + 1, device=z.device, dtype=z.dtype)  # (F,)
            ends = torch.arange(u + 1, n + 1, device=z.device)
            B_U = pre[:, u : u + 1]
            B_M = pre[:, ends] - B_U
            c = ((k - u) * B_M + f * B_U) / ((k - u) ** 2 + u * f)
            t = (B_M - (k - u) * c) / f
            last_free = v[:, ends - 1]
            first_zero = pad[:, ends]
            viol = torch.maximum((t - last_free), (first_zero - t))  # free > 0, rest <= 0
            viol = torch.maximum(viol, (v[:, u : u + 1] - t) - c)  # first free below c
            if u > 0:
                viol = torch.maximum(viol, c - (v[:, u - 1 : u] - t))  # last capped above c
            viol = torch.maximum(viol, -c)
            cand_t, cand_c, cand_v = t, c, viol
        j = torch.argmin(cand_v, dim=1, keepdim=True)
        vmin = torch.gather(cand_v, 1, j)[:, 0]
        better = vmin < best_viol
        best_viol = torch.where(better, vmin, best_viol)
        best_t = torch.where(better, torch.gather(cand_t, 1, j)[:, 0], best_t)
        best_c = torch.where(better, torch.gather(cand_c, 1, j)[:, 0], best_c)
    zero = pre[:, min(k, n)] <= 0  # T_k <= 0: p = 0
    best_c = torch.where(zero, torch.zeros_like(best_c), best_c)
    best_t = torch.where(zero, v[:, 0].clamp_min(0.0) + scale, best_t)
    return best_t, best_c


def knapsack(z: torch.Tensor, cap, r):
    """:func:`capped_simplex` as the losses take it: ``(t, c, guard, s)`` with ``s = r``
    where the sum constraint binds (``t > 0``: exactly r, not the rounded sum of p) and NaN
    elsewhere (there ``t = 0``)."""
    t, c = capped_simplex(z, cap, r)
    r = torch.as_tensor(r, dtype=z.dtype, device=z.device).expand(z.shape[0])
    return t, c, t, torch.where(t > 0, r, torch.nan)


def topk_simplex(z: torch.Tensor, k: int, r):
    """Thresholds ``(t, c, guard, s)`` of the projection of each row of ``z`` onto
    Delta_k^alpha(r) = ``{p >= 0, <1, p> <= r, p_j <= <1, p> / k}`` (``guard``: the smallest
    threshold the choice used: the module docstring's test; ``s``: the sum of p as the
    solution defines it, r on the radius and ``k c`` in the cone, which the losses' values
    use instead of the rounded sum).

    On ``<1, p> = r`` the cone's constraints are the box ``r / k``, so with ``F(s)`` the
    distance to the set's slice of sum s (convex, :mod:`topkbench.prox.topk`) the solution is
    that knapsack's where ``F'(r) = -t_r - P_r / k <= 0`` (``t_r`` its threshold, ``P_r =
    sum_j (z_j - t_r - r/k)_+``), and the top-k cone's projection (whose sum is then below
    r) elsewhere; the test reads only the knapsack's few largest entries."""
    r = torch.as_tensor(r, dtype=z.dtype, device=z.device).expand(z.shape[0])
    t_r, c_r = capped_simplex(z, r / k, r, force_sum=True)
    excess = (z - t_r[:, None] - c_r[:, None]).clamp_min(0.0).sum(dim=1)
    on_face = t_r + excess / k >= 0
    if bool(on_face.all()):
        return t_r, c_r, t_r, r
    t_c, c_c = topk_cone(z, k)
    t = torch.where(on_face, t_r, t_c)
    c = torch.where(on_face, c_r, c_c)
    guard = torch.where(on_face, t_r, torch.minimum(t_r, t_c))
    return t, c, guard, torch.where(on_face, r, k * c_c)


def dk_set(z: torch.Tensor, k: int, r):
    """Thresholds ``(t, c, guard, s)`` of the projection of each row of ``z`` onto D_k(r) =
    ``{p >= 0, <1, p> <= r, p_j <= r / k, (k - 1) p_j <= <1, p>}`` (the conjugate domain of the
    top-k hinge alpha as printed), by DESIGN §4.1's three primitives, row by row: (i)
    Delta_k^beta(r) where its solution meets the top-(k - 1) cone (or k <= 2); (ii) else the
    top-(k - 1) cone where its solution meets the box and the radius; (iii) else the knapsack
    with box ``r / k`` and sum ``(k - 1) r / k``.  ``guard`` is the smallest threshold of the
    solutions it chose between (the module docstring's test), ``s`` the sum of p as the chosen
    solution defines it (r where step (i)'s radius binds, ``(k - 1) c`` on the cone, ``(k - 1)
    r / k`` on step (iii); NaN where ``t = 0``), as :func:`topk_simplex` returns them.

    Step (ii)'s cone solution is the answer iff its sum ``s*`` is at most ``(k - 1) r / k``
    (then its largest entry ``s* / (k - 1)`` is within the box and its sum within r); with
    ``F(s)`` the distance to the cone's slice of sum s (convex), that is ``F'((k - 1) r / k)
    = -t_3 - P_3 / (k - 1) >= 0`` at the knapsack of step (iii) (box ``r / k``, sum ``(k - 1) r
    / k``: the cone's slice there), so the unbounded cone is projected only where it is the
    answer."""
    r = torch.as_tensor(r, dtype=z.dtype, device=z.device).expand(z.shape[0])
    t, c = capped_simplex(z, r / k, r)
    s = torch.where(t > 0, r, torch.nan)
    if k <= 2:
        return t, c, t, s
    p = torch.minimum((z - t[:, None]).clamp_min(0.0), c[:, None])
    done = (k - 1) * p.amax(dim=1) <= p.sum(dim=1) * (1 + 1e-12)
    t3, c3 = capped_simplex(z, r / k, (k - 1) * r / k, force_sum=True)
    s3 = (k - 1) * r / k
    excess = (z - t3[:, None] - c3[:, None]).clamp_min(0.0).sum(dim=1)
    cone = ~done & (t3 + excess / (k - 1) <= 0)
    guard = torch.where(done, t, torch.minimum(t, t3))
    if bool(cone.any()):
        t2, c2 = topk_cone(z, k - 1)
        t3 = torch.where(cone, t2, t3)
        c3 = torch.where(cone, c2, c3)
        s3 = torch.where(cone, (k - 1) * c2, s3)
        guard = torch.where(cone, torch.minimum(guard, t2), guard)
    return (torch.where(done, t, t3), torch.where(done, c, c3), guard,
            torch.where(done, s, s3))  # fmt: skip


def bipartite(b: torch.Tensor, bbar: torch.Tensor, r):
    """Thresholds ``(t, s)`` of the projection of each row's ``(b, bbar)`` onto the bipartite
    simplex B(r) = ``{x, y >= 0, <1, x> = <1, y> <= r}``: ``x = (b - t)_+``, ``y = (bbar -
    s)_+`` (TPAMI 002 eq. (17); the KKT conditions in :mod:`topkbench.prox.bipartite`).  Entries
    outside a row's blocks must hold values that stay inactive (below ``max b - r`` and
    ``-max bbar`` in b, below ``max bbar - r`` and ``-max b`` in bbar).

    With the radius active the blocks are two knapsacks of sum r, which is the solution iff
    their thresholds have ``t + s >= 0``; otherwise ``s = -t`` at the root of the decreasing
    ``g(t) = <1, (b - t)_+> - <1, (bbar + t)_+>``, found from its values at the breakpoints
    ``b_j`` and ``-bbar_j`` and interpolated on the piece that brackets it."""
    t1, _ = capped_simplex(b, float("inf"), r, force_sum=True)
    s1, _ = capped_simplex(bbar, float("inf"), r, force_sum=True)
    active = t1 + s1 >= 0
    asc_b, _ = torch.sort(b, dim=1)
    asc_y, _ = torch.sort(bbar, dim=1)
    pre_b, pre_y = _prefix(asc_b), _prefix(asc_y)
    points, _ = torch.sort(torch.cat([b, -bbar], dim=1), dim=1)
    t2 = _root(points, _excess(asc_b, pre_b, points) - _excess(asc_y, pre_y, -points))
    return torch.where(active, t1, t2), torch.where(active, s1, -t2)


def least_norm_top(z: torch.Tensor, slots: int, cap: float, positive_only: bool) -> torch.Tensor:
    """The least-norm maximizer of ``<z, p>`` over ``{0 <= p <= cap, <1, p> <= slots cap}``
    (``positive_only``: the entries <= 0 get nothing) or with the sum ``slots cap`` reached
    whatever the signs, row by row: ``cap`` on the entries above the ``slots``-th largest, the
    rest of the mass shared evenly by the entries equal to it, 0 elsewhere.  It is the limit of
    the projection of ``z / gamma`` as gamma -> 0, the smoothed hinges' gradient at gamma = 0,
    where the linear program's optimal face is that one (SVM^Multi: ``slots = 1``; beta and
    pseudo alpha: ``slots = k``, ``cap = 1/k``; alpha as printed: k or k - 1 slots)."""
    slots = min(slots, z.shape[1])
    bound = torch.topk(z, slots, dim=1).values[:, slots - 1 : slots]
    above = z > bound
    tied = z == bound
    if positive_only:
        above = above & (z > 0)
        tied = tied & (z > 0)
    n_above = above.sum(dim=1, keepdim=True).to(z.dtype)
    n_tied = tied.sum(dim=1, keepdim=True).to(z.dtype).clamp_min(1.0)
    share = torch.clamp((slots - n_above) * cap / n_tied, 0.0, cap)
    return torch.where(above, cap, torch.where(tied, share, 0.0))


__all__ = [
    "bipartite",
    "capped_simplex",
    "dk_set",
    "least_norm_top",
    "topk_cone",
    "topk_simplex",
]
