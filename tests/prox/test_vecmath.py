"""The vectorizable exp and log of the numba kernels (topkbench.prox.vecmath) against math."""

from __future__ import annotations

import math

import numpy as np

from topkbench.prox.vecmath import exp_rough, exp_shifted, log_into, vmax


def test_exp_shifted_matches_math_exp():
    """Within 2 ulp of math.exp on [-708, 708], 0 below -708, the argument clamped at 708
    (never used there, see roots._entropic_root)."""
    rng = np.random.default_rng(0)
    b = np.concatenate([rng.uniform(-720.0, 720.0, 20_000), [-708.5, -708.0, 0.0, 1e-300, 708.0]])
    out, tmp = np.empty_like(b), np.empty_like(b)
    exp_shifted(b, 0.25, b.shape[0], out, tmp)
    a = b - 0.25
    inside = (a > -708.0) & (a <= 708.0)
    want = np.exp(a[inside])
    assert np.all(np.abs(out[inside] - want) <= 2.0 * np.spacing(want))
    assert np.all(out[a <= -708.0] == 0.0)
    assert np.all(out[a > 708.0] == out[a > 708.0][0]) and np.isfinite(out).all()
    # only the first n entries are written
    part = np.full(5, -1.0)
    exp_shifted(np.zeros(5), 0.0, 3, part, np.empty(5))
    assert part.tolist() == [1.0, 1.0, 1.0, -1.0, -1.0]


def test_log_into_matches_math_log():
    """Within 4 ulp of math.log over the whole normal range, near 1 (full relative accuracy
    as log x -> 0), at the mantissa split sqrt(2) and at powers of two; zero, negative and
    subnormal inputs give log of the smallest normal (so x log x = 0 at x = 0)."""
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            10.0 ** rng.uniform(-307.0, 308.0, 20_000),
            rng.uniform(0.5, 2.0, 20_000),
            1.0 + rng.uniform(-1e-6, 1e-6, 2_000),
            [math.sqrt(2.0), np.nextafter(math.sqrt(2.0), 0.0), 1.0, 2.0, 0.5, 1e300, 2.0**-1022],
            np.ldexp(1.0, np.arange(-1022, 1024)),
        ]
    )
    out, tmp = np.empty_like(x), np.empty_like(x)
    log_into(x, x.shape[0], out, tmp)
    want = np.log(x)
    assert np.all(np.abs(out - want) <= 4.0 * np.spacing(np.abs(want)))
    edge = np.array([0.0, -1.0, 1e-320, 5.0])
    got = np.empty(4)
    log_into(edge, 4, got, np.empty(4))
    assert got[:3].tolist() == [math.log(2.2250738585072014e-308)] * 3
    assert abs(got[3] - math.log(5.0)) <= 2.0 * np.spacing(math.log(5.0))
    # in place, only the first n entries
    y = np.array([math.e, 1.0, 7.0])
    log_into(y, 2, y, np.empty(3))
    assert abs(y[0] - 1.0) <= 2.0 * np.spacing(1.0) and y[1] == 0.0 and y[2] == 7.0


def test_vmax_is_the_maximum_of_the_prefix():
    """Every prefix length (the eight-lane body and the tail), the maximum in each lane and in
    the tail, all-negative values, infinities; entries past n are ignored; n = 0 gives -inf."""
    rng = np.random.default_rng(2)
    for n in range(0, 40):
        for pos in range(max(n, 1)):
            x = -10.0 - rng.random(n + 3)
            x[n:] = 1e9  # past the prefix
            if n:
                x[pos] = -1.0
            assert vmax(x, n) == (x[:n].max() if n else -np.inf), (n, pos)
    assert vmax(np.array([-np.inf, -np.inf]), 2) == -np.inf
    assert vmax(np.array([1.0, np.inf, 3.0]), 3) == np.inf


def test_exp_rough_is_within_its_stated_error():
    """``exp_rough`` (the first LR^OVA Halley step's exponential) within 1e-8 relative of
    math.exp on [-708, 708], clamped outside (finite, positive), only n entries written."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-708.0, 708.0, 20_000), rng.uniform(-1.0, 1.0, 2_000)])
    out = np.empty_like(x)
    exp_rough(x, x.shape[0], out)
    want = np.exp(x)
    assert np.max(np.abs(out - want) / want) <= 1e-8
    # but it is rough: the degree-7 polynomial is visibly short of exp_shifted's accuracy
    assert np.max(np.abs(out - want) / want) > 1e-12
    big = np.array([800.0, -800.0, 709.0])
    ob = np.empty(3)
    exp_rough(big, 3, ob)
    assert np.all(np.isfinite(ob)) and np.all(ob > 0.0)
    np.testing.assert_allclose(ob, np.exp([708.0, -708.0, 708.0]), rtol=1e-8)
    part = np.full(4, -1.0)
    exp_rough(np.zeros(4), 2, part)
    assert part.tolist() == [1.0, 1.0, -1.0, -1.0]
