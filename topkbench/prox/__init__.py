"""Pure numerical building blocks of the losses (DESIGN §4): projections onto the simplex and
the top-k and bipartite sets, root finders, Lambert W, vectorizable exp/log/sum.

Flat ``@njit(cache=True)`` functions on plain arrays: no Python objects, logging or
exceptions; the wrappers in ``topkbench.solvers`` validate inputs, raise and warn.  numba's
disk cache keys a function on its own source file only, so after editing a helper that other
modules call run ``make clean-cache``.
"""
