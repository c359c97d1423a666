"""Batched projections for ``topkbench bench projections`` (TPAMI 002 §5, Fig. 3a): one call
projects every row of a batch, so the timing holds no Python call overhead per problem.

Sets (``PROJ_*``), all with radius r (DESIGN §4; ``topkbench.prox.topk``):
the simplex ``{x >= 0, <1,x> = r}`` by Kiwiel's variable fixing (``projections``, the paper's
"Delta"), the top-k simplex Delta_k^alpha(r), Delta_k^beta(r), D_k(r) (sort + sweep), and the
top-k entropic prox of TPAMI Prop. 15 (``topk_entropy``, at ``alpha = r``), and the weighted
top-k hinge's biased projection (``permutahedron``; exp rank weights on the first k of
m = d + 1 classes, the SDCA update of ``wtopk_svm``).  Each problem
computes its thresholds and applies them (writes x), as an SDCA update does.

numba's disk cache sees edits in this file only: ``make clean-cache`` after editing a kernel
these call.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from topkbench.losses.topk_entropy import topk_ent_prox
from topkbench.prox.permutahedron import wtopk_biased_projection
from topkbench.prox.projections import apply_threshold, simplex_threshold
from topkbench.prox.topk import (
    SET_ALPHA,
    SET_BETA,
    SET_DK,
    apply_box_threshold,
    topk_threshold,
)

PROJ_SIMPLEX = 0
PROJ_ALPHA = 1
PROJ_BETA = 2
PROJ_DK = 3
PROJ_TOPK_ENT = 4
PROJ_WTOPK = 5


@njit(cache=True)
def project_rows(kind, data, k, r, out):
    """Project every row of ``data`` onto the set ``kind`` (module docstring), writing the
    rows of ``out``; returns the sum of all coordinates of ``out`` (a checksum that keeps the
    work observable)."""
    n, d = data.shape
    idx = np.empty(d, dtype=np.int64)
    work = np.empty(d)
    vals = np.empty(d)
    ex = np.empty(d)
    tmp = np.empty(d)
    pos = np.empty(d)
    # the weighted top-k set's exp rank weights (Kato §7.3) and scratch, only where used
    dw = d + 1 if kind == PROJ_WTOPK else 1
    rho = np.zeros(dw)
    for j in range(min(k, dw)):
        rho[j] = math.exp(-(j + 1) / k)
    rho /= rho.sum()
    order = np.empty(dw, dtype=np.int64)
    cnt = np.empty(dw, dtype=np.int64)
    f1, f2, f3, f4 = np.empty(dw), np.empty(dw), np.empty(dw), np.empty(dw)
    total = 0.0
    for i in range(n):
        b = data[i]
        x = out[i]
        if kind == PROJ_SIMPLEX:
            t = simplex_threshold(b, r, idx)
            total += apply_threshold(b, t, x)
        elif kind == PROJ_WTOPK:
            wtopk_biased_projection(b, rho, r, x, order, f1, f2, f3, f4, cnt)
            for j in range(d):
                total += x[j]
        elif kind == PROJ_TOPK_ENT:
            topk_ent_prox(b, r, k, x, vals, work, idx, ex, tmp, pos, math.nan)
            for j in range(d):
                total += x[j]
        else:
            s = SET_ALPHA if kind == PROJ_ALPHA else (SET_BETA if kind == PROJ_BETA else SET_DK)
            t, c, _ = topk_threshold(s, b, k, 0.0, r, work)
            total += apply_box_threshold(b, t, c, x)
    return total
