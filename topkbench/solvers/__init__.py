"""Solvers: Python drivers around the numba kernels (validation, stopping, traces)."""
