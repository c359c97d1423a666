"""Kato & Hirohashi's weighted top-k hinge under autograd (papers/004 §4 eq. (8), smoothed by
eq. (25)), batched in torch operations, for :mod:`topkbench.torch.losses`.

With ``c = 1 - e_y + s - s_y 1`` (all m coordinates, ``c_y = 0``) and non-increasing rank
weights ``rho`` (zero-padded to length m, ``R = sum rho``), the loss is ``max{0, sum_r rho_r
c_[r]}``.  Smoothed, it is ``max_{x in D} <x, z> - gamma/2 (||x||^2 + <1, x>^2)`` on the
off-label margins ``z``, with D the off-label part of ``conv({0} u P(rho))``; its maximizer is
``x = argmin_{x in D} ||x - b||^2 + <1, x>^2`` at ``b = z / gamma`` (the block update of
:mod:`topkbench.prox.permutahedron`, whose docstring derives what follows) and its gradient
is ``x`` on the off-label classes, ``-<1, x>`` at the label.

**The projection** (:func:`wtopk_projection`).  For theta in [0, 1] put the label's target
``theta R`` among the sorted ``b`` (rank ``pos``), ``d = w_sorted - theta rho`` and ``v`` the
non-increasing isotonic regression of ``d``; then ``g'(theta) / 2 = R v_pos - <rho, v>`` is
non-decreasing and piecewise affine, and its root theta* gives ``p = theta* rho + d - v`` in
sorted order.  The root is found by regula falsi on a bracket (:func:`_root`, exact once the
bracket lies on the root's piece, as the numba kernel's Newton step): every row at once, no
loop over rows.

**The isotonic regression in O(K m)** (:func:`isotonic_nonincreasing`).  ``v_i = min_{j <= i}
max_{l >= i} A(j, l)``, with A the mean of ``d_j .. d_l``.  Since ``w`` is sorted and ``rho``
is zero beyond its K-th entry, ``d_i >= d_{i+1}`` for every ``i >= K``: a pool of the
regression holds a violated pair, so it starts at a rank below K, and for ``j >= K`` the
inner maximum is ``A(j, i) >= d_i``, equal at ``j = i``.  Hence ``v_i = min(min_{j < min(i+1,
K)} max_{l >= i} A(j, l), d_i [i >= K])``: K suffix maxima of m means per row.

**gamma = 0.**  The value is the sorted sum; the gradient is the limit of the smoothed ones,
the maximizer of ``<p, c>`` over P(rho) with the least ``||p - R e_y||`` (``v = p - R e_y``
is the gradient and ``<1, p> = R``): within each group of tied margins the weights of its
ranks are shared evenly, except in the label's group (tied at 0), where the label takes the
group's largest weight (the projection of ``R e_y`` onto the group's permutahedron) and the
others share the rest; where the sum is <= 0 (to the rounding of its terms) the gradient is 0
(the zero vertex).
"""

from __future__ import annotations

import torch

BISECTIONS = 64  # halvings of theta's bracket at most (every other step of the root search)
ROUNDING = 8 * 2.0**-52  # a weighted sum this small relative to its terms' is zero
CHUNK_ENTRIES = 1 << 22  # rows per pass of the regression: rows x K x m means at most this


class _Grid:
    """What every isotonic regression of one projection shares (rows of m entries, pools
    starting below rank K): the counts ``l - j + 1`` of the means, the pairs ``l < j`` that
    are no mean, and the ranks at or beyond K; built once per projection."""

    def __init__(self, m: int, K: int, dtype, device):
        self.J = max(1, min(K, m))
        i = torch.arange(m, device=device)
        j = torch.arange(self.J, device=device)
        self.count = (i[None, :] - j[:, None] + 1).clamp_min(1).to(dtype)[None]
        self.before = (i[None, :] < j[:, None])[None]
        self.tail = i[None, :] >= self.J
        self.rank = i[None, :]
        self.rows = max(1, CHUNK_ENTRIES // (self.J * m))


def isotonic_nonincreasing(d: torch.Tensor, grid: _Grid) -> torch.Tensor:
    """The non-increasing isotonic regression (least squares) of each row of ``d`` (B x m),
    whose only violated pairs ``d_i < d_{i+1}`` have ``i < K`` (module docstring)."""
    out = torch.empty_like(d)
    J = grid.J
    for a in range(0, d.shape[0], grid.rows):
        dd = d[a : a + grid.rows]
        S = torch.cumsum(dd, dim=1)
        before = torch.cat([torch.zeros_like(S[:, :1]), S[:, : J - 1]], dim=1)  # S_{j-1}
        A = ((S[:, None, :] - before[:, :, None]) / grid.count).masked_fill(grid.before, -torch.inf)
        suffix = torch.flip(torch.cummax(torch.flip(A, [2]), dim=2).values, [2])
        v = suffix.masked_fill(grid.before, torch.inf).min(dim=1).values
        out[a : a + grid.rows] = torch.where(grid.tail, torch.minimum(v, dd), v)
    return out


def _sorted_targets(bs: torch.Tensor, theta: torch.Tensor, R: float, i: torch.Tensor):
    """``w`` (B x m): the sorted ``bs`` (B x n) with the label's ``theta R`` put in its rank
    ``pos`` (B), and ``pos``; ``i`` the ranks 0 .. n (1 x m)."""
    B, n = bs.shape
    t = theta[:, None] * R
    pos = (bs > t).sum(dim=1)
    left = bs.gather(1, i.clamp(max=n - 1).expand(B, -1))
    right = bs.gather(1, (i - 1).clamp(min=0).expand(B, -1))
    w = torch.where(i < pos[:, None], left, torch.where(i == pos[:, None], t, right))
    return w, pos


def _slope(bs, theta, rho, R, grid):
    """``g'(theta) / 2`` per row, the size of its terms, ``d``, ``v`` and ``pos`` (module
    docstring)."""
    w, pos = _sorted_targets(bs, theta, R, grid.rank)
    d = w - theta[:, None] * rho[None, :]
    v = isotonic_nonincreasing(d, grid)
    at = R * v.gather(1, pos[:, None])[:, 0]
    weighted = rho[None, :] * v
    size = at.abs() + weighted.abs().sum(dim=1)
    return at - weighted.sum(dim=1), size, d, v, pos


def _root(bs, rho, R, grid, g_lo, g_hi, open_):
    """The root of the non-decreasing, piecewise-affine g' in (0, 1) for the rows ``open_``
    (g'(0) < 0 < g'(1)): regula falsi on the bracket, exact once both ends lie on the root's
    affine piece (with the Illinois halving against a stuck end), alternating with bisection,
    which also finds a root where g' jumps (the label's target crossing tied entries); each
    iteration evaluates only the rows still open, until g' vanishes to the rounding of its
    terms or the bracket to theta's (:data:`BISECTIONS` halvings at most)."""
    lo, hi = torch.zeros_like(g_lo), torch.ones_like(g_hi)
    theta = torch.full_like(g_lo, 0.5)
    side = torch.zeros_like(g_lo)  # +1: hi moved last, -1: lo moved last
    rows = torch.nonzero(open_)[:, 0]
    for it in range(2 * BISECTIONS):
        if rows.numel() == 0:
            break
        a, b_, ga, gb = lo[rows], hi[rows], g_lo[rows], g_hi[rows]
        secant = a - ga * (b_ - a) / (gb - ga)
        mid = 0.5 * (a + b_)
        ok = torch.isfinite(secant) & (secant > a) & (secant < b_)
        cand = mid if it % 2 else torch.where(ok, secant, mid)
        half, size, *_ = _slope(bs[rows], cand, rho, R, grid)
        theta[rows] = cand
        done = (half.abs() <= 1e-14 * size) | (b_ - a <= 4e-16)
        up = half > 0.0
        s = side[rows]
        move_hi, move_lo = up & ~done, ~up & ~done
        lo[rows] = torch.where(move_lo, cand, a)
        hi[rows] = torch.where(move_hi, cand, b_)
        g_lo[rows] = torch.where(move_lo, half, torch.where(move_hi & (s > 0), 0.5 * ga, ga))
        g_hi[rows] = torch.where(move_hi, half, torch.where(move_lo & (s < 0), 0.5 * gb, gb))
        side[rows] = torch.where(move_hi, 1.0, torch.where(move_lo, -1.0, s))
        rows = rows[~done]
    return theta


def wtopk_projection(b: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """``x = argmin_{x in D} ||x - b||^2 + <1, x>^2`` for each row of ``b`` (B x (m - 1)),
    D the off-label part of ``conv({0} u P(rho))``, ``rho`` (m) non-increasing, >= 0."""
    B, n = b.shape
    R = float(rho.sum())
    K = int((rho > 0).sum())
    bs, order = torch.sort(b, dim=1, descending=True)
    zero = torch.zeros(B, dtype=b.dtype, device=b.device)
    one = torch.ones_like(zero)
    grid = _Grid(n + 1, K, b.dtype, b.device)
    start = _slope(bs, zero, rho, R, grid)[0]
    end = _slope(bs, one, rho, R, grid)[0]
    theta = torch.where(end <= 0.0, one, zero)
    open_ = (start < 0.0) & (end > 0.0)
    if bool(open_.any()):
        theta = torch.where(open_, _root(bs, rho, R, grid, start, end, open_), theta)
    _, _, d, v, pos = _slope(bs, theta, rho, R, grid)
    top = theta[:, None] * rho[0]
    p = (theta[:, None] * rho[None, :] + (d - v)).clamp_min(0.0)
    p = torch.minimum(p, top)
    # sorted rank i holds b's entry order[i] above the label, order[i - 1] below it
    i = grid.rank
    src = torch.where(i < pos[:, None], i, i - 1).clamp(0, n - 1)
    keep = i != pos[:, None]
    x = torch.zeros_like(b)
    x.scatter_(1, order.gather(1, src)[keep].view(B, n), p[keep].view(B, n))
    return torch.where((start < 0.0)[:, None], x, torch.zeros_like(x))


def wtopk_limit(c: torch.Tensor, y: torch.Tensor, rho: torch.Tensor) -> tuple:
    """Value and gradient in the scores at gamma = 0 from the margins ``c`` (B x m, ``c_y =
    0``): module docstring."""
    B, m = c.shape
    cs, order = torch.sort(c, dim=1, descending=True, stable=True)
    total = (cs * rho[None, :]).sum(dim=1)
    group = torch.cat(
        [torch.zeros_like(cs[:, :1], dtype=torch.long), torch.cumsum(cs[:, 1:] != cs[:, :-1], 1)],
        dim=1,
    )
    rhos = rho[None, :].expand(B, m)
    sums = torch.zeros_like(cs).scatter_add_(1, group, rhos)
    counts = torch.zeros_like(cs).scatter_add_(1, group, torch.ones_like(cs))
    first = torch.full_like(cs, -1.0).scatter_reduce_(1, group, rhos, "amax")
    is_label = order == y[:, None]
    label_group = group.gather(1, is_label.long().argmax(dim=1, keepdim=True))
    in_label_group = group == label_group
    g_sum, g_cnt, g_first = (t.gather(1, group) for t in (sums, counts, first))
    shared = torch.where(
        in_label_group,
        (g_sum - g_first) / (g_cnt - 1).clamp_min(1),
        g_sum / g_cnt,
    )
    p_sorted = torch.where(is_label, g_first, shared)
    p = torch.zeros_like(c).scatter_(1, order, p_sorted)
    # a sum that is 0 up to its rounding is 0 (the zero vertex): its sign is noise
    size = (cs * rho[None, :]).abs().sum(dim=1)
    p = torch.where((total > ROUNDING * size)[:, None], p, torch.zeros_like(p))
    rows = torch.arange(B, device=c.device)
    G = p.clone()
    G[rows, y] = 0.0
    G[rows, y] = -G.sum(dim=1)
    return total.clamp_min(0.0), G
