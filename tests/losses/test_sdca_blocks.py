"""Vectorized SDCA block updates against the scalar solvers they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topkbench.losses.ova import _lr_ova_block
from topkbench.prox.roots import STATUS_OK, _logistic_dual_root, _sigmoid


def _scalar_lr_ova(y, s, a, kii, C):
    out = np.empty_like(s)
    for c in range(s.shape[0]):
        yt = 1.0 if c == y else -1.0
        u, status = _logistic_dual_root(yt * (s[c] - kii * a[c]), C * kii, 0.0)
        assert status == STATUS_OK
        out[c] = C * _sigmoid(u) * yt
    return out


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    log_C=st.floats(-4.0, 3.0),
    log_k=st.floats(-6.0, 4.0),
    score_scale=st.sampled_from([0.0, 0.1, 3.0, 50.0, 1e3]),
    warm=st.sampled_from(["cold", "random", "near"]),
)
def test_lr_ova_block_matches_the_scalar_root(seed, log_C, log_k, score_scale, warm):
    """Halley steps on all classes at once, then the scalar solver for the stragglers: the same
    block as m scalar safeguarded solves, from a zero block (first epoch), a random one, or one
    near the answer (later epochs), for C K from 1e-10 to 1e7."""
    rng = np.random.default_rng(seed)
    m = 37
    C, kii = 10.0**log_C, 10.0**log_k
    y = int(rng.integers(m))
    s = score_scale * rng.standard_normal(m)
    yt = np.where(np.arange(m) == y, 1.0, -1.0)
    if warm == "cold":
        a = np.zeros(m)
    elif warm == "random":
        a = C * yt * rng.uniform(0.0, 1.0, m)
    else:
        a = _scalar_lr_ova(y, s, np.zeros(m), kii, C)  # the root for other scores
        s = s + 0.05 * rng.standard_normal(m)
    want = _scalar_lr_ova(y, s, a, kii, C)
    out = np.empty(m)
    status = _lr_ova_block(y, s, a, kii, C, out, np.empty(m), np.empty(m), np.empty(m),
                           np.empty((3, m)))  # fmt: skip
    assert status == STATUS_OK
    np.testing.assert_allclose(out / C, want / C, rtol=1e-12, atol=1e-15)


def test_lr_ova_block_zero_norm_example():
    """K = 0: beta = sigmoid(-ytilde s) (the maximizer of -L* alone, DESIGN §4.3)."""
    s = np.array([0.3, -2.0, 5.0, 0.0])
    out = np.empty(4)
    _lr_ova_block(2, s, np.zeros(4), 0.0, 0.5, out, np.empty(4), np.empty(4), np.empty(4),
                  np.empty((3, 4)))  # fmt: skip
    yt = np.array([-1.0, -1.0, 1.0, -1.0])
    want = 0.5 * yt / (1.0 + np.exp(yt * s))
    assert out == pytest.approx(want, rel=1e-14)


def test_aligned_zeros_rows_start_on_cache_lines():
    """The epoch kernel's padded W and pass vectors: zeros of the prototype's dtype,
    C-contiguous, the first element on a 64-byte boundary, so every row is when the width is
    a whole number of 64-byte vectors (8 float64, 16 float32: ``_padded_width``)."""
    from topkbench.solvers.epochs import _aligned_zeros, _padded_width

    for like in (np.zeros(1), np.zeros(1, dtype=np.float32)):
        lanes = 64 // like.itemsize
        assert [_padded_width(c, like) for c in (1, lanes, lanes + 1)] == [lanes, lanes, 2 * lanes]
        for r, c in [(128, 104), (4, 8), (3, 5), (6, 16)]:
            a = _aligned_zeros(r, c, like)
            assert a.shape == (r, c) and a.dtype == like.dtype
            assert a.flags["C_CONTIGUOUS"] and not a.any()
            assert a.ctypes.data % 64 == 0
            if c % lanes == 0:
                assert all(a[i].ctypes.data % 64 == 0 for i in range(r))
