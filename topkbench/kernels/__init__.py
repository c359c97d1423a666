"""Numba kernels: flat ``@njit(cache=True)`` functions on plain arrays (DESIGN §5).

No Python objects, logging or exceptions in here; the wrappers in ``topkbench.solvers``
validate inputs, raise and warn. Note: numba's disk cache keys a function on its own source
file only, so after editing a helper in another kernel module run ``make clean-cache``.
"""
