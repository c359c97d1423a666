"""Top-k accuracy with ties counted against the prediction (DESIGN §2).

Example i is correct at k iff ``#{j != y_i : f_j >= f_{y_i}} < k``.  With continuous scores this
is TPAMI eq. (1); at ``W = 0`` it gives 0 (every other class ties with the label).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def label_ranks(scores: NDArray[np.float64], y: NDArray[np.int64]) -> NDArray[np.int64]:
    """Number of other classes scoring at least as high as the true one (0 = top-1 correct)."""
    scores = np.asarray(scores)
    y = np.asarray(y, dtype=np.int64)
    true = scores[np.arange(scores.shape[0]), y][:, None]
    return (scores >= true).sum(axis=1) - 1


def topk_accuracy(scores, y, ks=(1,)) -> dict[int, float]:
    """Top-k accuracy (fraction in [0, 1]) for each k in ``ks``."""
    ranks = label_ranks(scores, y)
    return {int(k): float(np.mean(ranks < k)) for k in ks}
