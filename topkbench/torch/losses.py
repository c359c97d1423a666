"""The registry's losses under autograd: value and exact (sub)gradient per example, batched.

Every loss is the per-example ``L(y, s)`` of DESIGN §2-3, the scale the numba kernels use
(:mod:`topkbench.losses.dispatch`), on scores ``s`` (B x m).  A loss and its gradient are
computed together in torch operations, without a loop over examples, and handed to autograd
as one function whose backward multiplies the stored gradient (:class:`_ExactLoss`):

* the smoothed hinges (gamma > 0, TPAMI Prop. 2) are ``L = max_{p in set} <z, p> - gamma/2
  ||p||^2`` on the off-label margins ``z = 1 + s^{\\y} - s_y`` (SVM^Multi: the unit simplex;
  top-k SVM^alpha: D_k; its pseudo form: Delta_k^alpha; top-k SVM^beta: Delta_k^beta), so
  ``p`` is the
  projection of ``z`` onto the set of radius gamma divided by gamma
  (:mod:`topkbench.torch.projections`), the gradient is ``p`` on the margins and ``-<1, p>``
  at the label, and the value is written in the projection's thresholds (``p = clip(z - t, 0,
  c)``: ``<z, p> - ||p||^2 / 2 = ||p||^2 / 2 + t <1, p> + c sum_j (z_j - t - c)_+``, exact
  for tiny gamma, as :func:`topkbench.losses.topk_hinge._hinge_loss` writes it);
* at gamma = 0 the value is the loss's closed form and the gradient the limit of the smoothed
  ones as gamma -> 0: the least-norm maximizer of ``<z, p>`` over the set (ties share the
  mass evenly);
* SVM^ML_gamma projects onto the bipartite simplex (:func:`_svm_ml`);
* top-k Ent takes the closed form of each candidate capped set (:func:`_topk_ent`);
* SVM^OVA_gamma, LR^OVA, LR^Multi, LR^ML and top-k Ent_tr have closed forms.

The projections of the smoothed hinges are computed in float64 and returned in the scores'
dtype; the other losses are evaluated in the scores' dtype (their log-domain forms are stable
in float32).
"""

from __future__ import annotations

import math
import numbers

import torch

from topkbench.losses.registry import METHODS, get_method
from topkbench.torch import projections as proj

REDUCTIONS = ("mean", "sum", "none")
# the smoothed hinges' projections start on each row's 2 k + PRESELECT_EXTRA largest margins
# (:func:`_smoothed_hinge`; torch.topk's cost grows with the entries kept)
PRESELECT_EXTRA = 2


class _ExactLoss(torch.autograd.Function):
    """Per-example losses whose gradient in the scores was computed with them: backward
    scales it by the incoming gradient (first derivatives only: a second backward raises)."""

    @staticmethod
    def forward(ctx, scores, values, grad):
        ctx.save_for_backward(grad)
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return upstream[:, None] * grad, None, None


def _off_label_index(y, m):
    """The columns of each row's m - 1 off-label classes, in order (B x (m - 1))."""
    j = torch.arange(m - 1, device=y.device)[None, :]
    return j + (j >= y[:, None])


def _off_margins(s, y):
    """The off-label margins ``z = 1 + s_j - s_y`` (B x (m - 1)) and their columns."""
    idx = _off_label_index(y, s.shape[1])
    return 1.0 + s.gather(1, idx) - s.gather(1, y[:, None]), idx


def _on_scores(p, idx, y, m):
    """The gradient in the scores of a function of the off-label margins with gradient ``p``
    there: ``p`` on the off-label classes, ``-<1, p>`` at the label."""
    G = torch.zeros((p.shape[0], m), dtype=p.dtype, device=p.device)
    G.scatter_(1, idx, p)
    G[torch.arange(p.shape[0], device=p.device), y] = -p.sum(dim=1)
    return G


def _smoothed_hinge(solve, s, y, q: int, gamma: float):
    """Value and gradient of ``max_{p in set(gamma)} (<z, p> - ||p||^2 / 2) / gamma`` on the
    off-label margins ``z = 1 + s_j - s_y``, with ``solve`` giving the thresholds of the
    projection onto the set of radius gamma, ``p = clip(z - t, 0, c)`` (module docstring).

    Each row is solved on its q largest margins, taken from the scores in their own dtype (the
    order is the margins') and only then in float64, where that is exact (the test of
    :mod:`topkbench.torch.projections`), else again on 4 q, up to all m - 1; p is zero below
    t, so the value and the gradient only need the margins kept."""
    B, m = s.shape
    rows_all = torch.arange(B, device=s.device)
    masked = s.clone()
    masked[rows_all, y] = -math.inf
    sy = s[rows_all, y].to(torch.float64)
    value = torch.empty(B, dtype=torch.float64, device=s.device)
    G = torch.zeros((B, m), dtype=torch.float64, device=s.device)
    rows = rows_all
    while rows.numel():
        q = min(q, m - 1)
        sub = masked if rows.numel() == B else masked[rows]
        top, cols = torch.topk(sub, q, dim=1)
        z = 1.0 + top.to(torch.float64) - sy[rows, None]
        t, c, guard, total = solve(z)
        ok = guard >= z[:, -1] if q < m - 1 else torch.ones_like(t, dtype=torch.bool)
        z, t, c, cols, done = z[ok], t[ok, None], c[ok, None], cols[ok], rows[ok]
        p = torch.minimum((z - t).clamp_min(0.0), c)
        # <1, p> as the solution defines it where known (r, k c, ...): t times the rounded
        # sum would carry |t| ulp(z) / gamma, which is large for large margins
        total = total[ok]
        total = torch.where(torch.isnan(total), p.sum(dim=1), total)
        finite = torch.isfinite(c[:, 0])
        over = torch.where(finite[:, None], (z - t - c).clamp_min(0.0), 0.0)
        capped = torch.where(finite, c[:, 0] * over.sum(dim=1), 0.0)
        value[done] = (0.5 * (p * p).sum(dim=1) + t[:, 0] * total + capped) / gamma
        if done.numel() == B:  # every row at once (the usual case): in place
            G.scatter_(1, cols, p / gamma)
        else:
            G[done] = G[done].scatter(1, cols, p / gamma)
        G[done, y[done]] = -p.sum(dim=1) / gamma
        rows = rows[~ok]
        q *= 4
    return value, G


def _hinge(name, s, y, k, gamma):
    """SVM^Multi and the top-k hinges (pseudo alpha, beta): module docstring."""
    m = s.shape[1]
    if gamma > 0.0:
        if name == "svm_multi":
            solve = lambda v: proj.knapsack(v, math.inf, gamma)  # noqa: E731
        elif name == "topk_svm_beta":
            solve = lambda v: proj.knapsack(v, gamma / k, gamma)  # noqa: E731
        elif name == "topk_svm_alpha":
            solve = lambda v: proj.dk_set(v, k, gamma)  # noqa: E731
        else:
            solve = lambda v: proj.topk_simplex(v, k, gamma)  # noqa: E731
        return _smoothed_hinge(solve, s, y, PRESELECT_EXTRA + 2 * k, gamma)
    z, idx = _off_margins(s, y)
    top, _ = torch.topk(z, min(k, z.shape[1]), dim=1)
    T_k = top.sum(dim=1)
    if name == "svm_multi":
        value = top[:, 0].clamp_min(0.0)
        p = proj.least_norm_top(z, 1, 1.0, positive_only=True)
    elif name == "topk_svm_beta":
        value = top.clamp_min(0.0).sum(dim=1) / k
        p = proj.least_norm_top(z, k, 1.0 / k, positive_only=True)
    elif name == "topk_svm_alpha":
        # (1/k) max{0, T_{k-1}, T_k}: the k largest where z_[k] > 0, else the k - 1 largest
        # (every sign) where T_{k-1} > 0, else nothing
        T_k1 = T_k - top[:, -1]
        value = torch.maximum(T_k, T_k1).clamp_min(0.0) / k
        full = proj.least_norm_top(z, k, 1.0 / k, positive_only=True)
        head = proj.least_norm_top(z, k - 1, 1.0 / k, positive_only=False) if k > 1 else 0 * z
        p = torch.where((top[:, -1] > 0)[:, None], full,
                        torch.where((T_k1 > 0)[:, None], head, 0.0))  # fmt: skip
    else:
        value = T_k.clamp_min(0.0) / k
        p = proj.least_norm_top(z, k, 1.0 / k, positive_only=False)
        p = torch.where((T_k > 0)[:, None], p, 0.0)
    return value, _on_scores(p, idx, y, m)


def _topk_ent(s, y, k):
    """Top-k Ent (TPAMI Prop. 4 / 17): ``L(a) = max_{x in Delta_k^alpha} <a, x> - <x, log x> -
    (1 - s) log(1 - s)`` on ``a = s^{\\y} - s_y``; the maximizer, which is the gradient, is
    ``x_j = exp(min(a_j - t, log(s/k)))``.  Every candidate number ``u`` of capped entries
    (the u largest) has a closed form in the log domain (:func:`topkbench.losses.topk_entropy.
    topk_ent_solve_sorted`, whose choice this mirrors: the first u consistent with its
    partition to 1e-10, else the least inconsistent, or all capped when ``m - 1 = k``);
    all of them are evaluated at once from the k largest margins' prefix sums and the
    log-sum-exps of the rest."""
    z, idx = _off_margins(s, y)
    a = z - 1.0
    B, n = a.shape
    U = min(k, n)
    v, order = torch.topk(a, U, dim=1)  # the k largest, descending
    u = torch.arange(U, dtype=s.dtype, device=s.device)
    head = proj._prefix(v)[:, :U]  # sums of the u largest
    # log-sum-exp of all but the u largest, each by its own pass (no cancellation)
    rest = a.clone()
    log_z = torch.empty((B, U), dtype=s.dtype, device=s.device)
    for j in range(U):
        log_z[:, j] = torch.logsumexp(rest, dim=1)
        rest.scatter_(1, order[:, j : j + 1], -math.inf)
    rho = u / k
    om = 1.0 - rho
    A = head / k
    om_log_om = torch.where(u > 0, om * torch.log(om), 0.0)
    log_q = -rho * math.log(k) - om * log_z - A + om_log_om
    sp_q = torch.nn.functional.softplus(log_q)
    t = log_z + sp_q - torch.log(om)
    log_cap = -sp_q - math.log(k)
    viol = v[:, :U] - t - log_cap
    prev = torch.cat([torch.full_like(v[:, :1], math.inf), v[:, : U - 1]], dim=1)
    viol = torch.where(u > 0, torch.maximum(viol, log_cap - (prev - t)), viol)
    s_frac = torch.sigmoid(-log_q)
    log1ms = -torch.nn.functional.softplus(-log_q)
    capped_loss = s_frac * (A + om * t - rho * log_cap) - torch.exp(log1ms) * log1ms
    cand_loss = torch.where(u > 0, capped_loss, torch.nn.functional.softplus(log_z))
    consistent = viol <= 1e-10 * (1.0 + t.abs())
    first = torch.where(consistent.any(dim=1), consistent.to(torch.int8).argmax(dim=1),
                        viol.argmin(dim=1))[:, None]  # fmt: skip
    value = cand_loss.gather(1, first)[:, 0]
    t_c, cap_c = t.gather(1, first)[:, 0], log_cap.gather(1, first)[:, 0]
    if n == k:  # every coordinate capped: x = (s/k) 1, s = sigmoid(A + log k)
        all_capped = ~consistent.any(dim=1)
        zk = a.sum(dim=1) / k + math.log(k)
        cap_all = torch.nn.functional.logsigmoid(zk) - math.log(k)
        value = torch.where(all_capped, torch.nn.functional.softplus(zk), value)
        t_c = torch.where(all_capped, v[:, -1] - cap_all, t_c)
        cap_c = torch.where(all_capped, cap_all, cap_c)
    x = torch.exp(torch.minimum(a - t_c[:, None], cap_c[:, None]))
    return value, _on_scores(x, idx, y, s.shape[1])


def _svm_ova(s, y, gamma):
    """``sum_c l_gamma(1 - yt_c s_c)``, ``l_0(r) = r_+``, ``l_gamma`` its Huber smoothing."""
    sign = -torch.ones_like(s)
    sign[torch.arange(s.shape[0], device=s.device), y] = 1.0
    r = 1.0 - sign * s
    if gamma == 0.0:
        return r.clamp_min(0.0).sum(dim=1), -sign * (r > 0).to(s.dtype)
    quad = r * r / (2.0 * gamma)
    lin = r - 0.5 * gamma
    value = torch.where(r >= gamma, lin, torch.where(r > 0, quad, 0.0)).sum(dim=1)
    return value, -sign * (r / gamma).clamp(0.0, 1.0)


def _lr_ova(s, y):
    """``sum_c log(1 + exp(-yt_c s_c))``."""
    sign = -torch.ones_like(s)
    sign[torch.arange(s.shape[0], device=s.device), y] = 1.0
    u = -sign * s
    return torch.nn.functional.softplus(u).sum(dim=1), -sign * torch.sigmoid(u)


def _lr_multi(s, y):
    """``log sum_j exp(s_j) - s_y``."""
    lse = torch.logsumexp(s, dim=1)
    G = torch.softmax(s, dim=1)
    G[torch.arange(s.shape[0], device=s.device), y] -= 1.0
    return lse - s.gather(1, y[:, None])[:, 0], G


def _topk_ent_tr(s, y, k):
    """``log(1 + sum_{j in J} exp(s_j - s_y))``, J the off-label classes but the k - 1
    largest (ties: the lower class index counts as larger, as in
    :func:`topkbench.solvers.ent_tr.ent_tr_loss_and_grad`); ``mu = max(0, max_J a_j)``
    keeps the exponentials in range."""
    B, m = s.shape
    rows = torch.arange(B, device=s.device)
    a = s - s.gather(1, y[:, None])
    a[rows, y] = -math.inf
    if k > 1:
        # drop the k - 1 largest: those above the (k-1)-th value, then the first of the tied
        bound = torch.topk(a, k - 1, dim=1).values[:, -1:]
        tied = a == bound
        room = (k - 1) - (a > bound).sum(dim=1, keepdim=True)
        drop = (a > bound) | (tied & (torch.cumsum(tied, dim=1) <= room))
        a = a.masked_fill(drop, -math.inf)
    mu = a.amax(dim=1).clamp_min(0.0)
    ex = torch.exp(a - mu[:, None])
    Z = torch.exp(-mu) + ex.sum(dim=1)
    G = ex / Z[:, None]
    G[rows, y] = -G.sum(dim=1)
    return mu + torch.log(Z), G


def _svm_ml(s, Y, gamma):
    """SVM^ML_gamma (TPAMI Props. 5-6, smoothed over all m coordinates): ``L = max_{(p, pbar)
    in B(gamma)} (<b, p> - ||p||^2/2 + <bbar, pbar> - ||pbar||^2/2) / gamma`` with ``b = 1/2 -
    s_Y`` and ``bbar = 1/2 + s_Ybar`` (:func:`~topkbench.torch.projections.bipartite`),
    written as ``((t + s) <1, p> + (||p||^2 + ||pbar||^2)/2) / gamma`` in its thresholds as
    :func:`topkbench.losses.multilabel.loss_value_ml` does; the gradient is ``-p / gamma`` on
    Y and ``pbar / gamma`` off it.  gamma = 0: ``max{0, 1 + max_Ybar s - min_Y s}``, the
    gradient -1 and +1 shared by the arguments of the min and the max where it is positive.
    0 (gradient 0) where Y is empty or complete."""
    if gamma > 0.0:
        # in float64 whatever the scores' precision: a smoothed hinge's gradient is
        # clip(z - t, 0, c) / gamma, which float32 loses once gamma nears ulp(z) (the other
        # hinges convert the margins they keep, _smoothed_hinge)
        s, Y = s.to(torch.float64), Y.to(torch.float64)
    Yb = Y > 0
    count = Yb.sum(dim=1)
    ranks = (count > 0) & (count < s.shape[1])
    big = torch.finfo(s.dtype).max
    lo = torch.where(Yb, s, big).amin(dim=1, keepdim=True)
    hi = torch.where(Yb, -big, s).amax(dim=1, keepdim=True)
    margin = (1.0 + hi - lo)[:, 0]
    if gamma == 0.0:
        value = torch.where(ranks, margin.clamp_min(0.0), 0.0)
        at_min = (Yb & (s == lo)).to(s.dtype)
        at_max = (~Yb & (s == hi)).to(s.dtype)
        G = (at_max / at_max.sum(dim=1, keepdim=True).clamp_min(1.0)
             - at_min / at_min.sum(dim=1, keepdim=True).clamp_min(1.0))  # fmt: skip
        return value, torch.where((ranks & (margin > 0))[:, None], G, 0.0)
    # rows without a ranking constraint get harmless finite blocks (their results are zeroed)
    lo = torch.where(ranks[:, None], lo, 0.0)
    hi = torch.where(ranks[:, None], hi, 0.0)
    max_b, max_y = 0.5 - lo, 0.5 + hi
    b = torch.where(Yb, 0.5 - s, torch.minimum(max_b - gamma, -max_y) - 1.0)
    bbar = torch.where(Yb, torch.minimum(max_y - gamma, -max_b) - 1.0, 0.5 + s)
    t, sb = proj.bipartite(b, bbar, gamma)
    p = torch.where(Yb, (b - t[:, None]).clamp_min(0.0), 0.0)
    pbar = torch.where(Yb, 0.0, (bbar - sb[:, None]).clamp_min(0.0))
    ts = t + sb
    # the common sum is gamma exactly where the radius binds (t + s > 0)
    value = (torch.where(ts > 0, ts * gamma, 0.0)
             + 0.5 * ((p * p).sum(dim=1) + (pbar * pbar).sum(dim=1))) / gamma  # fmt: skip
    value = torch.where(ranks, value.clamp_min(0.0), 0.0)
    return value, torch.where(ranks[:, None], (pbar - p) / gamma, 0.0)


def _lr_ml(s, Y):
    """``log sum_j exp(s_j) - (1/|Y|) sum_Y s_y``; 0 (with gradient 0) where Y is empty or
    holds every class, as in the kernels (no ranking constraint)."""
    count = Y.sum(dim=1)
    ranks = (count > 0) & (count < s.shape[1])
    share = Y / count.clamp_min(1)[:, None]
    value = torch.logsumexp(s, dim=1) - (share * s).sum(dim=1)
    G = torch.softmax(s, dim=1) - share
    return torch.where(ranks, value, 0.0), torch.where(ranks[:, None], G, 0.0)


def _wtopk(s, y, gamma, rho):
    """Kato's weighted top-k hinge (:mod:`topkbench.torch.permutahedron`), in float64."""
    from topkbench.torch.permutahedron import wtopk_limit, wtopk_projection

    B, m = s.shape
    s = s.to(torch.float64)
    weights = torch.zeros(m, dtype=torch.float64, device=s.device)
    weights[: len(rho)] = torch.as_tensor(rho, dtype=torch.float64, device=s.device)
    if gamma == 0.0:
        c = 1.0 + s - s.gather(1, y[:, None])
        c[torch.arange(B, device=s.device), y] = 0.0
        return wtopk_limit(c, y, weights)
    z, idx = _off_margins(s, y)
    x = wtopk_projection(z / gamma, weights)
    total = x.sum(dim=1)
    value = (x * z).sum(dim=1) - 0.5 * gamma * ((x * x).sum(dim=1) + total * total)
    return value.clamp_min(0.0), _on_scores(x, idx, y, m)


AVAILABLE = tuple(METHODS)  # every method of the registry


def _check(method: str, scores, target, k, gamma, reduction, weights="flat"):
    """Validate the arguments (each refusal names the valid range); returns the registry
    name, the target as the losses take it, k, gamma and the rank weights of wtopk_svm."""
    spec = get_method(method)
    name = spec.name
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(f"scores must be a 2-D tensor (batch x classes), got "
                         f"{getattr(scores, 'shape', type(scores).__name__)}")  # fmt: skip
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a floating-point tensor, got {scores.dtype}")
    B, m = scores.shape
    if m < 2:
        raise ValueError(f"scores need at least 2 classes (columns), got {m}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"k must be an integer in [1, {m - 1}], got {k!r}")
    k = int(k)
    if "k" in spec.params:
        if not 1 <= k <= m - 1:
            raise ValueError(f"k must be in [1, {m - 1}] for m = {m} classes, got {k}")
    elif k != 1:
        raise ValueError(f"method {name!r} takes no k (leave k=1), got k={k}")
    gamma = float(gamma)
    if not math.isfinite(gamma) or gamma < 0.0:
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma!r}")
    if gamma > 0.0 and "gamma" not in spec.params:
        raise ValueError(f"method {name!r} has no smoothing (leave gamma=0), got gamma={gamma}")
    if not isinstance(target, torch.Tensor):
        raise ValueError(f"target must be a tensor, got {type(target).__name__}")
    if target.device != scores.device:
        raise ValueError(f"target is on {target.device}, scores on {scores.device}")
    if spec.task == "multilabel":
        if target.shape != (B, m):
            raise ValueError(f"target must be a 0/1 matrix of shape {(B, m)} for a multilabel "
                             f"loss, got {tuple(target.shape)}")  # fmt: skip
        if not bool(((target == 0) | (target == 1)).all()):
            raise ValueError("target of a multilabel loss must hold only 0 and 1")
        target = target.to(scores.dtype)
    else:
        if target.shape != (B,):
            raise ValueError(f"target must hold one class index per row, shape {(B,)}, got "
                             f"{tuple(target.shape)}")  # fmt: skip
        if target.is_floating_point() or target.dtype == torch.bool or target.is_complex():
            raise ValueError(f"target must be an integer tensor of class indices, got "
                             f"{target.dtype}")  # fmt: skip
        if B and not bool(((target >= 0) & (target < m)).all()):
            bad = target[(target < 0) | (target >= m)][0].item()
            raise ValueError(f"target holds class {bad}, outside [0, {m}) for m = {m} classes")
        target = target.long()
    if B and not bool(torch.isfinite(scores).all()):
        raise ValueError("scores hold NaN or infinite entries")
    rho = None
    if "weights" in spec.params:
        from topkbench.solvers.frank_wolfe import weight_vector

        rho = weight_vector(weights, k, m)
    elif not isinstance(weights, str) or weights != "flat":
        raise ValueError(f"weights= is an option of wtopk_svm, not of {name}")
    return name, target, k, gamma, rho


def _values_and_gradient(name, s, target, k, gamma, rho=None):
    if name == "wtopk_svm":
        return _wtopk(s, target, gamma, rho)
    if name == "svm_ova":
        return _svm_ova(s, target, gamma)
    if name == "lr_ova":
        return _lr_ova(s, target)
    if name == "lr_multi":
        return _lr_multi(s, target)
    if name == "topk_ent_tr":
        return _topk_ent_tr(s, target, k)
    if name == "topk_ent":
        return _topk_ent(s, target, k)
    if name == "lr_ml":
        return _lr_ml(s, target)
    if name == "svm_ml":
        return _svm_ml(s, target, gamma)
    return _hinge(name, s, target, k, gamma)


def loss(method: str, scores, target, k: int = 1, gamma: float = 0.0, reduction: str = "mean",
         weights="flat"):  # fmt: skip
    """The loss ``method`` (a registry name or alias, ``topkbench methods``) of ``scores`` (B x
    m) against ``target`` (B class indices, or a B x m 0/1 matrix for a multilabel loss),
    per example in DESIGN's scale, reduced by ``"mean"`` (default), ``"sum"`` or ``"none"``;
    ``weights``: wtopk_svm's rank weights (``flat``, ``linear``, ``exp`` over the k first
    ranks, or a non-increasing sequence), as :func:`topkbench.fit` takes them.
    Differentiable in ``scores`` (first derivatives), on any device and floating dtype."""
    name, target, k, gamma, rho = _check(method, scores, target, k, gamma, reduction, weights)
    with torch.no_grad():
        s = scores.detach()
        if s.dtype in (torch.float16, torch.bfloat16):
            s = s.float()  # margins and exponentials in half precision overflow at 6.5e4
        if target.is_floating_point():
            target = target.to(s.dtype)
        values, grad = _values_and_gradient(name, s, target, k, gamma, rho)
    values = _ExactLoss.apply(scores, values.to(scores.dtype), grad.to(scores.dtype))
    if reduction == "mean":
        return values.mean()
    if reduction == "sum":
        return values.sum()
    return values


class TopKLoss(torch.nn.Module):
    """:func:`loss` as a module: ``TopKLoss("topk_svm_alpha_pseudo", k=5, gamma=1.0)(scores,
    target)``; the arguments are checked when called (k against the scores' classes)."""

    def __init__(self, method: str, k: int = 1, gamma: float = 0.0, reduction: str = "mean",
                 weights="flat"):  # fmt: skip
        super().__init__()
        get_method(method)  # an unknown name fails here, listing the valid ones
        self.method, self.k, self.gamma, self.reduction = method, k, gamma, reduction
        self.weights = weights

    def forward(self, scores, target):
        return loss(self.method, scores, target, self.k, self.gamma, self.reduction,
                    self.weights)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"method={self.method!r}, k={self.k}, gamma={self.gamma}, "
                f"reduction={self.reduction!r}")  # fmt: skip


__all__ = ["AVAILABLE", "TopKLoss", "loss"]
