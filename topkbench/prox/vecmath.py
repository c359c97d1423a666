"""Vectorizable ``exp`` and ``log`` for the numba kernels.

``math.exp`` and ``math.log`` are library calls that LLVM does not vectorize (numba has no SVML
on the machines we measure on), so a loop that calls them runs one element at a time.  The
functions here are branch-free loops over arrays (range reduction, a polynomial, and the
exponent handled through an int64 view of a float64 array), compiled with
``error_model="numpy"`` so that divisions carry no zero check and with fastmath "contract"
only (multiply-adds become FMAs: fewer instructions and one rounding instead of two; nothing
is reassociated); LLVM turns them into AVX-512 / AVX2 code.  The series of V
(:func:`~topkbench.prox.lambertw.lambertw_series`), the softmax root's vector loops and the
LR^OVA Halley steps are compiled the same way (on the 99-entry vectors of ``bench sdca``:
exp_shifted 144 -> 109 ns, the series 130 -> 92 ns).  ``exp_shifted`` is within 2 ulp of
``math.exp`` and ``log_into`` within 4 ulp of ``math.log``; ``exp_rough`` (a shorter
polynomial, ~6e-9) only feeds iterates that exact steps correct afterwards
(``tests/prox/test_vecmath.py``).  Also here: the sum and the 8-lane maximum of a
vector.

Users: the softmax root of TPAMI eq. (14) (:mod:`topkbench.prox.roots`), the top-k
entropic prox (:mod:`topkbench.losses.topk_entropy`), the LR^OVA block update and the
certificates of the logistic and entropic losses (:mod:`topkbench.losses.dispatch`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

EXP_CLAMP = 708.0  # |argument| bound of exp_shifted (e^708 < DBL_MAX; below -708: 0)

# exp_shifted: e^a = 2^k e^r with k = rint(a / log 2) and r = a - k log 2 (log 2 split in a
# 32-bit head, exact in k * head for |k| < 2^20, and a tail; fdlibm's constants), |r| <= 0.347,
# where the Taylor polynomial of degree 13 errs by r^14/14! < 5e-18 relative.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2^52: (x + _ROUND) - _ROUND rounds x to an integer
(_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7) = (1.0 / math.factorial(i) for i in range(8))
(_E8, _E9, _E10, _E11, _E12, _E13) = (1.0 / math.factorial(i) for i in range(8, 14))

# log_into: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m - 1) /
# (m + 1), |s| <= 3 - 2 sqrt(2) = 0.1716; the odd series 2 sum_k s^(2k+1) / (2k+1) truncated
# after k = 11 errs by s^24 / 25 < 1e-18 relative.
_TINY = 2.2250738585072014e-308  # smallest normal double: log_into clamps below it
_SQRT2 = 1.4142135623730951
_MANT = (1 << 52) - 1
_ONE_BITS = 1023 << 52
(_L0, _L1, _L2, _L3, _L4, _L5) = (1.0 / (2 * i + 1) for i in range(6))
(_L6, _L7, _L8, _L9, _L10, _L11) = (1.0 / (2 * i + 1) for i in range(6, 12))


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def exp_shifted(b, shift, n, out, tmp):
    """``out[j] = e^{b_j - shift}`` for ``j < n``, with the argument clamped to ``<= 708`` and
    ``0`` below ``-708``; ``tmp`` is scratch (length >= n).  Range reduction above, Estrin's
    scheme, and 2^k written into the exponent bits of ``out`` through an integer view."""
    bits = out.view(np.int64)
    for j in range(n):
        a = min(max(b[j] - shift, -EXP_CLAMP), EXP_CLAMP)
        kf = (a * _LOG2E + _ROUND) - _ROUND
        r = (a - kf * _LN2_HI) - kf * _LN2_LO
        r2 = r * r
        r4 = r2 * r2
        lo = ((_E0 + _E1 * r) + (_E2 + _E3 * r) * r2) + (
            (_E4 + _E5 * r) + (_E6 + _E7 * r) * r2
        ) * r4
        hi = ((_E8 + _E9 * r) + (_E10 + _E11 * r) * r2) + (_E12 + _E13 * r) * r4
        tmp[j] = lo + hi * (r4 * r4)
        bits[j] = (np.int64(kf) + 1023) << 52
    for j in range(n):
        v = tmp[j] * out[j]
        out[j] = v if b[j] - shift > -EXP_CLAMP else 0.0


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def exp_rough(x, n, out):
    """``out[j] ~ e^{x_j}`` for ``j < n`` to ~6e-9 relative, the argument clamped to [-708,
    708]: the reduction of :func:`exp_shifted` with a degree-7 Taylor polynomial (error
    ``0.347^8 / 8!``), for an iterate that exact steps correct afterwards (the first LR^OVA
    Halley step after the warm start, ~60 ns against ~110 ns for 100 entries).  The 2^k
    factor goes through an integer view of ``out``, as in :func:`exp_shifted`."""
    bits = out.view(np.int64)
    for j in range(n):
        a = min(max(x[j], -EXP_CLAMP), EXP_CLAMP)
        kf = (a * _LOG2E + _ROUND) - _ROUND
        bits[j] = (np.int64(kf) + 1023) << 52
    for j in range(n):
        a = min(max(x[j], -EXP_CLAMP), EXP_CLAMP)
        kf = (a * _LOG2E + _ROUND) - _ROUND
        r = (a - kf * _LN2_HI) - kf * _LN2_LO
        r2 = r * r
        p = ((_E0 + _E1 * r) + (_E2 + _E3 * r) * r2) + ((_E4 + _E5 * r) + (_E6 + _E7 * r) * r2) * (
            r2 * r2
        )
        out[j] = p * out[j]


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def log_into(x, n, out, tmp):
    """``out[j] = log(max(x_j, 2.2e-308))`` for ``j < n`` (finite ``x_j``; ``out`` may be
    ``x``); ``tmp`` is scratch (length >= n).  The clamp makes ``x log x`` come out as 0 at
    ``x = 0`` (callers form such products).  Exponent and mantissa are split through an
    integer view (series in the module's constants)."""
    bits = out.view(np.int64)
    for j in range(n):
        out[j] = max(x[j], _TINY)
    for j in range(n):
        bj = bits[j]
        tmp[j] = np.float64((bj >> 52) - 1023)
        bits[j] = (bj & _MANT) | _ONE_BITS
    for j in range(n):
        mant = out[j]
        big = mant >= _SQRT2
        mant = mant * 0.5 if big else mant
        e = tmp[j] + 1.0 if big else tmp[j]
        s = (mant - 1.0) / (mant + 1.0)
        s2 = s * s
        s4 = s2 * s2
        s8 = s4 * s4
        p0 = (_L0 + _L1 * s2) + (_L2 + _L3 * s2) * s4
        p1 = (_L4 + _L5 * s2) + (_L6 + _L7 * s2) * s4
        p2 = (_L8 + _L9 * s2) + (_L10 + _L11 * s2) * s4
        poly = p0 + (p1 + p2 * s8) * s8
        out[j] = e * _LN2_HI + (2.0 * s * poly + e * _LN2_LO)


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def vsum(x, n):
    """``sum_{j<n} x_j``; ``reassoc`` lets LLVM split it into vector lanes (a scalar sum is a
    chain of dependent adds, ~3 cycles per entry).  The order is fixed by the compiled code,
    so a run is reproducible on one machine.  Users: the certificate sums and the SDCA block
    updates (:mod:`topkbench.losses.dispatch`), the entropic prox
    (:mod:`topkbench.losses.topk_entropy`)."""
    acc = 0.0
    for j in range(n):
        acc += x[j]
    return acc


@njit(cache=True)
def vmax(x, n):
    """``max_{j<n} x_j`` (``-inf`` for ``n = 0``; no NaN in ``x``).  Eight running maxima: LLVM
    does not vectorize a floating-point max reduction without fast-math flags, and a single
    running maximum is a chain of dependent ``maxsd`` (99 entries: 32 -> 17 ns)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -np.inf
    j = 0
    while j + 8 <= n:
        a0 = max(a0, x[j])
        a1 = max(a1, x[j + 1])
        a2 = max(a2, x[j + 2])
        a3 = max(a3, x[j + 3])
        a4 = max(a4, x[j + 4])
        a5 = max(a5, x[j + 5])
        a6 = max(a6, x[j + 6])
        a7 = max(a7, x[j + 7])
        j += 8
    while j < n:
        a0 = max(a0, x[j])
        j += 1
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def vdot(x, y, n):
    """``sum_{j<n} x_j y_j`` (vectorized as :func:`vsum`)."""
    acc = 0.0
    for j in range(n):
        acc += x[j] * y[j]
    return acc
