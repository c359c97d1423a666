"""What the benchmarks share: the seeded Gaussian problem, the machine's measured peak, method
specs (``name[:gamma[:k]]``) and their labels, and the checks on both."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from topkbench.errors import ConfigError
from topkbench.losses.registry import get_method


def make_gaussian_problem(n: int, d: int, m: int, seed: int = 0, separation: float = 1.0):
    """``x = separation * mu_y + N(0, I)`` with class means ``mu ~ N(0, I_d)``, y uniform.

    With ``separation = 1`` the classes of the 128-dimensional problem barely overlap; smaller
    values give the overlapping classes a convergence study needs, but not too small: at 0.2
    (n = 20,000, m = 100) W = 0 is optimal for SVM^Multi at every C (measured: P* = P(0) = 1
    to 10 digits).  0 is in the Crammer-Singer subdifferential at W = 0 (all m - 1 margins
    tie there) whenever no direction makes the mean of ``max_{j != y} s_j - s_y`` negative,
    a condition that does not involve lambda.  At 0.5 P* = 0.0083 (C = 0.1), so the studies
    use 0.5."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(m, d))
    y = rng.integers(0, m, size=n)
    X = separation * means[y] + rng.normal(size=(n, d))
    return np.ascontiguousarray(X), y.astype(np.int64)


def make_delicious_problem(n: int = 11_628, d: int = 500, m: int = 983, seed: int = 0,
                           nnz_per_row: float = 18.4, labels_per_row: float = 19.0):  # fmt: skip
    """A multilabel problem shaped like Mulan's delicious (TPAMI Table 7: 12,920 x 500 binary
    sparse, m = 983, 18.4 nonzeros and about 19 labels an example; ``n`` defaults to 90 % of
    its training split, one fold of the protocol): binary CSR features and label sets, each
    example's features and labels drawn without replacement from Zipf-like popularities
    (``1/rank^0.8`` over features, ``1/rank`` over labels) with Poisson sizes (at least one,
    at most m - 1 labels), so that a few labels are frequent and most are rare, as in the
    real file.  Returns ``(X, Y)``: CSR features and a CSR 0/1 label indicator."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    feature_p = 1.0 / np.arange(1, d + 1) ** 0.8
    label_p = 1.0 / np.arange(1, m + 1)

    def rows(popularity, mean, low, high):
        popularity = popularity / popularity.sum()
        sizes = np.clip(rng.poisson(mean, size=n), low, high)
        # without replacement, by Gumbel top-k keys: one vectorized draw per row
        logp = np.log(popularity)
        cols = [np.sort(np.argsort(logp - np.log(-np.log(rng.random(len(logp)))))[-q:])
                for q in sizes]  # fmt: skip
        indptr = np.concatenate(([0], np.cumsum(sizes)))
        return sp.csr_matrix((np.ones(indptr[-1]), np.concatenate(cols), indptr),
                             shape=(n, len(popularity)))  # fmt: skip

    X = rows(feature_p, nnz_per_row, 1, d)
    Y = rows(label_p, labels_per_row, 1, m - 1)
    return X, Y


def measure_peak_gflops(size: int = 1024, repeats: int = 5) -> float:
    """The machine's double-precision peak on one core, GFLOP/s: the best of ``repeats``
    ``size x size`` BLAS dgemm products (2 size^3 flops) with the BLAS held to one thread."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.random((size, size))
    b = rng.random((size, size))
    best = np.inf
    with threadpool_limits(1):
        a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best / 1e9


def parse_method_spec(text: str) -> tuple[str, float, int]:
    """``name[:gamma[:k]]`` -> (name, gamma, k)."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise ConfigError(f"method spec {text!r} must look like name[:gamma[:k]]")
    try:
        gamma = float(parts[1]) if len(parts) > 1 else 0.0
        k = int(parts[2]) if len(parts) > 2 else 1
    except ValueError as exc:
        raise ConfigError(f"method spec {text!r}: {exc}") from None
    return get_method(parts[0]).name, gamma, k


def check_sdca_problem(n: int, d: int, m: int, C: float, eps: float = 1e-3) -> None:
    """Refuse sizes and parameters no SDCA benchmark can run, naming the valid range."""
    for name, value, low in (("n", n, 1), ("d", d, 1), ("m", m, 2)):
        if value < low:
            raise ConfigError(f"bench sdca: {name} must be >= {low}; got {value}")
    for name, value in (("C", C), ("eps", eps)):
        if not (np.isfinite(value) and value > 0):
            raise ConfigError(f"bench sdca: {name} must be a finite number > 0; got {value}")


def check_sdca_methods(methods, m: int, where: str) -> None:
    """Refuse a method of ``methods`` ((name, gamma, k) triples) that is not SDCA or whose
    gamma or k is out of range on m classes (:func:`topkbench.validation.check_method_params`),
    naming the command ``where`` and the method."""
    from topkbench.validation import check_method_params

    for name, gamma, k in methods:
        spec = get_method(name)
        if spec.solver != "sdca":
            raise ConfigError(f"{where}: {name} is not an SDCA method")
        if "weights" in spec.params:
            raise ConfigError(
                f"{where}: {name} takes rank weights, which this benchmark does not set; "
                "topkbench bench kato-fig2 | kato-fig4 time it"
            )
        try:
            check_method_params(spec, gamma, k, m)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {method_label(name, gamma, k)}: {exc}") from None


def method_label(name: str, gamma: float, k: int) -> str:
    label = name if gamma == 0.0 else f"{name} γ={gamma:g}"
    return label if k == 1 else f"{label} k={k}"


def normal_batches(rng, problems: int, d: int, batch_bytes: int, progress=None):
    """``problems`` N(0, 1) vectors of length ``d`` from ``rng``, as row batches of at most
    ``batch_bytes`` (at least one row); ``progress(d, done, problems)`` after each batch."""
    per_batch = max(1, min(problems, batch_bytes // (8 * d)))
    done = 0
    while done < problems:
        nb = min(per_batch, problems - done)
        yield rng.normal(size=(nb, d))
        done += nb
        if progress is not None:
            progress(d, done, problems)


@contextmanager
def saved_figure(path, *args, dpi: int = 120, **kwargs):
    """``plt.subplots(*args, **kwargs)`` drawn off-screen (Agg), then laid out, written to
    ``path`` and closed: ``with saved_figure(path, figsize=...) as (fig, ax): ...``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
