"""Shared test references (importable from every test module: ``pythonpath = ["tests"]``)."""

from __future__ import annotations

import math

import scipy.special as sps

# (method, gamma) for every convex loss the SDCA core implements
SDCA_METHODS = [
    ("svm_multi", 0.0),
    ("svm_multi", 0.5),
    ("lr_multi", 0.0),
    ("svm_ova", 0.0),
    ("svm_ova", 0.5),
    ("lr_ova", 0.0),
]


def V_reference(u: float) -> float:
    """W0(e^u) from scipy where e^u is finite, else Newton on v + log v = u."""
    if u < 700.0:
        return float(sps.lambertw(math.exp(u)).real)
    v = u - math.log(u)
    for _ in range(6):
        v -= (v + math.log(v) - u) / (1.0 + 1.0 / v)
    return v
