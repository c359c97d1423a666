"""The prefetch hint of the SDCA epoch loops (topkbench.solvers.prefetch)."""

from __future__ import annotations

import numpy as np
from numba import njit

from topkbench.solvers.prefetch import _prefetch, prefetch_at, prefetch_row


@njit  # not cached: numba inspects only freshly compiled code
def _touch(a, i):
    _prefetch(a, i, 0)
    prefetch_at(a[0], i)


def test_prefetch_emits_the_hint_and_changes_nothing():
    """The intrinsic compiles to an x86 prefetch instruction (the hint is not silently
    dropped), and prefetching rows of every dtype the epoch kernels pass leaves the array as
    it was."""
    for dtype in (np.float64, np.float32):
        a = np.arange(3 * 37, dtype=dtype).reshape(3, 37)
        before = a.copy()
        for i in range(3):
            prefetch_row(a, i)
        _touch(a, 2)
        np.testing.assert_array_equal(a, before)
    asm = "\n".join(_touch.inspect_asm().values())
    assert asm.count("prefetcht0") >= 2
