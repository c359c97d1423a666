"""The SVM^ML block update and smooth loss through the shifted, candidate-filtered projection
(``topkbench.losses.multilabel._ml_projection``) against the plain projection onto B(C) by
sorting (``project_bipartite(..., "sorting")``), on large label spaces with few positives,
labels at either end of the index range, badly scaled scores and arbitrary previous blocks
(the candidates' hint must be a lower bound whatever the previous block is)."""

from __future__ import annotations

import numpy as np
import pytest

from topkbench.losses.ids import LOSS_SVM_ML
from topkbench.losses.multilabel import loss_value_ml, update_block_ml
from topkbench.prox.bipartite import project_bipartite


def _case(rng, m):
    k = int(rng.integers(1, max(2, m // 8)))
    where = rng.integers(3)
    if where == 0:
        labels = np.arange(m - k, m)  # trailing labels: the compaction's end
    elif where == 1:
        labels = np.arange(k)
    else:
        labels = np.sort(rng.choice(m, size=k, replace=False))
    scale = 10.0 ** rng.uniform(-4, 4)
    s = rng.standard_t(3, size=m) * scale + rng.normal() * 1e3 * scale
    return labels.astype(np.int64), s


def _reference_block(labels, s, a, kii, C, gamma):
    m = s.shape[0]
    pos = np.zeros(m, bool)
    pos[labels] = True
    den = kii + gamma / C
    q = s - kii * a
    p, pb = project_bipartite((0.5 - q[pos]) / den, (0.5 + q[~pos]) / den, C, "sorting")
    out = np.zeros(m)
    out[pos] = p
    out[~pos] = -pb
    return out


@pytest.mark.parametrize("m", [40, 300, 1000])
def test_update_matches_the_sorting_projection(m):
    rng = np.random.default_rng(m)
    out, work, vals = np.empty(m), np.empty(m), np.empty(m)
    idx, mask, troots = np.empty(m, np.int64), np.zeros(m, bool), np.zeros(1)
    for trial in range(200):
        labels, s = _case(rng, m)
        C = 10.0 ** rng.uniform(-3, 2)
        kii = 10.0 ** rng.uniform(-6, 2) if trial % 7 else 0.0
        gamma = (0.0, 1e-3, 1.0)[trial % 3]
        if kii == 0.0 and gamma == 0.0:
            continue  # den = 0: the uniform block, a separate branch
        # a previous block with arbitrary negative entries (on Y too: not a dual point, but
        # the hint must not rely on that)
        a = np.zeros(m)
        chosen = rng.choice(m, size=int(rng.integers(0, m + 1)), replace=False)
        a[chosen] = -rng.random(len(chosen)) * C / max(len(chosen), 1)
        update_block_ml(LOSS_SVM_ML, labels, s, a, kii, C, gamma, out, work, vals, idx, troots,
                        0, mask)  # fmt: skip
        ref = _reference_block(labels, s, a, kii, C, gamma)
        # the reference projects the unshifted blocks, whose entries carry rounding of
        # eps |q| / den (the update shifts first and is the more accurate of the two)
        q_noise = np.abs(s - kii * a).max() / (kii + gamma / C) * np.finfo(float).eps
        tol = 1e-9 * (np.abs(ref).max() + C) + 16 * m * q_noise
        np.testing.assert_allclose(out, ref, rtol=0, atol=tol, err_msg=f"trial {trial}")
        assert not mask.any()


@pytest.mark.parametrize("m", [40, 1000])
def test_smooth_loss_matches_the_sorting_projection(m):
    """L_gamma(u) of TPAMI Prop. 6 from the projection onto B(gamma) by sorting, whatever
    block hints the candidates."""
    rng = np.random.default_rng(m + 1)
    work, idx, mask = np.empty(m), np.empty(m, np.int64), np.zeros(m, bool)
    for trial in range(200):
        labels, s = _case(rng, m)
        s = s / (np.abs(s).max() + 1e-300) * 10.0 ** rng.uniform(-2, 1)
        gamma = 10.0 ** rng.uniform(-3, 1)
        pos = np.zeros(m, bool)
        pos[labels] = True
        b, bb = 0.5 - s[pos], 0.5 + s[~pos]
        p, pb = project_bipartite(b, bb, gamma, "sorting")
        ref = (b @ p - p @ p / 2 + bb @ pb - pb @ pb / 2) / gamma
        # no hint, or a block with an arbitrary negative support as the hint
        some = rng.random(m) < rng.random()
        hint = np.empty(0) if trial % 2 else np.where(some, -rng.random(m), 0.0)
        got = loss_value_ml(LOSS_SVM_ML, labels, s, gamma, work, idx, mask, hint)
        assert got == pytest.approx(ref, rel=1e-9, abs=1e-9), trial
