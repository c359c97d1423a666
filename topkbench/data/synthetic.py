"""The synthetic circle of TPAMI §6.1 / CVPR §4 (Table 3), exactly as DESIGN §6.1.

Draw ``t ~ U[0, 7]``; the segments ``[0,1), [1,2), [2,3), [3,6), [6,7]`` (lengths 1,1,1,3,1)
carry the class distributions (columns of)::

    class 1: 0,  1, .4, .3, 0
    class 2: 1,  0, .1, .7, 0
    class 3: 0,  0, .5,  0, 1

and the point is ``(cos 2 pi t / 7, sin 2 pi t / 7)``.  Bayes-optimal accuracy is 80.0 % top-1
and 6.9/7 = 98.57 % top-2.  Labels are 0-based (class 1 -> 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEGMENT_EDGES = np.array([0.0, 1.0, 2.0, 3.0, 6.0, 7.0])
# P(class | segment): rows = classes, columns = segments
CLASS_GIVEN_SEGMENT = np.array(
    [
        [0.0, 1.0, 0.4, 0.3, 0.0],
        [1.0, 0.0, 0.1, 0.7, 0.0],
        [0.0, 0.0, 0.5, 0.0, 1.0],
    ]
)
BAYES_TOPK = {1: 0.8, 2: 6.9 / 7.0}


@dataclass(frozen=True)
class Split:
    X: np.ndarray
    y: np.ndarray


def sample_circle(n: int, rng: np.random.Generator) -> Split:
    """Draw ``n`` labelled points from the circle distribution."""
    t = rng.uniform(0.0, 7.0, size=n)
    seg = np.clip(np.searchsorted(SEGMENT_EDGES, t, side="right") - 1, 0, 4)
    cum = np.cumsum(CLASS_GIVEN_SEGMENT[:, seg], axis=0)  # 3 x n
    u = rng.uniform(size=n)
    y = (u[None, :] >= cum).sum(axis=0)
    y = np.minimum(y, 2).astype(np.int64)
    angle = 2.0 * np.pi * t / 7.0
    X = np.column_stack([np.cos(angle), np.sin(angle)])
    return Split(X, y)


def make_circle(
    seed: int, n_train: int = 200, n_val: int = 200, n_test: int = 200_000
) -> dict[str, Split]:
    """Train / val / test splits for one draw; ``seed`` alone determines all three."""
    rng = np.random.default_rng(seed)
    return {
        "train": sample_circle(n_train, rng),
        "val": sample_circle(n_val, rng),
        "test": sample_circle(n_test, rng),
    }


def make_gaussian(
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    n_features: int,
    n_classes: int,
    separation: float = 1.0,
) -> dict[str, Split]:
    """Gaussian classes: a stand-in of a given shape (e.g. Letter: 10,500/4,500/5,000, d=16, m=26).

    Class c has mean mu_c ~ N(0, separation^2 I_d) (drawn once from ``seed``) and covariance I;
    labels are uniform.  ``separation`` sets the difficulty: on the Letter shape, LR^Multi at C = 1
    reaches top-1 / top-3 test accuracy 67.8 / 88.0 % at 0.7 and 89.3 / 98.1 % at 1.0 (seed 0).
    ``seed`` alone fixes all splits.
    """
    rng = np.random.default_rng(seed)
    means = separation * rng.standard_normal((n_classes, n_features))

    def draw(n: int) -> Split:
        y = rng.integers(0, n_classes, size=n)
        X = means[y] + rng.standard_normal((n, n_features))
        return Split(X, y.astype(np.int64))

    return {"train": draw(n_train), "val": draw(n_val), "test": draw(n_test)}


@dataclass(frozen=True)
class MultilabelSplit:
    X: np.ndarray
    Y: object  # scipy.sparse.csr_matrix, n x m 0/1
    primary: np.ndarray  # one label per example: the highest-scoring relevant class


def make_multilabel(
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    n_features: int,
    n_labels: int,
    cardinality: float = 2.0,
    noise: float = 1.0,
    nonlinear: bool = False,
) -> dict[str, MultilabelSplit]:
    """Multilabel data of a given shape, for smoke runs and benchmarks of the multilabel
    protocol (no paper numbers exist for it).

    ``x ~ N(0, I_d)``; label scores ``u = V^T phi(x) + noise * N(0, I_m)`` with ``V ~ N(0, I)``
    drawn once, ``phi(x) = x`` (or ``phi(x) = x^2 - 1`` elementwise with ``nonlinear``, which
    only an RBF model can fit); label j is relevant iff ``u_j >= tau`` with ``tau`` the
    quantile that gives ``cardinality`` labels per example on average, so some examples have an
    empty label set (as in Mulan's delicious).  ``primary`` is the relevant label of largest
    score (or the largest score overall for an empty set): the single label a multiclass method
    trains on.  ``seed`` alone fixes all splits.
    """
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    V = rng.standard_normal((n_features, n_labels))
    tau = None

    def draw(n: int) -> MultilabelSplit:
        nonlocal tau
        X = rng.standard_normal((n, n_features))
        phi = X * X - 1.0 if nonlinear else X
        U = phi @ V / np.sqrt(n_features) + noise * rng.standard_normal((n, n_labels))
        if tau is None:  # fixed by the first (training) draw
            q = 1.0 - min(max(cardinality / n_labels, 0.0), 1.0)
            tau = float(np.quantile(U, q))
        T = U >= tau
        primary = np.where(T.any(axis=1), np.argmax(np.where(T, U, -np.inf), axis=1), U.argmax(1))
        return MultilabelSplit(X, sp.csr_matrix(T.astype(np.int8)), primary.astype(np.int64))

    return {"train": draw(n_train), "val": draw(n_val), "test": draw(n_test)}


def make_ill_conditioned(
    n: int,
    d: int,
    m: int,
    seed: int = 0,
    *,
    multilabel: bool = False,
    log10_scales: tuple[float, float] = (-2.0, 2.0),
    cardinality: float = 1.9,
):
    """Features scaled like raw real ones, for the conditioning benchmark.

    ``z ~ N(mu, I_d)`` with per-column offsets ``mu_j ~ U[0, 2]`` (raw features are seldom
    centred), then column j is multiplied by ``10^u_j``, ``u_j ~ U[log10_scales]``: magnitudes
    from 1e-2 to 1e2 and ``||x||^2`` up to ~1e5 at d = 72, as Mulan's emotions has.  Labels
    come from a linear teacher on the *unscaled* centred ``z`` plus N(0, 1/4) noise: the class
    of largest score (multiclass), or every label whose score exceeds the quantile giving
    ``cardinality`` labels per example on average (an n x m 0/1 CSR indicator; some label sets
    are empty).  ``seed`` alone fixes everything.
    """
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(*log10_scales, size=d)
    mu = rng.uniform(0.0, 2.0, size=d)
    Z = rng.standard_normal((n, d))
    teacher = rng.standard_normal((d, m)) / np.sqrt(d)
    U = Z @ teacher + 0.5 * rng.standard_normal((n, m))
    X = np.ascontiguousarray((Z + mu) * scales)
    if not multilabel:
        return X, U.argmax(axis=1).astype(np.int64)
    tau = float(np.quantile(U, 1.0 - min(max(cardinality / m, 0.0), 1.0)))
    return X, sp.csr_matrix((U >= tau).astype(np.int8))
