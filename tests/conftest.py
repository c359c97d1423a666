"""Shared fixtures.

Sections are kept apart so that several authors can add to this file:

* numerical core (kernels, losses, SDCA): small random problems and a session-scoped warm-up
  that compiles (or loads from numba's disk cache) every SDCA kernel once.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import settings

# ---------------------------------------------------------------------------------------------
# numerical core
# ---------------------------------------------------------------------------------------------

# JIT compilation breaks hypothesis deadlines (STYLE.md, "Tests"); derandomized so that a CI
# run is reproducible (the helpers that wrote the property tests ran them at 30-40x the
# example counts with random seeds)
settings.register_profile("topkbench", deadline=None, derandomize=True)
settings.load_profile("topkbench")

from reference import SDCA_METHODS  # noqa: E402


def make_problem(
    n: int = 20,
    d: int = 3,
    m: int = 4,
    seed: int = 0,
    *,
    zero_rows: tuple[int, ...] = (),
    sparse: bool = False,
    scale: float = 1.0,
):
    """Random features (Gaussian, some exact zeros) and labels covering every class."""
    rng = np.random.default_rng(seed)
    X = scale * rng.normal(size=(n, d))
    X[rng.random(size=(n, d)) < 0.2] = 0.0
    for i in zero_rows:
        X[i] = 0.0
    y = np.concatenate([np.arange(m), rng.integers(0, m, size=n - m)])
    rng.shuffle(y)
    if sparse:
        X = sp.csr_matrix(X)
    return X, y.astype(np.int64)


@pytest.fixture(scope="session")
def problem_factory():
    """``make_problem`` as a fixture (test modules do not import from conftest)."""
    return make_problem


@pytest.fixture(scope="session", autouse=True)
def compiled_sdca_kernels():
    """Compile (or load from cache) every SDCA kernel once per session, dense and CSR."""
    import topkbench

    X, y = make_problem(n=6, d=2, m=3, seed=123, zero_rows=(0,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method, gamma in SDCA_METHODS:
            for features in (X, sp.csr_matrix(X)):
                topkbench.fit(features, y, method, C=1.0, gamma=gamma, max_epochs=2, warn=False)
    return True
